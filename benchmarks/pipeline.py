"""Pipeline schedules: bubble fraction and peak activation memory.

    python benchmarks/pipeline.py [--json out.json] [--quick]

1. Bubble fraction, GPipe and 1F1B, p = 2 stages, m = 1..8 micro-batches,
   against the theory (p-1)/(m+p-1); interleaved 1F1B with v = 2 stages
   per rank (each half the work) against (p-1)/(v m + p - 1). Each stage is a block whose forward
   sleeps t_f and whose backward sleeps 2 t_f (threads backend): sleeping
   stands in for compute so that the figures measure the schedule (its
   idle time plus dtorch's per-micro-batch overhead), not this machine's
   load. Bubble = 1 - (time a rank spent in its blocks) / (step time,
   first rank's start to last rank's end), averaged over the ranks, best
   of 3 steps.
2. Peak activation memory per rank, GPipe vs 1F1B: two processes (tcp
   backend), each stage 4 Linear+Tanh layers of width 1024 on a float32
   batch of 512 rows cut into m micro-batches; tracemalloc's peak during
   one step minus the memory before it (NumPy reports its buffers to
   tracemalloc). GPipe holds all m micro-batches' activations, 1F1B at
   most p - stage.
"""
import argparse
import json
import os
import socket
import sys
import tempfile
import time
import tracemalloc

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
import dtorch  # noqa: E402
import dtorch.distributed as dist  # noqa: E402
from dtorch import nn  # noqa: E402
from dtorch.distributed.pipelining import (  # noqa: E402
    PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B)

SCHEDULES = {"GPipe": ScheduleGPipe, "1F1B": Schedule1F1B}


# ============================================================== bubble ==

class Sleep(dtorch.autograd.Function):
    """forward: sleep t_f; backward: sleep 2 t_f; the time slept is added
    to ``busy`` (a per-rank list)."""

    @staticmethod
    def forward(ctx, x, tf, busy):
        ctx.tf, ctx.busy = tf, busy
        t = time.perf_counter()
        time.sleep(tf)
        busy[0] += time.perf_counter() - t
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        t = time.perf_counter()
        time.sleep(2 * ctx.tf)
        ctx.busy[0] += time.perf_counter() - t
        return g, None, None


class SleepStage(nn.Module):
    def __init__(self, tf):
        super().__init__()
        self.lin = nn.Linear(8, 8)     # a parameter: backward runs
        self.tf = tf
        self.busy = [0.0]

    def forward(self, x):
        return Sleep.apply(self.lin(x), self.tf, self.busy)


def bubble(sched, p, m, tf, reps=3):
    """Mean over ranks of 1 - busy / step time, where the step runs from
    the first rank's start to the last rank's end (the pipeline's step:
    the last stage finishes early in GPipe/1F1B, the first stage late)."""
    x = dtorch.randn(4 * m, 8)
    marks = [[None] * p for _ in range(reps)]     # (start, end, busy)

    def body(rank, world):
        if sched == "Interleaved":
            # v = 2 stages per rank, each half the work: the same compute
            # per micro-batch and rank as the single-stage schedules
            mods = [SleepStage(tf / 2), SleepStage(tf / 2)]
            stages = [PipelineStage(mods[j], rank + j * p, 2 * p, "cpu")
                      for j in range(2)]
            sch = ScheduleInterleaved1F1B(stages, m,
                                          lambda out, y: out.sum())
            first, last = rank == 0, rank == p - 1
        else:
            mods = [SleepStage(tf)]
            stage = PipelineStage(mods[0], rank, p, "cpu")
            sch = SCHEDULES[sched](stage, m, lambda out, y: out.sum())
            first, last = stage.is_first, stage.is_last
        for r in range(reps):
            dist.barrier()
            for mod in mods:
                mod.busy[0] = 0.0
            t = time.perf_counter()
            if first:
                sch.step(x)
            elif last:
                sch.step(target=x)
            else:
                sch.step()
            marks[r][rank] = (t, time.perf_counter(),
                              sum(mod.busy[0] for mod in mods))
    dist.spawn_threads(body, p, timeout=120)
    best = None
    for rep in marks:
        wall = max(e for _, e, _ in rep) - min(s for s, _, _ in rep)
        frac = sum(1 - b / wall for _, _, b in rep) / p
        best = frac if best is None else min(best, frac)
    return best


