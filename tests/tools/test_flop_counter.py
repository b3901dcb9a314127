"""dtorch.utils.flop_counter.FlopCounterMode against torch's: the same
models built in both libraries from the same code give the same counts,
per module and per op key, forward and backward."""
import threading

import numpy as np
import pytest

import dtorch
from dtorch.utils.flop_counter import FlopCounterMode, register_flop_formula

torch = pytest.importorskip("torch")
from torch.utils.flop_counter import FlopCounterMode as TorchCounter  # noqa


def counts(lib, build, x, x_grad=False, depth=9):
    Counter = FlopCounterMode if lib is dtorch else TorchCounter
    lib.manual_seed(0)
    model = build(lib)
    inp = lib.tensor(x, requires_grad=x_grad)
    with Counter(display=False, depth=depth) as fc:
        out = model(inp)
        out = out[0] if isinstance(out, tuple) else out
        out.float().sum().backward()
    return {mod: {str(k): v for k, v in ops.items()}
            for mod, ops in fc.get_flop_counts().items()}


def same_as_torch(build, x, x_grad=False):
    ours, theirs = counts(dtorch, build, x, x_grad), \
        counts(torch, build, x, x_grad)
    assert ours == theirs
    return ours


def mlp(lib):
    nn = lib.nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(8, 16)
            self.act = nn.ReLU()
            self.head = nn.Sequential(nn.Linear(16, 16, bias=False),
                                      nn.Linear(16, 4))

        def forward(self, x):
            return self.head(self.act(self.fc1(x)))
    return Net()


def cnn(lib):
    nn = lib.nn
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 8, 3, stride=2, groups=2), nn.Flatten(),
        nn.Linear(8, 4))


