"""F.scaled_dot_product_attention as one op (dtorch/ops/attention.py):
values and gradients against PyTorch for every mask kind, causal masks with
L != S, grouped-query attention, dropout (statistics, determinism by seed,
gradients with the same mask), empty inputs, float64 gradcheck; what the
op keeps for backward; nn.MultiheadAttention on it."""
import numpy as np
import pytest

import dtorch
import dtorch.nn.functional as F
from dtorch.autograd import gradcheck

torch = pytest.importorskip("torch")
TF = torch.nn.functional

TOL = {np.float32: 2e-5, np.float64: 1e-12}


@pytest.fixture(params=["numpy", "compiled"])
def path(request, monkeypatch):
    """Run a test on the NumPy softmax passes and on the compiled kernels
    (dtorch._kernels; numba is optional)."""
    from dtorch import _kernels
    if request.param == "numpy":
        monkeypatch.setitem(_kernels._state, "mod", False)
    elif not _kernels.enabled():
        pytest.skip("numba is not installed: no compiled kernels")
    return request.param


def _mask(kind, L, S, rng):
    """(numpy mask or None, is_causal) for one mask kind."""
    if kind == "none":
        return None, False
    if kind == "causal":
        return None, True
    if kind == "bool":                     # broadcast over batch and heads
        m = rng.random((L, S)) > 0.4
        m[1] = False                       # a row that attends to nothing
        return m, False
    if kind == "bool_heads":               # (B, 1, L, S)
        m = rng.random((2, 1, L, S)) > 0.3
        m[0, 0, 0] = False
        return m, False
    if kind == "float":                    # (H, 1, S): per head and key
        m = rng.standard_normal((3, 1, S))
        m[0, 0, 1] = -np.inf
        return m, False
    if kind == "float_dead_row":           # a float row of -inf throughout
        m = rng.standard_normal((L, S))
        m[2] = -np.inf
        return m, False
    raise ValueError(kind)


def _compare(qs, ks, vs, mask_kind="none", dtype=np.float64, seed=0,
             **kw):
    rng = np.random.default_rng(seed)
    L, S = qs[-2], ks[-2]
    arrays = [rng.standard_normal(s).astype(dtype) for s in (qs, ks, vs)]
    m, causal = _mask(mask_kind, L, S, rng)
    grad_mask = m is not None and m.dtype != bool
    if grad_mask:
        m = m.astype(dtype)
    D = [dtorch.tensor(a, requires_grad=True) for a in arrays]
    T = [torch.tensor(a, requires_grad=True) for a in arrays]
    md = None if m is None else dtorch.tensor(m, requires_grad=grad_mask)
    mt = None if m is None else torch.tensor(m, requires_grad=grad_mask)
    od = F.scaled_dot_product_attention(*D, attn_mask=md, is_causal=causal,
                                        **kw)
    ot = TF.scaled_dot_product_attention(*T, attn_mask=mt, is_causal=causal,
                                         **kw)
    tol = TOL[dtype]
    assert od.dtype == dtorch.tensor(arrays[0]).dtype
    np.testing.assert_allclose(od.detach().numpy(), ot.detach().numpy(),
                               rtol=tol, atol=tol)
    g = rng.standard_normal(ot.shape).astype(dtype)
    od.backward(dtorch.tensor(g))
    ot.backward(torch.tensor(g))
    pairs = list(zip(D, T)) + ([(md, mt)] if grad_mask else [])
    for d, t in pairs:
        assert d.grad.shape == tuple(t.grad.shape)
        np.testing.assert_allclose(d.grad.numpy(), t.grad.numpy(),
                                   rtol=tol * 10, atol=tol * 10)
    return od


