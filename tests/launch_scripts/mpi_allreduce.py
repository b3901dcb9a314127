"""Smallest MPI job: allreduce of rank + 1, printed with the launch
environment (run under `python -m mpi4py`, as the sbatch files do)."""
import os
import sys

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
y = np.zeros(1)
comm.Allreduce(np.array([comm.rank + 1.0]), y)
env = os.environ
print(f"ALLREDUCE rank={comm.rank} size={comm.size} sum={y[0]:g} "
      f"RANK={env.get('RANK')} WORLD_SIZE={env.get('WORLD_SIZE')} "
      f"MASTER_ADDR={env.get('MASTER_ADDR')} "
      f"args={' '.join(sys.argv[1:])}", flush=True)
if env.get("SLURM_NTASKS") and comm.size != int(env["SLURM_NTASKS"]):
    # srun without --mpi=pmix silently gives 1-rank worlds (see slurm/README)
    sys.exit(f"MPI world size {comm.size} != SLURM_NTASKS "
             f"{os.environ['SLURM_NTASKS']}: srun needs --mpi=pmix")
