"""MLP 784-1024-1024-10 training step on the GPU: dtorch (CuPy) vs torch CUDA
when installed. Prints ms/step and the ratio; writes JSON to --out."""
import argparse
import json
import statistics
import time

import numpy as np

import dtorch

ap = argparse.ArgumentParser()
ap.add_argument("--batch", type=int, default=256)
ap.add_argument("--steps", type=int, default=50)
ap.add_argument("--out", default="gpu_mlp.json")
args = ap.parse_args()


def step_fn(lib, dev, sync):
    rng = np.random.default_rng(0)

    def p(*shape):
        a = (rng.standard_normal(shape) * 0.02).astype(np.float32)
        return lib.tensor(a, device=dev, requires_grad=True)
    ps = [p(1024, 784), p(1024), p(1024, 1024), p(1024), p(10, 1024), p(10)]
    x = lib.tensor(rng.standard_normal((args.batch, 784)).astype(np.float32),
                   device=dev)

    def run():
        w1, b1, w2, b2, w3, b3 = ps
        h = (x @ w1.t() + b1).relu()
        h = (h @ w2.t() + b2).relu()
        out = h @ w3.t() + b3
        (out * out).mean().backward()
        with lib.no_grad():
            for q in ps:
                q.sub_(q.grad * 0.01)
                q.grad = None
        sync()
    return run


def bench(run):
    for _ in range(5):
        run()
    ts = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        run()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


res = {"dtorch_cuda_ms": bench(step_fn(dtorch, "cuda",
                                       dtorch.cuda.synchronize))}
try:
    import torch
    if torch.cuda.is_available():
        res["torch_cuda_ms"] = bench(step_fn(torch, "cuda",
                                             torch.cuda.synchronize))
        res["ratio"] = res["dtorch_cuda_ms"] / res["torch_cuda_ms"]
except ImportError:
    pass
print(json.dumps(res, indent=2))
with open(args.out, "w") as f:
    json.dump(res, f, indent=2)
