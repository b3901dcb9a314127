"""Layers and losses: forward against PyTorch (when installed) with the same
weights, gradcheck in float64, bad-input errors."""
import numpy as np
import pytest

import dtorch
import dtorch as torch
from dtorch import nn
import dtorch.nn.functional as F
from dtorch.autograd import gradcheck


def t64(*shape, seed=0, req=True):
    rng = np.random.default_rng(seed)
    return dtorch.tensor(rng.standard_normal(shape), dtype=dtorch.float64,
                         requires_grad=req)


def check_grad(module, *inputs):
    """gradcheck w.r.t. the inputs and every parameter of a float64 module."""
    module.double()
    params = list(module.parameters())
    n = len(inputs)

    def fn(*args):
        out = module(*args[:n])
        return out[0] if isinstance(out, tuple) else out
    # gradcheck perturbs its inputs' memory in place: the parameters
    # themselves are passed as inputs, so the module sees the perturbation
    assert gradcheck(fn, tuple(inputs) + tuple(params))


def torch_oracle():
    return pytest.importorskip("torch")


def copy_to_torch(dmod, tmod):
    import torch as T
    with T.no_grad():
        for (name, p) in tmod.named_parameters():
            p.copy_(T.tensor(dict(dmod.named_parameters())[name]
                             .detach().numpy()))


def compare(dmod, tmod, *inputs, atol=1e-5):
    import torch as T
    copy_to_torch(dmod, tmod)
    din = [dtorch.tensor(a, requires_grad=True) for a in inputs]
    tin = [T.tensor(a, requires_grad=True) for a in inputs]
    dout = dmod(*din)
    tout = tmod(*tin)
    if isinstance(dout, tuple):
        dout, tout = dout[0], tout[0]
    np.testing.assert_allclose(dout.detach().numpy(),
                               tout.detach().numpy(), atol=atol, rtol=1e-4)
    # gradients of every parameter after the same backward
    dout.sum().backward()
    tout.sum().backward()
    tgrads = dict(tmod.named_parameters())
    for name, p in dmod.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(),
                                   tgrads[name].grad.numpy(),
                                   atol=atol * 10, rtol=1e-3, err_msg=name)
    for a, b in zip(din, tin):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(),
                                   atol=atol * 10, rtol=1e-3)


def rnd(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(
        np.float32)


# ------------------------------------------------------ against PyTorch --

def test_layers_match_pytorch():
    T = torch_oracle()
    tn = T.nn
    cases = [
        (nn.Linear(5, 3), tn.Linear(5, 3), (rnd(4, 5),)),
        (nn.Bilinear(3, 4, 2), tn.Bilinear(3, 4, 2), (rnd(5, 3), rnd(5, 4))),
        (nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2),
         tn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2),
         (rnd(2, 4, 9, 8),)),
        (nn.Conv2d(2, 3, (3, 2), padding="same", dilation=2),
         tn.Conv2d(2, 3, (3, 2), padding="same", dilation=2),
         (rnd(2, 2, 7, 6),)),
        (nn.Conv2d(2, 3, 3, padding=1, padding_mode="reflect"),
         tn.Conv2d(2, 3, 3, padding=1, padding_mode="reflect"),
         (rnd(1, 2, 5, 5),)),
        (nn.Conv1d(3, 4, 3, stride=2, padding=1),
         tn.Conv1d(3, 4, 3, stride=2, padding=1), (rnd(2, 3, 10),)),
        (nn.ConvTranspose2d(4, 2, 3, stride=2, padding=1, output_padding=1),
         tn.ConvTranspose2d(4, 2, 3, stride=2, padding=1, output_padding=1),
         (rnd(2, 4, 5, 4),)),
        (nn.LayerNorm((3, 4)), tn.LayerNorm((3, 4)), (rnd(2, 3, 4),)),
        (nn.BatchNorm2d(3), tn.BatchNorm2d(3), (rnd(4, 3, 2, 2),)),
        (nn.BatchNorm1d(3), tn.BatchNorm1d(3), (rnd(4, 3),)),
        (nn.MaxPool2d(3, 2, 1), tn.MaxPool2d(3, 2, 1), (rnd(2, 2, 7, 7),)),
        (nn.MaxPool2d(2, ceil_mode=True), tn.MaxPool2d(2, ceil_mode=True),
         (rnd(1, 2, 5, 5),)),
        (nn.AvgPool2d(3, 2, 1, count_include_pad=False),
         tn.AvgPool2d(3, 2, 1, count_include_pad=False), (rnd(2, 2, 7, 6),)),
        (nn.AvgPool2d(3, 2, ceil_mode=True),
         tn.AvgPool2d(3, 2, ceil_mode=True), (rnd(1, 2, 6, 6),)),
        (nn.AdaptiveAvgPool2d((3, 5)), tn.AdaptiveAvgPool2d((3, 5)),
         (rnd(2, 2, 7, 9),)),
        (nn.GELU(), tn.GELU(), (rnd(10),)),
        (nn.GELU("tanh"), tn.GELU("tanh"), (rnd(10),)),
        (nn.SiLU(), tn.SiLU(), (rnd(10),)),
        (nn.LeakyReLU(0.2), tn.LeakyReLU(0.2), (rnd(10),)),
        (nn.Softplus(), tn.Softplus(), (rnd(10) * 30,)),
        (nn.ELU(), tn.ELU(), (rnd(10),)),
        (nn.Softmax(1), tn.Softmax(1), (rnd(3, 4),)),
        (nn.LogSoftmax(-1), tn.LogSoftmax(-1), (rnd(3, 4),)),
    ]
    for dmod, tmod, inputs in cases:
        try:
            compare(dmod, tmod, *inputs)
        except AssertionError as e:
            raise AssertionError(f"{dmod}: {e}")