MASKS = ["none", "causal", "bool", "bool_heads", "float", "float_dead_row"]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("L,S", [(5, 5), (4, 7), (7, 4)])
def test_values_and_grads_match_torch(mask, L, S, dtype, path):
    _compare((2, 3, L, 8), (2, 3, S, 8), (2, 3, S, 6), mask, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("mask", ["none", "causal", "bool", "bool_heads",
                                  "float_dead_row"])
def test_grouped_query_attention(mask, dtype, path):
    # 6 query heads over 2 key/value heads
    _compare((2, 6, 5, 8), (2, 2, 7, 8), (2, 2, 7, 4), mask, dtype,
             enable_gqa=True)


@pytest.mark.parametrize("shapes", [
    ((4, 8), (5, 8), (5, 6)),                       # no batch, no heads
    ((3, 4, 8), (3, 5, 8), (3, 5, 6)),              # (N, L, E)
    ((2, 3, 4, 8), (1, 3, 5, 8), (1, 3, 5, 6)),     # batch broadcast
    ((2, 2, 3, 4, 8), (2, 2, 3, 5, 8), (2, 2, 3, 5, 6)),
])
def test_shapes_and_broadcasting(shapes):
    _compare(*shapes, scale=0.3)


def test_fully_masked_rows_give_zero_and_zero_grad(path):
    out = _compare((2, 3, 4, 8), (2, 3, 5, 8), (2, 3, 5, 6), "bool")
    assert not np.isnan(out.detach().numpy()).any()
    assert (out.detach().numpy()[:, :, 1] == 0).all()


@pytest.mark.parametrize("shapes", [
    ((0, 3, 4, 8), (0, 3, 5, 8), (0, 3, 5, 6)),      # empty batch
    ((2, 3, 4, 8), (2, 3, 0, 8), (2, 3, 0, 6)),      # no keys: zeros
    ((2, 3, 0, 8), (2, 3, 5, 8), (2, 3, 5, 6)),      # no queries
])
@pytest.mark.parametrize("p", [0.0, 0.5])
def test_empty(shapes, p, path):
    q, k, v = (dtorch.randn(*s, requires_grad=True) for s in shapes)
    out = F.scaled_dot_product_attention(q, k, v, dropout_p=p)
    want = TF.scaled_dot_product_attention(
        *(torch.zeros(s) for s in shapes))
    assert out.shape == tuple(want.shape)
    assert (out.detach().numpy() == 0).all()
    out.sum().backward()
    for t in (q, k, v):
        assert t.grad.shape == t.shape
        assert (t.grad.numpy() == 0).all()


def _keep_like_sdpa(seed, shape, p):
    # the draw F.scaled_dot_product_attention makes: one uniform per score
    dtorch.manual_seed(seed)
    return dtorch.rand(*shape, dtype=dtorch.float64).numpy() >= p


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("gqa", [False, True])
def test_dropout_equals_torch_with_the_same_mask(causal, gqa, path):
    rng = np.random.default_rng(1)
    hk = 2 if gqa else 4
    shapes = (2, 4, 5, 8), (2, hk, 6, 8), (2, hk, 6, 3)
    arrays = [rng.standard_normal(s) for s in shapes]
    p = 0.4
    keep = _keep_like_sdpa(7, (2, 4, 5, 6), p)
    dtorch.manual_seed(7)
    D = [dtorch.tensor(a, requires_grad=True) for a in arrays]
    od = F.scaled_dot_product_attention(*D, dropout_p=p, is_causal=causal,
                                        enable_gqa=gqa)
    # PyTorch with that mask, composed by hand
    T = [torch.tensor(a, requires_grad=True) for a in arrays]
    q, k, v = T
    if gqa:
        k, v = (t.repeat_interleave(2, dim=1) for t in (k, v))
    s = q @ k.transpose(-2, -1) / np.sqrt(8)
    if causal:
        s = s.masked_fill(~torch.ones(5, 6, dtype=torch.bool).tril(),
                          float("-inf"))
    ot = (s.softmax(-1) * torch.tensor(keep) / (1 - p)) @ v
    np.testing.assert_allclose(od.detach().numpy(), ot.detach().numpy(),
                               rtol=1e-12, atol=1e-12)
    g = rng.standard_normal(ot.shape)
    od.backward(dtorch.tensor(g))
    ot.backward(torch.tensor(g))
    for d, t in zip(D, T):
        np.testing.assert_allclose(d.grad.numpy(), t.grad.numpy(),
                                   rtol=1e-11, atol=1e-11)


def test_dropout_statistics_and_seed():
    # v = identity reads the dropped probabilities back: out = P*keep/(1-p)
    L = S = 64
    p = 0.3
    q = dtorch.randn(4, 2, L, 8, dtype=dtorch.float64)
    k = dtorch.randn(4, 2, S, 8, dtype=dtorch.float64)
    v = dtorch.eye(S, dtype=dtorch.float64).expand(4, 2, S, S)
    ref = F.scaled_dot_product_attention(q, k, v).numpy()
    dtorch.manual_seed(3)
    a = F.scaled_dot_product_attention(q, k, v, dropout_p=p).numpy()
    dtorch.manual_seed(3)
    b = F.scaled_dot_product_attention(q, k, v, dropout_p=p).numpy()
    c = F.scaled_dot_product_attention(q, k, v, dropout_p=p).numpy()
    np.testing.assert_array_equal(a, b)          # same seed, same draw
    assert (a != c).any()                        # the stream moves on
    dropped = a == 0
    n = dropped.size
    # binomial(n, p): 6 standard deviations
    assert abs(dropped.mean() - p) < 6 * np.sqrt(p * (1 - p) / n)
    np.testing.assert_allclose(a[~dropped], ref[~dropped] / (1 - p),
                               rtol=1e-12)
    # p = 1 drops everything, without NaN
    z = F.scaled_dot_product_attention(q, k, v, dropout_p=1.0).numpy()
    assert (z == 0).all()


def test_gradcheck_float64(path):
    rng = np.random.default_rng(2)

    def t(*s):
        return dtorch.tensor(rng.standard_normal(s), requires_grad=True)
    q, k, v = t(1, 4, 3, 5), t(1, 2, 4, 5), t(1, 2, 4, 3)
    fmask = t(4, 1, 4)
    assert gradcheck(lambda q, k, v, m: F.scaled_dot_product_attention(
        q, k, v, attn_mask=m, enable_gqa=True), (q, k, v, fmask))
    assert gradcheck(lambda q, k, v: F.scaled_dot_product_attention(
        q, k, v, is_causal=True, enable_gqa=True, scale=0.7), (q, k, v))
    bmask = dtorch.tensor(rng.random((3, 4)) > 0.3)
    bmask[0] = False

    def dropped(q, k, v):
        dtorch.manual_seed(5)          # the same mask on every call
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bmask,
                                              dropout_p=0.3,
                                              enable_gqa=True)
    assert gradcheck(dropped, (q, k, v))


