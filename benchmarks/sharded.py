"""Sharded data parallelism: per-rank memory and step time of DDP, ZeRO-1,
ZeRO-2 and FSDP in the same run.

    mpiexec -n 2 python benchmarks/sharded.py [--layers 8] [--width 1024]
        [--batch 64] [--steps 10] [--json out.json]

Model: ``layers`` x (Linear(width, width) + Tanh) and a Linear(width, 1)
head, float32, Adam; each rank a batch of ``batch`` rows. For each mode:

- state bytes per rank, counted from the objects after a step: parameters
  as stored (FSDP: its shards), gradients (FSDP: the shards' gradients;
  DDP/ZeRO: ``p.grad``) and optimizer state tensors;
- peak bytes: tracemalloc's peak during one step (NumPy reports its
  buffers) minus what was allocated before it: gradients, activations,
  communication buffers and FSDP's gathered units;
- step time: median of ``steps`` timed steps after 2 warm-up steps.

ZeRO-2 here saves communication (reduce-scatter + all-gather instead of
all-reduce + all-gather), not gradient memory: DDP still owns full-size
gradients. FSDP recomputes each unit's forward in backward (see
dtorch/distributed/fsdp), so its step costs about one more forward.

Measured (defaults, 8.4 M float32 parameters, mpiexec on a 2-core machine
at load average 4-8, so step times are noisy; MB per rank, worst rank):

    ranks mode   params grads optim state  peak  step ms  vs DDP
    2     ddp      32.0  32.0  64.1 128.1   6.3    173.5   1.00
    2     zero1    32.0  32.0  32.0  96.1  10.0    215.2   1.24
    2     zero2    32.0  32.0  32.0  96.1  36.0    250.5   1.44
    2     fsdp     16.0  16.0  32.0  64.1  20.3    360.2   2.08
    4     ddp      32.0  32.0  64.1 128.1   6.3    286.5   1.00
    4     zero1    32.0  32.0  16.0  80.1   7.0    383.4   1.34
    4     zero2    32.0  32.0  16.0  80.1  36.0    331.4   1.16
    4     fsdp      8.0   8.0  16.0  32.0  18.3    261.8   0.91

(4 ranks run oversubscribed on 2 cores.) ZeRO-2's peak is DDP's
communication-hook path (gradients copied into bucket buffers), not the
sharding.
"""
import argparse
import json
import os
import statistics
import sys
import time
import tracemalloc

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
import numpy as np  # noqa: E402

import dtorch  # noqa: E402
import dtorch.distributed as dist  # noqa: E402
from dtorch import nn, optim  # noqa: E402
from dtorch.distributed.algorithms.ddp_comm_hooks.zero_hook import \
    reduce_scatter_hook  # noqa: E402
from dtorch.distributed.fsdp import FSDP, ModuleWrapPolicy  # noqa: E402
from dtorch.distributed.optim import ZeroRedundancyOptimizer  # noqa: E402
from dtorch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from dtorch.tensor import Tensor  # noqa: E402


def build(layers, width):
    dtorch.manual_seed(0)
    mods = []
    for _ in range(layers):
        mods += [nn.Linear(width, width), nn.Tanh()]
    return nn.Sequential(*mods, nn.Linear(width, 1))


def setup(mode, layers, width):
    m = build(layers, width)
    if mode == "fsdp":
        model = FSDP(m, auto_wrap_policy=ModuleWrapPolicy({nn.Linear}))
        opt = optim.Adam(model.parameters(), lr=1e-4)
        return model, opt
    model = DDP(m)
    if mode == "ddp":
        return model, optim.Adam(m.parameters(), lr=1e-4)
    opt = ZeroRedundancyOptimizer(m.parameters(), optim.Adam, lr=1e-4)
    if mode == "zero2":
        model.register_comm_hook(opt, reduce_scatter_hook)
    return model, opt


def state_bytes(mode, model, opt):
    params = list(model.parameters())
    p = sum(t._data.nbytes for t in params)
    g = sum(t.grad._data.nbytes for t in params if t.grad is not None)
    st = opt.optim.state if mode.startswith("zero") else opt.state
    o = sum(v._data.nbytes for s in st.values() for v in s.values()
            if isinstance(v, Tensor))
    return p, g, o


def run(mode, args):
    model, opt = setup(mode, args.layers, args.width)
    rng = np.random.default_rng(dist.get_rank())
    x = dtorch.tensor(rng.standard_normal((args.batch, args.width)),
                      dtype=dtorch.float32)
    y = dtorch.tensor(rng.standard_normal((args.batch, 1)),
                      dtype=dtorch.float32)

    def step():
        opt.zero_grad(set_to_none=False)
        ((model(x) - y) ** 2).mean().backward()
        opt.step()
    for _ in range(2):
        step()
    times = []
    for _ in range(args.steps):
        dist.barrier()
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    step()
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    p, g, o = state_bytes(mode, model, opt)
    return {"mode": mode, "params_MB": p / 2**20, "grads_MB": g / 2**20,
            "optim_MB": o / 2**20, "state_MB": (p + g + o) / 2**20,
            "step_peak_MB": peak / 2**20,
            "step_ms": 1e3 * statistics.median(times)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--json")
    args = ap.parse_args()
    dist.init_process_group()
    rows = []
    for mode in ("ddp", "zero1", "zero2", "fsdp"):
        r = run(mode, args)
        mine = [None] * dist.get_world_size()
        dist.all_gather_object(mine, r)
        # the worst rank of each figure
        rows.append({k: (max(x[k] for x in mine) if k != "mode" else v)
                     for k, v in r.items()})
    if dist.get_rank() == 0:
        n = sum(p.numel() for p in build(args.layers, args.width)
                .parameters())
        print(f"{dist.get_world_size()} ranks, {n / 1e6:.2f} M parameters "
              f"(float32), Adam; per-rank figures, worst rank")
        print(f"{'mode':6} {'params':>8} {'grads':>8} {'optim':>8} "
              f"{'state':>8} {'peak':>8} {'step ms':>8} {'vs DDP':>7}")
        ddp = rows[0]["step_ms"]
        for r in rows:
            print(f"{r['mode']:6} {r['params_MB']:8.1f} {r['grads_MB']:8.1f}"
                  f" {r['optim_MB']:8.1f} {r['state_MB']:8.1f} "
                  f"{r['step_peak_MB']:8.1f} {r['step_ms']:8.1f} "
                  f"{r['step_ms'] / ddp:7.2f}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"args": vars(args), "rows": rows}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
