"""Ranks that hang, except one that fails.

usage: fail.py FAIL_RANK (exit CODE | kill SIG | none) [--child]
               [--ignore-term]
Every rank prints `PID rank pid`; with --child, each also starts a
`sleep` grandchild and prints `CHILD rank pid`, so a test can check that
the whole process tree is gone.  With --ignore-term the healthy ranks
ignore SIGTERM, so only the launcher's SIGKILL can stop them.  The
failing rank fails half a second after it is up."""
import os
import signal
import subprocess
import sys
import time

fail_rank, mode = int(sys.argv[1]), sys.argv[2]
value = sys.argv[3] if mode != "none" else None
rank = int(os.environ["RANK"])
if "--ignore-term" in sys.argv and rank != fail_rank:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print(f"PID {rank} {os.getpid()}", flush=True)
if "--child" in sys.argv:
    child = subprocess.Popen(["sleep", "120"])
    print(f"CHILD {rank} {child.pid}", flush=True)
print(f"rank {rank} is up", flush=True)
if rank == fail_rank and mode != "none":
    time.sleep(0.5)
    print(f"rank {rank} fails now ({mode} {value})", flush=True)
    if mode == "exit":
        sys.exit(int(value))
    os.kill(os.getpid(), getattr(signal, value))
time.sleep(120)