@pytest.mark.parametrize("p", [0.0, 0.2])
def test_backward_keeps_one_score_sized_array(p):
    # q, k, v, the output and the probabilities: nothing else of (B,H,L,S)
    B, H, L, S = 2, 3, 16, 16
    q = dtorch.randn(B, H, L, 4, requires_grad=True)
    k = dtorch.randn(B, H, S, 4, requires_grad=True)
    v = dtorch.randn(B, H, S, 4, requires_grad=True)
    m = dtorch.randn(L, S)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=m, dropout_p=p)
    fn = out.grad_fn
    assert type(fn).__name__ == "ScaledDotProductAttention"
    assert fn.next_functions[0][0] is not None
    arrays = [a for a in fn.to_save if a is not None]
    arrays += [a for a in fn.__dict__.values() if hasattr(a, "shape")]
    big = [a for a in arrays if a.size >= B * H * L * S]
    assert len(big) == 1, [a.shape for a in big]
    assert sum(a.nbytes for a in arrays) <= (
        B * H * L * S + 5 * B * H * L * 4) * 4


def test_errors():
    q = dtorch.randn(2, 3, 4, 8)
    k = dtorch.randn(2, 3, 5, 8)
    with pytest.raises(RuntimeError, match="same dtype"):
        F.scaled_dot_product_attention(q, k.double(), k)
    with pytest.raises(RuntimeError, match="should not be set when "
                                           "is_causal"):
        F.scaled_dot_product_attention(q, k, k, attn_mask=dtorch.ones(
            4, 5, dtype=dtorch.bool), is_causal=True)
    with pytest.raises(RuntimeError, match="attn_mask dtype to be bool or "
                                           "float"):
        F.scaled_dot_product_attention(q, k, k, attn_mask=dtorch.ones(
            4, 5, dtype=dtorch.int64))
    with pytest.raises(RuntimeError, match="must divide the number of "
                                           "heads"):
        F.scaled_dot_product_attention(q, k[:, :2], k[:, :2],
                                       enable_gqa=True)
    with pytest.raises(RuntimeError, match="do not broadcast"):
        F.scaled_dot_product_attention(q, k[:, :2], k[:, :2])
    with pytest.raises(RuntimeError, match=r"attn_mask of shape \(3, 5\)"):
        F.scaled_dot_product_attention(q, k, k, attn_mask=dtorch.zeros(3, 5))
    with pytest.raises(RuntimeError, match="key"):
        F.scaled_dot_product_attention(q, dtorch.randn(2, 3, 5, 7), k)
    with pytest.raises(ValueError, match="dropout probability"):
        F.scaled_dot_product_attention(q, k, k, dropout_p=1.5)


