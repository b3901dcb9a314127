"""Weak and strong scaling of DDP on the MLP 784-1024-1024-10, measured
paired inside ONE 2-rank launch (separate launches are useless on a shared,
noisy machine): DDP steps on both ranks alternate with steps where rank 0
trains alone while rank 1 sleeps. Efficiency = t(alone) / t(DDP) per pair
for weak scaling (per-rank batch 256), t(alone, 512) / (2 t(DDP, 256)) for
strong scaling (global batch 512). PyTorch DDP over gloo runs the same
protocol in the same launch when torch is installed.

The sync-only ceiling runs the same protocol with a plain model (no DDP,
no gradient traffic) whose step ends in a barrier: what any synchronous
data-parallel step can reach on this machine at this moment, given that
the slower rank sets the pace (rank-to-rank noise, shared caches).

    mpiexec -n 2 python benchmarks/scaling.py [--steps 20] [--out DIR]
    dtorch-launch --nproc-per-node 2 benchmarks/scaling.py

Writes DIR/scaling.json and DIR/scaling.png (matplotlib, when installed).
"""
import argparse
import faulthandler
import json
import os
import statistics
import sys
import time

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import dtorch  # noqa: E402
import dtorch.distributed as dist  # noqa: E402
from dtorch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402


def mlp(lib):
    return lib.nn.Sequential(lib.nn.Linear(784, 1024), lib.nn.ReLU(),
                             lib.nn.Linear(1024, 1024), lib.nn.ReLU(),
                             lib.nn.Linear(1024, 10))


def batch(lib, n, seed):
    rng = np.random.default_rng(seed)
    x = lib.tensor(rng.standard_normal((n, 784)).astype(np.float32))
    y = lib.tensor(rng.integers(0, 10, n).astype(np.int64))
    return x, y


def make_step(lib, model, x, y):
    opt = lib.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = lib.nn.functional.cross_entropy

    def step():
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
    return step


def idle_until(barrier_async):
    """Wait without spinning a core (a spinning MPI barrier would steal
    the CPU that the lone rank 0 is measured on)."""
    w = barrier_async()
    while not w.is_completed():
        time.sleep(0.0005)
    w.wait()


def paired(rank, ddp_step, solo_step, barrier, barrier_async, steps):
    """Median over pairs of (t_ddp, t_solo), measured on rank 0."""
    t_ddp, t_solo = [], []
    for i in range(steps + 2):          # 2 warm-up pairs
        barrier()
        t0 = time.perf_counter()
        ddp_step()
        d = time.perf_counter() - t0
        barrier()
        if rank == 0:
            t0 = time.perf_counter()
            solo_step()
            s = time.perf_counter() - t0
            # the same (nonblocking) collective as rank 1: MPI does not
            # match a blocking barrier with a nonblocking one
            barrier_async().wait()
        else:
            idle_until(barrier_async)
        if i >= 2 and rank == 0:
            t_ddp.append(d)
            t_solo.append(s)
    return t_ddp, t_solo


def summarise(t_ddp, t_solo, per_rank, solo_n, world):
    """Figures for one protocol; weak when solo_n == per_rank, strong when
    solo_n == per_rank * world (the same global batch on one rank)."""
    ratios = [s * per_rank / (solo_n * d) for s, d in zip(t_solo, t_ddp)]
    return {"t_ddp_ms": 1e3 * statistics.median(t_ddp),
            "t_solo_ms": 1e3 * statistics.median(t_solo),
            "throughput_1": solo_n / statistics.median(t_solo),
            "throughput_n": per_rank * world / statistics.median(t_ddp),
            "efficiency": statistics.median(ratios)}


PROTOCOLS = (("weak", 256, 256), ("strong", 256, 512))


def measure(lib, rank, world, ddp, solo, barrier, barrier_async, steps,
            before=None, after=None):
    """Run both protocols; rank 0 returns {kind: figures}."""
    res = {}
    for kind, per_rank, solo_n in PROTOCOLS:
        x, y = batch(lib, per_rank, rank)
        xs, ys = batch(lib, solo_n, 7)
        if before:
            before()
        t_ddp, t_solo = paired(rank, make_step(lib, ddp, x, y),
                               make_step(lib, solo, xs, ys), barrier,
                               barrier_async, steps)
        if rank == 0:
            res[kind] = summarise(t_ddp, t_solo, per_rank, solo_n, world)
            if after:
                res[kind].update(after())
    return res


