"""dtorch.compile: captured and replayed calls equal eager ones (values,
gradients, optimizer and BatchNorm state, bit for bit), guards recapture,
graph breaks run eagerly or raise under fullgraph, training steps with
schedulers, GradScaler, dropout and DDP on thread ranks."""
import copy
import math

import numpy as np
import pytest

import dtorch
import dtorch.distributed as dist
import dtorch.nn as nn
import dtorch.nn.functional as F
from dtorch.nn.parallel import DistributedDataParallel as DDP


@pytest.fixture(autouse=True)
def _fresh():
    dtorch.compiler.reset()
    yield
    dtorch.compiler.reset()


def mlp():
    return nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))


def cnn():
    return nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4),
                         nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(4 * 3 * 3, 3))


class Block(nn.Module):
    """A pre-LN transformer block with attention and MLP dropout."""

    def __init__(self, d=8, heads=2, p=0.2):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, dropout=p,
                                          batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(),
                                 nn.Linear(2 * d, d), nn.Dropout(p))

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


def state(model, opt=None):
    s = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    if opt is not None:
        for i, st in opt.state_dict()["state"].items():
            for k, v in st.items():
                s[f"opt.{i}.{k}"] = np.asarray(
                    v.numpy() if hasattr(v, "numpy") else v).copy()
    return s


def assert_bitwise(a, b):
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def stats(c):
    return dtorch.compiler.explain(c)


# ----------------------------------------------------------- forward --

def test_module_forward_backward_bitwise_and_replayed():
    m = mlp()
    mc = copy.deepcopy(m)
    c = dtorch.compile(mc)
    x = dtorch.randn(4, 5, requires_grad=True)
    for _ in range(4):
        ye, yc = m(x), c(x)
        np.testing.assert_array_equal(ye.numpy(force=True),
                                      yc.numpy(force=True))
        ge = dtorch.autograd.grad(ye.square().sum(), [x] + list(
            m.parameters()))
        gc = dtorch.autograd.grad(yc.square().sum(), [x] + list(
            c.parameters()))
        for a, b in zip(ge, gc):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
    e = stats(c)
    assert (e.captures, e.replays, e.graph_count) == (2, 2, 1)
    assert e.op_count == 3 and e.graph_break_count == 0
    assert yc.grad_fn.name() == "CompiledFunctionBackward"
    # torch's OptimizedModule: prefixed state_dict, attributes delegated
    assert list(c.state_dict())[0] == "_orig_mod.0.weight"
    assert c._orig_mod is mc and "forward" not in mc.__dict__


