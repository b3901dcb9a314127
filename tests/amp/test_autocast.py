"""autocast: op dtypes equal PyTorch's (CPU, bfloat16), nesting, the cast
cache, gradients' dtypes; float16/bfloat16 compute accuracy on CPU."""
import numpy as np
import pytest

import dtorch
import dtorch.nn as nn
import dtorch.nn.functional as F
from dtorch.amp import autocast_mode as AM
from torch_oracle import torch_oracle

torch = pytest.importorskip("torch")


def _pair(shape, seed):
    a = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return dtorch.tensor(a), torch.tensor(a)


# each case: a function of the library (dtorch or torch) and of two (8, 8)
# float32 inputs x, w; ``h = F.linear(x, w)`` is a bfloat16 activation
# under autocast, so a case sees both a float32 and a bfloat16 operand
def _cases():
    def lin(L, x, w):
        return L.nn.functional.linear(x, w)

    def idx(L, x):
        return L.zeros(8, dtype=L.long, device=x.device)

    return {
        "linear": lambda L, x, w: lin(L, x, w),
        "matmul": lambda L, x, w: x @ w,
        "mm": lambda L, x, w: L.mm(x, w),
        "matmul_mixed": lambda L, x, w: lin(L, x, w) @ w,
        "bmm": lambda L, x, w: L.bmm(x[None], w[None]),
        "addmm": lambda L, x, w: L.addmm(x, x, w),
        "baddbmm": lambda L, x, w: L.baddbmm(x[None], x[None], w[None]),
        "einsum": lambda L, x, w: L.einsum("ij,jk->ik", x, w),
        "conv2d": lambda L, x, w: L.nn.functional.conv2d(
            x.reshape(1, 1, 8, 8), w[:2, :].reshape(2, 1, 2, 4)),
        "conv1d": lambda L, x, w: L.nn.functional.conv1d(
            x.reshape(1, 8, 8), w.reshape(8, 8, 1)),
        "sdpa": lambda L, x, w: L.nn.functional.scaled_dot_product_attention(
            x[None], w[None], x[None]),
        "sdpa_causal": lambda L, x, w:
            L.nn.functional.scaled_dot_product_attention(
                lin(L, x, w)[None], w[None], x[None], is_causal=True),
        "softmax": lambda L, x, w: L.softmax(lin(L, x, w), -1),
        "softmax_f32": lambda L, x, w: L.softmax(x, -1),
        "log_softmax": lambda L, x, w: L.log_softmax(lin(L, x, w), -1),
        "sum": lambda L, x, w: lin(L, x, w).sum(),
        "mean": lambda L, x, w: lin(L, x, w).mean(),
        "prod": lambda L, x, w: lin(L, x, w).prod(),
        "prod_f32": lambda L, x, w: x.prod(),
        "exp": lambda L, x, w: lin(L, x, w).exp(),
        "log": lambda L, x, w: lin(L, x, w).abs().log(),
        "pow": lambda L, x, w: lin(L, x, w).pow(2),
        "cumsum": lambda L, x, w: lin(L, x, w).cumsum(0),
        "layer_norm": lambda L, x, w: L.nn.functional.layer_norm(
            lin(L, x, w), (8,), w[0], w[1]),
        "batch_norm_train": lambda L, x, w: L.nn.functional.batch_norm(
            lin(L, x, w), L.zeros(8), L.ones(8), w[0], w[1], training=True),
        "group_norm": lambda L, x, w: L.nn.functional.group_norm(
            lin(L, x, w).reshape(8, 8, 1), 2),
        "cross_entropy": lambda L, x, w: L.nn.functional.cross_entropy(
            lin(L, x, w), idx(L, x)),
        "nll_loss": lambda L, x, w: L.nn.functional.nll_loss(
            lin(L, x, w), idx(L, x)),
        "mse_loss": lambda L, x, w: L.nn.functional.mse_loss(
            lin(L, x, w), x),
        "l1_loss": lambda L, x, w: L.nn.functional.l1_loss(lin(L, x, w), x),
        "smooth_l1": lambda L, x, w: L.nn.functional.smooth_l1_loss(
            lin(L, x, w), x),
        "huber": lambda L, x, w: L.nn.functional.huber_loss(
            lin(L, x, w), x),
        "bce_logits": lambda L, x, w:
            L.nn.functional.binary_cross_entropy_with_logits(
                lin(L, x, w), x.sigmoid()),
        # losses of two bfloat16 operands: composites run whole in float32
        "mse_low": lambda L, x, w: L.nn.functional.mse_loss(
            lin(L, x, w), lin(L, w, x)),
        "l1_low": lambda L, x, w: L.nn.functional.l1_loss(
            lin(L, x, w), lin(L, w, x)),
        "kl_div_low": lambda L, x, w: L.nn.functional.kl_div(
            lin(L, x, w), lin(L, w, x), reduction="batchmean"),
        "cosine_embedding_low": lambda L, x, w:
            L.nn.functional.cosine_embedding_loss(
                lin(L, x, w), lin(L, w, x), L.ones(8)),
        "margin_ranking_low": lambda L, x, w:
            L.nn.functional.margin_ranking_loss(
                lin(L, x, w), lin(L, w, x), x.sign()),
        "hinge_embedding_low": lambda L, x, w:
            L.nn.functional.hinge_embedding_loss(lin(L, x, w), x.sign()),
        "triplet_margin_low": lambda L, x, w:
            L.nn.functional.triplet_margin_loss(
                lin(L, x, w), lin(L, w, x), x),
        "poisson_nll_low": lambda L, x, w: L.nn.functional.poisson_nll_loss(
            lin(L, x, w), lin(L, w, x).abs()),
        "add_mixed": lambda L, x, w: lin(L, x, w) + x,
        "mul_mixed": lambda L, x, w: lin(L, x, w) * x,
        "cat_mixed": lambda L, x, w: L.cat([lin(L, x, w), x]),
        "stack_mixed": lambda L, x, w: L.stack([lin(L, x, w), x]),
        "relu": lambda L, x, w: L.relu(lin(L, x, w)),
        "gelu": lambda L, x, w: L.nn.functional.gelu(lin(L, x, w)),
        "tanh": lambda L, x, w: lin(L, x, w).tanh(),
        "sigmoid": lambda L, x, w: lin(L, x, w).sigmoid(),
        "norm": lambda L, x, w: lin(L, x, w).norm(),
        "max": lambda L, x, w: lin(L, x, w).max(),
    }


