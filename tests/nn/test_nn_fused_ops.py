"""The fused nn ops (dtorch/ops: conv, pool, norm, rnn, ...): gradcheck in float64 and
agreement with the composed Tensor version or a NumPy reference."""
import numpy as np
import pytest

import dtorch
import dtorch.nn.functional as F
from dtorch.autograd import gradcheck
from dtorch.ops import conv, rnn


def t64(*shape, seed=0, req=True, scale=1.0):
    rng = np.random.default_rng(seed)
    return dtorch.tensor(rng.standard_normal(shape) * scale,
                         dtype=dtorch.float64, requires_grad=req)


def conv2d_ref(x, w, b, stride, pad, dil, groups):
    """Direct loops over output positions: the definition."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    x = np.pad(x, ((0, 0), (0, 0), pad[0], pad[1]))
    oh = (x.shape[2] - dil[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (x.shape[3] - dil[1] * (kw - 1) - 1) // stride[1] + 1
    out = np.zeros((n, o, oh, ow))
    og = o // groups
    for g in range(groups):
        xs = x[:, g * cg:(g + 1) * cg]
        for i in range(oh):
            for j in range(ow):
                patch = xs[:, :, i * stride[0]:i * stride[0] + dil[0] * (kh - 1) + 1:dil[0],
                           j * stride[1]:j * stride[1] + dil[1] * (kw - 1) + 1:dil[1]]
                out[:, g * og:(g + 1) * og, i, j] = np.einsum(
                    "nckl,ockl->no", patch, w[g * og:(g + 1) * og])
    if b is not None:
        out += b[None, :, None, None]
    return out


CONV_CASES = [
    dict(stride=1, padding=0, dilation=1, groups=1),
    dict(stride=2, padding=1, dilation=1, groups=1),
    dict(stride=1, padding=2, dilation=2, groups=2),
    dict(stride=(2, 1), padding=(0, 1), dilation=1, groups=4),
    dict(stride=1, padding="same", dilation=1, groups=1),
    dict(stride=1, padding="same", dilation=(1, 2), groups=1),
]


def ref_pads(case, kshape):
    """(before, after) padding per spatial axis of a conv test case."""
    if case["padding"] == "same":
        d = F._pair(case["dilation"])
        return [(dd * (k - 1) // 2, dd * (k - 1) - dd * (k - 1) // 2)
                for dd, k in zip(d, kshape)]
    p = F._pair(case["padding"])
    return [(p[0], p[0]), (p[1], p[1])]


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv2d_matches_reference_and_gradcheck(case):
    x = t64(2, 4, 7, 6, seed=1)
    kshape = (2, 3) if case["padding"] == "same" else (3, 3)
    w = t64(4, 4 // case["groups"], *kshape, seed=2)
    b = t64(4, seed=3)
    out = F.conv2d(x, w, b, **case)
    pads = ref_pads(case, kshape)
    ref = conv2d_ref(x.detach().numpy(), w.detach().numpy(),
                     b.detach().numpy(), F._pair(case["stride"]), pads,
                     F._pair(case["dilation"]), case["groups"])
    np.testing.assert_allclose(out.detach().numpy(), ref, atol=1e-10)
    if case["padding"] == "same":
        assert out.shape[2:] == x.shape[2:]
    assert gradcheck(lambda x, w, b: F.conv2d(x, w, b, **case), (x, w, b))


def test_conv2d_channels_last_input_and_single_channel():
    # an input that is channels-last in memory (a permuted view) takes the
    # no-copy branch of the padded NHWC buffer; C == 1 is the first layer
    # of every image model
    base = t64(2, 6, 7, 3, seed=4)
    x = base.detach().permute(0, 3, 1, 2).requires_grad_()   # NHWC memory
    assert not x.is_contiguous()
    w, b = t64(5, 3, 2, 3, seed=5), t64(5, seed=6)
    for kw in (dict(), dict(stride=2), dict(padding=1, dilation=2)):
        out = F.conv2d(x, w, b, **kw)
        p = kw.get("padding", 0)
        ref = conv2d_ref(x.detach().numpy(), w.detach().numpy(),
                         b.detach().numpy(), F._pair(kw.get("stride", 1)),
                         [(p, p), (p, p)], F._pair(kw.get("dilation", 1)), 1)
        np.testing.assert_allclose(out.detach().numpy(), ref, atol=1e-10)
        assert out.is_contiguous()
        assert gradcheck(lambda x, w, b: F.conv2d(x, w, b, **kw), (x, w, b))
    x1, w1 = t64(3, 1, 5, 6, seed=7), t64(4, 1, 3, 3, seed=8)
    assert gradcheck(lambda x, w: F.conv2d(x, w, padding=1), (x1, w1))


@pytest.mark.parametrize("case", CONV_CASES[:2] + CONV_CASES[4:] + [
    dict(stride=1, padding=3, dilation=1, groups=1),     # pad > k - 1
    dict(stride=(1, 2), padding=(1, 0), dilation=(2, 1), groups=1),
])
def test_conv2d_channels_last_path_in_chunks(case, monkeypatch):
    # C*KH*KW >= 128 takes the channels-last path; a tiny chunk size makes
    # every image its own chunk, so forward, weight gradient and the
    # stride-1 input gradient (a convolution itself) cross chunk borders
    monkeypatch.setattr(conv, "_CONV_CHUNK_BYTES", 1)
    x = t64(3, 24, 5, 6, seed=1)
    kshape = (2, 3) if case["padding"] == "same" else (3, 3)
    w, b = t64(3, 24, *kshape, seed=2, scale=0.3), t64(3, seed=3)
    out = F.conv2d(x, w, b, **case)
    pads = ref_pads(case, kshape)
    ref = conv2d_ref(x.detach().numpy(), w.detach().numpy(),
                     b.detach().numpy(), F._pair(case["stride"]), pads,
                     F._pair(case["dilation"]), 1)
    np.testing.assert_allclose(out.detach().numpy(), ref, atol=1e-10)
    assert gradcheck(lambda x, w, b: F.conv2d(x, w, b, **case), (x, w, b))


def test_conv2d_matches_torch_float32():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 16, 14, 14)).astype(np.float32)
    w = rng.standard_normal((24, 16, 3, 3)).astype(np.float32) * 0.1
    b = rng.standard_normal(24).astype(np.float32)
    g = rng.standard_normal((8, 24, 14, 14)).astype(np.float32)
    outs = []
    for lib in (dtorch, torch):
        xs, ws, bs = (lib.tensor(a, requires_grad=True) for a in (x, w, b))
        out = lib.nn.functional.conv2d(xs, ws, bs, padding=1)
        out.backward(lib.tensor(g))
        outs.append([a.detach().numpy() for a in
                     (out, xs.grad, ws.grad, bs.grad)])
    for d, t in zip(*outs):
        np.testing.assert_allclose(d, t, rtol=1e-4, atol=1e-3)


def test_conv1d_and_transpose_gradcheck():
    x = t64(2, 3, 9)
    w = t64(4, 3, 3, seed=1)
    b = t64(4, seed=2)
    out = F.conv1d(x, w, b, stride=2, padding=1)
    ref = conv2d_ref(x.detach().numpy()[:, :, None], w.detach().numpy()[:, :, None],
                     b.detach().numpy(), (1, 2), [(0, 0), (1, 1)], (1, 1), 1)
    np.testing.assert_allclose(out.detach().numpy(), ref[:, :, 0])
    assert gradcheck(lambda x, w, b: F.conv1d(x, w, b, 2, 1), (x, w, b))
    xt = t64(2, 4, 4, 3, seed=3)
    wt = t64(4, 3, 3, 2, seed=4)
    for kw in (dict(), dict(stride=2, padding=1, output_padding=1),
               dict(stride=2, dilation=2), ):
        assert gradcheck(lambda x, w, b: F.conv_transpose2d(x, w, b, **kw),
                         (xt, wt, t64(3, seed=5)))
    wg = t64(4, 1, 3, 3, seed=6)
    assert gradcheck(lambda x, w: F.conv_transpose2d(x, w, groups=2,
                                                     stride=2), (xt, wg))


def test_conv_transpose_is_adjoint_of_conv():
    # <conv(x), y> == <x, conv_transpose(y)> for the same weight
    x = t64(2, 3, 8, 7, req=False)
    w = t64(5, 3, 3, 2, seed=1, req=False)
    y = F.conv2d(x, w, stride=2, padding=1)
    g = t64(*y.shape, seed=2, req=False)
    xt = F.conv_transpose2d(g, w, stride=2, padding=1,
                            output_padding=(1, 1))
    assert xt.shape == x.shape
    lhs = (y * g).sum().item()
    rhs = (x * xt).sum().item()
    assert abs(lhs - rhs) < 1e-9


@pytest.mark.parametrize("kw", [
    dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=2, stride=1, dilation=2),
    dict(kernel_size=3, stride=2, ceil_mode=True)])
def test_max_pool2d(kw):
    x = t64(2, 3, 7, 8) if kw.get("kernel_size") != 2 or "stride" in kw \
        else t64(2, 3, 6, 8)
    out = F.max_pool2d(x, **kw)
    # reference: -inf padding and a window max
    k = kw["kernel_size"]
    s = kw.get("stride", k)
    p = kw.get("padding", 0)
    d = kw.get("dilation", 1)
    a = np.pad(x.detach().numpy(), ((0, 0), (0, 0), (p, p + s), (p, p + s)),
               constant_values=-np.inf)
    oh, ow = out.shape[2:]
    ref = np.empty(out.shape)
    for i in range(oh):
        for j in range(ow):
            ref[:, :, i, j] = a[:, :, i * s:i * s + d * (k - 1) + 1:d,
                                j * s:j * s + d * (k - 1) + 1:d].max((2, 3))
    np.testing.assert_allclose(out.detach().numpy(), ref)
    assert gradcheck(lambda x: F.max_pool2d(x, **kw), (x,))
    _, idx = F.max_pool2d(x, return_indices=True, **kw)
    flat = x.detach().numpy().reshape(2, 3, -1)
    picked = np.take_along_axis(flat, idx.numpy().reshape(2, 3, -1), -1)
    np.testing.assert_allclose(picked.reshape(out.shape),
                               out.detach().numpy())


def test_max_pool_ties_give_gradient_to_one_element():
    x = dtorch.ones(1, 1, 2, 2, requires_grad=True)
    F.max_pool2d(x, 2).sum().backward()
    assert x.grad.sum().item() == 1.0


@pytest.mark.parametrize("k,s,shape", [(2, 2, (2, 3, 7, 9)),
                                       (2, 2, (2, 3, 6, 8)),    # 2x2 pairs
                                       (3, 3, (1, 2, 9, 7)),
                                       ((1, 2), (1, 2), (1, 2, 4, 6)),
                                       (2, 1, (1, 2, 5, 5))])
def test_max_pool_ties_credit_the_first_maximum(k, s, shape):
    # small integers make many ties; the first maximum of each window in
    # row-major order gets the gradient (PyTorch's rule), both on the
    # tiled path (kernel == stride) and the overlapping one
    rng = np.random.default_rng(0)
    a = rng.integers(0, 3, shape).astype(np.float64)
    x = dtorch.tensor(a, requires_grad=True)
    out = F.max_pool2d(x, k, s)
    g = rng.standard_normal(tuple(out.shape))
    out.backward(dtorch.tensor(g))
    ref = np.zeros_like(a)
    kh, kw = (k, k) if isinstance(k, int) else k
    sh, sw = (s, s) if isinstance(s, int) else s
    for i in range(out.shape[2]):
        for j in range(out.shape[3]):
            win = a[:, :, i * sh:i * sh + kh, j * sw:j * sw + kw]
            flat = win.reshape(a.shape[0], a.shape[1], -1)
            first = flat.argmax(-1)          # argmax: the first maximum
            np.testing.assert_array_equal(out.detach().numpy()[:, :, i, j],
                                          flat.max(-1))
            for n in range(a.shape[0]):
                for c in range(a.shape[1]):
                    di, dj = divmod(first[n, c], kw)
                    ref[n, c, i * sh + di, j * sw + dj] += g[n, c, i, j]
    np.testing.assert_allclose(x.grad.numpy(), ref)


@pytest.mark.parametrize("kw", [
    dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=3, stride=2, padding=1, count_include_pad=False),
    dict(kernel_size=3, stride=2, ceil_mode=True),
    dict(kernel_size=2, divisor_override=3)])
def test_avg_pool2d(kw):
    x = t64(2, 2, 6, 7)
    out = F.avg_pool2d(x, **kw)
    assert gradcheck(lambda x: F.avg_pool2d(x, **kw), (x,))
    if kw == dict(kernel_size=2):
        a = x.detach().numpy()[:, :, :6, :6]
        ref = a.reshape(2, 2, 3, 2, 3, 2).mean((3, 5))
        np.testing.assert_allclose(out.detach().numpy(), ref)
    if kw.get("count_include_pad") is False:
        a = x.detach().numpy()
        # corner window holds a[0:2, 0:2] only
        np.testing.assert_allclose(out.detach().numpy()[:, :, 0, 0],
                                   a[:, :, :2, :2].mean((2, 3)))


def test_adaptive_avg_pool2d():
    x = t64(2, 3, 7, 5)
    out = F.adaptive_avg_pool2d(x, (3, 2))
    a = x.detach().numpy()
    ref = np.empty((2, 3, 3, 2))
    for i in range(3):
        h0, h1 = (i * 7) // 3, -(-(i + 1) * 7 // 3)
        for j in range(2):
            w0, w1 = (j * 5) // 2, -(-(j + 1) * 5 // 2)
            ref[:, :, i, j] = a[:, :, h0:h1, w0:w1].mean((2, 3))
    np.testing.assert_allclose(out.detach().numpy(), ref, atol=1e-12)
    assert gradcheck(lambda x: F.adaptive_avg_pool2d(x, (3, 2)), (x,))
    assert F.adaptive_avg_pool2d(x, 1).shape == (2, 3, 1, 1)
    y = t64(1, 2, 8, 8)
    np.testing.assert_allclose(
        F.adaptive_avg_pool2d(y, 4).detach().numpy(),
        F.avg_pool2d(y, 2).detach().numpy())


def test_softmax_log_softmax_match_composed():
    x = t64(3, 5, 4)
    for dim in (0, 1, -1):
        s = F.softmax(x, dim)
        e = (x - x.detach().amax(dim, keepdim=True)).exp()
        np.testing.assert_allclose(s.detach().numpy(),
                                   (e / e.sum(dim, keepdim=True)).detach().numpy())
        ls = F.log_softmax(x, dim)
        np.testing.assert_allclose(ls.detach().numpy(),
                                   (x - x.logsumexp(dim, keepdim=True)).detach().numpy())
        assert gradcheck(lambda x: F.softmax(x, dim), (x,))
        assert gradcheck(lambda x: F.log_softmax(x, dim), (x,))
    assert gradcheck(lambda x: x.softmax(-1) * x, (x,))


def test_nll_cross_entropy_match_composed():
    x = t64(6, 4)
    t = dtorch.tensor([0, 3, 1, -100, 2, 3])
    w = dtorch.tensor([0.5, 1.0, 2.0, 1.5], dtype=dtorch.float64)
    for red in ("mean", "sum", "none"):
        for weight in (None, w):
            got = F.cross_entropy(x, t, weight=weight, reduction=red)
            lp = (x - x.logsumexp(1, keepdim=True)).detach().numpy()
            tt = t.numpy()
            keep = tt != -100
            ww = np.ones(4) if weight is None else w.numpy()
            per = np.zeros(6)
            per[keep] = -lp[keep, tt[keep]] * ww[tt[keep]]
            ref = {"none": per, "sum": per.sum(),
                   "mean": per.sum() / ww[tt[keep]].sum()}[red]
            np.testing.assert_allclose(got.detach().numpy(), ref)
            assert gradcheck(lambda x: F.cross_entropy(
                x, t, weight=weight, reduction=red), (x,))
    # one fused node for class indices: spatial (N, C, d1) and unbatched
    xs = t64(2, 3, 4, seed=5)
    ts = dtorch.tensor([[0, 2, -100, 1], [1, 1, 0, 2]])
    for red in ("mean", "none"):
        assert gradcheck(lambda x: F.cross_entropy(
            x, ts, weight=w[:3], reduction=red), (xs,))
    assert gradcheck(lambda x: F.cross_entropy(x, dtorch.tensor(2)),
                     (t64(4, seed=6),))


def test_layer_norm_matches_composed_and_gradcheck():
    x = t64(3, 4, 5)
    w = t64(4, 5, seed=1)
    b = t64(4, 5, seed=2)
    out = F.layer_norm(x, (4, 5), w, b, eps=1e-5)
    mu = x.mean((-2, -1), keepdim=True)
    var = ((x - mu) ** 2).mean((-2, -1), keepdim=True)
    ref = (x - mu) / (var + 1e-5).sqrt() * w + b
    np.testing.assert_allclose(out.detach().numpy(), ref.detach().numpy(),
                               atol=1e-12)
    assert gradcheck(lambda x, w, b: F.layer_norm(x, (4, 5), w, b), (x, w, b))
    assert gradcheck(lambda x: F.layer_norm(x, (5,)), (x,))


def test_batch_norm_train_matches_composed_and_updates_stats():
    x = t64(4, 3, 2, 2)
    w = t64(3, seed=1)
    b = t64(3, seed=2)
    rm = dtorch.zeros(3, dtype=dtorch.float64)
    rv = dtorch.ones(3, dtype=dtorch.float64)
    out = F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1)
    mu = x.mean((0, 2, 3), keepdim=True)
    var = ((x - mu) ** 2).mean((0, 2, 3), keepdim=True)
    ref = (x - mu) / (var + 1e-5).sqrt() * w.reshape(1, 3, 1, 1) + \
        b.reshape(1, 3, 1, 1)
    np.testing.assert_allclose(out.detach().numpy(), ref.detach().numpy(),
                               atol=1e-12)
    a = x.detach().numpy()
    np.testing.assert_allclose(rm.numpy(), 0.1 * a.mean((0, 2, 3)))
    np.testing.assert_allclose(rv.numpy(),
                               0.9 + 0.1 * a.var((0, 2, 3), ddof=1))
    assert gradcheck(lambda x, w, b: F.batch_norm(x, None, None, w, b,
                                                  training=True), (x, w, b))
    x2 = t64(5, 3)
    assert gradcheck(lambda x: F.batch_norm(x, None, None, training=True),
                     (x2,))


def test_embedding_backward_sums_repeats_and_skips_padding():
    w = t64(5, 3)
    idx = dtorch.tensor([[0, 2, 2], [4, 0, 1]])
    out = F.embedding(idx, w, padding_idx=1)
    np.testing.assert_allclose(out.detach().numpy(), w.detach().numpy()[idx.numpy()])
    out.sum().backward()
    np.testing.assert_allclose(w.grad.numpy()[:, 0], [2, 0, 2, 0, 1])
    assert gradcheck(lambda w: F.embedding(idx, w), (t64(5, 3),))
    with pytest.raises(IndexError, match="index out of range"):
        F.embedding(dtorch.tensor([5]), w)
    with pytest.raises(RuntimeError, match="Long, Int"):
        F.embedding(dtorch.tensor([1.0]), w)


def test_gelu_matches_formula_and_gradcheck():
    import math
    x = t64(20)
    exact = np.array([v * 0.5 * (1 + math.erf(v / math.sqrt(2)))
                      for v in x.detach().numpy()])
    np.testing.assert_allclose(F.gelu(x).detach().numpy(), exact, atol=1e-7)
    a = x.detach().numpy()
    tanh = 0.5 * a * (1 + np.tanh(np.sqrt(2 / np.pi) * (a + 0.044715 * a ** 3)))
    np.testing.assert_allclose(F.gelu(x, approximate="tanh").detach().numpy(),
                               tanh)
    assert gradcheck(F.gelu, (x,))
    assert gradcheck(lambda x: F.gelu(x, approximate="tanh"), (x,))


def test_dropout():
    dtorch.manual_seed(0)
    x = dtorch.ones(1000, requires_grad=True)
    y = F.dropout(x, 0.3)
    kept = y.detach().numpy() != 0
    assert 0.6 < kept.mean() < 0.8
    np.testing.assert_allclose(y.detach().numpy()[kept], 1 / 0.7, rtol=1e-6)
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), y.detach().numpy())
    assert F.dropout(x, 0.3, training=False) is x
    with pytest.raises(ValueError, match="between 0 and 1"):
        F.dropout(x, 1.5)


def test_pad_modes():
    x = t64(2, 3, 4)
    for mode in ("constant", "reflect", "replicate", "circular"):
        out = F.pad(x, (2, 1, 1, 2), mode=mode)
        np_mode = {"constant": "constant", "reflect": "reflect",
                   "replicate": "edge", "circular": "wrap"}[mode]
        ref = np.pad(x.detach().numpy(), ((0, 0), (1, 2), (2, 1)),
                     mode=np_mode)
        np.testing.assert_allclose(out.detach().numpy(), ref)
        assert gradcheck(lambda x: F.pad(x, (2, 1, 1, 2), mode=mode), (x,))
    assert F.pad(x, (-1, 1)).shape == (2, 3, 4)


# ------------------------------------------------------- recurrences ------

def lstm_composed(xw, h, c, w_hh, b_hh):
    hs = []
    H = h.shape[-1]
    for t in range(xw.shape[0]):
        a = xw[t] + h @ w_hh.t() + b_hh
        i, f = a[:, :H].sigmoid(), a[:, H:2 * H].sigmoid()
        g, o = a[:, 2 * H:3 * H].tanh(), a[:, 3 * H:].sigmoid()
        c = f * c + i * g
        h = o * c.tanh()
        hs.append(h)
    return dtorch.stack(hs), c


def gru_composed(xw, h, w_hh, b_hh):
    hs = []
    H = h.shape[-1]
    for t in range(xw.shape[0]):
        hh = h @ w_hh.t() + b_hh
        x = xw[t]
        r = (x[:, :H] + hh[:, :H]).sigmoid()
        z = (x[:, H:2 * H] + hh[:, H:2 * H]).sigmoid()
        n = (x[:, 2 * H:] + r * hh[:, 2 * H:]).tanh()
        h = (1 - z) * n + z * h
        hs.append(h)
    return dtorch.stack(hs)


def test_lstm_layer_matches_composed_and_gradcheck():
    T, n, H = 4, 2, 3
    xw, h0, c0 = t64(T, n, 4 * H), t64(n, H, seed=1), t64(n, H, seed=2)
    w, b = t64(4 * H, H, seed=3), t64(4 * H, seed=4)
    y = rnn.LSTMLayer.apply(xw, h0, c0, w, b)
    hs, c = lstm_composed(xw, h0, c0, w, b)
    np.testing.assert_allclose(y[:T].detach().numpy(), hs.detach().numpy())
    np.testing.assert_allclose(y[T].detach().numpy(), c.detach().numpy())
    assert gradcheck(lambda *a: rnn.LSTMLayer.apply(*a), (xw, h0, c0, w, b))
    assert gradcheck(lambda *a: rnn.LSTMLayer.apply(*a, reverse=True),
                     (xw, h0, c0, w, b))


def test_gru_and_rnn_layers_gradcheck():
    T, n, H = 4, 2, 3
    xw, h0 = t64(T, n, 3 * H), t64(n, H, seed=1)
    w, b = t64(3 * H, H, seed=3), t64(3 * H, seed=4)
    y = rnn.GRULayer.apply(xw, h0, w, b)
    np.testing.assert_allclose(y[:T].detach().numpy(),
                               gru_composed(xw, h0, w, b).detach().numpy())
    assert gradcheck(lambda *a: rnn.GRULayer.apply(*a), (xw, h0, w, b))
    assert gradcheck(lambda *a: rnn.GRULayer.apply(*a, reverse=True),
                     (xw, h0, w, b))
    xr, wr, br = t64(T, n, H), t64(H, H, seed=5), t64(H, seed=6)
    for act in ("tanh", "relu"):
        assert gradcheck(lambda *a: rnn.RNNLayer.apply(*a, nonlinearity=act),
                         (xr, h0, wr, br))
        assert gradcheck(lambda *a: rnn.RNNLayer.apply(
            *a, reverse=True, nonlinearity=act), (xr, h0, wr, br))


# ------------------------------------------- gradients at boundary values --
# (issue 21 item 3; the full sweep against PyTorch is test_boundary_grads.py)

def test_bce_saturated_sigmoid_trains_without_nan():
    """A float32 sigmoid rounds to exactly 1.0 from about 17: BCELoss's
    gradient must stay finite there (it was 0 / 0 = NaN, and the run
    turned NaN at step 2)."""
    dtorch.manual_seed(0)
    lin = dtorch.nn.Linear(1, 1)
    with dtorch.no_grad():
        lin.weight.fill_(20.0)
        lin.bias.fill_(0.0)
    opt = dtorch.optim.SGD(lin.parameters(), lr=0.1)
    x = dtorch.ones(4, 1)
    target = dtorch.tensor([[1.0], [1.0], [0.0], [1.0]])
    for _ in range(3):
        p = dtorch.sigmoid(lin(x))
        assert p[0].item() == 1.0          # saturated, as in the report
        loss = dtorch.nn.BCELoss()(p, target)
        opt.zero_grad()
        loss.backward()
        assert np.isfinite(lin.weight.grad.numpy()).all()
        opt.step()
        assert np.isfinite(lin.weight.detach().numpy()).all()


def test_bce_gradient_at_exact_0_and_1():
    x = dtorch.tensor([0.0, 1.0, 0.0, 1.0], requires_grad=True)
    t = dtorch.tensor([0.0, 1.0, 1.0, 0.0])
    F.binary_cross_entropy(x, t, reduction="sum").backward()
    # (x - t) / max(x (1 - x), 1e-12): 0 where right, +-1e12 where wrong
    np.testing.assert_allclose(x.grad.numpy(), [0, 0, -1e12, 1e12],
                               rtol=1e-6)


def test_bce_with_logits_zero_logit_gradient():
    """A zero-initialised head gives logits exactly 0: the gradient is
    sigmoid(0) - t (0 for t = 1/2), not the g / 2 that relu'(0) and
    abs'(0) composed to."""
    x = dtorch.zeros(4, requires_grad=True)
    t = dtorch.tensor([0.5, 1.0, 0.0, 0.25])
    F.binary_cross_entropy_with_logits(x, t, reduction="sum").backward()
    np.testing.assert_array_equal(x.grad.numpy(), [0.0, -0.5, 0.5, 0.25])
    x.grad = None
    pw = dtorch.tensor([2.0, 2.0, 2.0, 2.0])
    F.binary_cross_entropy_with_logits(x, t, reduction="sum",
                                       pos_weight=pw).backward()
    # (pw t + 1 - t) sigmoid(x) - pw t
    np.testing.assert_array_equal(x.grad.numpy(),
                                  [-0.25, -1.0, 0.5, 0.125])


