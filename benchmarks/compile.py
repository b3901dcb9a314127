"""dtorch.compile against PyTorch, side by side in one process, 1 thread.

Workloads (each timed as CPU time of the calling thread, time.thread_time,
so that the other load of a shared machine does not enter; interleaved:
every round times each variant once, and the ratios are taken per round):

- chain: 300 tiny elementwise ops (x*1.01, +0.1, tanh, 100 times) on 8
  floats, forward + backward: the per-op cost of dispatch;
- mlp: MLP 64-128-128-10, batch 32, SGD(momentum 0.9), cross-entropy step;
- cnn: Conv2d(3,8,3,p=1)-BatchNorm2d-ReLU-MaxPool2d(2)-Flatten-Linear, batch
  8 on 3x16x16, SGD step;
- decoder: Embedding(256,64) + nn.TransformerEncoderLayer(64, 4 heads, ff
  128, GELU, dropout 0.1, norm_first, causal) + Linear(64,256), batch 8,
  seq 32, AdamW, cross-entropy.

Variants: torch eager, torch.compile (inductor; skipped with
--no-inductor, its compile time printed), dtorch eager, dtorch.compile.
Prints per workload the per-call time of each (median over rounds) and the
ratios dtorch-compiled/torch-eager, dtorch-compiled/dtorch-eager and
dtorch-compiled/torch-compiled as min-max over rounds, with the load
average (``uptime``) before and after; ``--json F`` writes them too.

    python benchmarks/compile.py [--rounds 7] [--calls 30] [--only chain,mlp]
        [--no-inductor] [--json F] [--replot F]

With --json F a PNG of each variant's time over torch eager's (medians)
is written next to it (when matplotlib is installed); --replot F redraws
it from F. benchmarks/plots/compile.json is a run of this script.
"""
import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
# GNU OpenMP (loaded by torch) spins its waiting threads by default, and
# once numba's pool is up that spin lands in the calling thread: torch's MLP
# step measured 8-12 ms of thread CPU instead of 0.3-0.5 ms without this
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(_HERE), _HERE]

import numpy as np  # noqa: E402
import torch  # noqa: E402

import dtorch  # noqa: E402
import _plot  # noqa: E402

torch.set_num_threads(1)
dtorch.set_num_threads(1)


def chain(x):
    for _ in range(100):
        x = x * 1.01
        x = x + 0.1
        x = x.tanh()
    return x.sum()


def make_chain(lib, compiled):
    x = lib.randn(8, requires_grad=True)
    f = compiled(chain) if compiled else chain

    def call():
        f(x).backward()
    return call


def Decoder(lib):
    nn = lib.nn

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.e = nn.Embedding(256, 64)
            self.t = nn.TransformerEncoderLayer(
                64, 4, 128, 0.1, activation="gelu", batch_first=True,
                norm_first=True)
            self.o = nn.Linear(64, 256)
            self.mask = nn.Transformer.generate_square_subsequent_mask(32)

        def forward(self, x):
            h = self.t(self.e(x), src_mask=self.mask, is_causal=True)
            return self.o(h).reshape(-1, 256)
    return Decoder()


def make_step(lib, kind, compiled):
    lib.manual_seed(0)
    nn = lib.nn
    if kind == "mlp":
        model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(),
                              nn.Linear(128, 128), nn.ReLU(),
                              nn.Linear(128, 10))
        x, y = lib.randn(32, 64), lib.randint(0, 10, (32,))
    elif kind == "decoder":
        model = Decoder(lib)
        x, y = lib.randint(0, 256, (8, 32)), lib.randint(0, 256, (8 * 32,))
    else:
        model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1),
                              nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                              nn.Flatten(), nn.Linear(8 * 8 * 8, 10))
        x, y = lib.randn(8, 3, 16, 16), lib.randint(0, 10, (8,))
    opt = (lib.optim.AdamW(model.parameters(), lr=1e-3) if kind == "decoder"
           else lib.optim.SGD(model.parameters(), lr=0.01, momentum=0.9))
    net = compiled(model) if compiled else model
    loss_fn = nn.CrossEntropyLoss()

    def call():
        opt.zero_grad()
        loss_fn(net(x), y).backward()
        opt.step()
    return call


def variants(name, inductor):
    mk = (lambda lib, c: make_chain(lib, c)) if name == "chain" else \
        (lambda lib, c: make_step(lib, name, c))
    out = {"torch": mk(torch, None), "dtorch": mk(dtorch, None),
           "dtorch.compile": mk(dtorch, dtorch.compile)}
    if inductor:
        out["torch.compile"] = mk(torch, torch.compile)
    return out


def per_call(fn, calls):
    t = time.thread_time()
    for _ in range(calls):
        fn()
    return (time.thread_time() - t) / calls


def load():
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def plot(res, json_path):
    names = list(res["workloads"])
    variants = [k for k in ("dtorch", "dtorch.compile", "torch.compile")
                if all(k in w["ms_per_call"]
                       for w in res["workloads"].values())]
    groups = {k: [res["workloads"][n]["ms_per_call"][k] /
                  res["workloads"][n]["ms_per_call"]["torch"] for n in names]
              for k in variants}
    return _plot.bars(_plot.png_path(json_path), names, groups,
                      "time / torch eager (median, 1 thread)",
                      "dtorch.compile vs eager and torch.compile", hline=1.0,
                      note=f"load average {res['load_before']} (2 cores)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--only", default="chain,mlp,cnn,decoder")
    ap.add_argument("--no-inductor", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--replot")
    a = ap.parse_args()
    if a.replot:
        with open(a.replot) as f:
            print(plot(json.load(f), a.replot))
        return None
    res = {"load_before": load(), "threads": 1, "workloads": {}}
    print(f"load average before: {res['load_before']} "
          f"({os.cpu_count()} cores); CPU time per call, 1 thread")
    for name in a.only.split(","):
        vs = variants(name, not a.no_inductor)
        warm = {}
        for k, fn in vs.items():             # warm-up: captures, compiles
            t = time.perf_counter()
            for _ in range(3):
                fn()
            warm[k] = time.perf_counter() - t
        times = {k: [] for k in vs}
        for _ in range(a.rounds):
            for k, fn in vs.items():
                times[k].append(per_call(fn, a.calls))
        med = {k: statistics.median(v) for k, v in times.items()}

        def ratio(p, q):
            r = [x / y for x, y in zip(times[p], times[q])]
            return [round(min(r), 3), round(max(r), 3)]
        w = {"ms_per_call": {k: round(v * 1e3, 4) for k, v in med.items()},
             "warmup_s": {k: round(v, 3) for k, v in warm.items()},
             "compiled/torch": ratio("dtorch.compile", "torch"),
             "compiled/dtorch_eager": ratio("dtorch.compile", "dtorch"),
             "dtorch_eager/torch": ratio("dtorch", "torch")}
        if "torch.compile" in vs:
            w["compiled/torch.compile"] = ratio("dtorch.compile",
                                                "torch.compile")
        res["workloads"][name] = w
        print(f"\n{name}: ms per call " + ", ".join(
            f"{k} {v:.3f}" for k, v in w["ms_per_call"].items()))
        print("  first 3 calls (s): " + ", ".join(
            f"{k} {v:.2f}" for k, v in w["warmup_s"].items()))
        for k in ("compiled/torch", "compiled/dtorch_eager",
                  "dtorch_eager/torch", "compiled/torch.compile"):
            if k in w:
                print(f"  {k}: {w[k][0]:.2f}-{w[k][1]:.2f}x")
    res["load_after"] = load()
    print(f"\nload average after: {res['load_after']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
        plot(res, a.json)
    return res


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