def test_float_mask_of_another_dtype_gets_its_own_grad_dtype():
    q = dtorch.randn(1, 2, 3, 4, dtype=dtorch.float64)
    m = dtorch.zeros(3, 3, requires_grad=True)            # float32
    F.scaled_dot_product_attention(q, q, q, attn_mask=m).sum().backward()
    assert m.grad.dtype == dtorch.float32 and m.grad.shape == (3, 3)


def test_autocast_bfloat16_runs_in_low_precision():
    q = dtorch.randn(1, 2, 4, 8)
    with dtorch.autocast("cpu", dtype=dtorch.bfloat16):
        out = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert out.dtype == dtorch.bfloat16
    ref = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    np.testing.assert_allclose(out.float().numpy(), ref.numpy(),
                               atol=5e-2)


# ------------------------------------------------------ MultiheadAttention --

# torch warns that a bool key padding mask with a float attention mask is
# deprecated; both kinds are tested on purpose
@pytest.mark.filterwarnings("ignore:Support for mismatched")
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("masks", ["none", "causal", "float+kpm",
                                   "bool+kpm", "kpm+causal"])
def test_multihead_attention_matches_torch(masks, batch_first):
    E, H, L, N = 8, 2, 5, 3
    torch.manual_seed(0)
    tm = torch.nn.MultiheadAttention(E, H, batch_first=batch_first).double()
    dm = dtorch.nn.MultiheadAttention(E, H, batch_first=batch_first).double()
    sd = tm.state_dict()
    assert list(dm.state_dict()) == list(sd)
    dm.load_state_dict({k: dtorch.tensor(v.numpy()) for k, v in sd.items()})
    rng = np.random.default_rng(0)
    x = rng.standard_normal((N, L, E) if batch_first else (L, N, E))
    xd = dtorch.tensor(x, requires_grad=True)
    xt = torch.tensor(x, requires_grad=True)
    kpm = np.zeros((N, L), bool)
    kpm[0, -2:] = True
    causal_f = np.triu(np.full((L, L), -np.inf), 1)
    kw = {"none": {}, "causal": {"attn_mask": causal_f, "is_causal": True},
          "float+kpm": {"attn_mask": causal_f, "key_padding_mask": kpm},
          "bool+kpm": {"attn_mask": np.isinf(causal_f),
                       "key_padding_mask": kpm},
          "kpm+causal": {"attn_mask": causal_f, "key_padding_mask": kpm,
                         "is_causal": True}}[masks]

    def args(lib):
        return {k: (lib.tensor(v) if isinstance(v, np.ndarray) else v)
                for k, v in kw.items()}
    od, wd = dm(xd, xd, xd, need_weights=False, **args(dtorch))
    ot, _ = tm(xt, xt, xt, need_weights=False, **args(torch))
    assert wd is None
    np.testing.assert_allclose(od.detach().numpy(), ot.detach().numpy(),
                               rtol=1e-10, atol=1e-10)
    g = rng.standard_normal(od.shape)
    od.backward(dtorch.tensor(g))
    ot.backward(torch.tensor(g))
    np.testing.assert_allclose(xd.grad.numpy(), xt.grad.numpy(),
                               rtol=1e-10, atol=1e-10)
    for (n, p), (_, pt) in zip(dm.named_parameters(), tm.named_parameters()):
        np.testing.assert_allclose(p.grad.numpy(), pt.grad.numpy(),
                                   rtol=1e-9, atol=1e-10, err_msg=n)
    # the weights path (need_weights=True) gives the same output
    ow, _ = dm(xd, xd, xd, need_weights=True, **args(dtorch))
    np.testing.assert_allclose(ow.detach().numpy(), od.detach().numpy(),
                               rtol=1e-12, atol=1e-12)