def gpt(lib, vocab=16, d=16, heads=2, layers=2, T=8):
    """examples/gpt.py's architecture from plain layers (the example's
    tensor-parallel ones are dtorch's own)."""
    nn, F = lib.nn, lib.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.q, self.k, self.v = (nn.Linear(d, d) for _ in range(3))
            self.proj = nn.Linear(d, d)
            self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x):
            b, t, _ = x.shape
            h = self.ln1(x)

            def split(y):
                return y.view(b, t, heads, d // heads).transpose(1, 2)
            y = F.scaled_dot_product_attention(
                split(self.q(h)), split(self.k(h)), split(self.v(h)),
                is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
            return x + self.out(F.gelu(self.fc(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(T, d)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln_f = nn.LayerNorm(d)
            self.head = nn.Linear(d, vocab, bias=False)
            self.head.weight = self.tok.weight

        def forward(self, idx):
            x = self.tok(idx) + self.pos(lib.arange(idx.shape[1]))
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.ln_f(x))
    return GPT()


def test_mlp_per_module_forward_and_backward():
    x = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    got = same_as_torch(mlp, x)
    # x needs no gradient: fc1's backward is its weight gradient only
    assert got["Net.fc1"] == {"aten.addmm": 2 * 3 * 8 * 16,
                              "aten.mm": 2 * 3 * 8 * 16}
    x3 = np.random.default_rng(1).standard_normal((2, 5, 8)).astype(
        np.float32)
    same_as_torch(mlp, x3, x_grad=True)        # 3-D input, folded rows


def test_cnn_counts_convolutions_as_torch():
    x = np.random.default_rng(0).standard_normal((2, 3, 6, 6)).astype(
        np.float32)
    got = same_as_torch(cnn, x)
    assert got["Global"]["aten.convolution"] > 0
    # the input gradient of the first convolution adds to its backward
    with_input = same_as_torch(cnn, x, x_grad=True)
    assert with_input["Sequential.0"]["aten.convolution_backward"] == \
        2 * got["Sequential.0"]["aten.convolution_backward"]


@pytest.mark.parametrize("build,shape", [
    (lambda lib: lib.nn.ConvTranspose2d(3, 4, 3, stride=2, padding=1,
                                        output_padding=1), (2, 3, 5, 5)),
    (lambda lib: lib.nn.Conv1d(3, 4, 3, stride=2, padding=2, dilation=2),
     (2, 3, 11)),
    (lambda lib: lib.nn.Conv2d(4, 6, (3, 2), stride=(2, 1), groups=2,
                               bias=False), (1, 4, 7, 5)),
])
def test_convolution_variants(build, shape):
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    same_as_torch(build, x, x_grad=True)


def test_gpt_equals_torch_math_attention():
    from torch.nn.attention import SDPBackend, sdpa_kernel
    idx = np.random.default_rng(0).integers(0, 16, (2, 8))
    ours = counts(dtorch, gpt, idx)
    with sdpa_kernel(SDPBackend.MATH):     # torch's CPU kernel counts 0
        theirs = counts(torch, gpt, idx)
    for mod in ("Global", "GPT"):
        assert sum(ours[mod].values()) == sum(theirs[mod].values()), mod
    # per module only where torch's tracker is exact: it adds a sibling's
    # backward to each of q, k, v (they share their input), dtorch counts
    # each node for the modules its forward ran in
    assert ours["GPT.blocks.0.k"] == {"aten.addmm": 2 * 16 * 16 * 16,
                                      "aten.mm": 2 * 2 * 16 * 16 * 16}
    for mod in ("GPT.head", "GPT.blocks.1.fc", "GPT.blocks.0.out"):
        assert ours[mod] == theirs[mod], mod
    # attention under its own key, the rest as torch's
    assert ours["Global"]["aten._scaled_dot_product_flash_attention"] == \
        2 * (2 * 2) * 2 * (2 * 8 * 8 * 8)      # layers x b*h x 2 bmm
    for key in ("aten.addmm", "aten.mm"):
        assert ours["Global"][key] == theirs["Global"][key]


def test_example_gpt_counts_as_its_plain_twin():
    import importlib.util
    import os
    path = os.path.join(os.path.dirname(__file__), "..", "..", "examples",
                        "gpt.py")
    spec = importlib.util.spec_from_file_location("gpt_example", path)
    ex = importlib.util.module_from_spec(spec)
    import sys
    sys.path.insert(0, os.path.dirname(path))
    try:
        spec.loader.exec_module(ex)
    finally:
        sys.path.remove(os.path.dirname(path))
    dtorch.manual_seed(0)
    model = ex.GPT(16, n_layer=2, n_head=2, d_model=16, block_size=8)
    idx = dtorch.tensor(np.random.default_rng(0).integers(0, 16, (2, 8)))
    with FlopCounterMode(display=False) as fc:
        model(idx).sum().backward()
    plain = counts(dtorch, gpt, idx.numpy())
    assert fc.get_total_flops() == sum(plain["Global"].values())


def test_matmul_forms_and_einsum():
    def chain(lib):
        class M(lib.nn.Module):
            def forward(self, x):
                y = (x @ x.transpose(-1, -2)) @ x            # bmm
                z = x[0, 0] @ x[0, 0].T                      # mm
                v = x[0, 0, 0] @ x[0, 0].T                   # 1-D @ 2-D: mm
                w = x[0, 0] @ x[0, 0, 0]                     # mv: 0
                e = lib.einsum("bhij,bhkj->bhik", x, x)      # bmm
                return y.sum() + z.sum() + v.sum() + w.sum() + e.sum()
        return M()
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 5)).astype(
        np.float32)
    same_as_torch(chain, x, x_grad=True)


def test_lstm_and_gru_count_their_products():
    T, n, I, H = 5, 3, 4, 6
    lstm = dtorch.nn.LSTM(I, H)
    x = dtorch.randn(T, n, I, requires_grad=True)
    with FlopCounterMode(display=False) as fc:
        lstm(x)[0].sum().backward()
    proj = 2 * T * n * I * 4 * H            # the input projection
    rec = 2 * T * n * H * 4 * H             # h @ W_hh^T, every step
    # backward: dx and dW_ih of the projection; dh and dW_hh of the steps
    assert fc.get_total_flops() == proj + rec + 2 * proj + 2 * rec
    gru = dtorch.nn.GRU(I, H, bias=False)
    with FlopCounterMode(display=False) as fc:
        gru(x.detach())[0].sum()
    assert fc.get_flop_counts()["Global"] == {
        "aten.mm": 2 * T * n * I * 3 * H + 2 * T * n * H * 3 * H}


def test_counts_per_thread_and_nothing_outside():
    lin = dtorch.nn.Linear(4, 4)
    x = dtorch.randn(2, 4)
    other = []

    def work():
        for _ in range(20):
            lin(x)
        other.append(True)

    with FlopCounterMode(display=False) as fc:
        t = threading.Thread(target=work)
        t.start()
        lin(x)
        t.join()
    assert other and fc.get_total_flops() == 2 * 2 * 4 * 4
    assert "Linear" in fc.get_flop_counts()
    lin(x)                                   # closed: nothing counted
    assert fc.get_total_flops() == 2 * 2 * 4 * 4
    from dtorch.autograd import function as F
    assert F._profile is None and F._hook is None


def test_create_graph_counts_backward_ops_once():
    w = dtorch.randn(4, 4, requires_grad=True)
    x = dtorch.randn(3, 4, requires_grad=True)
    with FlopCounterMode(display=False) as plain:
        (x @ w).sum().backward()
    with FlopCounterMode(display=False) as graph:
        g, = dtorch.autograd.grad((x @ w).sum(), w, create_graph=True)
    # forward mm + the gradients as ops (no analytic count on top)
    assert graph.get_total_flops() <= plain.get_total_flops()
    assert graph.get_total_flops() >= 2 * 3 * 4 * 4 * 2


def test_custom_formula_and_table():
    class Twice(dtorch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

    def formula(args, kwargs, out, need):
        return [("twice", args[0].numel())], [("twice", args[0].numel())]

    x = dtorch.randn(5, requires_grad=True)
    with FlopCounterMode(display=False,
                         custom_mapping={Twice: formula}) as fc:
        Twice.apply(x).sum().backward()
    assert fc.get_flop_counts()["Global"] == {"twice": 10}
    with FlopCounterMode(display=False) as fc:
        Twice.apply(x)                       # the mapping is gone again
    assert fc.get_total_flops() == 0
    register_flop_formula(Twice, formula)
    try:
        with FlopCounterMode(display=False) as fc:
            mlp(dtorch)(dtorch.randn(3, 8))
            Twice.apply(x)
        table = fc.get_table()
    finally:
        from dtorch.utils import flop_counter
        flop_counter._FORMULAS.pop(Twice)
    lines = table.splitlines()
    assert lines[0].split() == ["Module", "FLOP", "%", "Total"]
    assert any(line.strip().startswith("- twice") for line in lines)
    assert "Net.fc1" in table and "Global" in table


def test_profiler_and_counter_together():
    from dtorch.profiler import profile
    lin = dtorch.nn.Linear(4, 4)
    with profile() as prof, FlopCounterMode(display=False) as fc:
        lin(dtorch.randn(2, 4))
    assert fc.get_total_flops() == 2 * 2 * 4 * 4
    assert any("Linear" in e.name for e in prof.events())
