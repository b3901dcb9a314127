"""Sharded data parallelism: per-rank memory and step time of DDP, ZeRO-1,
ZeRO-2 and FSDP in the same run.

    mpiexec -n 2 python benchmarks/sharded.py [--model mlp|gpt]
        [--layers 8] [--width 1024] [--batch 64] [--steps 10] [--json F]

Model (mlp): ``layers`` x (Linear(width, width) + Tanh) and a
Linear(width, 1) head; (gpt): examples/gpt.py's GPT with ``layers`` blocks
of ``width``, 4 heads, vocabulary ``vocab``, ``seq`` tokens, the blocks as
FSDP units. float32, Adam; each rank a batch of ``batch`` rows. For each
mode:

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

GPT (``--model gpt --layers 4 --width 256 --batch 8 --steps 5``: 4.2 M
parameters, vocabulary 4096, 64 tokens; load average 5-10, so the step
times say little beyond FSDP's recomputation):

    ranks mode   params grads optim state  peak  step ms  vs DDP
    2     ddp      16.1  16.1  32.2  64.5  69.1   1077.2   1.00
    2     zero1    16.1  16.1  16.1  48.3  69.1    632.2   0.59
    2     zero2    16.1  16.1  16.1  48.3  69.1    788.8   0.73
    2     fsdp      8.1   8.1  16.1  32.2  33.7   1680.5   1.56
    4     ddp      16.1  16.1  32.2  64.5  69.1   1953.0   1.00
    4     zero1    16.1  16.1   8.1  40.3  69.1   1635.2   0.84
    4     zero2    16.1  16.1   8.1  40.3  69.1   2005.3   1.03
    4     fsdp      4.0   4.0   8.1  16.1  33.7   3147.4   1.61

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


def build_gpt(args):
    """examples/gpt.py's GPT (no tensor parallelism: a one-rank TP group
    per rank), float32; the blocks are FSDP's units."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), "examples"))
    import gpt
    mine = None
    for r in range(dist.get_world_size()):     # new_group is collective
        g = dist.new_group([r])
        if r == dist.get_rank():
            mine = g
    dtorch.manual_seed(0)
    m = gpt.GPT(args.vocab, args.layers, 4, args.width, args.seq,
                tp_group=mine)
    return m, gpt.Block


def setup(mode, args):
    if args.model == "gpt":
        m, unit = build_gpt(args)
    else:
        m, unit = build(args.layers, args.width), nn.Linear
    if mode == "fsdp":
        model = FSDP(m, auto_wrap_policy=ModuleWrapPolicy({unit}))
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
    model, opt = setup(mode, args)
    rng = np.random.default_rng(dist.get_rank())
    if args.model == "gpt":
        idx = rng.integers(0, args.vocab, (args.batch, args.seq + 1))
        x, y = dtorch.tensor(idx[:, :-1]), dtorch.tensor(idx[:, 1:])

        def loss_fn(out):
            return nn.functional.cross_entropy(
                out.reshape(-1, out.shape[-1]), y.reshape(-1))
    else:
        x = dtorch.tensor(rng.standard_normal((args.batch, args.width)),
                          dtype=dtorch.float32)
        y = dtorch.tensor(rng.standard_normal((args.batch, 1)),
                          dtype=dtorch.float32)

        def loss_fn(out):
            return ((out - y) ** 2).mean()

    def step():
        opt.zero_grad(set_to_none=False)
        loss_fn(model(x)).backward()
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
    ap.add_argument("--model", choices=["mlp", "gpt"], default="mlp")
    ap.add_argument("--vocab", type=int, default=4096, help="gpt only")
    ap.add_argument("--seq", type=int, default=64, help="gpt only")
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
        n = rows[0]["params_MB"] * 2**20 / 4
        print(f"{dist.get_world_size()} ranks, {args.model}, {n / 1e6:.2f} "
              f"M parameters (float32), Adam; per-rank figures, worst rank")
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