CASES = _cases()


def _name(dt):
    return str(dt).split(".")[-1]


def _close(got, want, tol=None):
    want = want.float().detach().numpy()
    tol = 0.05 * max(1.0, float(np.abs(want).max())) if tol is None else tol
    np.testing.assert_allclose(got.float().detach().numpy(), want, atol=tol,
                               rtol=0.05)


def _torch_autocast(fn, *args):
    with torch.autocast("cpu"):
        return fn(*args)


@pytest.mark.parametrize("name", sorted(CASES))
def test_op_dtype_equals_torch_cpu_bfloat16(name):
    fn = CASES[name]
    x, tx = _pair((8, 8), 0)
    w, tw = _pair((8, 8), 1)
    with dtorch.autocast("cpu"):
        got = fn(dtorch, x, w)
    # alone: near dtorch's own float32 answer (also where torch can't run)
    ref = fn(dtorch, x, w)
    assert got.dtype in (dtorch.bfloat16, dtorch.float32), got.dtype
    _close(got, ref)
    want = torch_oracle(_torch_autocast, fn, torch, tx, tw)
    assert _name(got.dtype) == _name(want.dtype), (name, got.dtype,
                                                   want.dtype)
    assert tuple(got.shape) == tuple(want.shape)
    _close(got, want)


# modules and their output dtype under CPU autocast: PyTorch's CPU list has
# nn.LSTM (mkldnn_rnn_layer) but not GRU or the LSTM/GRU cells, whose
# float32 state promotes their output back (the test checks the table
# against torch where torch runs)
MODULES = {
    "LSTM": (lambda L: L.nn.LSTM(8, 8), "bfloat16"),
    "GRU": (lambda L: L.nn.GRU(8, 8), "float32"),
    "RNNCell": (lambda L: L.nn.RNNCell(8, 8), "bfloat16"),
    "GRUCell": (lambda L: L.nn.GRUCell(8, 8), "float32"),
    "LSTMCell": (lambda L: L.nn.LSTMCell(8, 8), "float32"),
    "RNN": (lambda L: L.nn.RNN(8, 8), "bfloat16"),
    "Linear": (lambda L: L.nn.Linear(8, 8), "bfloat16"),
    "LayerNorm": (lambda L: L.nn.LayerNorm(8), "float32"),
    "BatchNorm1d": (lambda L: L.nn.BatchNorm1d(8), "float32"),
    "MultiheadAttention": (lambda L: L.nn.MultiheadAttention(8, 2),
                           "bfloat16"),
}