@pytest.mark.parametrize("cls", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("kw", [
    dict(), dict(num_layers=2, bidirectional=True, batch_first=True),
    dict(bias=False)])
def test_recurrent_match_pytorch(cls, kw):
    T = torch_oracle()
    dtorch.manual_seed(0)
    dmod = getattr(nn, cls)(4, 3, **kw)
    tmod = getattr(T.nn, cls)(4, 3, **kw)
    assert [n for n, _ in dmod.named_parameters()] == \
        [n for n, _ in tmod.named_parameters()]
    compare(dmod, tmod, rnd(5, 2, 4))
    # initial states and the final states
    dirs = 2 if kw.get("bidirectional") else 1
    nl = kw.get("num_layers", 1)
    h0 = rnd(nl * dirs, 2 if not kw.get("batch_first") else 5, 3, seed=1)
    x = rnd(5, 2, 4, seed=2)
    if kw.get("batch_first"):
        h0 = rnd(nl * dirs, 5, 3, seed=1)
    hx_d = dtorch.tensor(h0)
    hx_t = T.tensor(h0)
    if cls == "LSTM":
        hx_d = (hx_d, dtorch.tensor(h0 * 0.5))
        hx_t = (hx_t, T.tensor(h0 * 0.5))
    od, hd = dmod(dtorch.tensor(x), hx_d)
    ot, ht = tmod(T.tensor(x), hx_t)
    np.testing.assert_allclose(od.detach().numpy(), ot.detach().numpy(),
                               atol=1e-5)
    if cls == "LSTM":
        for a, b in zip(hd, ht):
            np.testing.assert_allclose(a.detach().numpy(),
                                       b.detach().numpy(), atol=1e-5)
    else:
        np.testing.assert_allclose(hd.detach().numpy(),
                                   ht.detach().numpy(), atol=1e-5)


def test_multihead_attention_matches_pytorch():
    T = torch_oracle()
    for kw in (dict(), dict(batch_first=True), dict(kdim=3, vdim=5)):
        dmod = nn.MultiheadAttention(8, 2, **kw)
        tmod = T.nn.MultiheadAttention(8, 2, **kw)
        assert sorted(dmod.state_dict()) == sorted(tmod.state_dict())
        copy_to_torch(dmod, tmod)
        q = rnd(4, 2, 8)
        k = rnd(6, 2, kw.get("kdim", 8), seed=1)
        v = rnd(6, 2, kw.get("vdim", 8), seed=2)
        if kw.get("batch_first"):
            q, k, v = (np.ascontiguousarray(a.transpose(1, 0, 2))
                       for a in (q, k, v))
        mask = np.zeros((2, 6), bool)
        mask[1, 4:] = True
        am = np.triu(np.ones((4, 6), bool), 3)
        od, wd = dmod(dtorch.tensor(q), dtorch.tensor(k), dtorch.tensor(v),
                      key_padding_mask=dtorch.tensor(mask),
                      attn_mask=dtorch.tensor(am))
        ot, wt = tmod(T.tensor(q), T.tensor(k), T.tensor(v),
                      key_padding_mask=T.tensor(mask),
                      attn_mask=T.tensor(am))
        np.testing.assert_allclose(od.detach().numpy(), ot.detach().numpy(),
                                   atol=1e-5)
        np.testing.assert_allclose(wd.detach().numpy(), wt.detach().numpy(),
                                   atol=1e-5)
    # self-attention (one fused projection)
    dmod = nn.MultiheadAttention(8, 4, batch_first=True)
    tmod = T.nn.MultiheadAttention(8, 4, batch_first=True)
    copy_to_torch(dmod, tmod)
    x = rnd(2, 5, 8)
    od, _ = dmod(*(dtorch.tensor(x),) * 3, need_weights=False)
    ot, _ = tmod(*(T.tensor(x),) * 3, need_weights=False)
    np.testing.assert_allclose(od.detach().numpy(), ot.detach().numpy(),
                               atol=1e-5)


def test_losses_match_pytorch():
    T = torch_oracle()
    tF = T.nn.functional
    x = rnd(6, 5)
    y = rnd(6, 5, seed=1)
    p = 1 / (1 + np.exp(-x))
    t01 = (rnd(6, 5, seed=2) > 0).astype(np.float32)
    idx = np.array([0, 4, 2, 1, 3, -100])
    w = np.abs(rnd(5, seed=3)) + 0.5
    probs = np.exp(y) / np.exp(y).sum(1, keepdims=True)
    d, t = dtorch.tensor, T.tensor
    for red in ("mean", "sum", "none"):
        pairs = [
            (F.mse_loss(d(x), d(y), reduction=red),
             tF.mse_loss(t(x), t(y), reduction=red)),
            (F.l1_loss(d(x), d(y), reduction=red),
             tF.l1_loss(t(x), t(y), reduction=red)),
            (F.smooth_l1_loss(d(x), d(y), reduction=red, beta=0.5),
             tF.smooth_l1_loss(t(x), t(y), reduction=red, beta=0.5)),
            (F.binary_cross_entropy(d(p), d(t01), reduction=red),
             tF.binary_cross_entropy(t(p), t(t01), reduction=red)),
            (F.binary_cross_entropy_with_logits(
                d(x * 20), d(t01), reduction=red, pos_weight=d(w)),
             tF.binary_cross_entropy_with_logits(
                 t(x * 20), t(t01), reduction=red, pos_weight=t(w))),
            (F.cross_entropy(d(x), d(idx), reduction=red),
             tF.cross_entropy(t(x), t(idx), reduction=red)),
            (F.cross_entropy(d(x), d(idx), weight=d(w), reduction=red,
                             label_smoothing=0.1),
             tF.cross_entropy(t(x), t(idx), weight=t(w), reduction=red,
                              label_smoothing=0.1)),
            (F.cross_entropy(d(x), d(idx), reduction=red,
                             label_smoothing=0.2),
             tF.cross_entropy(t(x), t(idx), reduction=red,
                              label_smoothing=0.2)),
            (F.cross_entropy(d(x), d(probs), weight=d(w), reduction=red,
                             label_smoothing=0.1),
             tF.cross_entropy(t(x), t(probs), weight=t(w), reduction=red,
                              label_smoothing=0.1)),
            (F.nll_loss(d(x), d(idx), weight=d(w), reduction=red),
             tF.nll_loss(t(x), t(idx), weight=t(w), reduction=red)),
        ]
        for i, (a, b) in enumerate(pairs):
            np.testing.assert_allclose(a.detach().numpy(), b.numpy(),
                                       rtol=1e-5, atol=1e-6,
                                       err_msg=f"{red} case {i}")
    # spatial cross entropy (N, C, d1, d2)
    x4 = rnd(2, 3, 4, 5)
    t4 = np.random.default_rng(0).integers(0, 3, (2, 4, 5))
    np.testing.assert_allclose(
        F.cross_entropy(d(x4), d(t4)).item(),
        tF.cross_entropy(t(x4), t(t4)).item(), rtol=1e-5)


# --------------------------------------------------------- gradchecks --

def test_layer_gradchecks():
    dtorch.manual_seed(0)
    check_grad(nn.Linear(3, 2), t64(4, 3))
    check_grad(nn.Bilinear(2, 3, 2), t64(3, 2), t64(3, 3, seed=1))
    check_grad(nn.Conv2d(2, 2, 2, stride=1, padding=1), t64(1, 2, 3, 3))
    check_grad(nn.Conv1d(2, 2, 2, padding="same"), t64(1, 2, 4))
    check_grad(nn.ConvTranspose2d(2, 2, 2, stride=2), t64(1, 2, 2, 2))
    check_grad(nn.LayerNorm(3), t64(2, 3))
    check_grad(nn.BatchNorm1d(3), t64(4, 3))
    check_grad(nn.Embedding(4, 2),
               dtorch.tensor([[0, 1], [3, 1]]))
    check_grad(nn.MultiheadAttention(4, 2, batch_first=True),
               t64(1, 3, 4), t64(1, 2, 4, seed=1), t64(1, 2, 4, seed=2))


@pytest.mark.parametrize("cls", ["LSTM", "GRU", "RNN"])
def test_recurrent_gradcheck(cls):
    dtorch.manual_seed(0)
    m = getattr(nn, cls)(2, 2, num_layers=2, bidirectional=True,
                         batch_first=True)
    check_grad(m, t64(2, 3, 2))


def test_cell_modules():
    dtorch.manual_seed(0)
    T = pytest.importorskip("torch")
    for name in ("LSTMCell", "GRUCell", "RNNCell"):
        dm = getattr(nn, name)(3, 4)
        tm = getattr(T.nn, name)(3, 4)
        copy_to_torch(dm, tm)
        x = rnd(2, 3)
        a = dm(dtorch.tensor(x))
        b = tm(T.tensor(x))
        if isinstance(a, tuple):
            a, b = a[1], b[1]
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(),
                                   atol=1e-6)