def test_gradients_match_torch_and_finite_differences():
    torch = pytest.importorskip("torch")
    f = dtorch.compile(lambda x, w: (x @ w).tanh().mul(x.sum()).exp().sum())
    rng = np.random.default_rng(0)
    xa, wa = rng.standard_normal((3, 4)), rng.standard_normal((4, 2)) * .3
    x = dtorch.tensor(xa, requires_grad=True)
    w = dtorch.tensor(wa, requires_grad=True)
    for _ in range(3):                   # capture, capture, replay
        gx, gw = dtorch.autograd.grad(f(x, w), [x, w])
    assert stats(f).replays == 1
    tx = torch.tensor(xa, requires_grad=True)
    tw = torch.tensor(wa, requires_grad=True)
    (tx @ tw).tanh().mul(tx.sum()).exp().sum().backward()
    np.testing.assert_allclose(gx.numpy(), tx.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(gw.numpy(), tw.grad.numpy(), rtol=1e-12)
    assert dtorch.autograd.gradcheck(f, (x, w))      # every call replayed


def test_chain_table_bitwise():
    chains = [
        lambda x: (x * 1.5 + 0.25).relu().sum(),
        lambda x: x.softmax(-1).log().mean(),
        lambda x: (x.exp() / (1 + x.exp())).pow(2).sum(1).max(),
        lambda x: x.reshape(2, -1).t().matmul(x.reshape(2, -1)).trace(),
        lambda x: (x.clamp(-0.5, 0.5) - x.abs().sqrt()).cumsum(0).sum(),
        lambda x: F.layer_norm(x, (6,)).sigmoid().sum(),
        lambda x: dtorch.where(x > 0, x, x * 0.1).sum(),
        lambda x: x[:, 1:4].sum() + x[0].sum(),
    ]
    for fn in chains:
        c = dtorch.compile(fn)
        for i in range(3):
            x = dtorch.randn(4, 6, requires_grad=True)
            ye, = dtorch.autograd.grad(fn(x), [x])
            yc, = dtorch.autograd.grad(c(x), [x])
            np.testing.assert_array_equal(ye.numpy(), yc.numpy())
        assert stats(c).replays == 1


def test_retain_graph_and_double_backward():
    c = dtorch.compile(lambda x: (x * x).sum())
    x = dtorch.randn(3, requires_grad=True)
    c(x), c(x)
    y = c(x)
    y.backward(retain_graph=True)
    y.backward()
    np.testing.assert_array_equal(x.grad.numpy(), 4 * x.detach().numpy())
    g, = dtorch.autograd.grad(c(x), [x], create_graph=True)
    with pytest.raises(RuntimeError, match="CompiledFunction"):
        g.sum().backward()


def test_inplace_change_before_backward_is_an_error():
    m = nn.Linear(3, 2)
    c = dtorch.compile(m)
    x = dtorch.randn(2, 3)
    c(x), c(x)
    y = c(x)
    with dtorch.no_grad():
        m.weight.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace"):
        y.sum().backward()


# ------------------------------------------------------------ guards --

def test_guards_recapture_and_cache_limit():
    m = mlp()
    c = dtorch.compile(m)
    x = dtorch.randn(2, 5)
    for _ in range(3):
        c(x)
    assert stats(c).recaptures == 0
    c(dtorch.randn(3, 5))                       # shape
    c(x.double().float().requires_grad_())      # requires_grad
    with dtorch.no_grad():                      # grad mode
        c(x)
    m.eval()                                    # training
    c(x)
    m.train()
    e = stats(c)
    assert e.recaptures == 4 and e.fallbacks == 0
    # a replaced parameter: captured again, and used
    m[0].weight = nn.Parameter(m[0].weight.detach() * 0)
    for _ in range(3):
        y = c(x)
    np.testing.assert_array_equal(y.detach().numpy(), m(x).detach().numpy())
    assert stats(c).recaptures == 5
    dtorch.compiler.config.cache_size_limit, old = 5, \
        dtorch.compiler.config.cache_size_limit
    try:
        c(dtorch.randn(7, 5))
        e = stats(c)
        assert e.fallbacks == 1
        assert "cache_size_limit (5)" in e.fallback_reasons[-1]
    finally:
        dtorch.compiler.config.cache_size_limit = old
    dtorch.compiler.reset()
    c(x)
    assert stats(c).captures == 1


def test_python_argument_is_guarded():
    f = dtorch.compile(lambda x, k: x * k)
    x = dtorch.ones(2)
    assert [f(x, k).sum().item() for k in (2, 2, 2, 3, 3, 3)] == \
        [4, 4, 4, 6, 6, 6]
    assert stats(f).replays == 2 and stats(f).recaptures == 1


# ------------------------------------------------------ graph breaks --

class ItemNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        y = self.fc(x)
        if y.sum() > 0:          # bool(tensor): data-dependent control flow
            return y * 2
        return y


@pytest.mark.parametrize("how", ["bool", "item", "tolist"])
def test_graph_break_runs_eagerly_or_raises(how):
    def f(x):
        y = x * 2
        if how == "bool":
            return y + 1 if y.sum() > 0 else y - 1
        if how == "item":
            return y * y.max().item()
        return y + len(y.tolist())
    c = dtorch.compile(f)
    x = dtorch.randn(3)
    for _ in range(3):
        np.testing.assert_array_equal(c(x).numpy(), f(x).numpy())
        np.testing.assert_array_equal(c(-x).numpy(), f(-x).numpy())
    e = stats(c)
    name = {"bool": "bool(Tensor)", "item": "Tensor.item()",
            "tolist": "Tensor.tolist()"}[how]
    assert e.graph_break_count == 1 and name in e.break_reasons[0]
    assert "test_compile.py" in e.break_reasons[0]
    with pytest.raises(dtorch.compiler.Unsupported, match=name.replace(
            "(", r"\(").replace(")", r"\)")):
        dtorch.compile(f, fullgraph=True)(x)


def test_module_with_break_falls_back_with_reason():
    m = ItemNet()
    c = dtorch.compile(m)
    x = dtorch.randn(2, 3)
    for _ in range(3):
        np.testing.assert_array_equal(c(x).detach().numpy(),
                                      m(x).detach().numpy())
    e = stats(c)
    assert e.fallbacks == 1 and "bool(Tensor)" in e.fallback_reasons[0]
    assert e.replays == 0
    with pytest.raises(dtorch.compiler.Unsupported, match="ItemNet"):
        dtorch.compile(m, fullgraph=True)(x)


def test_varying_tensor_from_python_data_falls_back():
    n = [0]

    def f(x):
        n[0] += 1
        return x + dtorch.tensor([float(n[0])])
    c = dtorch.compile(f)
    outs = [c(dtorch.zeros(1)).item() for _ in range(4)]
    assert outs == [1.0, 2.0, 3.0, 4.0]
    e = stats(c)
    assert e.graph_count == 0 and "differs between two calls" in \
        e.fallback_reasons[0]


def test_random_draws_are_fresh_each_replay():
    f = dtorch.compile(lambda x: x + dtorch.rand(3) + F.dropout(x, 0.5))
    x = dtorch.ones(3)
    outs = []
    for i in range(5):
        dtorch.manual_seed(i)
        outs.append(f(x).numpy().copy())
        dtorch.manual_seed(i)
        ref = (x + dtorch.rand(3) + F.dropout(x, 0.5)).numpy()
        np.testing.assert_array_equal(outs[-1], ref)
    assert stats(f).replays == 3
    assert len({o.tobytes() for o in outs}) == 5


def test_compiler_disable_is_a_break():
    @dtorch.compiler.disable
    def eager_part(y):
        return y * 3

    f = dtorch.compile(lambda x: eager_part(x + 1))
    x = dtorch.ones(2)
    assert [f(x).sum().item() for _ in range(3)] == [12.0] * 3
    assert "disable(eager_part)" in stats(f).break_reasons[0]


def test_entry_points():
    m = mlp()
    assert dtorch.compile(m, disable=True) is m
    with pytest.raises(RuntimeError, match="backend 'tvm'"):
        dtorch.compile(m, backend="tvm")
    with pytest.raises(RuntimeError, match="Unrecognized mode"):
        dtorch.compile(m, mode="fast")
    with pytest.raises(RuntimeError, match="options"):
        dtorch.compile(m, options={"triton.cudagraphs": True})

    @dtorch.compile(fullgraph=True)
    def g(x):
        return x.sin()
    x = dtorch.randn(3)
    for _ in range(3):
        np.testing.assert_array_equal(g(x).numpy(), x.sin().numpy())
    # Module.compile: in place
    x = dtorch.randn(2, 5)
    ref = m(x).detach().numpy()
    assert m.compile() is None
    for _ in range(3):
        np.testing.assert_array_equal(m(x).detach().numpy(), ref)
    assert stats(m).replays == 1
    eg = dtorch.compile(mlp(), backend="eager")
    for _ in range(3):
        eg(x)
    assert stats(eg).captures == 0


# ---------------------------------------------------- training steps --

def _train(make, shape, compiled, steps=5, opt_cls=None, sched=True,
           loss_fn=None, seed=3):
    dtorch.manual_seed(seed)
    model = make()
    opt = (opt_cls or (lambda p: dtorch.optim.SGD(p, lr=0.1, momentum=0.9)))(
        model.parameters())
    sch = dtorch.optim.lr_scheduler.StepLR(opt, 2, 0.5) if sched else None
    net = dtorch.compile(model) if compiled else model
    loss_fn = loss_fn or (lambda out: out.square().mean())
    rng = np.random.default_rng(0)
    xs = [dtorch.tensor(rng.standard_normal(shape).astype(np.float32))
          for _ in range(steps)]

    def step(x):
        opt.zero_grad()
        loss = loss_fn(net(x))
        loss.backward()
        dtorch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if sch is not None:
            sch.step()
        return loss
    if compiled:
        step = dtorch.compile(step)
    losses = []
    for i, x in enumerate(xs):
        dtorch.manual_seed(100 + i)
        losses.append(step(x).item())
    return losses, state(model, opt), step, net


@pytest.mark.parametrize("make,shape", [
    (mlp, (4, 5)), (cnn, (3, 2, 6, 6)), (Block, (2, 3, 8))],
    ids=["mlp", "cnn_bn", "block_dropout"])
def test_training_step_bitwise(make, shape):
    le, se, _, _ = _train(make, shape, False)
    lc, sc, step, net = _train(make, shape, True)
    assert le == lc
    assert_bitwise(se, sc)
    e = stats(step)
    # call 1: the step's capture sees backward(); 2, 3: the model's; 4, 5
    assert e.segmented and e.graph_count == 1 and e.replays == 2
    assert "loss.backward()" in e.log[0]
    if make is cnn:      # running stats were updated by every replay
        assert sc["1.num_batches_tracked"] == 5


def test_training_step_adamw_whole_function_with_module_found():
    dtorch.manual_seed(0)
    models = [Block(), None]
    models[1] = copy.deepcopy(models[0])
    res = []
    for k, model in enumerate(models):
        opt = dtorch.optim.AdamW(model.parameters(), lr=1e-2)

        def step(x):
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss
        if k:
            step = dtorch.compile(step)
        for i in range(4):
            dtorch.manual_seed(i)
            step(dtorch.ones(2, 3, 8))
        res.append(state(model, opt))
        if k:
            e = stats(step)
            assert e.graph_count == 1 and e.replays == 1
            assert "Block" in e.log[0]
            assert "forward" not in model.__dict__   # only during a call
    assert_bitwise(*res)


def test_gradscaler_skips_under_compile():
    def run(compiled):
        dtorch.manual_seed(0)
        m = mlp()
        opt = dtorch.optim.SGD(m.parameters(), lr=0.1)
        scaler = dtorch.amp.GradScaler("cpu", init_scale=2.0 ** 8,
                                       growth_interval=2)
        net = dtorch.compile(m) if compiled else m

        def step(x):
            opt.zero_grad()
            loss = net(x).sum()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            return loss
        step = dtorch.compile(step) if compiled else step
        for i in range(6):
            x = dtorch.ones(2, 5) * (i + 1)
            if i == 3:
                x = x * math.inf               # an overflow: the step skips
            step(x)
        return state(m), scaler.get_scale()
    (se, ke), (sc, kc) = run(False), run(True)
    assert ke == kc
    assert_bitwise(se, sc)


def test_autocast_bfloat16_under_compile():
    m = mlp()
    c = dtorch.compile(copy.deepcopy(m))
    x = dtorch.randn(3, 5)
    for _ in range(3):
        with dtorch.autocast("cpu", dtype=dtorch.bfloat16):
            ye, yc = m(x), c(x)
        assert yc.dtype == dtorch.bfloat16
        np.testing.assert_array_equal(ye.float().detach().numpy(),
                                      yc.float().detach().numpy())
    c(x)                              # autocast off: a recapture
    e = stats(c)
    assert e.replays == 1 and e.recaptures == 1


def _ddp_body(how):
    def body(rank, world):
        dtorch.manual_seed(0)
        m = mlp()
        model = DDP(m, bucket_cap_mb=0.0001)
        net = dtorch.compile(model) if how == "model" else model
        opt = dtorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        fired = []
        for p in m.parameters():
            p.register_post_accumulate_grad_hook(
                lambda p: fired.append(id(p)))
        rng = np.random.default_rng(rank)

        def step(x):
            opt.zero_grad()
            F.mse_loss(net(x), dtorch.zeros(3, 3)).backward()
            opt.step()
        if how == "step":
            step = dtorch.compile(step)
        for _ in range(5):
            step(dtorch.tensor(rng.standard_normal((3, 5)).astype(
                np.float32)))
        rep = {"model": lambda: stats(net).replays,
               "step": lambda: stats(step).replays}.get(how, lambda: 2)()
        return state(m), len(fired), rep
    return body


@pytest.mark.parametrize("how", ["model", "step"])
def test_ddp_thread_ranks_compiled_equals_eager(how):
    ref = dist.spawn_threads(_ddp_body(None), 2, timeout=60)
    res = dist.spawn_threads(_ddp_body(how), 2, timeout=60)
    for (se, ne, _), (sc, nc, rep) in zip(ref, res):
        assert_bitwise(se, sc)
        # DDP's hooks fired for every parameter in every step, replayed too
        assert ne == nc == 20 and rep == (3 if how == "model" else 2)
    assert_bitwise(res[0][0], res[1][0])       # ranks agree


# ----------------------------------------------------------- nanoGPT --

class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, block_size, dropout):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.attn_dropout, self.resid_dropout = nn.Dropout(dropout), \
            nn.Dropout(dropout)
        self.n_head, self.n_embd, self.dropout = n_head, n_embd, dropout

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=None,
            dropout_p=self.dropout if self.training else 0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class GPT(nn.Module):
    """nanoGPT's model, in small (tied embeddings, arange positions)."""

    def __init__(self, vocab=11, block_size=6, n_embd=8, n_head=2,
                 dropout=0.1):
        super().__init__()
        self.block_size = block_size
        self.wte = nn.Embedding(vocab, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.ln_1, self.ln_2, self.ln_f = (nn.LayerNorm(n_embd)
                                           for _ in range(3))
        self.attn = CausalSelfAttention(n_embd, n_head, block_size, dropout)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(),
                                 nn.Linear(4 * n_embd, n_embd),
                                 nn.Dropout(dropout))
        self.lm_head = nn.Linear(n_embd, vocab, bias=False)
        self.wte.weight = self.lm_head.weight

    def forward(self, idx, targets=None):
        b, t = idx.size()
        assert t <= self.block_size
        pos = dtorch.arange(0, t, dtype=dtorch.long, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        x = self.ln_f(x)
        if targets is not None:
            logits = self.lm_head(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)),
                                   targets.view(-1), ignore_index=-1)
        else:
            logits = self.lm_head(x[:, [-1], :])
            loss = None
        return logits, loss


