"""Core overhead, side by side with PyTorch CPU (when installed), same threads.

(a) per-op dispatch: a chain of 1,000 ops on tiny tensors, forward+backward;
(b) MLP 784-1024-1024-10, batch 256, forward+backward with raw tensor ops,
    also as a share of NumPy's own sgemm rate for the step's FLOPs.

    python benchmarks/core_overhead.py [--threads 1] [--repeats 20] [--out F]

Set the thread count before NumPy loads: this script sets OMP/OPENBLAS
variables from --threads itself, so run it as a fresh process.
"""
import argparse
import json
import os
import statistics
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--repeats", type=int, default=30)
ap.add_argument("--out", default="benchmarks/results/core_overhead.json")
args = ap.parse_args()
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = str(args.threads)

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import dtorch  # noqa: E402

try:
    import torch
    torch.set_num_threads(args.threads)
except ImportError:
    torch = None


def timeit(fn, repeats):
    fn()   # warm up
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def paired(fd, ft, repeats):
    """Medians of dtorch and torch runs interleaved one by one, so that
    both see the same machine noise."""
    fd()
    if ft:
        ft()
    td, tt = [], []
    for _ in range(repeats):
        for f, ts in ((fd, td), (ft, tt)):
            if f is None:
                continue
            t0 = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t0)
    return statistics.median(td), statistics.median(tt) if ft else None


def chain(lib, n=1000):
    x = lib.ones(4, requires_grad=True)

    def run():
        y = x
        for i in range(n // 2):
            y = y * 1.0001
            y = y + 0.5
        y.sum().backward()
        x.grad = None
    return run


def mlp(lib, batch=256):
    rng = np.random.default_rng(0)

    def p(*shape):
        a = (rng.standard_normal(shape) * 0.02).astype(np.float32)
        return lib.tensor(a, requires_grad=True)
    w1, b1 = p(1024, 784), p(1024)
    w2, b2 = p(1024, 1024), p(1024)
    w3, b3 = p(10, 1024), p(10)
    x = lib.tensor(rng.standard_normal((batch, 784)).astype(np.float32))
    params = [w1, b1, w2, b2, w3, b3]

    def run():
        h = (x @ w1.t() + b1).relu()
        h = (h @ w2.t() + b2).relu()
        out = h @ w3.t() + b3
        (out * out).mean().backward()
        for q in params:
            q.grad = None
    return run


def sgemm_rate():
    a = np.random.rand(256, 1024).astype(np.float32)
    b = np.random.rand(1024, 1024).astype(np.float32)
    t = timeit(lambda: a @ b, 20)
    return 2 * 256 * 1024 * 1024 / t


def main():
    res = {"threads": args.threads}
    flops = 3 * 2 * 256 * (784 * 1024 + 1024 * 1024 + 1024 * 10)
    res["numpy_sgemm_gflops"] = sgemm_rate() / 1e9
    rows = []
    for name, make in [("chain_1000_ops", chain), ("mlp_fwd_bwd", mlp)]:
        d, t = paired(make(dtorch), make(torch) if torch else None,
                      args.repeats)
        res[name] = {"dtorch_ms": d * 1e3,
                     "torch_ms": t * 1e3 if t else None,
                     "ratio": d / t if t else None}
        rows.append((name, d, t))
    d_mlp = res["mlp_fwd_bwd"]["dtorch_ms"] / 1e3
    res["mlp_gflops"] = flops / d_mlp / 1e9
    res["mlp_share_of_sgemm"] = res["mlp_gflops"] / res["numpy_sgemm_gflops"]
    res["per_op_us"] = res["chain_1000_ops"]["dtorch_ms"]
    print(f"threads={args.threads}  numpy sgemm "
          f"{res['numpy_sgemm_gflops']:.1f} GFLOP/s")
    print(f"{'benchmark':<18}{'dtorch ms':>12}{'torch ms':>12}{'ratio':>8}")
    for name, d, t in rows:
        ts = f"{t * 1e3:12.2f}" if t else f"{'n/a':>12}"
        rs = f"{d / t:8.2f}" if t else f"{'n/a':>8}"
        print(f"{name:<18}{d * 1e3:12.2f}{ts}{rs}")
    print(f"per-op fwd+bwd: {res['per_op_us']:.2f} us (dtorch); MLP step "
          f"{res['mlp_gflops']:.1f} GFLOP/s = "
          f"{100 * res['mlp_share_of_sgemm']:.0f}% of NumPy sgemm")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
