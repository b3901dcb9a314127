"""Mixed precision step time: float32 vs autocast (bfloat16 on CPU, float16
on CUDA) for an MLP and a transformer block, and the weight-cast cache's
extra memory.

    python benchmarks/amp.py [--device cpu|cuda] [--dtype bfloat16|float16]
                             [--steps 10] [--threads 1] [--out F]

A step is forward (under autocast in the amp arm), cross-entropy / MSE loss,
backward and SGD; float16 adds a GradScaler. Times are medians over
--steps after a warm-up. The cache figure is the bytes the region's
weight casts hold at its end (one 16-bit copy of every float32 parameter a
low-precision op used), next to the float32 parameters' bytes.
"""
import argparse
import json
import os
import statistics
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("--device", default="cpu")
ap.add_argument("--dtype", default=None)
ap.add_argument("--steps", type=int, default=10)
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--out", default="benchmarks/results/amp.json")
args = ap.parse_args()
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, str(args.threads))

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import dtorch  # noqa: E402
from dtorch import nn  # noqa: E402
from dtorch.amp import autocast_mode as AM  # noqa: E402

dev = args.device
dtype = getattr(dtorch, args.dtype) if args.dtype else (
    dtorch.float16 if dev.startswith("cuda") else dtorch.bfloat16)
dev_type = "cuda" if dev.startswith("cuda") else "cpu"


def sync():
    if dev_type == "cuda":
        dtorch.cuda.synchronize()


def mlp():
    model = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(),
                          nn.Linear(1024, 1024), nn.ReLU(),
                          nn.Linear(1024, 10)).to(dev)
    x = dtorch.randn(256, 784, device=dev)
    y = dtorch.randint(0, 10, (256,), device=dev)
    return model, x, lambda out: nn.functional.cross_entropy(out, y)


def block():
    # a GPT-style pre-norm block: attention + 4x MLP, causal mask
    d, L, B = 256, 128, 16
    model = nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0,
                                       batch_first=True,
                                       norm_first=True).to(dev)
    x = dtorch.randn(B, L, d, device=dev)
    mask = nn.Transformer.generate_square_subsequent_mask(L).to(dev)
    tgt = dtorch.randn(B, L, d, device=dev)

    class Causal(nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, v):
            return self.m(v, src_mask=mask, is_causal=True)
    return Causal(), x, lambda out: nn.functional.mse_loss(out.float(), tgt)


def bench(make, amp):
    dtorch.manual_seed(0)
    model, x, loss_fn = make()
    opt = dtorch.optim.SGD(model.parameters(), lr=1e-3)
    scaler = dtorch.amp.GradScaler(dev_type, enabled=amp and
                                   dtype is dtorch.float16)
    cache = [0]

    def step():
        opt.zero_grad()
        with dtorch.autocast(dev_type, dtype=dtype, enabled=amp):
            loss = loss_fn(model(x))
            cache[0] = AM._cache_nbytes()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        sync()
    step()
    times = []
    for _ in range(args.steps):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    pbytes = sum(p.numel() * 4 for p in model.parameters())
    return statistics.median(times) * 1e3, cache[0], pbytes


res = {"device": dev, "dtype": str(dtype), "steps": args.steps,
       "threads": args.threads}
print(f"{'model':8s} {'fp32 ms':>9s} {'amp ms':>9s} {'speed-up':>9s} "
      f"{'cache MiB':>10s} {'params MiB':>10s}")
for name, make in (("mlp", mlp), ("block", block)):
    t32, _, pb = bench(make, False)
    tlo, cb, _ = bench(make, True)
    res[name] = {"fp32_ms": round(t32, 2), "amp_ms": round(tlo, 2),
                 "speedup": round(t32 / tlo, 3),
                 "cache_bytes": cb, "param_bytes": pb}
    print(f"{name:8s} {t32:9.2f} {tlo:9.2f} {t32 / tlo:9.2f} "
          f"{cb / 2**20:10.2f} {pb / 2**20:10.2f}", flush=True)
os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
with open(args.out, "w") as f:
    json.dump(res, f, indent=1)