def test_multihead_attention_dropout_draws_as_before():
    # need_weights=False (one op) and True (the composed path) draw the
    # same dropout mask from the same seed: the same output
    dm = dtorch.nn.MultiheadAttention(8, 2, dropout=0.5).double()
    x = dtorch.randn(5, 3, 8, dtype=dtorch.float64)
    dtorch.manual_seed(11)
    a, _ = dm(x, x, x, need_weights=False)
    dtorch.manual_seed(11)
    b, _ = dm(x, x, x, need_weights=True)
    np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(),
                               rtol=1e-12, atol=1e-12)
    dm.eval()
    c, _ = dm(x, x, x, need_weights=False)
    assert not np.allclose(a.detach().numpy(), c.detach().numpy())


def test_transformer_layer_uses_the_op():
    layer = dtorch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0,
                                              batch_first=True)
    x = dtorch.randn(2, 5, 8, requires_grad=True)
    seen = []
    from dtorch.profiler import profile
    with profile() as prof:
        layer(x, is_causal=True,
              src_mask=dtorch.nn.Transformer.generate_square_subsequent_mask(
                  5)).sum().backward()
    seen = {e.name for e in prof.events()}
    assert "dtorch::ScaledDotProductAttention" in seen
    assert "dtorch::Softmax" not in seen


# ------------------------------------------------------------ CUDA path --

@pytest.mark.parametrize("p", [0.0, 0.3])
def test_device(device, p):
    # the same op on the device's array module (the CuPy stand-in checks
    # its API use); results equal the CPU's with the same dropout mask
    rng = np.random.default_rng(4)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in
              ((2, 4, 5, 8), (2, 2, 6, 8), (2, 2, 6, 3))]
    m = rng.random((5, 6)) > 0.3
    m[0] = False
    D = [dtorch.tensor(a, device=device, requires_grad=True) for a in arrays]
    out = F.scaled_dot_product_attention(
        *D, attn_mask=dtorch.tensor(m, device=device), dropout_p=p,
        enable_gqa=True)
    assert out.device.type == device
    out.sum().backward()
    if p == 0.0:
        C = [dtorch.tensor(a, requires_grad=True) for a in arrays]
        ref = F.scaled_dot_product_attention(
            *C, attn_mask=dtorch.tensor(m), enable_gqa=True)
        ref.sum().backward()
        np.testing.assert_allclose(out.detach().cpu().numpy(),
                                   ref.detach().numpy(), atol=1e-5)
        for d, c in zip(D, C):
            np.testing.assert_allclose(d.grad.cpu().numpy(), c.grad.numpy(),
                                       atol=1e-4)
    else:
        o = out.detach().cpu().numpy()
        assert np.isfinite(o).all() and (o[:, :, 0] == 0).all()
        for d in D:
            assert d.grad.device.type == device
            assert np.isfinite(d.grad.cpu().numpy()).all()