def test_loss_gradchecks():
    x = t64(4, 3)
    y = t64(4, 3, seed=1, req=False)
    idx = dtorch.tensor([0, 2, 1, 2])
    pr = dtorch.tensor(np.random.default_rng(0).dirichlet(np.ones(3), 4))
    t01 = dtorch.tensor((np.random.default_rng(1).random((4, 3)) > 0.5)
                        .astype(np.float64))
    w = dtorch.tensor([1.0, 2.0, 0.5], dtype=dtorch.float64)
    fns = [
        lambda x: nn.MSELoss()(x, y), lambda x: nn.L1Loss()(x, y),
        lambda x: nn.SmoothL1Loss()(x, y),
        lambda x: nn.CrossEntropyLoss(weight=w, label_smoothing=0.1)(x, idx),
        lambda x: nn.CrossEntropyLoss()(x, pr),
        lambda x: nn.NLLLoss(reduction="sum")(x, idx),
        lambda x: nn.BCELoss()(x.sigmoid(), t01),
        lambda x: nn.BCEWithLogitsLoss(pos_weight=w)(x, t01),
        lambda x: F.softplus(x).sum() + F.silu(x).sum() + F.elu(x).sum(),
        lambda x: F.normalize(x, dim=1),
        lambda x: F.scaled_dot_product_attention(x[None], x[None], x[None],
                                                 is_causal=True),
    ]
    for f in fns:
        assert gradcheck(f, (x,))