def test_nanogpt_compile_unmodified():
    rng = np.random.default_rng(0)
    data = [(dtorch.tensor(rng.integers(0, 11, (2, 6))),
             dtorch.tensor(rng.integers(0, 11, (2, 6)))) for _ in range(5)]
    out = []
    for compiled in (False, True):
        dtorch.manual_seed(0)
        model = GPT()
        opt = dtorch.optim.AdamW(model.parameters(), lr=1e-2,
                                 betas=(0.9, 0.95), weight_decay=0.1)
        if compiled:
            model = dtorch.compile(model)
        losses = []
        for i, (X, Y) in enumerate(data):
            dtorch.manual_seed(10 + i)
            logits, loss = model(X, Y)
            loss.backward()
            dtorch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
        model.eval()
        with dtorch.no_grad():
            for _ in range(3):
                logits, _ = model(data[0][0])
        out.append((losses, logits.numpy().copy(),
                    {k.replace("_orig_mod.", ""): v for k, v in
                     state(model).items()}))
        if compiled:
            e = stats(model)
            assert e.graph_count == 2 and e.replays == 4
            assert model.block_size == 6           # delegated attribute
    (le, ge, se), (lc, gc, sc) = out
    assert le == lc
    np.testing.assert_array_equal(ge, gc)
    assert_bitwise(se, sc)


