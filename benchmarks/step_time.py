"""Training-step time and peak memory, side by side with PyTorch CPU.

(a) mlp: MLP 784-1024-1024-10, batch 256, SGD(momentum=0.9), cross-entropy;
(b) cnn: Conv2d(1,32,3,p=1)-ReLU-MaxPool2d(2)-Conv2d(32,64,3,p=1)-ReLU-
    MaxPool2d(2)-Flatten-Linear(3136,128)-ReLU-Linear(128,10), batch 64 on
    1x28x28, Adam;
(c) lstm: Embedding(256,128) + LSTM(128,256,batch_first) + Linear(256,256),
    batch 32, seq 64, Adam, cross-entropy over every position;
(d) lstm_word: PyTorch's word_language_model shapes on a 10k vocabulary:
    Embedding(10000,200) + 2-layer LSTM(200,200, dropout 0.2, seq-first) +
    Linear(200,10000), bptt 35, batch 20, Adam;
(e) decoder: a pre-LN causal decoder block: Embedding(1024,256) +
    nn.TransformerEncoderLayer(256, 4 heads, ff 1024, GELU, dropout 0.1,
    norm_first, causal mask) + Linear(256,1024), batch 16, seq 128, Adam;
(f) gpt: a nanoGPT-style model written on F.scaled_dot_product_attention:
    4 blocks, d 256, 4 heads, seq 128, vocab 2048, dropout 0.1, tied
    embedding, batch 8, AdamW;
(g) resnet: a ResNet-18-style network with BatchNorm: conv3x3(3,16)-BN-ReLU,
    four stages of two BasicBlocks (16, 32, 64, 128 channels, strides 1, 2,
    2, 2, 1x1 strided projection shortcuts with BN), global average pool,
    Linear(128,10), batch 16 on 3x32x32, SGD(momentum 0.9, nesterov,
    weight decay 5e-4);
(h) vit: a small ViT: 4x4 patches of 3x32x32 images by a strided
    Conv2d(3,128,4,stride 4), class token, learned positions, 3
    nn.TransformerEncoderLayer(128, 4 heads, ff 256, GELU, norm_first), a
    LayerNorm + Linear(128,10) head on the class token, batch 32, AdamW.

    python benchmarks/step_time.py [--threads 1 all] [--repeats 20] [--runs 3]
        [--only mlp,cnn,lstm,lstm_word,decoder,gpt,resnet,vit]
        [--profile-steps 3] [--no-rss] [--out F] [--cpu-profile]

``--cpu-profile`` prints, instead of step times, dtorch's CPU time per op
family over ``--profile-steps`` steps at each thread count: the calling
thread's CPU time (time.thread_time) and the whole process's
(time.process_time) inside each op's forward and backward, exclusive of
nested ops. process / thread is the number of cores the op kept busy
(1.0: it ran on one core); CPU time, not wall time, so that other load on
the machine does not enter the figures. That child sets
OPENBLAS_THREAD_TIMEOUT=4 (unless set): OpenBLAS's workers would otherwise
spin after each GEMM and be charged to the ops that follow.

``--threads`` takes numbers or ``all`` (every core this process may use).
Besides the step times, each thread count reports the per-op autograd
overhead (a chain of 1,000 ops on 4-element tensors, forward + backward,
interleaved with torch's) and a profile of where a step goes, by
dtorch.profiler and torch.profiler over ``--profile-steps`` steps: GEMM
ops (matmul/linear/conv/bmm/mm, forward and backward nodes; dtorch's conv
includes its im2col), attention (everything inside an attention op: for
dtorch the whole SDPA op and its backward, for torch its SDPA forward, whose
backward torch runs as separate bmm/softmax nodes, counted under GEMM and
the rest), RNN layers (whole), the optimizer step (whole), and the rest
(elementwise, norms, softmax, losses, and Python/framework time between
ops) = profiled step time minus those. Profiling adds per-op cost to both.

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
ap.add_argument("--threads", nargs="+", default=["1", "all"],
                help="thread counts, or 'all' for every usable core")
ap.add_argument("--repeats", type=int, default=20)
ap.add_argument("--runs", type=int, default=3,
                help="timing children per thread count; the last table "
                     "gives each workload's dtorch/torch ratio as a range "
                     "over them")
ap.add_argument("--warmup", type=int, default=3)
ap.add_argument("--block", type=int, default=2,
                help="timed steps per turn of one framework")
ap.add_argument("--pause", type=float, default=None,
                help="seconds idle before each turn with more than one "
                     "thread (default 0.25; see the docstring)")
ap.add_argument("--only",
                default="mlp,cnn,lstm,lstm_word,decoder,gpt,resnet,vit")
ap.add_argument("--clock", choices=["wall", "thread"], default="wall",
                help="thread: time each 1-thread step by the calling "
                     "thread's CPU time (time.thread_time), which load from "
                     "other processes does not enter; more threads keep "
                     "wall time")
ap.add_argument("--cpu-profile", action="store_true",
                help="dtorch's CPU time per op family (see the docstring)")
ap.add_argument("--profile-steps", type=int, default=3,
                help="steps profiled per case and framework (0: no profile)")
ap.add_argument("--chain-repeats", type=int, default=20,
                help="runs of the 1,000-op chain (0: no per-op line)")
ap.add_argument("--no-rss", action="store_true",
                help="skip the peak-memory children")
ap.add_argument("--out", default="benchmarks/results/step_time.json")
ap.add_argument("--child", choices=["time", "rss", "cpu"], help=argparse.SUPPRESS)
ap.add_argument("--framework", choices=["dtorch", "torch"],
                help=argparse.SUPPRESS)
args = ap.parse_args()


def _threads(v):
    if v == "all":
        try:
            return len(os.sched_getaffinity(0))
        except AttributeError:
            return os.cpu_count() or 1
    return int(v)


args.threads = [_threads(v) for v in args.threads]

if args.child:
    # before NumPy / torch load: their thread pools read these once
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                "MKL_NUM_THREADS"):
        os.environ[var] = str(args.threads[0])
    if args.child == "cpu":
        # OpenBLAS's workers spin ~0.1 s after each GEMM by default, which
        # process time would charge to the next op: 2^4 cycles instead
        os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")

CASES = {
    "mlp": "(a) MLP 784-1024-1024-10 b256 SGD-momentum",
    "cnn": "(b) CNN 2xconv3x3+pool, b64 1x28x28 Adam",
    "lstm": "(c) Emb+LSTM(128,256)+Linear b32 T64 Adam",
    "lstm_word": "(d) word LM 10k, 2xLSTM(200) b20 T35 Adam",
    "decoder": "(e) pre-LN causal decoder d256 b16 T128 Adam",
    "gpt": "(f) GPT 4 blocks d256 b8 T128 AdamW",
    "resnet": "(g) ResNet-18-style BN, b16 3x32x32 SGD-nesterov",
    "vit": "(h) ViT 3 layers d128 p4, b32 3x32x32 AdamW",
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
    elif case == "lstm_word":
        model = _word_lm(lib)
        x = rng.integers(0, 10000, (35, 20))
        y = rng.integers(0, 10000, 35 * 20)
    elif case == "decoder":
        model = _decoder(lib)
        x = rng.integers(0, 1024, (16, 128))
        y = rng.integers(0, 1024, 16 * 128)
    elif case == "gpt":
        model = _gpt(lib)
        x = rng.integers(0, 2048, (8, 128))
        y = rng.integers(0, 2048, 8 * 128)
    elif case in ("resnet", "vit"):
        model = _resnet(lib) if case == "resnet" else _vit(lib)
        b = 16 if case == "resnet" else 32
        x = rng.standard_normal((b, 3, 32, 32)).astype(np.float32)
        y = rng.integers(0, 10, b)
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
    elif case in ("gpt", "vit"):
        opt = lib.optim.AdamW(model.parameters(), lr=3e-4,
                              weight_decay=0.1)
    elif case == "resnet":
        opt = lib.optim.SGD(model.parameters(), lr=0.05, momentum=0.9,
                            nesterov=True, weight_decay=5e-4)
    else:
        opt = lib.optim.Adam(model.parameters(), lr=1e-3)
    xt = lib.tensor(x)
    yt = lib.tensor(y.astype(np.int64))
    loss_fn = nn.CrossEntropyLoss()
    return model, opt, xt, yt, loss_fn


def _word_lm(lib):
    nn = lib.nn

    class WordLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.drop = nn.Dropout(0.2)
            self.encoder = nn.Embedding(10000, 200)
            self.rnn = nn.LSTM(200, 200, 2, dropout=0.2)
            self.decoder = nn.Linear(200, 10000)

        def forward(self, idx):
            h, _ = self.rnn(self.drop(self.encoder(idx)))
            return self.decoder(self.drop(h)).reshape(-1, 10000)
    return WordLM()


def _decoder(lib):
    nn = lib.nn

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(1024, 256)
            self.block = nn.TransformerEncoderLayer(
                256, 4, 1024, dropout=0.1, activation="gelu",
                batch_first=True, norm_first=True)
            self.head = nn.Linear(256, 1024)
            self.register_buffer(
                "mask", nn.Transformer.generate_square_subsequent_mask(128))

        def forward(self, idx):
            h = self.block(self.emb(idx), src_mask=self.mask, is_causal=True)
            return self.head(h).reshape(-1, 1024)
    return Decoder()


def _gpt(lib, n_layer=4, d=256, heads=4, T=128, vocab=2048, p=0.1):
    """nanoGPT's model, written once for either framework."""
    nn, F = lib.nn, lib.nn.functional

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = nn.Linear(d, 3 * d)
            self.c_proj = nn.Linear(d, d)
            self.resid = nn.Dropout(p)

        def forward(self, x):
            B, T_, C = x.shape
            q, k, v = self.c_attn(x).split(d, dim=2)
            q, k, v = (t.reshape(B, T_, heads, C // heads).transpose(1, 2)
                       for t in (q, k, v))
            y = F.scaled_dot_product_attention(
                q, k, v, dropout_p=p if self.training else 0.0,
                is_causal=True)
            y = y.transpose(1, 2).reshape(B, T_, C)
            return self.resid(self.c_proj(y))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(d)
            self.attn = Attention()
            self.ln_2 = nn.LayerNorm(d)
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(),
                                     nn.Linear(4 * d, d), nn.Dropout(p))

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(vocab, d)
            self.wpe = nn.Embedding(T, d)
            self.drop = nn.Dropout(p)
            self.h = nn.ModuleList([Block() for _ in range(n_layer)])
            self.ln_f = nn.LayerNorm(d)
            self.lm_head = nn.Linear(d, vocab, bias=False)
            self.lm_head.weight = self.wte.weight      # tied
            self.register_buffer("pos", lib.arange(T))

        def forward(self, idx):
            x = self.drop(self.wte(idx) + self.wpe(self.pos))
            for blk in self.h:
                x = blk(x)
            return self.lm_head(self.ln_f(x)).reshape(-1, vocab)
    return GPT()


