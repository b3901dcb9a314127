"""Elastic ZeRO-1 and FSDP (issue 27): the per-step cost of the buddy
replicas.

    python benchmarks/elastic_zero_buddy.py [--runs 3] [--nproc 3]
                                            [--hidden 16,512] [--steps 60]
                                            [--fsdp]

Each run starts ``dtorch-launch --elastic N:N --nproc-per-node N`` on
loopback with this file as the script: an MLP (64 -> H -> H -> 10) under
``ElasticJob`` with ``ZeroRedundancyOptimizer(Adam)`` (``--fsdp``: the job
wraps it in FSDP, each Linear a unit, Adam over the flat parameters). The
ranks train
``--steps`` steps in blocks of ``--block``, the buddy replica switched on
and off block by block (interleaved, so both see the same load), and
record per step the wall time, the process's CPU time (getrusage: the
communication threads included) and the time in the buddy swap. Printed
per hidden size: the medians over steps and ranks of each run, as ranges
over the runs, the ratio on/off, and the bytes one rank swaps per step;
with ``uptime``'s load (the machine is shared).
"""
import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def worker(args):
    import numpy as np

    import dtorch as torch
    from dtorch.distributed import elastic
    from dtorch.distributed.optim import ZeroRedundancyOptimizer
    torch.manual_seed(0)
    h, bs = args.hidden, 96
    g = np.random.default_rng(0)
    n = bs * args.steps
    x = torch.from_numpy(g.standard_normal((n, 64)).astype(np.float32))
    y = torch.from_numpy(g.integers(0, 10, n))
    model = torch.nn.Sequential(torch.nn.Linear(64, h), torch.nn.ReLU(),
                                torch.nn.Linear(h, h), torch.nn.ReLU(),
                                torch.nn.Linear(h, 10))
    if args.fsdp:
        from dtorch.distributed.fsdp.wrap import ModuleWrapPolicy
        opt, fsdp = (lambda ps: torch.optim.Adam(ps, lr=1e-3)), {
            "auto_wrap_policy": ModuleWrapPolicy({torch.nn.Linear})}
    else:
        opt, fsdp = ZeroRedundancyOptimizer(
            model.parameters(), torch.optim.Adam, lr=1e-3), None
    job = elastic.ElasticJob(model, opt, torch.utils.data.TensorDataset(
        x, y), batch_size=bs, shuffle=False, fsdp=fsdp)
    opt = job.optimizer
    buddy, swap = job._buddy, [0.0]
    real = buddy.step_done

    def timed(group, version):
        t = time.perf_counter()
        real(group, version)
        swap[0] = time.perf_counter() - t
    buddy.step_done = timed
    rows = []
    for _ in job.epochs(1):
        for step in job.steps():
            on = (job.done // args.block) % 2 == 0
            job._buddy = buddy if on else None
            swap[0] = 0.0
            t, c = time.perf_counter(), _cpu()
            with step:
                xb, yb = step.batch
                opt.zero_grad()
                torch.nn.functional.cross_entropy(job.model(xb), yb
                                                  ).backward()
                opt.step()
            rows.append([on, time.perf_counter() - t, _cpu() - c, swap[0]])
    job._buddy = buddy
    import pickle
    nbytes = len(pickle.dumps(buddy.layout.snapshot(), protocol=5))
    with open(os.path.join(args.out, f"rank{job.rank}.json"), "w") as f:
        json.dump({"rows": rows[args.block:], "bytes": nbytes,
                   "params": sum(n for (_, n) in (
                       (s, int(np.prod(s))) for s, _ in
                       buddy.layout.specs()))}, f)
    job.close()


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_run(nproc, hidden, steps, block, fsdp):
    out = tempfile.mkdtemp(prefix="zero-buddy-")
    port = _port()
    env = dict(os.environ, PYTHONPATH=ROOT, DTORCH_RDZV_TOKEN=f"zb-{port}")
    subprocess.run(
        [sys.executable, "-m", "launch", "--elastic", f"{nproc}:{nproc}",
         "--nproc-per-node", str(nproc), "--master-port", str(port),
         os.path.abspath(__file__), "--worker", "--out", out, "--hidden",
         str(hidden), "--steps", str(steps), "--block", str(block)]
        + (["--fsdp"] if fsdp else []),
        env=env, cwd=ROOT, check=True, timeout=600,
        stdout=subprocess.DEVNULL)
    ranks = []
    for name in sorted(os.listdir(out)):
        with open(os.path.join(out, name)) as f:
            ranks.append(json.load(f))
        os.remove(os.path.join(out, name))
    os.rmdir(out)
    rows = [r for d in ranks for r in d["rows"]]

    def med(on, col):
        return statistics.median(r[col] for r in rows if r[0] == on)
    return {"wall_on": med(True, 1), "wall_off": med(False, 1),
            "cpu_on": med(True, 2), "cpu_off": med(False, 2),
            "swap": med(True, 3), "bytes": ranks[0]["bytes"],
            "params": ranks[0]["params"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--out")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--nproc", type=int, default=3)
    ap.add_argument("--hidden", default="16,512")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--block", type=int, default=5)
    ap.add_argument("--fsdp", action="store_true")
    args = ap.parse_args()
    if args.worker:
        args.hidden = int(args.hidden)
        return worker(args)
    print("load before:", os.getloadavg())
    for h in map(int, args.hidden.split(",")):
        runs = [one_run(args.nproc, h, args.steps, args.block, args.fsdp)
                for _ in range(args.runs)]

        def rng(key, scale=1e3):
            v = sorted(r[key] * scale for r in runs)
            return f"{v[0]:.2f}-{v[-1]:.2f}"
        ratio = sorted(r["cpu_on"] / r["cpu_off"] for r in runs)
        wratio = sorted(r["wall_on"] / r["wall_off"] for r in runs)
        print(f"{'FSDP' if args.fsdp else 'ZeRO-1'}: "
              f"hidden {h} ({runs[0]['params']} parameters, "
              f"{runs[0]['bytes'] / 1e3:.1f} kB swapped per rank and step), "
              f"{args.nproc} ranks, {args.runs} runs: step CPU ms with "
              f"buddy {rng('cpu_on')} / without {rng('cpu_off')} (ratio "
              f"{ratio[0]:.2f}-{ratio[-1]:.2f}); step wall ms "
              f"{rng('wall_on')} / {rng('wall_off')} (ratio "
              f"{wratio[0]:.2f}-{wratio[-1]:.2f}); the swap itself "
              f"{rng('swap')} ms wall")
    print("load after:", os.getloadavg())


if __name__ == "__main__":
    sys.exit(main())