def test_compiled_step_on_device(device):
    """cpu, and cuda on the CuPy stand-in (DTORCH_FAKE_CUDA=1, marker
    gpu): the replay runs the ops' array bodies on the device's arrays."""
    res = []
    for compiled in (False, True):
        dtorch.manual_seed(0)
        m = Block().to(device)
        opt = dtorch.optim.Adam(m.parameters(), lr=1e-2)
        net = dtorch.compile(m) if compiled else m
        for i in range(4):
            dtorch.manual_seed(i)
            x = dtorch.ones(2, 3, 8, device=device)
            net(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
        if compiled:
            assert stats(net).replays == 2
            assert net(x).device == x.device
        res.append({k: v.detach().cpu().numpy().copy()
                    for k, v in m.state_dict().items()})
    assert_bitwise(*res)


class BasicBlock(nn.Module):
    """ResNet's block: in-place ReLU and an in-place residual add."""

    def __init__(self, c=3):
        super().__init__()
        self.c1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.b1, self.b2 = nn.BatchNorm2d(c), nn.BatchNorm2d(c)
        self.c2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        out = self.relu(self.b1(self.c1(x)))
        out = self.b2(self.c2(out))
        out += x
        return self.relu(out)


def test_inplace_ops_on_tracked_tensors_replayed():
    m = BasicBlock()
    c = dtorch.compile(copy.deepcopy(m))
    for _ in range(4):
        x = dtorch.randn(2, 3, 4, 4, requires_grad=True)
        ye, yc = m(x * 1), c(x * 1)         # non-leaf inputs
        ge = dtorch.autograd.grad(ye.square().sum(), [x] + list(
            m.parameters()))
        gc = dtorch.autograd.grad(yc.square().sum(), [x] + list(
            c.parameters()))
        np.testing.assert_array_equal(ye.detach().numpy(),
                                      yc.detach().numpy())
        for a, b in zip(ge, gc):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert stats(c).replays == 2
    assert_bitwise(state(m), {k.replace("_orig_mod.", ""): v
                              for k, v in state(c).items()})


# the held-out workloads' layers, small: an LSTM LM, a bidirectional GRU
# classifier, a causal pre-LN decoder layer with dropout, a ViT
class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.e = nn.Embedding(20, 8)
        self.rnn = nn.LSTM(8, 16, batch_first=True)
        self.o = nn.Linear(16, 20)

    def forward(self, x):
        return self.o(self.rnn(self.e(x))[0])


class GRUC(nn.Module):
    def __init__(self):
        super().__init__()
        self.e = nn.Embedding(20, 8)
        self.rnn = nn.GRU(8, 8, bidirectional=True, batch_first=True)
        self.o = nn.Linear(16, 3)

    def forward(self, x):
        out, _ = self.rnn(self.e(x))
        return self.o(out.mean(1))


class Dec(nn.Module):
    def __init__(self):
        super().__init__()
        self.e = nn.Embedding(20, 16)
        self.t = nn.TransformerEncoderLayer(
            16, 2, 32, 0.1, activation="gelu", batch_first=True,
            norm_first=True)
        self.o = nn.Linear(16, 20)

    def forward(self, x):
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1])
        return self.o(self.t(self.e(x), src_mask=mask, is_causal=True))


