"""dtorch-launch: start the ranks of a job and give them their environment.

Runners: local (processes on this node), mpi (mpiexec, or srun inside a
SLURM allocation), slurm (srun), ray (one actor per rank).  This package
only starts processes and sets environment variables; it never imports
dtorch or collectives (see DESIGN.md, "Layers").
"""