def test_lstm_cell_runs_in_float32_on_cpu_and_low_on_cuda_list():
    # PyTorch's LSTMCell is float32 under CPU autocast (its float32 cell
    # state promotes h and c), nn.LSTM bfloat16 (mkldnn_rnn_layer is listed)
    from dtorch.amp import autocast_mode as A
    from dtorch.nn.modules import rnn
    assert rnn._lstm_cell._autocast_policy == {"cpu": A.FP32,
                                               "cuda": A.LOWER}
    cell = nn.LSTMCell(8, 8)
    with dtorch.autocast("cpu"):
        h, c = cell(dtorch.randn(3, 8))
        y, _ = nn.LSTM(8, 8)(dtorch.randn(2, 3, 8))
    assert h.dtype is dtorch.float32 and c.dtype is dtorch.float32
    assert y.dtype is dtorch.bfloat16


def _first(out):
    while isinstance(out, tuple):
        out = out[0]
    return out


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_dtype_equals_torch_cpu_bfloat16(name):
    make, dtype = MODULES[name]
    dm, tm = make(dtorch), make(torch)
    dm.load_state_dict({k: dtorch.tensor(v.detach().numpy())
                        for k, v in tm.state_dict().items()})
    x, tx = _pair((3, 8) if "Cell" in name or "Norm" in name
                  else (2, 3, 8), 2)
    n_in = 3 if name == "MultiheadAttention" else 1
    with dtorch.autocast("cpu"):
        got = _first(dm(*(x,) * n_in))
    # alone: PyTorch's listed dtype, near dtorch's own float32 answer
    assert _name(got.dtype) == dtype, (name, got.dtype)
    _close(got, _first(dm(*(x,) * n_in)), tol=0.05)
    # parameters stay float32 (master weights)
    assert all(p.dtype is dtorch.float32 for p in dm.parameters())
    want = _first(torch_oracle(_torch_autocast, tm, *(tx,) * n_in))
    assert _name(want.dtype) == dtype, (name, want.dtype)
    _close(got, want, tol=0.05)


def test_oracle_failing_on_this_cpu_skips_after_dtorch_checks(monkeypatch):
    """An AVX2-only CPU: torch's LSTM under bfloat16 autocast raises from
    oneDNN. The test skips naming the CPU and the error, after checking
    dtorch alone; any other torch error still fails the test."""
    onednn = RuntimeError("could not create a primitive descriptor for an "
                          "LSTM forward propagation primitive")

    def raises(exc):
        def forward(self, *a, **k):
            raise exc
        return forward

    monkeypatch.setattr(torch.nn.LSTM, "forward", raises(onednn))
    with pytest.raises(pytest.skip.Exception,
                       match=r"torch oracle cannot run .*(AVX|capab).*"
                             r"primitive descriptor") as e:
        test_module_dtype_equals_torch_cpu_bfloat16("LSTM")
    assert "lacks" in str(e.value) or "unknown" in str(e.value)
    # dtorch's own checks ran first: a wrong dtorch answer fails, no skip
    real, calls = nn.LSTM.forward, []

    def wrong_first_call(self, x):   # the autocast call, not the reference
        calls.append(1)
        return real(self, x)[0] * (2 if len(calls) == 1 else 1), None
    monkeypatch.setattr(nn.LSTM, "forward", wrong_first_call)
    with pytest.raises(AssertionError):
        test_module_dtype_equals_torch_cpu_bfloat16("LSTM")
    monkeypatch.setattr(nn.LSTM, "forward", real)
    # an error of the call itself is not the CPU's: it propagates
    monkeypatch.setattr(torch.nn.LSTM, "forward",
                        raises(RuntimeError("input.size(-1) must be 8")))
    with pytest.raises(RuntimeError, match="must be 8"):
        test_module_dtype_equals_torch_cpu_bfloat16("LSTM")


