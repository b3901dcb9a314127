"""A job that expects to be preempted once (run by slurm/train.sbatch).

First run (DTORCH_RESTART_COUNT=0): waits for SIGUSR1, which the sbatch
trap passes on before it requeues the job; the handler 'checkpoints' (a
JSON file) and exits.  Second run: reads the checkpoint, does an MPI
allreduce and prints RESUMED."""
import json
import os
import signal
import sys
import time

from mpi4py import MPI

comm = MPI.COMM_WORLD
ckpt = os.path.join(sys.argv[1], f"ckpt{comm.rank}.json")
restart = int(os.environ["DTORCH_RESTART_COUNT"])


def on_usr1(signum, frame):
    with open(ckpt, "w") as f:
        json.dump({"step": 5}, f)
    print(f"rank {comm.rank}: USR1, saved step 5", flush=True)
    sys.exit(0)


if restart == 0:
    signal.signal(signal.SIGUSR1, on_usr1)
    print(f"rank {comm.rank}: waiting for USR1", flush=True)
    # long enough for a loaded machine to start the other rank and the
    # test to see both lines; USR1 ends the wait
    time.sleep(300)
    sys.exit(f"rank {comm.rank}: no USR1 within 300 s")
with open(ckpt) as f:
    step = json.load(f)["step"]
total = comm.allreduce(step)
print(f"RESUMED rank={comm.rank} restart={restart} step={step} "
      f"total={total}", flush=True)