# ---------------------------------------------------------- behaviour --

def test_batchnorm_running_stats_and_eval():
    bn = nn.BatchNorm2d(2, momentum=0.5)
    x = dtorch.tensor(rnd(8, 2, 3, 3))
    bn(x)
    a = x.numpy()
    np.testing.assert_allclose(bn.running_mean.numpy(),
                               0.5 * a.mean((0, 2, 3)), rtol=1e-5)
    np.testing.assert_allclose(bn.running_var.numpy(),
                               0.5 + 0.5 * a.var((0, 2, 3), ddof=1),
                               rtol=1e-5)
    assert bn.num_batches_tracked.item() == 1
    bn.eval()
    out = bn(x).detach().numpy()
    ref = (a - bn.running_mean.numpy()[None, :, None, None]) / np.sqrt(
        bn.running_var.numpy()[None, :, None, None] + 1e-5)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
    cma = nn.BatchNorm1d(2, momentum=None)
    cma(dtorch.tensor(rnd(4, 2)))
    cma(dtorch.tensor(rnd(4, 2, seed=1)))
    m = (rnd(4, 2).mean(0) + rnd(4, 2, seed=1).mean(0)) / 2
    np.testing.assert_allclose(cma.running_mean.numpy(), m, rtol=1e-5)
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        nn.BatchNorm1d(2)(dtorch.ones(1, 2))
    with pytest.raises(ValueError, match="expected 4D input"):
        nn.BatchNorm2d(2)(dtorch.ones(2, 2))


