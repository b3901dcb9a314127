"""What straggler detection costs: step time with it on and off
(``DTORCH_STRAGGLER``), side by side, under DDP or FSDP, and what the
transports' per-peer wait timing costs per message.

    python benchmarks/straggler.py [--ranks 2] [--steps 200] [--rounds 5]
                                   [--wrap ddp|fsdp] [--shm 1|0]

Each round trains the same MLP (DDP or FSDP) on ``--ranks`` tcp processes
(loopback) twice, detection on and off, in turn (so both see the same
machine load); each run reports its median step (CPU time of the step's
thread and wall time). Prints the per-round on/off ratios' median and
range (the exchange, an all-reduce of 3 x ranks numbers every
``DTORCH_STRAGGLER_EVERY`` steps, is in the "on" runs). ``--shm 0`` sets
DTORCH_TCP_SHM=0 (DDP's buckets take the socket ring, not the shared-memory
reducer).

Then, in this process: the CPU time of the timing a transport adds per
blocking wait (a perf_counter pair and a list add, once per late peer; a
wait that does not block adds nothing), next to the CPU time of one small
all-reduce message on 2 thread ranks. The machine's load is printed too:
figures taken under load are noise-dominated.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

CHILD = r"""
import json, os, sys, time
import dtorch, dtorch.distributed as dist
from dtorch.nn.parallel import DistributedDataParallel as DDP
from dtorch.distributed.fsdp import FullyShardedDataParallel as FSDP
dist.init_process_group("tcp")
dtorch.manual_seed(0)
nn = dtorch.nn
wrap = FSDP if sys.argv[2] == "fsdp" else DDP
model = wrap(nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10)))
opt = dtorch.optim.SGD(model.parameters(), lr=0.01)
x, y = dtorch.randn(64, 256), dtorch.randint(0, 10, (64,))
walls, cpus = [], []
for i in range(int(sys.argv[1])):
    t0, c0 = time.perf_counter(), time.thread_time()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step(); opt.zero_grad()
    walls.append(time.perf_counter() - t0); cpus.append(time.thread_time() - c0)
walls, cpus = sorted(walls[10:]), sorted(cpus[10:])
if dist.get_rank() == 0:
    print(json.dumps({"wall": walls[len(walls) // 2], "cpu": cpus[len(cpus) // 2]}))
dist.destroy_process_group()
"""


def run(ranks, steps, on, wrap="ddp", shm="1"):
    env = dict(os.environ, DTORCH_STRAGGLER="1" if on else "0",
               OMP_NUM_THREADS="1", PYTHONPATH=ROOT, DTORCH_TCP_SHM=shm)
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(CHILD)
    try:
        out = subprocess.run(
            [sys.executable, "-m", "launch", "--nproc-per-node", str(ranks),
             f.name, str(steps), wrap], env=env, capture_output=True, text=True,
            timeout=600, cwd=ROOT)
    finally:
        os.unlink(f.name)
    # the launcher prefixes each line with "[rank R] "
    lines = [line[line.index("{"):] for line in out.stdout.splitlines()
             if "{" in line]
    if out.returncode != 0 or not lines:
        raise SystemExit(f"run failed:\n{out.stdout}\n{out.stderr}")
    return json.loads(lines[-1])


def per_message(n=200000):
    """(seconds of CPU per blocking wait's timing, per small all-reduce
    message on 2 thread ranks, per step of the detector's own work with
    its exchange every 20 steps, on 3 thread ranks)."""
    acc, r = [0.0, 0.0], 1
    c0 = time.thread_time()
    for _ in range(n):
        t0 = time.perf_counter()
        acc[r] += time.perf_counter() - t0
    timing = (time.thread_time() - c0) / n
    import numpy as np
    from collectives.threads import spawn_threads
    m = 2000

    def rank(g):
        x = np.zeros(4, np.float32)
        c = time.thread_time()
        for _ in range(m):
            g.all_reduce(x)
        return (time.thread_time() - c) / m
    message = min(spawn_threads(rank, 2))
    tcp = _tcp_messages(m)

    import dtorch.distributed as dist
    from dtorch.nn.parallel._straggler import StragglerDetector

    def detector(r, w):
        det = StragglerDetector(None, every=20)
        c = time.thread_time()
        for _ in range(m):
            det.forward()
            det.backward_end(0.0)
        return (time.thread_time() - c) / m
    step = min(dist.spawn_threads(detector, 3))
    return timing, message, step, tcp


def _tcp_messages(m):
    """CPU seconds per small message on 2 loopback tcp ranks (threads of
    this process): (socket ring all_reduce, shared-memory reducer
    all_reduce_coalesced). The timing runs at most once per blocking
    wait and late peer of a message."""
    import socket
    import threading
    import numpy as np
    from collectives.tcp import tcp_group
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = {}

    def rank(r):
        g = tcp_group(r, 2, "127.0.0.1", port, "bench", timeout=60)
        try:
            x = np.zeros(4, np.float32)
            res = []
            for op in (lambda: g.all_reduce(x),
                       lambda: g.all_reduce_coalesced([x])):
                c = time.thread_time()
                for _ in range(m):
                    op()
                res.append((time.thread_time() - c) / m)
            out[r] = res
        finally:
            g.destroy()
    ts = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return min(out[0][0], out[1][0]), min(out[0][1], out[1][1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--wrap", choices=["ddp", "fsdp"], default="ddp")
    ap.add_argument("--shm", choices=["1", "0"], default="1")
    a = ap.parse_args()
    print(f"load average before: {os.getloadavg()}")
    for _ in range(3):
        timing, message, step, (ring, red) = per_message()
        print(f"per blocking wait: timing {timing * 1e9:.0f} ns CPU; one "
              f"small all-reduce on 2 ranks: threads {message * 1e6:.1f} "
              f"us CPU ({100 * timing / message:.2f}%), tcp ring "
              f"{ring * 1e6:.1f} us ({100 * timing / ring:.2f}%), tcp "
              f"shm reducer {red * 1e6:.1f} us ({100 * timing / red:.2f}%)"
              f"; the detector per step (3 thread ranks, exchange "
              f"included) {step * 1e6:.1f} us CPU")
    wall, cpu = [], []
    for _ in range(a.rounds):
        on = run(a.ranks, a.steps, True, a.wrap, a.shm)
        off = run(a.ranks, a.steps, False, a.wrap, a.shm)
        wall.append(on["wall"] / off["wall"])
        cpu.append(on["cpu"] / off["cpu"])
        print(f"on {on['wall'] * 1e3:.3f} ms (cpu {on['cpu'] * 1e3:.3f}) | "
              f"off {off['wall'] * 1e3:.3f} ms (cpu {off['cpu'] * 1e3:.3f})")
    for name, r in (("wall", wall), ("cpu", cpu)):
        print(f"on/off {name}: median {statistics.median(r):.4f} "
              f"range {min(r):.4f}-{max(r):.4f}")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
