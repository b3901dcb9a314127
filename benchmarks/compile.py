"""dtorch.compile against PyTorch, side by side in one process.

Workloads (each timed per call, interleaved: every round times each
variant once, and the ratios are taken per round; at 1 thread by the
calling thread's CPU time, time.thread_time, so that the other load of a
shared machine does not enter; at more threads by wall time):

- chain: 300 tiny elementwise ops (x*1.01, +0.1, tanh, 100 times) on 8
  floats, forward + backward: the per-op cost of dispatch (compiled, the
  whole chain is one fused kernel each way);
- tiny steps: mlp_s (MLP 64-128-128-10, batch 32, SGD momentum), cnn_s
  (Conv2d(3,8,3)-BN-ReLU-MaxPool-Linear, batch 8 on 3x16x16), decoder_s
  (Embedding + pre-LN TransformerEncoderLayer(64, 4 heads) + Linear, batch
  8, seq 32, AdamW);
- the held-out-style steps of benchmarks/step_time.py (imported, the same
  models, data and optimizers): mlp, cnn, lstm, decoder (pre-LN block),
  gpt (nanoGPT with SDPA and dropout), resnet (BatchNorm), vit; plus
  bigru (Embedding(1000,64) + bidirectional 1-layer GRU(64,128) + Linear
  on the last step, batch 32, seq 48, Adam), defined here.

Variants: torch eager, torch.compile (inductor; --no-inductor skips it),
dtorch eager, dtorch.compile. Prints per workload the median per-call time
of each, the ratios dtorch.compile/torch eager, /dtorch eager and
/torch.compile as min-max over rounds, the first three calls' time (what
capture or compilation costs), the fused groups, and the load average
(``uptime``) before and after. ``--threads 1,2`` runs each thread count in
a child process (OMP/OpenBLAS thread variables set before NumPy loads).

Kernel launches per step on the CuPy stand-in (tests/fakecupy, NumPy
underneath: the count a GPU would pay, not GPU time), eager against
compiled, for each workload (``--launches``, a child with
DTORCH_FAKE_CUDA=1).

    python benchmarks/compile.py [--rounds 7] [--calls 30] [--threads 1,2]
        [--only chain,mlp_s,...] [--no-inductor] [--no-launches]
        [--json F] [--replot F]

With --json F a PNG of each variant's time over torch eager's (medians)
is written next to it (when matplotlib is installed); --replot F redraws
it from F. benchmarks/plots/compile.json is a run of this script.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def _threads_arg():
    # the thread count of this process, before NumPy and torch load: their
    # pools read the variables once
    for i, a in enumerate(sys.argv):
        if a == "--child-threads":
            return sys.argv[i + 1]
    return "1"


_N = _threads_arg()
os.environ.setdefault("OMP_NUM_THREADS", _N)
# GNU OpenMP (loaded by torch) spins its waiting threads by default, and
# once numba's pool is up that spin lands in the calling thread: torch's MLP
# step measured 8-12 ms of thread CPU instead of 0.3-0.5 ms without this
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("OPENBLAS_NUM_THREADS", _N)
_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
sys.path[:0] = [_ROOT, _HERE]

import numpy as np  # noqa: E402

if "--launches-child" not in sys.argv:
    import torch  # noqa: E402
else:
    torch = None

import dtorch  # noqa: E402
import _plot  # noqa: E402

if torch is not None:
    torch.set_num_threads(int(_N))
dtorch.set_num_threads(int(_N))

SMALL = ("chain", "mlp_s", "cnn_s", "decoder_s")
HELD_OUT = ("mlp", "cnn", "lstm", "decoder", "gpt", "resnet", "vit", "bigru")


def _step_time():
    """benchmarks/step_time.py's workloads (it parses its arguments when
    imported: it gets an empty command line)."""
    mod = sys.modules.get("step_time")
    if mod is None:
        argv, sys.argv = sys.argv, [os.path.join(_HERE, "step_time.py")]
        try:
            import step_time as mod
        finally:
            sys.argv = argv
    return mod


def chain(x):
    for _ in range(100):
        x = x * 1.01
        x = x + 0.1
        x = x.tanh()
    return x.sum()


def make_chain(lib, compiled, device="cpu"):
    x = lib.randn(8, requires_grad=True, device=device)
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
            self.register_buffer(     # a buffer: .to(device) moves it
                "mask", nn.Transformer.generate_square_subsequent_mask(32))

        def forward(self, x):
            h = self.t(self.e(x), src_mask=self.mask, is_causal=True)
            return self.o(h).reshape(-1, 256)
    return Decoder()


def BiGRU(lib):
    nn = lib.nn

    class BiGRU(nn.Module):
        """A bidirectional GRU classifier over token sequences."""

        def __init__(self):
            super().__init__()
            self.e = nn.Embedding(1000, 64)
            self.rnn = nn.GRU(64, 128, batch_first=True, bidirectional=True)
            self.o = nn.Linear(256, 10)

        def forward(self, x):
            h, _ = self.rnn(self.e(x))
            return self.o(h[:, -1])
    return BiGRU()


def build(lib, kind):
    """(model, optimizer, x, y, loss) for one framework, the same initial
    weights and data in both."""
    lib.manual_seed(0)
    nn = lib.nn
    if kind in HELD_OUT and kind != "bigru":
        return _step_time().build(lib, kind)
    rng = np.random.default_rng(0)
    if kind == "mlp_s":
        model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(),
                              nn.Linear(128, 128), nn.ReLU(),
                              nn.Linear(128, 10))
        x, y = rng.standard_normal((32, 64)), rng.integers(0, 10, 32)
    elif kind == "decoder_s":
        model = Decoder(lib)
        x, y = rng.integers(0, 256, (8, 32)), rng.integers(0, 256, 8 * 32)
    elif kind == "bigru":
        model = BiGRU(lib)
        x, y = rng.integers(0, 1000, (32, 48)), rng.integers(0, 10, 32)
    else:
        model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1),
                              nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                              nn.Flatten(), nn.Linear(8 * 8 * 8, 10))
        x, y = rng.standard_normal((8, 3, 16, 16)), rng.integers(0, 10, 8)
    init = np.random.default_rng(1)
    with lib.no_grad():
        for _, p in sorted(model.named_parameters()):
            p.copy_(lib.tensor((init.standard_normal(tuple(p.shape)) * 0.05)
                               .astype(np.float32)))
    opt = (lib.optim.AdamW(model.parameters(), lr=1e-3)
           if kind in ("decoder_s", "bigru")
           else lib.optim.SGD(model.parameters(), lr=0.01, momentum=0.9))
    x = lib.tensor(x.astype(np.float32) if x.dtype.kind == "f" else x)
    return model, opt, x, lib.tensor(y.astype(np.int64)), \
        nn.CrossEntropyLoss()


def make_step(lib, kind, compiled, device="cpu"):
    model, opt, x, y, loss_fn = build(lib, kind)
    if device != "cpu":
        model.to(device)
        x, y = x.to(device), y.to(device)
    net = compiled(model) if compiled else model

    def call():
        opt.zero_grad()
        loss_fn(net(x), y).backward()
        opt.step()
    return call


def make(lib, name, compiled, device="cpu"):
    if name == "chain":
        return make_chain(lib, compiled, device)
    return make_step(lib, name, compiled, device)


def variants(name, inductor):
    out = {"torch": make(torch, name, None),
           "dtorch": make(dtorch, name, None),
           "dtorch.compile": make(dtorch, name, dtorch.compile)}
    if inductor:
        out["torch.compile"] = make(torch, name, torch.compile)
    return out


def per_call(fn, calls, clock):
    t = clock()
    for _ in range(calls):
        fn()
    return (clock() - t) / calls


def load():
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def fused_groups():
    """(groups, ops in them) over every program dtorch.compile holds."""
    from dtorch._compile import _all
    n = ops = 0
    for c in list(_all):
        for e in c.cache.values():
            p = e.program
            if p is not None:
                n += len(p.groups)
                ops += sum(g.n_ops for g in p.groups)
    return n, ops


def run_workload(name, a, threads):
    clock = time.thread_time if threads == 1 else time.perf_counter
    from dtorch._compile import fuse as _fuse
    compile_s = _fuse.stats["compile_s"]
    vs = variants(name, not a.no_inductor)
    dtorch.compiler.reset()
    warm = {}
    for k, fn in vs.items():             # warm-up: captures, compiles
        t = time.perf_counter()
        for _ in range(3):
            fn()
        warm[k] = time.perf_counter() - t
    groups = fused_groups()
    calls = a.calls if name in SMALL else max(1, a.calls // 10)
    times = {k: [] for k in vs}
    for _ in range(a.rounds):
        for k, fn in vs.items():
            times[k].append(per_call(fn, calls, clock))
    med = {k: statistics.median(v) for k, v in times.items()}

    def ratio(p, q):
        r = [x / y for x, y in zip(times[p], times[q])]
        return [round(min(r), 3), round(max(r), 3)]
    w = {"ms_per_call": {k: round(v * 1e3, 4) for k, v in med.items()},
         "first3_s": {k: round(v, 3) for k, v in warm.items()},
         "numba_compile_s": round(_fuse.stats["compile_s"] - compile_s, 2),
         "fused_groups": groups[0], "fused_ops": groups[1],
         "compiled/torch": ratio("dtorch.compile", "torch"),
         "compiled/dtorch_eager": ratio("dtorch.compile", "dtorch"),
         "dtorch_eager/torch": ratio("dtorch", "torch")}
    if "torch.compile" in vs:
        w["compiled/torch.compile"] = ratio("dtorch.compile",
                                            "torch.compile")
    print(f"\n{name} ({threads} thread{'s' if threads > 1 else ''}): ms "
          f"per call " + ", ".join(f"{k} {v:.3f}"
                                   for k, v in w["ms_per_call"].items()))
    print("  first 3 calls (s): " + ", ".join(
        f"{k} {v:.2f}" for k, v in w["first3_s"].items()) +
        f"; numba compiles {w['numba_compile_s']} s; fused: "
        f"{groups[0]} groups of {groups[1]} ops")
    for k in ("compiled/torch", "compiled/dtorch_eager",
              "dtorch_eager/torch", "compiled/torch.compile"):
        if k in w:
            print(f"  {k}: {w[k][0]:.2f}-{w[k][1]:.2f}x")
    sys.stdout.flush()
    return w


# --------------------------------------------------- launches (stand-in) --

def launches_child(names):
    """Kernel launches per call on the CuPy stand-in, eager and compiled
    (this process runs with DTORCH_FAKE_CUDA=1)."""
    import cupy
    assert getattr(cupy, "_FAKE", False)
    out = {}
    for name in names:
        res = {}
        for compiled in (False, True):
            fn = make(dtorch, name, dtorch.compile if compiled else None,
                      "cuda")
            for _ in range(3):
                fn()
            cupy._launches.clear()
            fn()
            res["compiled" if compiled else "eager"] = sum(
                cupy._launches.values())
            if compiled:
                res["fused_launches"] = cupy._launches["fuse:dtorch_fused"]
        out[name] = res
    print(json.dumps(out))


def launches(names):
    env = dict(os.environ, DTORCH_FAKE_CUDA="1",
               PYTHONPATH=os.pathsep.join([os.path.join(
                   _ROOT, "tests", "fakecupy"), _ROOT]))
    r = subprocess.run([sys.executable, os.path.abspath(__file__),
                        "--launches-child", "--only", ",".join(names)],
                       env=env, capture_output=True, text=True)
    if r.returncode:
        print(f"launch count child failed: {r.stderr[-2000:]}")
        return None
    return json.loads(r.stdout.strip().splitlines()[-1])


def plot(res, json_path):
    rows = [(n, t) for t, r in sorted(res["threads"].items())
            for n in r["workloads"]]
    names = [f"{n} t{t}" for n, t in rows]
    ws = [res["threads"][t]["workloads"][n] for n, t in rows]
    variants = [k for k in ("dtorch", "dtorch.compile", "torch.compile")
                if all(k in w["ms_per_call"] for w in ws)]
    groups = {k: [w["ms_per_call"][k] / w["ms_per_call"]["torch"]
                  for w in ws] for k in variants}
    return _plot.bars(_plot.png_path(json_path), names, groups,
                      "time / torch eager (median)",
                      "dtorch.compile vs eager and torch.compile", hline=1.0,
                      note=f"load average {res['load_before']} "
                           f"({os.cpu_count()} cores)")


def child(a, threads):
    res = {"workloads": {}, "load_before": load()}
    for name in a.only.split(","):
        res["workloads"][name] = run_workload(name, a, threads)
    res["load_after"] = load()
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=30,
                    help="calls per round (the held-out steps: a tenth)")
    ap.add_argument("--threads", default="1")
    ap.add_argument("--only", default=",".join(SMALL + HELD_OUT))
    ap.add_argument("--no-inductor", action="store_true")
    ap.add_argument("--no-launches", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--replot")
    ap.add_argument("--child-threads", help=argparse.SUPPRESS)
    ap.add_argument("--launches-child", action="store_true",
                    help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.replot:
        with open(a.replot) as f:
            print(plot(json.load(f), a.replot))
        return None
    names = a.only.split(",")
    if a.launches_child:
        return launches_child(names)
    if a.child_threads:
        print(json.dumps(child(a, int(a.child_threads))))
        return None
    res = {"load_before": load(), "threads": {}}
    print(f"load average before: {res['load_before']} ({os.cpu_count()} "
          f"cores)")
    for t in a.threads.split(","):
        if t == "1" and a.threads == "1":
            res["threads"][t] = child(a, 1)
            continue
        cmd = [sys.executable, os.path.abspath(__file__), "--child-threads",
               t, "--rounds", str(a.rounds), "--calls", str(a.calls),
               "--only", a.only] + (["--no-inductor"] if a.no_inductor
                                    else [])
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        last = None
        for line in p.stdout:
            if line.startswith("{"):
                last = line
            else:
                print(line, end="")
        p.wait()
        if last is not None:
            res["threads"][t] = json.loads(last)
    if not a.no_launches:
        res["launches"] = launches(names)
        print("\nkernel launches per call on the CuPy stand-in "
              "(eager -> compiled; fused kernels among them):")
        for n, r in (res["launches"] or {}).items():
            print(f"  {n}: {r['eager']} -> {r['compiled']} "
                  f"({r['fused_launches']} fused)")
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
