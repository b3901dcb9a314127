"""A job that checkpoints every step and crashes once.

usage: resume.py CKPT_DIR STEPS CRASH_STEP
Each rank adds (step + 1) * (rank + 1) to a running total and saves
{step, total} to CKPT_DIR/rankR.json after every step.  On the first run
(DTORCH_RESTART_COUNT=0) rank 1 dies at CRASH_STEP; after the restart
every rank resumes from its own checkpoint.  Final line:
`RESULT rank total start_step restart_count`."""
import json
import os
import sys
import time

ckpt_dir, steps, crash = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rank = int(os.environ["RANK"])
restart = int(os.environ["DTORCH_RESTART_COUNT"])
path = os.path.join(ckpt_dir, f"rank{rank}.json")
state = {"step": 0, "total": 0}
if os.path.exists(path):
    with open(path) as f:
        state = json.load(f)
start = state["step"]
print(f"rank {rank} restart {restart} starts at step {start} port "
      f"{os.environ['MASTER_PORT']} token {os.environ['DTORCH_RDZV_TOKEN']}",
      flush=True)
for step in range(start, steps):
    if restart == 0 and rank == 1 and step == crash:
        print(f"rank {rank} crashes at step {step}", flush=True)
        os._exit(7)
    total = state["total"] + (step + 1) * (rank + 1)
    state = {"step": step + 1, "total": total}
    tmp = path + ".tmp"
    with open(tmp, "w") as f:     # write-then-rename: never a torn file
        json.dump(state, f)
    os.replace(tmp, path)
    time.sleep(0.02)
print(f"RESULT {rank} {state['total']} {start} {restart}", flush=True)