def run_dtorch(args, rank, world):
    g = dist._group(None)
    dtorch.manual_seed(0)
    ddp = DDP(mlp(dtorch), bucket_cap_mb=args.bucket_cap_mb)
    n = args.steps + 2

    def reset():
        ddp.stats.update(comm_s=0.0, wait_s=0.0, buckets=0)

    def comm_figures():
        st = ddp.stats
        return {"comm_ms_per_step": 1e3 * st["comm_s"] / n,
                "exposed_comm_ms_per_step": 1e3 * st["wait_s"] / n,
                "hidden_comm_share": 1 - st["wait_s"] / max(st["comm_s"],
                                                            1e-12),
                "buckets_per_step": st["buckets"] / n}
    return measure(dtorch, rank, world, ddp, mlp(dtorch), g.barrier,
                   lambda: g.barrier(async_op=True), args.steps, reset,
                   comm_figures)


def run_ceiling(args, rank, world):
    """Weak-scaling protocol, no DDP: each rank trains its own replica and
    waits for the other at the end of the step (see the docstring)."""
    g = dist._group(None)
    dtorch.manual_seed(0)
    x, y = batch(dtorch, 256, rank)
    xs, ys = batch(dtorch, 256, 7)
    train = make_step(dtorch, mlp(dtorch), x, y)

    def step():
        train()
        g.barrier()
    t_sync, t_solo = paired(rank, step, make_step(dtorch, mlp(dtorch), xs,
                                                  ys), g.barrier,
                            lambda: g.barrier(async_op=True), args.steps)
    if rank == 0:
        return summarise(t_sync, t_solo, 256, 256, world)


class _TorchWork:
    def __init__(self, w):
        self.w = w

    def is_completed(self):
        return self.w.is_completed()

    def wait(self):
        self.w.wait()


def run_torch(args, rank, world):
    try:
        import torch
        import torch.distributed as tdist
    except ImportError:
        return None
    torch.set_num_threads(1)
    port = int(os.environ.get("SCALING_TORCH_PORT", "29533"))
    tdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                             rank=rank, world_size=world)
    torch.manual_seed(0)
    ddp = torch.nn.parallel.DistributedDataParallel(
        mlp(torch), bucket_cap_mb=args.bucket_cap_mb)
    res = measure(torch, rank, world, ddp, mlp(torch), tdist.barrier,
                  lambda: _TorchWork(tdist.barrier(async_op=True)),
                  args.steps)
    tdist.destroy_process_group()
    return res


def plot(res, world, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return
    fig, ax = plt.subplots(figsize=(5, 4))
    ranks = [1, world]
    for name, r in res.items():
        if not r:
            continue
        w = r["weak"]
        ax.plot(ranks, [w["throughput_1"], w["throughput_n"]], "o-",
                label=f"{name} (eff {w['efficiency']:.2f})")
    base = res["dtorch"]["weak"]["throughput_1"]
    ax.plot(ranks, [base, base * world], "k--", label="ideal (dtorch)")
    ax.set_xlabel("ranks")
    ax.set_ylabel("samples / s")
    ax.set_xticks(ranks)
    ax.set_title("Weak scaling: MLP, batch 256 per rank")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--bucket-cap-mb", type=float, default=25,
                    help="DDP bucket size, for both frameworks")
    ap.add_argument("--hang-dump", type=float, default=600,
                    help="print every thread's stack after this many s")
    args = ap.parse_args()
    faulthandler.dump_traceback_later(args.hang_dump, exit=True)
    dist.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    if world < 2:
        sys.exit("run with 2 ranks: mpiexec -n 2 python "
                 "benchmarks/scaling.py")
    res = {"dtorch": run_dtorch(args, rank, world), "world": world,
           "sync_ceiling": run_ceiling(args, rank, world)}
    res["torch_gloo"] = None if args.no_torch else \
        run_torch(args, rank, world)
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "scaling.json"), "w") as f:
            json.dump(res, f, indent=2)
        print(f"{'':18}{'t_ddp ms':>10}{'t_solo ms':>10}{'samples/s':>11}"
              f"{'eff':>6}{'hidden':>8}")
        for lib in ("dtorch", "torch_gloo"):
            for kind in ("weak", "strong"):
                r = (res[lib] or {}).get(kind)
                if not r:
                    continue
                hid = r.get("hidden_comm_share")
                hs = f"{hid:8.2f}" if hid is not None else f"{'':8}"
                print(f"{lib + ' ' + kind:18}{r['t_ddp_ms']:10.1f}"
                      f"{r['t_solo_ms']:10.1f}{r['throughput_n']:11.0f}"
                      f"{r['efficiency']:6.2f}{hs}")
        c = res["sync_ceiling"]
        print(f"{'sync-only ceiling':18}{c['t_ddp_ms']:10.1f}"
              f"{c['t_solo_ms']:10.1f}{c['throughput_n']:11.0f}"
              f"{c['efficiency']:6.2f}")
        plot({"dtorch": res["dtorch"], "torch gloo": res["torch_gloo"]},
             world, os.path.join(args.out, "scaling.png"))
    dist.barrier()


if __name__ == "__main__":
    main()