def _resnet(lib, widths=(16, 32, 64, 128), classes=10):
    nn = lib.nn

    class BasicBlock(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.short = nn.Sequential()
            if stride != 1 or cin != cout:
                self.short = nn.Sequential(
                    nn.Conv2d(cin, cout, 1, stride, bias=False),
                    nn.BatchNorm2d(cout))

        def forward(self, x):
            h = self.bn1(self.conv1(x)).relu()
            return (self.bn2(self.conv2(h)) + self.short(x)).relu()

    layers = [nn.Conv2d(3, widths[0], 3, 1, 1, bias=False),
              nn.BatchNorm2d(widths[0]), nn.ReLU()]
    cin = widths[0]
    for i, c in enumerate(widths):
        layers += [BasicBlock(cin, c, 1 if i == 0 else 2),
                   BasicBlock(c, c, 1)]
        cin = c
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(),
               nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


def _vit(lib, d=128, depth=3, heads=4, ff=256, patch=4, img=32, classes=10):
    nn = lib.nn
    n = (img // patch) ** 2

    class ViT(nn.Module):
        def __init__(self):
            super().__init__()
            self.patch = nn.Conv2d(3, d, patch, stride=patch)
            self.cls = nn.Parameter(lib.zeros(1, 1, d))
            self.pos = nn.Parameter(lib.zeros(1, n + 1, d))
            self.enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(
                d, heads, ff, dropout=0.1, activation="gelu",
                batch_first=True, norm_first=True), depth,
                enable_nested_tensor=False)
            self.norm = nn.LayerNorm(d)
            self.head = nn.Linear(d, classes)

        def forward(self, x):
            h = self.patch(x).flatten(2).transpose(1, 2)
            h = lib.cat([self.cls.expand(x.shape[0], -1, -1), h], 1)
            h = self.enc(h + self.pos)
            return self.head(self.norm(h[:, 0]))
    return ViT()


def stepper(lib, case):
    model, opt, x, y, loss_fn = build(lib, case)

    def step(scope=None):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        if scope is None:
            opt.step()
        else:                       # profiled: the optimizer as one range
            with scope(_OPT):
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
    # one thread does all of either framework's work: its CPU time is the
    # step's, without the time other processes took the core
    clock = time.thread_time if args.clock == "thread" \
        and args.threads[0] == 1 else time.perf_counter
    res = {"threads": args.threads[0], "blas": blas_info(),
           "pause_s": pause, "clock": clock.__name__,
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
                if k == "torch":
                    _torch_threads(torch, res)
                if pause:
                    time.sleep(pause)
                    runs[k]()             # untimed: wakes its thread pool
                for _ in range(args.block):
                    t0 = clock()
                    runs[k]()
                    ts[k].append(clock() - t0)
        res["cases"][case] = {k: summary(v) for k, v in ts.items()}
        if args.profile_steps > 0:
            if torch is not None:
                _torch_threads(torch, res)
            res["cases"][case]["profile"] = {
                "dtorch": profile_dtorch(runs["dtorch"], dtorch)}
            if torch is not None:
                res["cases"][case]["profile"]["torch"] = profile_torch(
                    runs["torch"], torch)
    if args.chain_repeats > 0:
        res["chain"] = chain_overhead(dtorch, torch, pause)
    print(json.dumps(res))


def _torch_threads(torch, res):
    """Put torch's intra-op thread count back to --threads. Starting numba's
    OpenMP thread pool (dtorch's compiled kernels, at their first call) set
    it to every core in this process: measured torch's 1-thread MLP step
    3-4x slower on a loaded 2-core machine, two OpenMP threads spinning
    against dtorch's turns."""
    n = args.threads[0]
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
        res["torch_threads_reset"] = res.get("torch_threads_reset", 0) + 1


# ---------------------------------------------------- per-op overhead --

def chain(lib, n=1000):
    """n ops on 4-element tensors (alternating * and +), then backward."""
    x = lib.ones(4, requires_grad=True)

    def run():
        y = x
        for _ in range(n // 2):
            y = y * 1.0001
            y = y + 0.5
        y.sum().backward()
        x.grad = None
    return run


def chain_overhead(dtorch, torch, pause):
    runs = {"dtorch": chain(dtorch)}
    if torch is not None:
        runs["torch"] = chain(torch)
    for fn in runs.values():
        fn()
    ts = {k: [] for k in runs}
    order = list(runs)
    for r in range(args.chain_repeats):
        for k in (order if r % 2 == 0 else order[::-1]):
            if k == "torch":
                _torch_threads(torch, {})
            if pause:
                time.sleep(pause)
                runs[k]()
            t0 = time.perf_counter()
            runs[k]()
            ts[k].append(time.perf_counter() - t0)
    # 1,000 ops: ms per chain = us per op
    out = {k: summary(v) for k, v in ts.items()}
    if "torch" in out:
        out["ratio"] = out["dtorch"]["median_ms"] / out["torch"]["median_ms"]
    return out


# ------------------------------------------------------------- profiles --

_GEMM = ("::mm", " mmbackward", "addmm", "bmm", "matmul", "linear", "conv",
         "einsum")
_ATTN = ("scaled_dot_product", "attention")
_RNN = ("lstm", "rnn", "gru")
_OPT = "optimizer.step"


def _category(ev):
    """The first of optimizer/attention/rnn found on ev or an ancestor
    (the whole op goes there), else gemm or rest by ev's own name."""
    node = ev
    while node is not None:
        n = node.name.lower()
        if n == _OPT:
            return "optimizer"
        if any(a in n for a in _ATTN):
            return "attention"
        if any(a in n for a in _RNN):
            return "rnn"
        node = node.cpu_parent
    n = ev.name.lower()
    return "gemm" if any(g in n for g in _GEMM) else "rest"


def _breakdown(events, wall_ms, steps):
    cats = {"gemm": 0.0, "attention": 0.0, "rnn": 0.0, "optimizer": 0.0}
    for ev in events:
        c = _category(ev)
        if c in cats:
            cats[c] += ev.self_cpu_time_total / 1e3 / steps
    res = {"step_ms": wall_ms / steps}
    res.update({k + "_ms": v for k, v in cats.items()})
    res["rest_ms"] = res["step_ms"] - sum(cats.values())
    return res


def _profiled_steps(step, lib):
    def run():
        t0 = time.perf_counter()
        for _ in range(args.profile_steps):
            step(scope=lib.profiler.record_function)
        return (time.perf_counter() - t0) * 1e3
    return run


def profile_dtorch(step, dtorch):
    import dtorch.profiler  # noqa: F401
    with dtorch.profiler.profile() as prof:
        wall = _profiled_steps(step, dtorch)()
    return _breakdown(prof.events(), wall, args.profile_steps)


def profile_torch(step, torch):
    from torch.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        wall = _profiled_steps(step, torch)()
    return _breakdown(prof.events(), wall, args.profile_steps)


def child_cpu():
    """dtorch's CPU time per op class over --profile-steps steps (see the
    docstring): every Function subclass's forward and backward timed by
    thread and process CPU time, nested calls subtracted from their
    caller."""
    sys.path.insert(0, ROOT)
    import dtorch
    from dtorch.autograd.function import Function
    acc, stack = {}, []

    def wrap(cls, kind):
        fn = cls.__dict__[kind]
        if not isinstance(fn, staticmethod):
            return
        f = fn.__func__

        def timed(*a, **k):
            t0, p0 = time.thread_time(), time.process_time()
            stack.append([0.0, 0.0])
            try:
                return f(*a, **k)
            finally:
                dt, dp = time.thread_time() - t0, time.process_time() - p0
                inner = stack.pop()
                if stack:
                    stack[-1][0] += dt
                    stack[-1][1] += dp
                a_ = acc.setdefault(f"{cls.__name__}.{kind[:3]}", [0.0, 0.0])
                a_[0] += dt - inner[0]
                a_[1] += dp - inner[1]
        setattr(cls, kind, staticmethod(timed))

    todo, seen = [Function], set()
    while todo:
        c = todo.pop()
        for sub in c.__subclasses__():
            if sub not in seen:
                seen.add(sub)
                todo.append(sub)
                for kind in ("forward", "backward"):
                    if kind in sub.__dict__:
                        wrap(sub, kind)
    out = {"threads": args.threads[0], "cases": {}}
    for case in args.only.split(","):
        step = stepper(dtorch, case)
        for _ in range(args.warmup):
            step()
        acc.clear()
        t0, p0 = time.thread_time(), time.process_time()
        for _ in range(args.profile_steps):
            step()
        tot = ((time.thread_time() - t0) / args.profile_steps,
               (time.process_time() - p0) / args.profile_steps)
        out["cases"][case] = {
            "step": tot, "ops": {k: (v[0] / args.profile_steps,
                                     v[1] / args.profile_steps)
                                 for k, v in acc.items()}}
    print(json.dumps(out))


def cpu_report(tr, top=12):
    print(f"\nthreads={tr['threads']}: dtorch CPU ms per step, calling "
          f"thread / whole process (cores busy = process / thread)")
    for case, c in tr["cases"].items():
        th, pr = c["step"]
        print(f"{CASES[case]}: step {th * 1e3:.1f} / {pr * 1e3:.1f} "
              f"(x{pr / max(th, 1e-9):.2f})")
        for k, (t, p) in sorted(c["ops"].items(),
                                key=lambda kv: -kv[1][1])[:top]:
            print(f"    {k:<32}{t * 1e3:8.2f}{p * 1e3:8.2f}"
                  f"   x{p / max(t, 1e-9):.2f}")


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
           str(args.warmup), "--block", str(args.block), "--profile-steps",
           str(args.profile_steps), "--chain-repeats",
           str(args.chain_repeats), "--clock", args.clock,
           *extra]   # a later flag in extra wins
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
    if args.cpu_profile:
        for th in args.threads:
            cpu_report(run_child("--child", "cpu", "--only", args.only,
                                 threads=th))
        return
    ratios = {}
    for th in args.threads:
        more = [run_child("--child", "time", "--only", args.only,
                          "--profile-steps", "0", "--chain-repeats", "0",
                          threads=th) for _ in range(args.runs - 1)]
        tr = run_child("--child", "time", "--only", args.only, threads=th)
        for case in cases:
            ratios.setdefault(case, {})[th] = [
                r["cases"][case]["dtorch"]["median_ms"]
                / r["cases"][case]["torch"]["median_ms"]
                for r in more + [tr] if "torch" in r["cases"][case]]
            c = tr["cases"][case]
            if not args.no_rss:
                for fw in fws:
                    c[fw].update(run_child("--child", "rss", "--framework",
                                           fw, "--only", case, threads=th))
            if "torch" in c:
                c["ratio"] = c["dtorch"]["median_ms"] / c["torch"]["median_ms"]
            if "torch" in c and not args.no_rss:
                c["rss_ratio"] = c["dtorch"]["peak_mb"] / c["torch"]["peak_mb"]
                c["step_rss_ratio"] = (
                    (c["dtorch"]["peak_mb"] - c["dtorch"]["setup_mb"])
                    / max(c["torch"]["peak_mb"] - c["torch"]["setup_mb"], 1))
        results["runs"].append(tr)
        report(tr, cases)
    results["ratios"] = ratios
    ratio_table(ratios, cases)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
    print(f"wrote {args.out}")
    # a PNG next to the JSON when matplotlib is installed
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import _plot
    _plot.plot_step_time(args.out)


def ratio_table(ratios, cases):
    """dtorch / torch step time per workload and thread count: the range
    (min-max) over --runs children of each child's ratio of medians."""
    ths = args.threads
    print(f"\ndtorch/torch step time, min-max over {args.runs} runs "
          f"(ratio of medians per run; load avg "
          f"{os.getloadavg()[0]:.1f} now)")
    print(f"{'case':<50}" + "".join(f"{f'{t} thread(s)':>16}" for t in ths))
    for case in cases:
        cells = []
        for t in ths:
            v = ratios[case].get(t) or []
            cells.append(f"{min(v):.2f}-{max(v):.2f}" if v else "n/a")
        print(f"{CASES[case]:<50}" + "".join(f"{c:>16}" for c in cells))


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
    nan = float("nan")
    for case in cases:
        c = tr["cases"][case]
        d = c["dtorch"]

        def fmt(s):
            return (f"{s['median_ms']:7.1f} [{s['q1_ms']:.0f}-"
                    f"{s['q3_ms']:.0f}]")
        t = c.get("torch")
        rss = (f"{d['peak_mb']:9.0f}/{t['peak_mb'] if t else 0:<8.0f}"
               f"{c.get('rss_ratio', nan):7.2f}"
               f"{c.get('step_rss_ratio', nan):10.2f}") \
            if "peak_mb" in d else ""
        print(f"{CASES[case]:<44}{fmt(d):>16}"
              f"{fmt(t) if t else 'n/a':>16}"
              f"{c['ratio'] if t else nan:7.2f}{rss}")
    ch = tr.get("chain")
    if ch:
        t = ch.get("torch")
        print(f"per-op autograd overhead (1,000-op chain fwd+bwd): dtorch "
              f"{ch['dtorch']['median_ms']:.2f} us/op, torch "
              + (f"{t['median_ms']:.2f} us/op, ratio {ch['ratio']:.2f}"
                 if t else "n/a"))
    rows = [(case, fw, c["profile"][fw]) for case in cases
            for c in [tr["cases"][case]] if "profile" in c
            for fw in ("dtorch", "torch") if fw in c["profile"]]
    if rows:
        print("where a profiled step goes, ms (share of the profiled step):")
        cols = ("gemm", "attention", "rnn", "optimizer", "rest")
        print(f"{'case':<12}{'fw':<8}{'step':>8}"
              + "".join(f"{c:>15}" for c in cols))
        for case, fw, pr in rows:
            tot = pr["step_ms"]
            print(f"{case:<12}{fw:<8}{tot:8.1f}" + "".join(
                f"{pr[c + '_ms']:8.1f} ({100 * pr[c + '_ms'] / tot:3.0f}%)"
                for c in cols))


if __name__ == "__main__":
    if args.child == "time":
        child_time()
    elif args.child == "cpu":
        child_cpu()
    elif args.child == "rss":
        child_rss()
    else:
        main()