def test_softplus_and_logsigmoid_at_zero():
    x = dtorch.zeros(2, requires_grad=True)
    (F.softplus(x) + F.logsigmoid(x)).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [1.0, 1.0])


def test_masked_gradients_ignore_infinite_upstream():
    """A backward that multiplies by a 0/1 mask gives inf * 0 = NaN;
    PyTorch masks (0 there)."""
    x = dtorch.tensor([-1.0, 2.0, 0.5], requires_grad=True)
    up = dtorch.tensor([float("inf"), 1.0, 1.0])
    for f in (F.relu, lambda t: t.clamp(0.0, 1.0), F.relu6, F.hardtanh,
              lambda t: dtorch.maximum(t, dtorch.zeros(3)),
              lambda t: dtorch.where(t > 0, t, dtorch.zeros(3))):
        x.grad = None
        f(x).backward(up)
        assert x.grad[0].item() == 0.0


def test_norm_and_std_gradient_at_zero():
    x = dtorch.zeros(2, 3, requires_grad=True)
    (x.norm(dim=1).sum() + x.std(1).sum() + x.norm()).backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.zeros((2, 3)))
    z = dtorch.zeros(1, 3, requires_grad=True)
    F.normalize(z, dim=1).sum().backward()
    assert np.isfinite(z.grad.numpy()).all()
