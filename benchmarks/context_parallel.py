"""Context-parallel attention: per-rank activation memory, the longest
sequence under a fixed per-rank budget, and CPU time against one rank.

    python benchmarks/context_parallel.py [--json out.json] [--quick]

Every configuration runs as CP processes (tcp backend, OMP_NUM_THREADS=1);
the work is one causal (--no-causal: unmasked) SDPA forward + backward,
batch 1, 4 heads of 32, float32, against the gradient of a fixed random
output. "sdpa" is one rank
of dtorch's own SDPA op (it keeps the T x T probabilities for backward);
"ring"/"ulysses" are context_parallel's algorithms (ring: K/V round the
ring, set_rotate_method("alltoall")).

1. Peak memory per rank: tracemalloc's peak during the step minus the
   memory before it (the inputs; NumPy reports its buffers to
   tracemalloc), the largest over the ranks.
2. Longest sequence under a per-rank budget (--budget MiB): T grown by
   x1.25 until the peak passes the budget, then bisected (to a multiple
   of 8 CP).
3. CPU time: the step's process CPU time (time.process_time, comm threads
   included) summed over the ranks, best of --reps, at one T for every
   configuration (the same total work), over one rank's.
"""
import argparse
import json
import os
import socket
import sys
import tempfile
import time
import tracemalloc

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
import dtorch  # noqa: E402
import dtorch.distributed as dist  # noqa: E402
import dtorch.nn.functional as F  # noqa: E402
from dtorch.distributed.device_mesh import init_device_mesh  # noqa: E402
from dtorch.distributed.tensor.experimental import (  # noqa: E402
    context_parallel, set_rotate_method)

H, E = 4, 32


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _step(mesh, algorithm, T, measure, causal=True):
    """One forward + backward; ``measure`` wraps it and returns a number."""
    rng = np.random.default_rng(T)
    full = [dtorch.tensor(rng.standard_normal((1, H, T, E), np.float32))
            for _ in range(4)]
    if algorithm == "sdpa":
        region = None
    else:
        region = context_parallel(mesh, buffers=full,
                                  buffer_seq_dims=[2] * 4,
                                  no_restore_buffers=full,
                                  algorithm=algorithm)
        region.__enter__()
    q, k, v = (t.requires_grad_() for t in full[:3])

    def run():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        (out * full[3]).sum().backward()
    try:
        return measure(run)
    finally:
        if region is not None:
            region.__exit__(None, None, None)


def _peak(run):
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    run()
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    return peak


def _agree(x, op=dist.ReduceOp.MAX):
    t = dtorch.tensor([float(x)], dtype=dtorch.float64)
    dist.all_reduce(t, op=op)
    return t.item()


def _rank(rank, n, port, algorithm, job, out):
    dist.init_process_group("tcp", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=n)
    mesh = init_device_mesh("cpu", (n,), mesh_dim_names=("cp",))
    set_rotate_method("alltoall")
    res, causal = {}, job["causal"]
    # warm-up: lazy imports and first-call caches are not activations
    _step(mesh, algorithm, 16 * n, lambda run: run())
    if "mem_T" in job:
        res["peak_mb"] = _agree(_step(mesh, algorithm, job["mem_T"],
                                      _peak, causal)) / 2**20
    if "budget_mb" in job:
        unit, budget = 8 * n, job["budget_mb"] * 2**20

        def fits(T):
            return _agree(_step(mesh, algorithm, T, _peak, causal)) <= budget
        lo, T = 0, unit
        while fits(T):
            lo, T = T, max(T + unit, int(T * 1.25) // unit * unit)
        hi = T
        while hi - lo > unit:
            mid = (lo + hi) // 2 // unit * unit
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        res["longest_T"] = lo
    if "time_T" in job:
        def cpu(run):
            t = time.process_time()
            run()
            return time.process_time() - t
        best = []
        for _ in range(job["reps"]):
            dist.barrier()
            best.append(_agree(_step(mesh, algorithm, job["time_T"], cpu,
                                     causal), dist.ReduceOp.SUM))
        res["cpu_s"] = min(best)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(res, f)
    dist.barrier()
    dist.destroy_process_group()


def run(algorithm, n, **job):
    from dtorch.multiprocessing import spawn
    os.environ["DTORCH_RDZV_TOKEN"] = os.urandom(8).hex()
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r.json")
        spawn(_rank, args=(n, _free_port(), algorithm, job, out), nprocs=n)
        with open(out) as f:
            return json.load(f)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--quick", action="store_true",
                    help="CP 1, 2 only, 1 repetition")
    ap.add_argument("--budget", type=float, default=16.0,
                    help="per-rank activation budget, MiB")
    ap.add_argument("--mem-T", type=int, default=1024)
    ap.add_argument("--time-T", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--no-causal", action="store_true",
                    help="attention without the causal mask")
    ap.add_argument("--time-only", action="store_true",
                    help="CPU time only (no memory figures)")
    args = ap.parse_args()
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    cps = [1, 2] if args.quick else [1, 2, 4]
    reps = 1 if args.quick else args.reps
    print(f"load: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; "
          f"{'non-causal' if args.no_causal else 'causal'} SDPA, 1 x {H} "
          f"heads x {E}, float32, tcp ranks")
    configs = [("sdpa", 1)] + [(a, n) for a in ("ring", "ulysses")
                               for n in cps]
    rows = []
    print(f"{'':>10} {'CP':>3} {'peak MiB @T=' + str(args.mem_T):>16} "
          f"{'longest T @' + str(args.budget) + ' MiB':>20} "
          f"{'CPU s @T=' + str(args.time_T):>14}")
    for alg, n in configs:
        mem = {} if args.time_only else dict(mem_T=args.mem_T,
                                             budget_mb=args.budget)
        r = run(alg, n, time_T=args.time_T, reps=reps,
                causal=not args.no_causal, **mem)
        r.update(algorithm=alg, cp=n)
        rows.append(r)
        print(f"{alg:>10} {n:>3} {r.get('peak_mb', np.nan):16.2f} "
              f"{r.get('longest_T', 0):20d} {r['cpu_s']:14.3f}", flush=True)
    print(f"load after: {os.getloadavg()[0]:.1f}")
    ref = {a: next(r for r in rows if r["algorithm"] == a and r["cp"] == 1)
           for a in ("sdpa", "ring", "ulysses")}
    for r in rows:
        base = ref[r["algorithm"]]
        if not args.time_only:
            r["peak_vs_cp1"] = r["peak_mb"] / base["peak_mb"]
            r["longest_vs_cp1"] = r["longest_T"] / base["longest_T"]
        r["cpu_vs_sdpa"] = r["cpu_s"] / ref["sdpa"]["cpu_s"]
        r["cpu_vs_cp1"] = r["cpu_s"] / base["cpu_s"]
        mem = "" if args.time_only else (
            f"peak x{r['peak_vs_cp1']:.3f} of CP 1, longest T "
            f"x{r['longest_vs_cp1']:.2f} of CP 1, ")
        print(f"{r['algorithm']:>10} CP {r['cp']}: {mem}CPU "
              f"x{r['cpu_vs_cp1']:.2f} of CP 1 (x{r['cpu_vs_sdpa']:.2f} of "
              f"one-rank SDPA)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