def test_nested_and_disabled_regions_and_decorator():
    x = dtorch.randn(4, 8)
    w = dtorch.randn(8, 8)
    assert not dtorch.amp.is_autocast_enabled("cpu")
    with dtorch.autocast("cpu"):
        assert F.linear(x, w).dtype is dtorch.bfloat16
        with dtorch.autocast("cpu", enabled=False):
            assert F.linear(x, w).dtype is dtorch.float32
            with dtorch.autocast("cpu", dtype=dtorch.float16):
                assert F.linear(x, w).dtype is dtorch.float16
            assert F.linear(x, w).dtype is dtorch.float32
        assert F.linear(x, w).dtype is dtorch.bfloat16
        # a cuda region does not touch CPU tensors
        with dtorch.autocast("cuda", enabled=True):
            assert F.linear(x, w).dtype is dtorch.bfloat16
    assert F.linear(x, w).dtype is dtorch.float32
    assert dtorch.autograd.function._autocast is None   # hook removed

    @dtorch.autocast("cpu")
    def f(a):
        return a @ w
    assert f(x).dtype is dtorch.bfloat16
    assert (x @ w).dtype is dtorch.float32
    with dtorch.cpu.amp.autocast():
        assert (x @ w).dtype is dtorch.bfloat16
    with dtorch.amp.autocast("cpu", dtype=dtorch.float16):
        assert (x @ w).dtype is dtorch.float16
    # the region closes on an exception too
    with pytest.raises(ValueError):
        with dtorch.autocast("cpu"):
            raise ValueError("x")
    assert (x @ w).dtype is dtorch.float32
    with pytest.raises(RuntimeError, match="unsupported autocast"):
        dtorch.autocast("tpu")


def test_backward_dtypes_and_gradients_match_torch():
    """Gradients reach float32 parameters as float32 and equal PyTorch's
    under bfloat16 autocast (bfloat16 tolerance)."""
    torch.manual_seed(0)
    tm = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(),
                             torch.nn.LayerNorm(32), torch.nn.Linear(32, 4))
    dm = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32),
                       nn.Linear(32, 4))
    dm.load_state_dict({k: dtorch.tensor(v.detach().numpy())
                        for k, v in tm.state_dict().items()})
    x, tx = _pair((8, 16), 3)
    y = np.arange(8) % 4
    with dtorch.autocast("cpu"):
        out = dm(x)
        loss = F.cross_entropy(out, dtorch.tensor(y))
    assert out.dtype is dtorch.bfloat16 and loss.dtype is dtorch.float32
    loss.backward()
    grads = [p.grad.numpy() for p in dm.parameters()]
    # alone: near dtorch's own float32 gradients
    dm.zero_grad()
    F.cross_entropy(dm(x), dtorch.tensor(y)).backward()
    for (n, p), g in zip(dm.named_parameters(), grads):
        np.testing.assert_allclose(g, p.grad.numpy(), err_msg=n,
                                   atol=0.05 * np.abs(p.grad.numpy()).max())

    def torch_step():
        with torch.autocast("cpu"):
            tloss = torch.nn.functional.cross_entropy(tm(tx),
                                                      torch.tensor(y))
        tloss.backward()
    torch_oracle(torch_step)
    for (n, p), g, tp in zip(dm.named_parameters(), grads, tm.parameters()):
        assert p.grad.dtype is dtorch.float32, n
        tg = tp.grad.numpy()
        np.testing.assert_allclose(g, tg, atol=0.05 * np.abs(tg).max(),
                                   err_msg=n)


def test_weight_cast_cache_per_region():
    w = dtorch.randn(8, 8, requires_grad=True)
    x = dtorch.randn(4, 8)
    with dtorch.autocast("cpu"):
        a = x @ w
        b = F.linear(x, w)
        assert AM._cache_size() == 1      # one cast of w, reused
        assert AM._cache_nbytes() == 8 * 8 * 2
        (a.float().sum() + b.float().sum()).backward()
    assert AM._cache_size() == 0
    ones = np.ones((4, 8), np.float32)
    want = x.numpy().T @ ones + ones.T @ x.numpy()
    np.testing.assert_allclose(w.grad.numpy(), want, rtol=0.02, atol=0.05)
    with dtorch.autocast("cpu", cache_enabled=False):
        x @ w
        assert AM._cache_size() == 0
    # no cache under no_grad (a cast made there has no graph) nor for
    # tensors that are not leaves requiring grad
    with dtorch.autocast("cpu"), dtorch.no_grad():
        x @ w
        assert AM._cache_size() == 0
    with dtorch.autocast("cpu"):
        x @ x.t()
        assert AM._cache_size() == 0
    # a new region casts again: an in-place change of w between regions
    # is seen
    with dtorch.no_grad():
        w.mul_(0)
    with dtorch.autocast("cpu"):
        assert float((x @ w).float().abs().sum()) == 0.0


def test_cache_is_per_thread():
    import threading
    w = dtorch.randn(8, 8, requires_grad=True)
    seen = []

    def other():
        seen.append((dtorch.amp.is_autocast_enabled("cpu"),
                     (dtorch.randn(2, 8) @ w).dtype))
    with dtorch.autocast("cpu"):
        t = threading.Thread(target=other)
        t.start()
        t.join()
    assert seen == [(False, dtorch.float32)]


