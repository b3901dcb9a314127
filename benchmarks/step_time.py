"""Training-step time and peak memory, side by side with PyTorch CPU.

(a) MLP 784-1024-1024-10, batch 256, SGD(momentum=0.9), cross-entropy;
(b) CNN Conv2d(1,32,3,p=1)-ReLU-MaxPool2d(2)-Conv2d(32,64,3,p=1)-ReLU-
    MaxPool2d(2)-Flatten-Linear(3136,128)-ReLU-Linear(128,10), batch 64 on
    1x28x28, Adam;
(c) Embedding(256,128) + LSTM(128,256,batch_first) + Linear(256,256),
    batch 32, seq 64, Adam, cross-entropy over every position.

    python benchmarks/step_time.py [--threads 1 2] [--repeats 30]
                                   [--only mlp,cnn,lstm] [--out F]

Each thread count runs in a fresh child process, which sets OMP/OPENBLAS/MKL
thread variables before NumPy loads and calls ``torch.set_num_threads``.
Time: both frameworks in one process from the same initial weights and data,
turns interleaved (dtorch, torch, torch, dtorch, ...) after a warm-up, so
that machine noise hits both alike; the median ms/step is reported, with the
interquartile range. Sharing the process does not favour either side:
importing dtorch tunes glibc's malloc process-wide, but torch's MLP step
took the same time with and without dtorch imported (30.4-31.1 ms, one
pinned core); torch alone in a process that the scheduler moves between
the two cores measured 36-45 ms, which is where higher standalone figures
for torch come from. With more than one thread each turn starts after a
short idle pause and one untimed step: worker threads of OpenBLAS and of
torch's OpenMP spin-wait for a while after their last job, and on a 2-core
machine the other library's spinning threads would otherwise steal a core
from the step being timed (measured: both frameworks 2-7x slower). With one
thread there are no worker threads, and turns follow each other directly.
Memory: each framework runs the same steps alone in its own child; the child reports ``ru_maxrss`` (peak RSS), and the RSS right
after imports and model set-up, so the step's own peak is visible apart
from the size of the libraries (torch's import alone is a few hundred MB).

BLAS: the kernel NumPy's OpenBLAS picked is reported (threadpoolctl). If
OPENBLAS_CORETYPE is set in the environment it is reported too; it is left
as it is (unset it in the benchmark's own command line to compare).
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
ap.add_argument("--repeats", type=int, default=30)
ap.add_argument("--warmup", type=int, default=3)
ap.add_argument("--block", type=int, default=2,
                help="timed steps per turn of one framework")
ap.add_argument("--pause", type=float, default=None,
                help="seconds idle before each turn with more than one "
                     "thread (default 0.25; see the docstring)")
ap.add_argument("--only", default="mlp,cnn,lstm")
ap.add_argument("--out", default="benchmarks/results/step_time.json")
ap.add_argument("--child", choices=["time", "rss"], help=argparse.SUPPRESS)
ap.add_argument("--framework", choices=["dtorch", "torch"],
                help=argparse.SUPPRESS)
args = ap.parse_args()

if args.child:
    # before NumPy / torch load: their thread pools read these once
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                "MKL_NUM_THREADS"):
        os.environ[var] = str(args.threads[0])

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")

CASES = {
    "mlp": "(a) MLP 784-1024-1024-10 b256 SGD-momentum",
    "cnn": "(b) CNN 2xconv3x3+pool, b64 1x28x28 Adam",
    "lstm": "(c) Emb+LSTM(128,256)+Linear b32 T64 Adam",
}


# ---------------------------------------------------------------- models --

def build(lib, case, seed=0):
    """(model, optimizer, inputs, targets, loss_fn) for one framework; both
    frameworks get the same data, and torch gets dtorch's initial weights."""
    import numpy as np
    nn = lib.nn
    lib.manual_seed(seed)
    rng = np.random.default_rng(seed)
    if case == "mlp":
        model = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(),
                              nn.Linear(1024, 1024), nn.ReLU(),
                              nn.Linear(1024, 10))
        x = rng.standard_normal((256, 784)).astype(np.float32)
        y = rng.integers(0, 10, 256)
    elif case == "cnn":
        model = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(),
            nn.Linear(128, 10))
        x = rng.standard_normal((64, 1, 28, 28)).astype(np.float32)
        y = rng.integers(0, 10, 64)
    else:
        class TextModel(nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = nn.Embedding(256, 128)
                self.lstm = nn.LSTM(128, 256, batch_first=True)
                self.head = nn.Linear(256, 256)

            def forward(self, idx):
                h, _ = self.lstm(self.emb(idx))
                return self.head(h).reshape(-1, 256)
        model = TextModel()
        x = rng.integers(0, 256, (32, 64))
        y = rng.integers(0, 256, 32 * 64)
    # identical initial weights in both frameworks
    init = np.random.default_rng(seed + 1)
    with lib.no_grad():
        for _, p in sorted(model.named_parameters()):
            a = (init.standard_normal(tuple(p.shape)) * 0.05)
            p.copy_(lib.tensor(a.astype(np.float32)))
    if case == "mlp":
        opt = lib.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    else:
        opt = lib.optim.Adam(model.parameters(), lr=1e-3)
    xt = lib.tensor(x)
    yt = lib.tensor(y.astype(np.int64))
    loss_fn = nn.CrossEntropyLoss()
    return model, opt, xt, yt, loss_fn


def stepper(lib, case):
    model, opt, x, y, loss_fn = build(lib, case)

    def step():
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss
    return step


# ---------------------------------------------------------------- children --

def child_time():
    import numpy as np
    sys.path.insert(0, ROOT)
    import dtorch
    try:
        import torch
        torch.set_num_threads(args.threads[0])
    except ImportError:
        torch = None
    pause = args.pause
    if pause is None:
        pause = 0.25 if args.threads[0] > 1 else 0.0
    res = {"threads": args.threads[0], "blas": blas_info(),
           "pause_s": pause,
           "torch": torch.__version__ if torch else None,
           "numpy": np.__version__, "cases": {}}
    for case in args.only.split(","):
        runs = {"dtorch": stepper(dtorch, case)}
        if torch is not None:
            runs["torch"] = stepper(torch, case)
        for _ in range(args.warmup):
            for fn in runs.values():
                fn()
        ts = {k: [] for k in runs}
        order = list(runs)
        for r in range(args.repeats):
            # alternate who goes first, so neither always follows the other
            for k in (order if r % 2 == 0 else order[::-1]):
                if pause:
                    time.sleep(pause)
                    runs[k]()             # untimed: wakes its thread pool
                for _ in range(args.block):
                    t0 = time.perf_counter()
                    runs[k]()
                    ts[k].append(time.perf_counter() - t0)
        res["cases"][case] = {k: summary(v) for k, v in ts.items()}
    print(json.dumps(res))


def child_rss():
    import numpy as np  # noqa: F401  (both frameworks load it anyway)
    if args.framework == "dtorch":
        sys.path.insert(0, ROOT)
        import dtorch as lib
    else:
        import torch as lib
        lib.set_num_threads(args.threads[0])
    case = args.only
    step = stepper(lib, case)
    base = rss_now()
    for _ in range(args.warmup + 3):
        step()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"peak_mb": peak, "setup_mb": base}))


