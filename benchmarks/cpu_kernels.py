"""Per-op time of the compiled CPU kernels (dtorch._kernels, numba) against
the NumPy path they replace, forward + backward through dtorch's autograd.

    python benchmarks/cpu_kernels.py [--threads 1 2] [--turns 7]
                                     [--only adam,softmax] [--out F]
    python benchmarks/cpu_kernels.py --steps mlp,cnn,lstm,decoder,gpt

``--steps``: whole training steps (forward, backward, optimizer) of
benchmarks/step_time.py's workloads instead of single ops, both paths
interleaved the same way (the model keeps training across turns).

``--conv``: per convolution layer, against PyTorch in the same process
(the layers of step_time.py's ResNet, CNN and ViT and a grid of others,
``--conv-shapes`` to choose): the calling thread's CPU time
(time.thread_time, so other load on the machine enters only through the
caches) of forward, forward + input gradient and forward + weight
gradient, for dtorch as it runs, dtorch with its column-matrix path only
(Winograd off) and torch, interleaved per round; medians and min-max over
``--turns`` rounds. One thread unless ``--threads`` says otherwise.

``--torch``: the non-GEMM ops (norms, softmax family, pooling,
activations, a Winograd and a strided conv layer), dtorch as it runs
against torch on the same arrays, forward + backward (``_fwd``: forward
only, no graph), per ``--threads`` count: time per call (median over
``--turns`` interleaved rounds, torch imported first as in step_time.py;
the calling thread's CPU time at one thread, wall time at more) and the
cores each kept busy (process CPU / wall; torch's OpenMP workers spin
after each op, which counts as busy).

Each thread count runs in a fresh child (OMP/OPENBLAS/MKL thread variables
set before NumPy loads, then ``dtorch.set_num_threads``). In the child both
paths run in one process (``dtorch._kernels.forced``), turns interleaved
(numpy, kernel, kernel, numpy, ...) after a warm-up that also compiles (or
loads from the cache) every kernel, so that load from other processes hits
both alike. A turn times ``reps`` calls; the figure is the median over
turns of the per-call time, with min-max of the turns. Also reported: the
time of numba's import and of each kernel's first call in a fresh process
(compile on a cold cache, load on a warm one: run the script twice).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
ap.add_argument("--turns", type=int, default=7)
ap.add_argument("--only", default="")
ap.add_argument("--out", default="benchmarks/results/cpu_kernels.json")
ap.add_argument("--steps", default="",
                help="instead of ops: whole training steps of these "
                     "benchmarks/step_time.py workloads (e.g. mlp,cnn,gpt)")
ap.add_argument("--block", type=int, default=2,
                help="steps per turn with --steps")
ap.add_argument("--parallel-min", type=int, default=None,
                help="override dtorch._kernels.PARALLEL_MIN (elements from "
                     "which a kernel uses more than one thread)")
ap.add_argument("--conv", action="store_true",
                help="convolution layers against PyTorch (see above)")
ap.add_argument("--conv-shapes", default="",
                help="';'-separated n,c,h,o,k,stride,pad tuples for --conv")
ap.add_argument("--torch", action="store_true",
                help="non-GEMM ops against PyTorch (see above)")
ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
args = ap.parse_args()

if args.child:
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(args.threads[0])


def cases():
    """name -> (setup() -> step callable): shapes of a GPT block (B 8, T 128,
    d 256, 4 heads, vocab 1024) and a few smaller ones for the crossover."""
    import numpy as np
    import dtorch
    import dtorch.nn.functional as F
    rng = np.random.default_rng(0)

    def fb(shape, f, *extra):
        def setup():
            x = dtorch.tensor(rng.standard_normal(shape).astype(np.float32),
                              requires_grad=True)
            gs = {}

            def step():
                y = f(x, *extra)
                if y.ndim and "g" not in gs:    # the output's shape
                    gs["g"] = dtorch.tensor(rng.standard_normal(
                        tuple(y.shape)).astype(np.float32))
                y.backward(gs["g"] if y.ndim else None)
                x.grad = None
            return step
        return setup

    def ce(n, c):
        def setup():
            x = dtorch.tensor(rng.standard_normal((n, c)).astype(np.float32),
                              requires_grad=True)
            t = dtorch.tensor(rng.integers(0, c, n))

            def step():
                F.cross_entropy(x, t).backward()
                x.grad = None
            return step
        return setup

    def ln(n, d):
        w = dtorch.ones(d, requires_grad=True)
        b = dtorch.zeros(d, requires_grad=True)

        def f(x):
            return F.layer_norm(x, (d,), w, b)
        return fb((n, d), f)

    def opt(kind, shapes):
        def setup():
            ps = [dtorch.nn.Parameter(dtorch.tensor(
                rng.standard_normal(s).astype(np.float32))) for s in shapes]
            for p in ps:
                p.grad = dtorch.tensor(rng.standard_normal(
                    p.shape).astype(np.float32))
            o = (dtorch.optim.AdamW(ps, lr=1e-3) if kind == "adamw" else
                 dtorch.optim.Adam(ps, lr=1e-3) if kind == "adam" else
                 dtorch.optim.SGD(ps, lr=1e-2, momentum=0.9))
            o.step()
            return o.step
        return setup

    def conv(shape, o, k, stride=1, pad=1):
        w = dtorch.tensor(rng.standard_normal(
            (o, shape[1], k, k)).astype(np.float32) * 0.1,
            requires_grad=True)

        def f(x):
            return F.conv2d(x, w, None, stride, pad)
        return fb(shape, f)

    def bn(shape, training=True):
        c = shape[1]
        w = dtorch.ones(c, requires_grad=True)
        b = dtorch.zeros(c, requires_grad=True)
        rm, rv = dtorch.zeros(c), dtorch.ones(c)

        def f(x):
            return F.batch_norm(x, rm, rv, w, b, training=training)
        return fb(shape, f)

    # a GPT block's parameters (d 256) x 2 blocks + embeddings and head
    gpt = ([(768, 256), (768,), (256, 256), (256,), (1024, 256), (1024,),
            (256, 1024), (256,), (256,), (256,), (256,), (256,)] * 2
           + [(1024, 256), (128, 256), (256,), (256,)])
    mlp = [(1024, 784), (1024,), (1024, 1024), (1024,), (10, 1024), (10,)]
    return {
        "adamw_gpt": opt("adamw", gpt),
        "adam_mlp": opt("adam", mlp),
        "sgd_mlp": opt("sgd", mlp),
        "adam_small": opt("adam", [(64, 64), (64,)] * 4),
        "softmax_attn": fb((8, 4, 128, 128), F.softmax, -1),
        "softmax_small": fb((32, 64), F.softmax, -1),
        "log_softmax": fb((2048, 1024), F.log_softmax, -1),
        "cross_entropy": ce(1024, 1024),
        "cross_entropy_small": ce(64, 10),
        "gelu": fb((1024, 1024), F.gelu),
        "gelu_small": fb((64, 64), F.gelu),
        "gelu_mid": fb((256, 256), F.gelu),
        "silu": fb((1024, 1024), F.silu),
        # ResNet-18-style (b16, 3x32x32) and the CNN's shapes
        "conv3x3_cnn": conv((64, 32, 14, 14), 64, 3),
        "conv3x3_res16": conv((16, 16, 32, 32), 16, 3),
        "conv3x3_s2_res": conv((16, 32, 16, 16), 64, 3, 2),
        "conv1x1_s2_res": conv((16, 32, 16, 16), 64, 1, 2, 0),
        "conv3x3_small": conv((2, 16, 8, 8), 16, 3),
        "maxpool_cnn": fb((64, 32, 28, 28), F.max_pool2d, 2),
        "avgpool_res": fb((16, 128, 4, 4), F.adaptive_avg_pool2d, 1),
        "batch_norm_res": bn((16, 32, 16, 16)),
        "batch_norm_eval": bn((16, 32, 16, 16), False),
        "batch_norm_small": bn((4, 8, 4, 4)),
        "relu_cnn": fb((64, 32, 28, 28), F.relu),
        "relu_small": fb((64, 64), F.relu),
        "dropout": fb((1024, 1024), F.dropout, 0.1),
        "dropout_small": fb((64, 64), F.dropout, 0.1),
        "layer_norm": ln(1024, 256),
        "layer_norm_small": ln(64, 64),
    }


def step_cases():
    """name -> step() of benchmarks/step_time.py's workloads (its build and
    stepper, loaded as a module; not run)."""
    import runpy
    argv = sys.argv
    sys.argv = [os.path.join(os.path.dirname(__file__), "step_time.py")]
    try:
        mod = runpy.run_path(sys.argv[0], run_name="step_time_module")
    finally:
        sys.argv = argv
    import dtorch
    return {c: (lambda c=c: mod["stepper"](dtorch, c))
            for c in args.steps.split(",")}


def child():
    t0 = time.perf_counter()
    import numpy as np  # noqa: F401
    import dtorch
    from dtorch import _kernels
    dtorch.set_num_threads(args.threads[0])
    if args.parallel_min is not None:
        _kernels.PARALLEL_MIN = args.parallel_min
    t_import = time.perf_counter()
    _kernels.enabled()
    t_numba = time.perf_counter() - t_import
    all_cases = step_cases() if args.steps else cases()
    names = [n for n in all_cases if not args.only or any(
        o in n for o in args.only.split(","))]
    out = {"threads": args.threads[0], "numba_import_s": t_numba,
           "kernel_threads": _kernels.num_threads(),
           "import_dtorch_s": t_import - t0, "first_call_s": {}, "ops": {}}
    for name in names:
        numpy_step = all_cases[name]()
        with _kernels.forced(True):
            kernel_step = all_cases[name]()
            t = time.perf_counter()
            kernel_step()           # compiles, or loads from the cache
            out["first_call_s"][name] = time.perf_counter() - t
        # reps so that one turn lasts about 50 ms (--steps: --block steps)
        t = time.perf_counter()
        numpy_step()
        one = max(time.perf_counter() - t, 1e-6)
        reps = args.block if args.steps else max(1, int(0.05 / one))
        times = {"numpy": [], "kernel": []}
        order = ["numpy", "kernel", "kernel", "numpy"]
        for turn in range(args.turns * 2):
            which = order[turn % 4]
            with _kernels.forced(which == "kernel"):
                f = kernel_step if which == "kernel" else numpy_step
                f()
                t = time.perf_counter()
                for _ in range(reps):
                    f()
                times[which].append((time.perf_counter() - t) / reps * 1e6)
        med = {k: statistics.median(v) for k, v in times.items()}
        out["ops"][name] = {
            "numpy_us": med["numpy"], "kernel_us": med["kernel"],
            "numpy_range": [min(times["numpy"]), max(times["numpy"])],
            "kernel_range": [min(times["kernel"]), max(times["kernel"])],
            "speedup": med["numpy"] / med["kernel"]}
    print(json.dumps(out))


# (n, c, h, o, k, stride, pad): step_time.py's ResNet-18-style layers
# (batch 16, 3x32x32), its CNN (batch 64, 1x28x28) and ViT patch embedding,
# then a grid of channel counts, image sizes, kernels and batches
CONV_SHAPES = [
    (16, 3, 32, 16, 3, 1, 1), (16, 16, 32, 16, 3, 1, 1),
    (16, 16, 32, 32, 3, 2, 1), (16, 16, 32, 32, 1, 2, 0),
    (16, 32, 16, 32, 3, 1, 1), (16, 32, 16, 64, 3, 2, 1),
    (16, 32, 16, 64, 1, 2, 0), (16, 64, 8, 64, 3, 1, 1),
    (16, 64, 8, 128, 3, 2, 1), (16, 64, 8, 128, 1, 2, 0),
    (16, 128, 4, 128, 3, 1, 1),
    (64, 1, 28, 32, 3, 1, 1), (64, 32, 14, 64, 3, 1, 1),
    (32, 3, 32, 128, 4, 4, 0),
    (1, 16, 8, 16, 3, 1, 1), (8, 16, 7, 32, 3, 1, 1),
    (2, 128, 2, 128, 3, 1, 1), (4, 256, 7, 256, 3, 1, 1),
    (1, 64, 64, 64, 3, 1, 1), (16, 64, 16, 64, 1, 1, 0),
    (8, 32, 16, 32, 5, 1, 2), (4, 3, 64, 64, 7, 2, 3),
]


def conv_child():
    """--conv in the child: dtorch (as it runs / column path only) against
    torch, per layer; prints one JSON line."""
    import numpy as np
    import torch
    import dtorch
    from dtorch.ops import conv as C
    torch.set_num_threads(args.threads[0])
    dtorch.set_num_threads(args.threads[0])
    rng = np.random.default_rng(0)
    shapes = [tuple(int(v) for v in t.split(","))
              for t in args.conv_shapes.split(";") if t] or CONV_SHAPES

    def runner(lib, x, w, s, p, part):
        fn = lib.nn.functional.conv2d
        X = lib.tensor(x, requires_grad=part == "gx")
        W = lib.tensor(w, requires_grad=part == "gw")
        y0 = fn(X, W, None, s, p)
        G = lib.tensor(rng.standard_normal(tuple(y0.shape)).astype(x.dtype))
        if part == "fwd":
            return lambda: fn(X, W, None, s, p)

        def f():
            fn(X, W, None, s, p).backward(G)
            X.grad = W.grad = None
        return f

    def timed(f, reps):
        t = time.thread_time()
        for _ in range(reps):
            f()
        return (time.thread_time() - t) / reps * 1e3

    wino = C._WINO_MIN_C
    out = {"threads": args.threads[0], "layers": []}
    for n, c, h, o, k, s, p in shapes:
        x = rng.standard_normal((n, c, h, h)).astype(np.float32)
        w = (rng.standard_normal((o, c, k, k)) * 0.1).astype(np.float32)
        row = {"shape": [n, c, h, o, k, s, p]}
        for part in ("fwd", "gx", "gw"):
            fd = runner(dtorch, x, w, s, p, part)
            ft = runner(torch, x, w, s, p, part)
            for f in (fd, ft, fd, ft):      # warm-up (oneDNN's JIT)
                f()
            t = time.thread_time()
            fd()
            reps = max(1, int(0.02 / max(time.thread_time() - t, 1e-5)))
            ts = {"dtorch": [], "columns": [], "torch": []}
            for _ in range(args.turns):
                ts["dtorch"].append(timed(fd, reps))
                ts["torch"].append(timed(ft, reps))
                C._WINO_MIN_C = 1 << 30
                ts["columns"].append(timed(fd, reps))
                C._WINO_MIN_C = wino
            row[part] = {k: [statistics.median(v), min(v), max(v)]
                         for k, v in ts.items()}
        out["layers"].append(row)
    print(json.dumps(out))


def torch_cases(np, rng):
    """name -> (array inputs, f(lib, tensors) -> output, forward only):
    the same computation in dtorch and torch."""
    f32 = np.float32

    def a(*shape):
        return rng.standard_normal(shape).astype(f32)

    def bn(training):
        def f(lib, x, w, b, rm, rv):
            return lib.nn.functional.batch_norm(x, rm, rv, w, b,
                                                training=training)
        return f

    def gn(lib, x, w, b):
        return lib.nn.functional.group_norm(x, 8, w, b)

    def ln(lib, x, w, b):
        return lib.nn.functional.layer_norm(x, (x.shape[-1],), w, b)

    def ce(lib, x, t):
        return lib.nn.functional.cross_entropy(x, t)

    def conv(stride):
        def f(lib, x, w):
            return lib.nn.functional.conv2d(x, w, None, stride, 1)
        return f
    c = 32
    stats = (a(c), a(c), a(c), np.abs(a(c)) + 1)
    return {
        "batch_norm_eval": ((a(16, c, 16, 16),) + stats, bn(False), False),
        "batch_norm_eval_fwd": ((a(16, c, 16, 16),) + stats, bn(False),
                                True),
        "batch_norm_train": ((a(16, c, 16, 16),) + stats, bn(True), False),
        "group_norm": ((a(16, c, 16, 16), a(c), a(c)), gn, False),
        "layer_norm": ((a(1024, 256), a(256), a(256)), ln, False),
        "softmax_attn": ((a(8, 4, 128, 128),),
                         lambda lib, x: x.softmax(-1), False),
        "log_softmax": ((a(2048, 1024),),
                        lambda lib, x: x.log_softmax(-1), False),
        "cross_entropy": ((a(1024, 1024),
                           rng.integers(0, 1024, 1024)), ce, False),
        "maxpool_cnn": ((a(64, 32, 28, 28),),
                        lambda lib, x: lib.nn.functional.max_pool2d(x, 2),
                        False),
        "avgpool": ((a(16, 64, 16, 16),),
                    lambda lib, x: lib.nn.functional.avg_pool2d(x, 2),
                    False),
        "relu_cnn": ((a(64, 32, 28, 28),),
                     lambda lib, x: lib.nn.functional.relu(x), False),
        "gelu": ((a(1024, 1024),),
                 lambda lib, x: lib.nn.functional.gelu(x), False),
        "conv3x3_res": ((a(16, c, 16, 16), a(c, c, 3, 3) * f32(0.1)),
                        conv(1), False),
        "conv3x3_s2_res": ((a(16, c, 16, 16), a(2 * c, c, 3, 3)
                            * f32(0.1)), conv(2), False),
    }


def torch_child():
    """--torch in the child: prints one JSON line."""
    import numpy as np
    import torch
    import dtorch
    torch.set_num_threads(args.threads[0])
    dtorch.set_num_threads(args.threads[0])
    rng = np.random.default_rng(0)
    # one thread: the calling thread's CPU time (all either library does;
    # load from other processes does not enter); more: wall time
    clock = time.thread_time if args.threads[0] == 1 else time.perf_counter
    out = {"threads": args.threads[0], "clock": clock.__name__, "ops": {}}
    for name, (arrays, fn, fwd) in torch_cases(np, rng).items():
        if args.only and not any(o in name for o in args.only.split(",")):
            continue
        steps = {}
        for lib in (dtorch, torch):
            ts = [lib.tensor(v, requires_grad=not fwd and v.dtype.kind == "f"
                             and i < 3) for i, v in enumerate(arrays)]
            g = lib.tensor(rng.standard_normal(
                tuple(fn(lib, *ts).shape)).astype(np.float32))

            def step(lib=lib, ts=ts, g=g):
                if fwd:
                    with lib.no_grad():
                        return fn(lib, *ts)
                fn(lib, *ts).backward(g)
                for t in ts:
                    t.grad = None
            steps[lib.__name__] = step
        for f in list(steps.values()) * 3:      # warm-up, compiles
            f()
        t = time.perf_counter()
        steps["dtorch"]()
        reps = max(1, int(0.03 / max(time.perf_counter() - t, 1e-6)))
        ts = {k: [] for k in steps}
        cpu = {k: [] for k in steps}
        order = ["dtorch", "torch", "torch", "dtorch"]
        for turn in range(args.turns * 2):
            k = order[turn % 4]
            steps[k]()
            t, c = clock(), time.process_time()
            w0 = time.perf_counter()
            for _ in range(reps):
                steps[k]()
            w = time.perf_counter() - w0
            ts[k].append((clock() - t) / reps * 1e3)
            cpu[k].append((time.process_time() - c) / w)
        out["ops"][name] = {k: [statistics.median(ts[k]), min(ts[k]),
                                max(ts[k]), statistics.median(cpu[k])]
                            for k in steps}
    print(json.dumps(out))


def torch_main():
    for n in args.threads:
        r = subprocess.run([sys.executable, __file__, "--child", "--torch",
                            "--threads", str(n), "--turns", str(args.turns),
                            "--only", args.only],
                           capture_output=True, text=True)
        if r.returncode:
            sys.exit(r.stderr)
        res = json.loads(r.stdout.strip().splitlines()[-1])
        load = os.getloadavg()
        print(f"threads {n}; {res['clock']} ms per call, median of {args.turns} "
              f"rounds (min-max), cores busy; load avg {load[0]:.1f}")
        print(f"  {'op':22s} {'dtorch ms':>22s} {'torch ms':>22s} "
              f"{'d/t':>5s} {'cores d/t':>10s}")
        for name, o in res["ops"].items():
            d, t = o["dtorch"], o["torch"]
            print(f"  {name:22s} {d[0]:8.3f} ({d[1]:.3f}-{d[2]:.3f}) "
                  f"{t[0]:8.3f} ({t[1]:.3f}-{t[2]:.3f}) {d[0] / t[0]:5.2f} "
                  f"{d[3]:4.2f}/{t[3]:4.2f}")
        path = args.out.replace(".json", f"_torch{n}.json")
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w") as fh:
            json.dump({"torch": res, "loadavg": load}, fh, indent=1)


def conv_main():
    r = subprocess.run([sys.executable, __file__, "--child", "--conv",
                        "--threads", str(args.threads[0]), "--turns",
                        str(args.turns), "--conv-shapes", args.conv_shapes],
                       capture_output=True, text=True)
    if r.returncode:
        sys.exit(r.stderr)
    res = json.loads(r.stdout.strip().splitlines()[-1])
    load = os.getloadavg()
    print(f"threads {res['threads']}; thread CPU time, ms, median of "
          f"{args.turns} rounds; load avg {load[0]:.1f}")
    print(f"  {'n,c,h,o,k,s,p':24s}" + "".join(
        f" {p + ': dtorch/cols/torch':>27s} {'d/t':>5s}"
        for p in ("fwd", "+gx", "+gw")))
    for row in res["layers"]:
        line = f"  {','.join(map(str, row['shape'])):24s}"
        for part in ("fwd", "gx", "gw"):
            d, c, t = (row[part][k][0] for k in ("dtorch", "columns",
                                                  "torch"))
            line += f" {d:9.2f}/{c:7.2f}/{t:7.2f}  {d / t:5.2f}"
        print(line)
    path = args.out.replace(".json", "_conv.json")
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as fh:
        json.dump({"conv": res, "loadavg": load}, fh, indent=1)


def main():
    if args.conv:
        return conv_main()
    if args.torch:
        return torch_main()
    res = []
    for n in args.threads:
        cmd = [sys.executable, __file__, "--child", "--threads", str(n),
               "--turns", str(args.turns), "--only", args.only,
               "--steps", args.steps, "--block", str(args.block)]
        if args.parallel_min is not None:
            cmd += ["--parallel-min", str(args.parallel_min)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode:
            sys.exit(r.stderr)
        res.append(json.loads(r.stdout.strip().splitlines()[-1]))
    load = os.getloadavg()
    for r in res:
        print(f"threads {r['threads']} (kernels {r['kernel_threads']}); "
              f"numba import {r['numba_import_s']:.2f} s; load avg "
              f"{load[0]:.1f}")
        print(f"  {'op':22s} {'numpy us':>10s} {'kernel us':>10s} "
              f"{'speedup':>8s} {'best turns':>10s}  first call s")
        for name, o in r["ops"].items():
            # best turns: the fastest turn of each path, the least touched
            # by other load on a busy machine
            best = o["numpy_range"][0] / o["kernel_range"][0]
            print(f"  {name:22s} {o['numpy_us']:10.1f} {o['kernel_us']:10.1f}"
                  f" {o['speedup']:8.2f} {best:10.2f}  "
                  f"{r['first_call_s'][name]:.2f}")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump({"runs": res, "loadavg": load}, fh, indent=1)


if __name__ == "__main__":
    if args.child:
        conv_child() if args.conv else torch_child() if args.torch \
            else child()
    else:
        main()