# ----------------------------------------------------------------- ONNX --

@pytest.mark.parametrize("kw", [{"is_causal": True},
                                {"enable_gqa": True}])
def test_onnx_export(tmp_path, kw):
    onnx = pytest.importorskip("onnx")
    ref = pytest.importorskip("onnx.reference")

    class Att(dtorch.nn.Module):
        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v, **kw)
    q = dtorch.randn(2, 4, 5, 8)
    hk = 2 if kw.get("enable_gqa") else 4
    k, v = dtorch.randn(2, hk, 6, 8), dtorch.randn(2, hk, 6, 3)
    path = str(tmp_path / "att.onnx")
    dtorch.onnx.export(Att(), (q, k, v), path,
                       input_names=["q", "k", "v"], output_names=["y"])
    onnx.checker.check_model(onnx.load(path))
    got, = ref.ReferenceEvaluator(path).run(
        None, {"q": q.numpy(), "k": k.numpy(), "v": v.numpy()})
    np.testing.assert_allclose(got, Att()(q, k, v).numpy(), atol=1e-5)


def test_compiled_softmax_kernels_run(monkeypatch):
    from dtorch import _kernels
    if not _kernels.enabled():
        pytest.skip("numba is not installed: no compiled kernels")
    real, calls = _kernels._state["mod"], []

    class Spy:
        def __getattr__(self, name):
            calls.append(name)
            return getattr(real, name)
    monkeypatch.setitem(_kernels._state, "mod", Spy())
    q = dtorch.randn(2, 2, 8, 4, requires_grad=True)
    m = dtorch.ones(8, 8, dtype=dtorch.bool)
    m[3] = False
    out = F.scaled_dot_product_attention(q, q, q, attn_mask=m)
    assert (out.detach().numpy()[:, :, 3] == 0).all()      # not NaN
    out.sum().backward()
    assert calls.count("softmax_bwd") == 1
    assert np.isfinite(q.grad.numpy()).all()


def test_double_backward_gradgradcheck(path):
    # create_graph=True through the op (gradient penalties, MAML): second
    # derivatives against finite differences, float mask, GQA, causal,
    # dropout (fixed seed), a fully masked row
    from dtorch.autograd import gradgradcheck
    rng = np.random.default_rng(6)

    def t(*s):
        return dtorch.tensor(rng.standard_normal(s), requires_grad=True)
    q, k, v = t(1, 4, 3, 5), t(1, 2, 4, 5), t(1, 2, 4, 3)
    fmask = t(4, 1, 4)
    assert gradgradcheck(lambda q, k, v, m: F.scaled_dot_product_attention(
        q, k, v, attn_mask=m, enable_gqa=True), (q, k, v, fmask))
    assert gradgradcheck(lambda q, k, v: F.scaled_dot_product_attention(
        q, k, v, is_causal=True, enable_gqa=True, scale=0.7), (q, k, v))
    bmask = dtorch.tensor(rng.random((3, 4)) > 0.3)
    bmask[0] = False

    def dropped(q, k, v):
        dtorch.manual_seed(5)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bmask,
                                              dropout_p=0.3,
                                              enable_gqa=True)
    assert gradgradcheck(dropped, (q, k, v))


def test_double_backward_matches_torch():
    # a gradient penalty through attention: d/dq of |d out/d k|^2
    rng = np.random.default_rng(8)
    arrays = [rng.standard_normal(s) for s in
              ((2, 2, 4, 3), (2, 2, 5, 3), (2, 2, 5, 2))]
    res = []
    for lib, fn in ((dtorch, F.scaled_dot_product_attention),
                    (torch, TF.scaled_dot_product_attention)):
        q, k, v = (lib.tensor(a, requires_grad=True) for a in arrays)
        out = fn(q, k, v, is_causal=True)
        gk, = lib.autograd.grad((out ** 2).sum(), (k,), create_graph=True)
        (gk ** 2).sum().backward()
        res.append([t.grad.numpy() for t in (q, k, v)])
    for a, b in zip(*res):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10)