def test_dropout_module_and_embedding_padding():
    d = nn.Dropout(0.5)
    x = dtorch.ones(100)
    assert (d(x).numpy() == 0).any()
    d.eval()
    assert d(x) is x
    e = nn.Embedding(5, 2, padding_idx=0)
    out = e(dtorch.tensor([0, 0, 1]))
    out.sum().backward()
    assert e.weight.grad[0].abs().sum().item() == 0
    assert e.weight.grad[1].sum().item() == 2


def test_flatten_unflatten_identity_and_shapes():
    x = dtorch.randn(2, 3, 4, 5)
    assert nn.Flatten()(x).shape == (2, 60)
    assert nn.Flatten(0, 2)(x).shape == (24, 5)
    assert nn.Unflatten(1, (3, 20))(nn.Flatten()(x)).shape == (2, 3, 20)
    assert nn.Identity(54, unused="x")(x) is x
    assert F.one_hot(dtorch.tensor([0, 2, 1])).tolist() == \
        [[1, 0, 0], [0, 0, 1], [0, 1, 0]]
    assert F.one_hot(dtorch.tensor([1]), 4).shape == (1, 4)


def test_bad_inputs_give_pytorch_errors():
    conv = nn.Conv2d(1, 32, 3)
    with pytest.raises(RuntimeError) as e:
        conv(dtorch.randn(2, 28, 28, 1, 1))
    assert str(e.value) == ("Expected 3D (unbatched) or 4D (batched) input "
                            "to conv2d, but got input of size: "
                            "[2, 28, 28, 1, 1]")
    with pytest.raises(RuntimeError, match=r"expected input\[4, 3, 8, 8\] "
                       r"to have 1 channels, but got 3 channels instead"):
        conv(dtorch.randn(4, 3, 8, 8))
    assert conv(dtorch.randn(1, 5, 5)).shape == (32, 3, 3)     # unbatched
    with pytest.raises(RuntimeError, match="Kernel size can't be greater"):
        conv(dtorch.randn(1, 1, 2, 2))
    with pytest.raises(IndexError,
                       match=r"Target 7 is out of bounds.*5 classes"):
        nn.CrossEntropyLoss()(dtorch.randn(3, 5), dtorch.tensor([1, 7, 0]))
    with pytest.raises(IndexError, match="Target -3 is out of bounds"):
        F.nll_loss(dtorch.randn(3, 5), dtorch.tensor([1, -3, 0]))
    with pytest.raises(ValueError, match="Expected input batch_size"):
        F.cross_entropy(dtorch.randn(3, 5), dtorch.tensor([1, 2]))
    with pytest.raises(RuntimeError, match="mat1 and mat2 shapes cannot be "
                       r"multiplied \(4x3 and 5x2\)"):
        nn.Linear(5, 2)(dtorch.randn(4, 3))
    with pytest.raises(ValueError, match="is not a valid value for "
                       "reduction"):
        F.mse_loss(dtorch.ones(2), dtorch.ones(2), reduction="avg")
    with pytest.raises(ValueError, match="padding='same' is not supported "
                       "for strided convolutions"):
        nn.Conv2d(1, 1, 3, stride=2, padding="same")
    with pytest.raises(RuntimeError, match="all elements of input should "
                       "be between 0 and 1"):
        F.binary_cross_entropy(dtorch.tensor([1.5]), dtorch.tensor([1.0]))
    with pytest.raises(RuntimeError, match="Given normalized_shape=.3."):
        nn.LayerNorm(3)(dtorch.ones(2, 4))
    with pytest.raises(ValueError, match="LSTM: Expected input to be 2D or "
                       "3D, got 4D instead"):
        nn.LSTM(2, 2)(dtorch.ones(1, 1, 1, 2))
    with pytest.raises(RuntimeError, match=r"Expected hidden size \(1, 3, 2\)"):
        nn.GRU(2, 2)(dtorch.ones(4, 3, 2), dtorch.zeros(2, 3, 2))


@pytest.mark.parametrize("mode", ["RNN", "LSTM", "GRU"])
@pytest.mark.parametrize("batch_first,shape", [(False, (0, 2, 3)),
                                               (False, (0, 3)),
                                               (True, (2, 0, 3))])
def test_rnn_refuses_an_empty_sequence_as_pytorch(mode, batch_first, shape):
    m = getattr(nn, mode)(3, 4, batch_first=batch_first)
    with pytest.raises(RuntimeError, match="sequence length to be larger "
                                           "than 0"):
        m(dtorch.zeros(shape))