def rss_now():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def blas_info():
    try:
        from threadpoolctl import threadpool_info
        info = [{k: d.get(k) for k in ("internal_api", "version",
                                         "architecture", "num_threads",
                                         "filepath")}
                for d in threadpool_info()]
    except ImportError:
        info = "threadpoolctl not installed"
    return {"pools": info,
            "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE")}


def summary(ts):
    ts = sorted(t * 1e3 for t in ts)
    q = statistics.quantiles(ts, n=4)
    return {"median_ms": statistics.median(ts), "q1_ms": q[0],
            "q3_ms": q[2], "min_ms": ts[0], "max_ms": ts[-1]}


# ------------------------------------------------------------------ parent --

def run_child(*extra, threads):
    cmd = [sys.executable, os.path.abspath(__file__), "--threads",
           str(threads), "--repeats", str(args.repeats), "--warmup",
           str(args.warmup), "--block", str(args.block), *extra]
    if args.pause is not None:
        cmd += ["--pause", str(args.pause)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def have_torch():
    try:
        import importlib.util
        return importlib.util.find_spec("torch") is not None
    except Exception:
        return False


def main():
    cases = args.only.split(",")
    fws = ["dtorch"] + (["torch"] if have_torch() else [])
    results = {"runs": []}
    for th in args.threads:
        tr = run_child("--child", "time", "--only", args.only, threads=th)
        for case in cases:
            c = tr["cases"][case]
            for fw in fws:
                c[fw].update(run_child("--child", "rss", "--framework", fw,
                                       "--only", case, threads=th))
            if "torch" in c:
                c["ratio"] = c["dtorch"]["median_ms"] / c["torch"]["median_ms"]
                c["rss_ratio"] = c["dtorch"]["peak_mb"] / c["torch"]["peak_mb"]
                c["step_rss_ratio"] = (
                    (c["dtorch"]["peak_mb"] - c["dtorch"]["setup_mb"])
                    / max(c["torch"]["peak_mb"] - c["torch"]["setup_mb"], 1))
        results["runs"].append(tr)
        report(tr, cases)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
    print(f"wrote {args.out}")
    # a PNG next to the JSON when matplotlib is installed
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import _plot
    _plot.plot_step_time(args.out)


def report(tr, cases):
    pools = tr["blas"]["pools"]
    kern = ", ".join(f"{p['internal_api']} {p['version']} "
                     f"{p['architecture']}" for p in pools) \
        if isinstance(pools, list) else pools
    print(f"\nthreads={tr['threads']}  numpy {tr['numpy']} [{kern}; "
          f"OPENBLAS_CORETYPE={tr['blas']['OPENBLAS_CORETYPE']}]  "
          f"torch {tr['torch']}")
    print(f"{'case':<44}{'dtorch ms':>16}{'torch ms':>16}{'ratio':>7}"
          f"{'peak RSS MB d/t':>18}{'ratio':>7}{'step-only':>10}")
    for case in cases:
        c = tr["cases"][case]
        d = c["dtorch"]

        def fmt(s):
            return (f"{s['median_ms']:7.1f} [{s['q1_ms']:.0f}-"
                    f"{s['q3_ms']:.0f}]")
        t = c.get("torch")
        print(f"{CASES[case]:<44}{fmt(d):>16}"
              f"{fmt(t) if t else 'n/a':>16}"
              f"{c['ratio'] if t else float('nan'):7.2f}"
              f"{d['peak_mb']:9.0f}/{t['peak_mb'] if t else 0:<8.0f}"
              f"{c['rss_ratio'] if t else float('nan'):7.2f}"
              f"{c['step_rss_ratio'] if t else float('nan'):10.2f}")


if __name__ == "__main__":
    if args.child == "time":
        child_time()
    elif args.child == "rss":
        child_rss()
    else:
        main()