@pytest.mark.parametrize("dt", ["bfloat16", "float16"])
def test_low_precision_gemm_accumulates_in_float32(dt):
    """16-bit matmul/linear/conv on NumPy: float32 accumulation, one
    rounding (as PyTorch's CPU kernels), the 16-bit dtype out and in the
    gradients."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, 300)).astype(np.float32)
    b = rng.standard_normal((300, 32)).astype(np.float32)
    D = getattr(dtorch, dt)
    x = dtorch.tensor(a).to(D).requires_grad_()
    y = dtorch.tensor(b).to(D).requires_grad_()
    out = x @ y
    assert out.dtype is D
    ref = (x.detach().float() @ y.detach().float()).to(D)
    assert np.array_equal(out.detach().float().numpy(), ref.float().numpy())
    out.float().sum().backward()
    assert x.grad.dtype is D and y.grad.dtype is D
    c = dtorch.tensor(rng.standard_normal((2, 3, 9, 9)).astype(np.float32))
    k = dtorch.tensor(rng.standard_normal((4, 3, 3, 3)).astype(np.float32))
    got = F.conv2d(c.to(D), k.to(D))
    assert got.dtype is D
    want = F.conv2d(c.to(D).float(), k.to(D).float())
    np.testing.assert_allclose(got.float().numpy(), want.numpy(), rtol=0.01,
                               atol=0.05)
    # last: torch's 16-bit CPU matmul is the part a CPU may lack
    tx = torch.tensor(a).to(getattr(torch, dt))
    ty = torch.tensor(b).to(getattr(torch, dt))
    np.testing.assert_allclose(out.detach().float().numpy(),
                               torch_oracle(torch.matmul, tx, ty)
                               .float().numpy(), rtol=0.02, atol=0.1)


# PyTorch's CUDA lists (autocast_mode.cpp): float16 for the GEMMs, float32
# for the exp/log/pow family, softmax, sums, norms and losses
CUDA_EXPECT = {
    "linear": "float16", "matmul": "float16", "bmm": "float16",
    "addmm": "float16", "conv2d": "float16", "sdpa": "float16",
    "softmax": "float32", "log_softmax": "float32", "sum": "float32",
    "mean": "float32", "prod": "float32", "exp": "float32", "log": "float32",
    "pow": "float32", "cumsum": "float32", "layer_norm": "float32",
    "group_norm": "float32", "cross_entropy": "float32",
    "mse_loss": "float32", "add_mixed": "float32", "relu": "float16",
    "cat_mixed": "float32", "gelu": "float16",
}
# not listed: Tensor.norm of a float16 tensor returns float16 (it computes
# in float32 and casts back), where PyTorch's CUDA autocast returns float32


@pytest.mark.parametrize("name", sorted(CUDA_EXPECT))
def test_cuda_policy(device, name):
    if device == "cpu":
        pytest.skip("the CUDA list applies to cuda tensors")
    x, _ = _pair((8, 8), 0)
    w, _ = _pair((8, 8), 1)
    x, w = x.to(device), w.to(device)
    with dtorch.autocast("cuda"):
        got = CASES[name](dtorch, x, w)
    assert _name(got.dtype) == CUDA_EXPECT[name]


def test_cuda_banned_bce(device):
    if device == "cpu":
        pytest.skip("the CUDA list applies to cuda tensors")
    x = dtorch.rand(4, device=device)
    with dtorch.autocast("cuda"):
        with pytest.raises(RuntimeError, match="unsafe to autocast"):
            F.binary_cross_entropy(x, x)


def test_bfloat16_ops_that_branch_on_float_dtypes():
    """ml_dtypes' bfloat16 has dtype.kind 'V': ops that asked
    ``kind == 'f'`` treated it as an integer (max_pool2d raised)."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((2, 3, 6, 6)).astype(np.float32)
    a[0, 0, 0, 0] = np.nan
    x = dtorch.tensor(a).bfloat16().requires_grad_()
    ref = dtorch.tensor(a).bfloat16().float()
    for f in (lambda t: F.max_pool2d(t, 2), lambda t: t.sort(-1)[0],
              lambda t: t.median(),
              lambda t: F.softmax(t, -1), lambda t: t.max(-1)[0]):
        got = f(x)
        assert got.dtype is dtorch.bfloat16
        np.testing.assert_allclose(got.detach().float().numpy(),
                                   f(ref).detach().to(dtorch.bfloat16)
                                   .float().numpy(), rtol=1e-2, atol=1e-2)
    F.max_pool2d(x, 2).float().sum().backward()
    assert x.grad.dtype is dtorch.bfloat16