class ViT(nn.Module):
    def __init__(self):
        super().__init__()
        self.p = nn.Conv2d(3, 16, 4, stride=4)
        self.cls = nn.Parameter(dtorch.zeros(1, 1, 16))
        self.pos = nn.Parameter(dtorch.randn(1, 5, 16) * .02)
        self.t = nn.TransformerEncoderLayer(
            16, 2, 32, 0.0, activation="gelu", batch_first=True,
            norm_first=True)
        self.h = nn.Sequential(nn.LayerNorm(16), nn.Linear(16, 10))

    def forward(self, x):
        x = self.p(x).flatten(2).transpose(1, 2)
        x = dtorch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1) + \
            self.pos
        return self.h(self.t(x)[:, 0])


@pytest.mark.parametrize("M,inp", [
    (LM, lambda: dtorch.randint(0, 20, (2, 5))),
    (GRUC, lambda: dtorch.randint(0, 20, (2, 5))),
    (Dec, lambda: dtorch.randint(0, 20, (2, 5))),
    (ViT, lambda: dtorch.randn(2, 3, 8, 8))],
    ids=["lstm", "gru", "dec", "vit"])
def test_workloads_replay_bitwise(M, inp):
    m = M()
    c = dtorch.compile(copy.deepcopy(m))
    for i in range(4):
        x = inp()
        dtorch.manual_seed(i)
        ye = m(x)
        dtorch.manual_seed(i)
        yc = c(x)
        np.testing.assert_array_equal(ye.detach().numpy(),
                                      yc.detach().numpy())
        ge = dtorch.autograd.grad(ye.square().sum(), list(m.parameters()))
        gc = dtorch.autograd.grad(yc.square().sum(), list(c.parameters()))
        for a, b in zip(ge, gc):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
    e = stats(c)
    assert e.replays == 2 and e.fallbacks == 0


