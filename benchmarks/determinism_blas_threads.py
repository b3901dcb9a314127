"""What holding BLAS at one thread costs deterministic mode (issue 26,
dtorch/_blas_threads.py), at 1 rank.

Modes, interleaved, --repeats runs each, per step (after 3 warm-up steps):
  normal   the switch off: BLAS at its default threads
  det      the switch on: BLAS held at one thread (what dtorch does)
  det-2t   the switch on with the hold disabled: BLAS at its default
           threads, as before the fix (its bits depend on the count)
CPU = the process's user+system seconds (getrusage: BLAS worker threads
too), wall = perf_counter. Models: the GPT of benchmarks/determinism.py
(d 64, V 12), a wider GPT (d 256, V 4: its shard GEMMs are big enough for
OpenBLAS to thread them) and an MLP 256 wide (batch 64, V 2).

    python benchmarks/determinism_blas_threads.py [--repeats 3] [--steps 20]
"""
import argparse
import os
import resource
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import dtorch as torch  # noqa: E402
import dtorch.distributed as dist  # noqa: E402
from dtorch import _blas_threads, nn  # noqa: E402
from dtorch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from determinism import GPT, data, train_step  # noqa: E402


def wide_mlp():
    return nn.Sequential(nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 256),
                         nn.GELU(), nn.Linear(256, 10))


CASES = {  # name: (model, data kind, batch, virtual shards)
    "gpt": (GPT, "gpt", 24, 12),
    "gpt256": (lambda: GPT(d=256), "gpt", 24, 4),
    "mlp256": (wide_mlp, "mlp256", 64, 2),
}


def _batch(kind, n):
    g = torch.Generator().manual_seed(1)
    if kind == "mlp256":
        return torch.randn(n, 256, generator=g), torch.randint(
            0, 10, (n,), generator=g)
    return data(kind, n, g)


def _cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def step_ms(case, mode, steps):
    make, kind, batch, shards = CASES[case]
    real_set = _blas_threads._set
    if mode == "det-2t":
        _blas_threads._set = lambda lib, n: None     # the hold disabled
    try:
        torch.use_deterministic_algorithms(mode != "normal")
        torch.manual_seed(0)
        x, y = _batch(kind, batch)
        ddp = DDP(make(), virtual_shards=shards)
        opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
        for s in range(steps + 3):
            if s == 3:
                c, w = _cpu(), time.perf_counter()
            train_step(ddp, opt, x, y)
        return ((_cpu() - c) / steps * 1e3,
                (time.perf_counter() - w) / steps * 1e3)
    finally:
        torch.use_deterministic_algorithms(False)
        _blas_threads._set = real_set


def hold_cost(n=200):
    """us to take and give back the hold, and of the per-forward re-pin."""
    t = time.perf_counter()
    for _ in range(n):
        _blas_threads.Hold().release()
    take = (time.perf_counter() - t) / n * 1e6
    h = _blas_threads.Hold()
    t = time.perf_counter()
    for _ in range(n * 50):
        _blas_threads.repin()
    repin = (time.perf_counter() - t) / (n * 50) * 1e6
    h.release()
    return take, repin


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--only", default=",".join(CASES))
    a = ap.parse_args(argv)
    print(f"load average {os.getloadavg()[0]:.1f} "
          f"{os.getloadavg()[1]:.1f}; BLAS threads by default "
          f"{torch.get_num_threads()}")
    take, repin = hold_cost()
    print(f"hold take+release {take:.0f} us; re-pin check {repin:.2f} us "
          f"per forward")
    modes = ("normal", "det", "det-2t")
    for case in a.only.split(","):
        ms = {m: [] for m in modes}
        for _ in range(a.repeats):
            for m in modes:
                ms[m].append(dist.spawn_threads(
                    lambda r, w: step_ms(case, m, a.steps), 1)[0])

        def rng(m, i):
            v = [t[i] for t in ms[m]]
            return f"{min(v):7.1f}-{max(v):7.1f}"

        def ratio(m, to, i):
            r = [b[i] / a_[i] for a_, b in zip(ms[to], ms[m])]
            return f"{min(r):4.2f}-{max(r):4.2f}x"
        print(f"{case:7} ms/step CPU: normal {rng('normal', 0)} det "
              f"{rng('det', 0)} det-2t {rng('det-2t', 0)}  det/det-2t "
              f"{ratio('det', 'det-2t', 0)}")
        print(f"{'':7} ms/step wall: normal {rng('normal', 1)} det "
              f"{rng('det', 1)} det-2t {rng('det-2t', 1)}  det/det-2t "
              f"{ratio('det', 'det-2t', 1)}")


if __name__ == "__main__":
    main()