# ============================================================== memory ==

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _memory_rank(rank, p, port, sched, m, out):
    dist.init_process_group("tcp", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=p)
    width, batch, layers = 1024, 512, 4
    dtorch.manual_seed(rank)
    mod = nn.Sequential(*[x for _ in range(layers)
                          for x in (nn.Linear(width, width), nn.Tanh())])
    stage = PipelineStage(mod, rank, p, "cpu")
    sch = SCHEDULES[sched](stage, m, lambda o, y: o.square().mean())
    x = dtorch.randn(batch, width)

    def step():
        mod.zero_grad(set_to_none=False)
        if stage.is_first:
            sch.step(x, return_outputs=False)
        elif stage.is_last:
            sch.step(target=x, return_outputs=False)
        else:
            sch.step()
    step()                           # gradients allocated: not counted
    dist.barrier()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    step()
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"peak_mb": peak / 2**20, "live": stage.peak_live}, f)
    dist.barrier()
    dist.destroy_process_group()


def memory(sched, p, m):
    from dtorch.multiprocessing import spawn
    # the tcp rendezvous wants a per-job secret (dtorch-launch sets one)
    os.environ["DTORCH_RDZV_TOKEN"] = os.urandom(8).hex()
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r")
        spawn(_memory_rank, args=(p, _free_port(), sched, m, out), nprocs=p)
        res = []
        for r in range(p):
            with open(f"{out}.{r}") as f:
                res.append(json.load(f))
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--quick", action="store_true",
                    help="m = 1, 2, 4, 8 only and 1 repetition")
    ap.add_argument("--tf", type=float, default=0.02,
                    help="seconds a stage's forward takes (backward: 2x)")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    p = 2
    ms = [1, 2, 4, 8] if args.quick else list(range(1, 9))
    reps = 1 if args.quick else 3
    res = {"p": p, "tf_s": args.tf, "bubble": [], "memory": []}
    print(f"bubble fraction, p={p}, t_f={args.tf * 1e3:.0f} ms, "
          f"t_b=2 t_f (threads backend, sleeping blocks)")
    print(f"{'m':>3} {'theory':>8} {'GPipe':>8} {'1F1B':>8}   "
          f"{'theory':>8} {'interleaved v=2':>16}")
    for m in ms:
        theory = (p - 1) / (m + p - 1)
        g = bubble("GPipe", p, m, args.tf, reps)
        o = bubble("1F1B", p, m, args.tf, reps)
        row = {"m": m, "theory": theory, "GPipe": g, "1F1B": o}
        extra = ""
        if m % p == 0:       # interleaved needs a multiple of p
            row["theory_v2"] = (p - 1) / (2 * m + p - 1)
            row["Interleaved_v2"] = bubble("Interleaved", p, m, args.tf,
                                           reps)
            extra = (f"   {row['theory_v2']:8.3f} "
                     f"{row['Interleaved_v2']:16.3f}")
        res["bubble"].append(row)
        print(f"{m:>3} {theory:8.3f} {g:8.3f} {o:8.3f}{extra}", flush=True)
    print("\npeak activation memory per rank (MiB), p=2, 4 x Linear(1024) "
          "+ Tanh per stage, batch 512 float32 (tcp, 2 processes)")
    print(f"{'m':>3} {'GPipe r0':>9} {'GPipe r1':>9} {'1F1B r0':>9} "
          f"{'1F1B r1':>9}  live micro-batches (GPipe / 1F1B)")
    for m in ([1, 2, 4, 8]):
        g = memory("GPipe", p, m)
        o = memory("1F1B", p, m)
        res["memory"].append({"m": m, "GPipe": g, "1F1B": o})
        print(f"{m:>3} {g[0]['peak_mb']:9.1f} {g[1]['peak_mb']:9.1f} "
              f"{o[0]['peak_mb']:9.1f} {o[1]['peak_mb']:9.1f}  "
              f"{[r['live'] for r in g]} / {[r['live'] for r in o]}",
              flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