def test_forward_hooks_run_eagerly_and_deepcopy():
    m = mlp()
    c = dtorch.compile(m)
    x = dtorch.randn(2, 5)
    seen = []
    h = m[1].register_forward_hook(lambda mod, i, o: seen.append(1))
    for _ in range(3):
        c(x)
    assert len(seen) == 3 and stats(c).replays == 0
    assert "forward hooks" in stats(c).fallback_reasons[0]
    h.remove()
    for _ in range(3):
        c(x)
    assert stats(c).replays == 1
    # a deep copy compiles on its own, over its own parameters
    m.compile()
    m2 = copy.deepcopy(m)
    with dtorch.no_grad():
        m2[0].weight.zero_()
    for _ in range(3):
        y1, y2 = m(x), m2(x)
    assert m2.__dict__["forward"] is not m.__dict__["forward"]
    assert not np.array_equal(y1.detach().numpy(), y2.detach().numpy())
    np.testing.assert_array_equal(y2.detach().numpy(), m2[2](m2[1](
        m2[0](x))).detach().numpy())


def test_compiled_method_and_frozen_parameters():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 2)

        @dtorch.compile
        def forward(self, x):
            return self.fc(x).relu()
    a, b = Net(), Net()
    x = dtorch.randn(4, 3)
    for _ in range(3):
        ya, yb = a(x), b(x)               # each instance its own cache
    np.testing.assert_array_equal(yb.detach().numpy(),
                                  b.fc(x).relu().detach().numpy())
    assert not np.array_equal(ya.detach().numpy(), yb.detach().numpy())
    a.fc.weight.requires_grad_(False)     # a guard: captured again
    for _ in range(3):
        y = a(x)
    y.sum().backward()
    assert a.fc.weight.grad is None and a.fc.bias.grad is not None
    e = stats(a)
    assert e.recaptures == 1 and e.replays == 2


def test_module_plain_attribute_is_guarded():
    class Scale(nn.Module):
        def __init__(self):
            super().__init__()
            self.alpha = 2.0

        def forward(self, x):
            return x * self.alpha
    m = Scale()
    c = dtorch.compile(m)
    x = dtorch.ones(2)
    outs = []
    for a in (2.0, 2.0, 2.0, 3.0, 3.0, 3.0):
        m.alpha = a
        outs.append(c(x).sum().item())
    assert outs == [4.0] * 3 + [6.0] * 3
    assert stats(c).recaptures == 1 and stats(c).replays == 2


def test_explain_uncompiled_counters_and_dynamic():
    def f(x):
        y = x.exp()
        return y * y.sum().item()
    e = dtorch.compiler.explain(f)(dtorch.ones(2))
    assert e.captures == 1 and e.graph_break_count == 1
    assert "Tensor.item()" in str(e)
    dtorch.compiler.reset()
    g = dtorch.compile(lambda x: x + 1)
    for _ in range(4):
        g(dtorch.ones(2))
    c = dtorch.compiler.counters
    assert (c["captures"], c["programs"], c["replays"]) == (2, 1, 2)
    dtorch._compile._dynamic_warned[0] = False      # warned once a process
    with pytest.warns(UserWarning, match="no symbolic shapes"):
        dtorch.compile(lambda x: x, dynamic=True)
    assert not dtorch.compiler.is_compiling()
    seen = []
    h = dtorch.compile(lambda x: seen.append(
        dtorch.compiler.is_compiling()) or x * 2)
    h(dtorch.ones(1))
    assert seen == [True]


def test_step_finds_modules_one_attribute_deep():
    class Trainer:
        def __init__(self):
            self.model = mlp()
            self.opt = dtorch.optim.SGD(self.model.parameters(), lr=0.1)

        def step(self, x):
            self.opt.zero_grad()
            loss = self.model(x).square().mean()
            loss.backward()
            self.opt.step()
            return loss
    t = Trainer()
    step = dtorch.compile(t.step)
    for _ in range(4):
        step(dtorch.ones(2, 5))
    e = stats(step)
    assert e.segmented and e.graph_count == 1 and e.replays == 1


def test_untracked_inplace_outside_an_op_is_a_break():
    def f(x):
        y = x * 2
        y.clamp_(min=0)           # no graph: changes the array in place
        return y + 1
    c = dtorch.compile(f)
    x = dtorch.randn(4)
    for _ in range(3):
        np.testing.assert_array_equal(c(x).numpy(), f(x).numpy())
    assert "in-place change by clamp_()" in stats(c).break_reasons[0]
    with pytest.raises(dtorch.compiler.Unsupported, match="clamp_"):
        dtorch.compile(f, fullgraph=True)(x)


def test_unseen_write_is_caught_by_the_validation_replay():
    """An array written outside ops without a version bump is invisible
    to the trace; the replay that checks the second capture catches it."""
    class Sneaky(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(2, 2)

        def forward(self, x):
            y = self.fc(x)
            y._data[0] = 7.0             # not an op, no version bump
            return y * 2
    m = Sneaky()
    c = dtorch.compile(m)
    x = dtorch.randn(2, 2)
    for _ in range(3):
        np.testing.assert_array_equal(c(x).detach().numpy(),
                                      m(x).detach().numpy())
    e = stats(c)
    assert e.replays == 0 and "bit for bit" in e.fallback_reasons[0]
