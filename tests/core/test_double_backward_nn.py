"""Double backward (create_graph=True) through the nn primitives.

Every op family with a ``backward_graph`` is gradgradchecked in float64
(second derivatives against finite differences of the first ones, the
output gradient a differentiable input too), at points away from kinks.
Then the programs that need it, against PyTorch with the same weights: a
WGAN-GP critic step and an R1 penalty (conv discriminators with
LeakyReLU / LayerNorm / softplus), a MAML inner + outer step (conv,
training-mode BatchNorm, ReLU, max / avg pool, cross_entropy) and a
Hessian-vector product (tanh, softplus, mse). An op without a
differentiable backward raises, naming it, when differentiated twice.
Shapes are tiny: gradgradcheck perturbs every element.
"""
import numpy as np
import pytest

import dtorch
import dtorch.nn.functional as F
from dtorch.autograd import gradgradcheck as _gradgradcheck

D = dtorch.float64


def gradgradcheck(f, inputs):
    """autograd.gradgradcheck, and the first-order gradients that
    create_graph=True gives equal to the plain ones (gradgradcheck alone
    would accept a backward_graph that differentiates the wrong function
    consistently)."""
    assert _gradgradcheck(f, inputs)
    ins = [t for t in inputs if t.requires_grad]
    for create in (False, True):
        outs = f(*inputs)
        outs = list(outs) if isinstance(outs, tuple) else [outs]
        gos = [dtorch.ones_like(o) + dtorch.arange(o.numel(), dtype=D
                                                   ).reshape(o.shape) / 7
               for o in outs]
        gs = dtorch.autograd.grad(outs, ins, gos, create_graph=create)
        if not create:
            plain = [g.numpy() for g in gs]
    for a, b in zip(plain, gs):
        np.testing.assert_allclose(b.detach().numpy(), a, rtol=1e-12,
                                   atol=1e-12)
    return True


def R(*shape, seed=0, scale=1.0, shift=0.0):
    """A float64 leaf with values away from 0 (kinks of relu-like ops)."""
    rng = np.random.default_rng(seed + sum(shape))
    a = rng.standard_normal(shape) * scale
    a = np.where(np.abs(a) < 0.05, 0.3, a) + shift
    return dtorch.tensor(a, dtype=D, requires_grad=True)


def _sq(t):
    # a non-linear input: the op's own second derivative is then not all
    # that the check sees (x * x couples the two orders)
    return t * t


# ------------------------------------------------------------ activations --

ACTS = {
    "softmax": lambda t: F.softmax(t, 1),
    "softmax0": lambda t: F.softmax(t, 0),
    "log_softmax": lambda t: F.log_softmax(t, 1),
    "gelu": F.gelu,
    "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
    "leaky_relu": lambda t: F.leaky_relu(t, 0.2),
    "elu": F.elu,
    "selu": F.selu,
    "celu": lambda t: F.celu(t, 0.7),
    "hardswish": lambda t: F.hardswish(t * 2.5),
    "hardsigmoid": lambda t: F.hardsigmoid(t * 2.5),
    "hardshrink": lambda t: F.hardshrink(t, 0.2),
    "softshrink": lambda t: F.softshrink(t, 0.2),
    "threshold": lambda t: F.threshold(t, 0.1, 2.0),
    "softplus": F.softplus,
    "softplus_beta_threshold": lambda t: F.softplus(t, beta=2.0,
                                                    threshold=1.0),
    "silu": F.silu,
    "mish": F.mish,
    "logsigmoid": F.logsigmoid,
    "tanh": dtorch.tanh,
    "sigmoid": dtorch.sigmoid,
}


@pytest.mark.parametrize("name", sorted(ACTS))
def test_activation_gradgrad(name):
    f = ACTS[name]
    x = R(3, 4, seed=1)
    assert gradgradcheck(f, (x,))
    assert gradgradcheck(lambda t: f(_sq(t)), (R(2, 3, seed=2),))


@pytest.mark.parametrize("wshape", [(1,), (3,)])
def test_prelu_gradgrad(wshape):
    x = R(2, 3, 2, seed=3)
    w = R(*wshape, seed=4, scale=0.3)
    assert gradgradcheck(lambda a, b: F.prelu(_sq(a) - 1, b), (x, w))


# ------------------------------------------------------------------ losses --

@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_nll_gradgrad(reduction):
    x = R(4, 3, seed=5)
    t = dtorch.tensor([1, 0, 2, 2])
    assert gradgradcheck(lambda a: F.cross_entropy(a, t, reduction=reduction),
                         (x,))
    assert gradgradcheck(lambda a: F.nll_loss(F.log_softmax(a, 1), t,
                                              reduction=reduction), (x,))
    # spatial targets, class weights, an ignored target
    x4 = R(2, 3, 2, 1, seed=6)
    t4 = dtorch.tensor([[[0], [2]], [[-100], [1]]])
    w = dtorch.tensor([0.5, 1.0, 2.0], dtype=D)
    assert gradgradcheck(lambda a: F.cross_entropy(
        a, t4, weight=w, reduction=reduction), (x4,))


def test_cross_entropy_label_smoothing_gradgrad():
    x = R(3, 4, seed=7)
    t = dtorch.tensor([3, 0, 1])
    assert gradgradcheck(lambda a: F.cross_entropy(a, t, label_smoothing=0.1),
                         (x,))


@pytest.mark.parametrize("p", [1, 2])
def test_multi_margin_gradgrad(p):
    x = R(3, 5, seed=19)
    t = dtorch.tensor([0, 3, 1])
    w = dtorch.tensor([0.5, 1.0, 2.0, 1.5, 0.7], dtype=D)
    assert gradgradcheck(lambda a: F.multi_margin_loss(
        _sq(a), t, p=p, margin=0.8), (x,))
    assert gradgradcheck(lambda a: F.multi_margin_loss(
        _sq(a), t, p=p, weight=w, reduction="sum"), (x,))


def test_binary_losses_gradgrad():
    x, q = R(3, 2, seed=8), dtorch.rand(3, 2, dtype=D).requires_grad_()
    p = (dtorch.rand(3, 2, dtype=D) * 0.8 + 0.1).requires_grad_()
    w = dtorch.tensor([0.7, 1.5], dtype=D)
    assert gradgradcheck(lambda a, b: F.binary_cross_entropy_with_logits(
        a, b), (x, q))
    assert gradgradcheck(lambda a, b: F.binary_cross_entropy_with_logits(
        a, b, weight=w, pos_weight=w * 2, reduction="sum"), (x, q))
    assert gradgradcheck(lambda a, b: F.binary_cross_entropy(a, b, weight=w),
                         (p, q))
    t = dtorch.tensor([[1.0, -1.0], [-1.0, 1.0], [1.0, 1.0]], dtype=D)
    assert gradgradcheck(lambda a: F.soft_margin_loss(a, t), (x,))


@pytest.mark.filterwarnings("ignore:Using a target size")
def test_regression_losses_gradgrad():
    x, y = R(3, 4, seed=9), R(3, 4, seed=10)
    for f in (lambda a, b: F.smooth_l1_loss(a, b, beta=0.5),
              lambda a, b: F.huber_loss(a, b, delta=0.7),
              lambda a, b: F.mse_loss(a, b), lambda a, b: F.l1_loss(a, b)):
        assert gradgradcheck(f, (x, y))
    # only one side differentiable, and a target broadcast against x
    yc = y.detach()
    assert gradgradcheck(lambda a: F.smooth_l1_loss(a, yc, beta=0.5), (x,))
    assert gradgradcheck(lambda b: F.huber_loss(x.detach(), b), (y,))
    # broadcast operands
    assert gradgradcheck(lambda a, b: F.smooth_l1_loss(a, b, beta=0.5),
                         (x, R(4, seed=11)))
    assert gradgradcheck(lambda a, b: F.huber_loss(a, b), (x, R(3, 1,
                                                              seed=12)))


# ------------------------------------------------------------------- norms --

def test_norms_gradgrad():
    x = R(3, 2, 4, seed=12)
    w, b = R(4, seed=13), R(4, seed=14)
    wc, bc = R(2, seed=15), R(2, seed=16)
    assert gradgradcheck(lambda a, w, b: F.layer_norm(a, (4,), w, b),
                         (x, w, b))
    assert gradgradcheck(lambda a: F.layer_norm(_sq(a), (2, 4)), (x,))
    assert gradgradcheck(lambda a, w, b: F.batch_norm(
        a, None, None, w, b, training=True), (x, wc, bc))
    x4 = R(2, 2, 2, 3, seed=17)
    assert gradgradcheck(lambda a: F.batch_norm(_sq(a), None, None,
                                                training=True), (x4,))
    assert gradgradcheck(lambda a: F.group_norm(a, 2), (x4,))
    assert gradgradcheck(lambda a: F.instance_norm(a), (x4,))


def test_dropout_gradgrad():
    x = R(3, 4, seed=18)

    def f(a):
        dtorch.manual_seed(3)       # the same mask at every evaluation
        return F.dropout(_sq(a), 0.4, training=True)
    assert gradgradcheck(f, (x,))


# ------------------------------------------------------------ conv / pool --

CONVS = [
    # x, w, kwargs: plain padded, strided + grouped + asymmetric padding,
    # dilated; the last takes the channels-last path (C*KH*KW >= 128)
    ((1, 2, 4, 3), (2, 2, 3, 3), dict(padding=1)),
    ((1, 4, 5, 4), (2, 2, 3, 2), dict(stride=2, padding=(1, 0), groups=2)),
    ((1, 1, 5, 5), (2, 1, 2, 2), dict(stride=(2, 1), dilation=(1, 2))),
    ((1, 16, 3, 3), (1, 16, 3, 3), dict(padding=1, stride=2)),
]


@pytest.mark.parametrize("i", range(len(CONVS)))
def test_conv2d_gradgrad(i):
    xs, ws, kw = CONVS[i]
    x, w, b = R(*xs, seed=20 + i), R(*ws, seed=30 + i), R(ws[0], seed=40)
    assert gradgradcheck(lambda x, w, b: F.conv2d(x, w, b, **kw), (x, w, b))


def test_conv_transpose2d_gradgrad():
    x, w, b = R(1, 2, 2, 3, seed=50), R(2, 2, 3, 2, seed=51), R(2, seed=52)
    assert gradgradcheck(lambda x, w, b: F.conv_transpose2d(
        x, w, b, stride=2, padding=1, output_padding=1), (x, w, b))
    # output_padding >= stride (allowed below the dilation)
    assert gradgradcheck(lambda x, w, b: F.conv_transpose2d(
        x, w, b, stride=2, dilation=3, output_padding=2, padding=1),
        (x, w, b))
    w2 = R(2, 1, 2, 2, seed=53)
    assert gradgradcheck(lambda x, w: F.conv_transpose2d(
        x, w, groups=2, padding=(0, 1)), (x, w2))


def test_conv2d_third_order():
    # the weight-gradient op is differentiable again: d/dx, d/dw of a
    # gradient's gradient
    x, w = R(1, 1, 3, 3, seed=54), R(2, 1, 2, 2, seed=55)

    def f(x, w):
        y = F.conv2d(x, w, padding=1).tanh().sum()
        gx, = dtorch.autograd.grad(y, x, create_graph=True)
        return gx
    assert gradgradcheck(f, (x, w))


POOLS = {
    "max2x2": lambda t: F.max_pool2d(t, 2),     # the 2x2 pairs path
    "max_tiled": lambda t: F.max_pool2d(t, (1, 3)),
    "max_overlap_pad": lambda t: F.max_pool2d(t, 3, stride=1, padding=1),
    "max_dilated": lambda t: F.max_pool2d(t, 2, stride=1, dilation=2),
    "max_ceil": lambda t: F.max_pool2d(t, 3, stride=2, ceil_mode=True),
    "avg2x2": lambda t: F.avg_pool2d(t, 2),
    "avg_pad": lambda t: F.avg_pool2d(t, 3, stride=2, padding=1),
    "avg_pad_excl": lambda t: F.avg_pool2d(t, 3, stride=2, padding=1,
                                           count_include_pad=False),
    "avg_ceil": lambda t: F.avg_pool2d(t, 3, stride=2, ceil_mode=True),
}


@pytest.mark.parametrize("name", sorted(POOLS))
def test_pool_gradgrad(name):
    x = R(1, 2, 4, 6, seed=60)
    assert gradgradcheck(lambda t: POOLS[name](_sq(t)), (x,))


@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate",
                                  "circular"])
def test_pad_gradgrad(mode):
    x = R(1, 2, 3, 4, seed=65)
    assert gradgradcheck(lambda a: F.pad(_sq(a), (1, 2, 2, 1), mode=mode),
                         (x,))


# -------------------------------------------------- indexing / selection --

def test_indexing_gradgrad():
    y = R(3, 4, seed=70)
    idx = dtorch.tensor([2, 0, 2])
    mask = y.detach() > 0
    for f in (lambda a: _sq(a)[idx], lambda a: _sq(a)[1:, ::2],
              lambda a: _sq(a)[mask],
              lambda a: _sq(a)[idx, dtorch.tensor([1, 1, 3])],
              lambda a: _sq(a)[:, None, 2]):
        assert gradgradcheck(f, (y,))

    def setitem(a, v):
        b = a * 1.0
        b[1:, 2] = _sq(v)
        return _sq(b)
    assert gradgradcheck(setitem, (y, R(2, seed=71)))


def test_embedding_gradgrad():
    w = R(5, 3, seed=72)
    ids = dtorch.tensor([[1, 4, 1], [0, 1, 2]])
    assert gradgradcheck(lambda w: F.embedding(ids, _sq(w), padding_idx=2),
                         (w,))
    assert gradgradcheck(lambda w: F.embedding(ids, _sq(w),
                                               scale_grad_by_freq=True), (w,))


def test_gather_scatter_gradgrad():
    y = R(3, 4, seed=73)
    gi = dtorch.tensor([[0, 1, 1, 3], [2, 2, 0, 1], [3, 3, 3, 3]])
    ii = dtorch.tensor([2, 0, 2, 1])
    cases = [
        ((y,), lambda a: _sq(a).gather(1, gi)),
        ((y,), lambda a: _sq(a).gather(0, gi[:2, :3])),
        ((y, R(3, 2, seed=74)),
         lambda a, s: _sq(a).scatter(1, gi[:, :2], _sq(s))),
        ((y, R(3, 4, seed=75)),
         lambda a, s: _sq(a).scatter_add(1, gi, _sq(s))),
        # src larger than the index: zeros where it was not read
        ((y, R(3, 4, seed=79)),
         lambda a, s: _sq(a).scatter(1, gi[:2, :2], _sq(s))),
        ((y,), lambda a: _sq(a).index_select(1, ii)),
        ((y, R(3, 4, seed=76)),
         lambda a, s: _sq(a).index_add(1, ii, _sq(s), alpha=2.0)),
        ((y, R(2, 4, seed=77)),
         lambda a, s: _sq(a).index_copy(0, dtorch.tensor([2, 0]), _sq(s))),
    ]
    for inputs, f in cases:
        assert gradgradcheck(f, inputs)


def test_selection_scan_gradgrad():
    y = R(3, 4, seed=78)
    for f in (lambda a: a.logcumsumexp(1), lambda a: _sq(a).logcumsumexp(0),
              lambda a: _sq(a).tril(1), lambda a: _sq(a).triu(),
              lambda a: _sq(a).cumsum(1), lambda a: _sq(a).cumprod(0),
              lambda a: _sq(a).cummax(1)[0], lambda a: _sq(a).sort(1)[0],
              lambda a: _sq(a).topk(2)[0], lambda a: _sq(a).max(1)[0]):
        assert gradgradcheck(f, (y,))


@pytest.mark.parametrize("dim", [0, 1])
def test_cumprod_with_zeros_gradgrad(dim):
    # zeros: recomputed as a running product (out / x is undefined)
    a = np.random.default_rng(7).standard_normal((3, 4))
    a[0, 1] = a[1, 3] = a[1, 0] = 0.0
    y = dtorch.tensor(a, requires_grad=True)
    assert gradgradcheck(lambda t: t.cumprod(dim), (y,))


def test_einsum_gradgrad():
    a, b, c = R(2, 2, 3, seed=80), R(2, 3, 2, seed=81), R(2, seed=82)
    assert gradgradcheck(lambda a, b: dtorch.einsum("bij,bjk->bik", a, b),
                         (a, b))
    assert gradgradcheck(lambda a, b, c: dtorch.einsum("bij,bjk,k->i", a, b,
                                                       c), (a, b, c))
    assert gradgradcheck(lambda a: dtorch.einsum("bij->j", _sq(a)), (a,))
    # repeated letters (diagonals, a trace) and a 0-d operand
    m, v = R(3, 3, seed=83), R(3, seed=84)
    assert gradgradcheck(lambda m: dtorch.einsum("ii->i", _sq(m)), (m,))
    assert gradgradcheck(lambda m, v: dtorch.einsum("ii,i->", _sq(m), v),
                         (m, v))
    assert gradgradcheck(lambda a: dtorch.einsum("iij->ij", _sq(a)),
                         (R(2, 2, 3, seed=85),))
    s0 = dtorch.tensor(0.7, dtype=D, requires_grad=True)
    assert gradgradcheck(lambda s, v: dtorch.einsum(",i->i", s, v), (s0, v))


def test_einsum_0d_operand_gradient_shape():
    # ascontiguousarray made a 0-d operand's gradient 1-d (first order)
    s0 = dtorch.tensor(2.0, requires_grad=True)
    dtorch.einsum(",i->i", s0, dtorch.ones(3)).sum().backward()
    assert s0.grad.shape == ()
    assert float(s0.grad) == 3.0


# ---------------------------------------------------- recurrent layers --

RNNS = ["RNN", "RNN_relu", "LSTM", "GRU"]


def _rnn(M, kind, **kw):
    if kind == "RNN_relu":
        return M.nn.RNN(2, 2, nonlinearity="relu", **kw).double()
    return getattr(M.nn, kind)(2, 2, **kw).double()


@pytest.mark.parametrize("kind", RNNS)
def test_rnn_layer_gradgrad(kind):
    # by recomputation (ops/recompute.py): input and initial state here,
    # the weights against PyTorch below
    dtorch.manual_seed(0)
    m = _rnn(dtorch, kind)
    x, h0 = R(2, 1, 2, seed=100), R(1, 1, 2, seed=101, shift=0.5)
    if kind == "LSTM":
        def f(x, h0):
            y, (h, c) = m(x, (h0, h0 * 0.5))
            return y, c
    else:
        def f(x, h0):
            return m(x, h0)[0]
    assert gradgradcheck(f, (x, h0))


def test_lstm_third_order():
    dtorch.manual_seed(1)
    m = _rnn(dtorch, "LSTM")
    x = R(2, 1, 2, seed=102)

    def f(x):
        g, = dtorch.autograd.grad(m(x)[0].tanh().sum(), x,
                                  create_graph=True)
        return g
    assert gradgradcheck(f, (x,))


@pytest.mark.parametrize("kind", RNNS)
def test_rnn_gradient_penalty_matches_torch(kind):
    torch.manual_seed(2)
    tm = _rnn(torch, kind, num_layers=2, bidirectional=True)
    dm = _rnn(dtorch, kind, num_layers=2, bidirectional=True)
    _same_weights(dm, tm)
    x0 = np.random.default_rng(5).standard_normal((3, 2, 2))

    def step(M, model):
        x = M.tensor(x0).requires_grad_(True)
        y = model(x)[0]
        g, = M.autograd.grad(y.pow(2).sum(), x, create_graph=True)
        loss = y.mean() + (g.pow(2).sum() - 1) ** 2
        loss.backward()
        return loss.item()

    assert abs(step(dtorch, dm) - step(torch, tm)) < 1e-10
    _close_grads(dm, tm)


# ------------------------------------- piecewise ops: zeros, not None --

PIECEWISE = {
    "leaky_relu": lambda t: F.leaky_relu(t, 0.1),
    "hardsigmoid": F.hardsigmoid,
    "threshold": lambda t: F.threshold(t, 0.1, 2.0),
    "hardshrink": F.hardshrink,
    "prelu": lambda t: F.prelu(t, dtorch.tensor([0.1], dtype=D)),
    "max_pool2d": lambda t: F.max_pool2d(t, 2),
    "max_pool2d_pad": lambda t: F.max_pool2d(t, 3, 1, 1),
    "avg_pool2d": lambda t: F.avg_pool2d(t, 2),
    "nll_loss": lambda t: F.nll_loss(t.reshape(2, -1),
                                     dtorch.tensor([1, 0])),
}


@pytest.mark.parametrize("name", sorted(PIECEWISE))
def test_piecewise_second_derivative_is_zero_not_none(name):
    # PyTorch connects a piecewise-linear op's gradient to the op's input
    # with a zero derivative: a bias before it gets a zero .grad, not None
    # (an optimizer then steps it, as in an R1 penalty-only step)
    b = dtorch.tensor([0.3, -0.2], dtype=D, requires_grad=True)
    x = R(2, 2, 4, 4, seed=95)
    y = PIECEWISE[name](x + b.reshape(1, 2, 1, 1))
    g, = dtorch.autograd.grad((y * y.detach()).sum(), x, create_graph=True)
    assert g.requires_grad
    (g * g.detach()).sum().backward()
    assert b.grad is not None
    np.testing.assert_array_equal(b.grad.numpy(), 0.0)


# ------------------------------------------ not covered: a named error --

def test_uncovered_op_raises_named_error():
    # CTC loss has no backward_graph
    lp = R(4, 2, 3, seed=90)
    tg = dtorch.tensor([[1, 2], [1, 1]])
    n4, n2 = dtorch.tensor([4, 4]), dtorch.tensor([2, 1])

    def loss(a):
        return F.ctc_loss(F.log_softmax(a, 2), tg, n4, n2)
    g, = dtorch.autograd.grad(loss(lp), lp, create_graph=True)
    # the first order is right ...
    g1, = dtorch.autograd.grad(loss(lp), lp)
    np.testing.assert_allclose(g.detach().numpy(), g1.numpy())
    # ... and differentiating it again names the op
    with pytest.raises(RuntimeError, match="CTCLoss"):
        (g * g).sum().backward()
    # logcumsumexp over a slice that spans more than float64's exponent
    # range: its one backward body (itself made of logcumsumexp) is
    # differentiable there too, as PyTorch's
    m = dtorch.tensor([[-2000.0, 0.0, 1.0]], dtype=D, requires_grad=True)
    g, = dtorch.autograd.grad(m.logcumsumexp(1).sum(), m, create_graph=True)
    g1, = dtorch.autograd.grad(m.logcumsumexp(1).sum(), m)
    assert g.detach().numpy().tobytes() == g1.numpy().tobytes()
    h, = dtorch.autograd.grad((g * g).sum(), m)
    mt = torch.tensor([[-2000.0, 0.0, 1.0]], dtype=torch.float64,
                      requires_grad=True)
    gt, = torch.autograd.grad(mt.logcumsumexp(1).sum(), mt,
                              create_graph=True)
    ht, = torch.autograd.grad((gt * gt).sum(), mt)
    np.testing.assert_allclose(h.numpy(), ht.numpy(), rtol=1e-12,
                               atol=1e-15)


# ------------------------------------------------ programs vs PyTorch --

torch = pytest.importorskip("torch")


def _same_weights(dmodel, tmodel):
    dmodel.load_state_dict({k: dtorch.tensor(v.detach().numpy())
                            for k, v in tmodel.state_dict().items()})


def _close_grads(dmodel, tmodel, tol=1e-10):
    for (n, p), (_, q) in zip(dmodel.named_parameters(),
                              tmodel.named_parameters()):
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(),
                                   rtol=tol, atol=tol, err_msg=n)


def _critic(M, norm):
    nn = M.nn
    layers = [nn.Conv2d(1, 16, 3, stride=2, padding=1), nn.LeakyReLU(0.2),
              # 16 * 3 * 3 >= 128: dtorch's channels-last conv path
              nn.Conv2d(16, 4, 3, stride=2, padding=1)]
    if norm:
        layers.append(nn.LayerNorm([4, 2, 2]))
    layers += [nn.LeakyReLU(0.2), nn.Flatten(), nn.Linear(16, 1)]
    return nn.Sequential(*layers).double()


@pytest.mark.parametrize("norm", [False, True])
def test_wgan_gp_step_matches_torch(norm):
    torch.manual_seed(0)
    tm, dm = _critic(torch, norm), _critic(dtorch, norm)
    _same_weights(dm, tm)
    rng = np.random.default_rng(1)
    real, fake = rng.standard_normal((2, 3, 1, 8, 8))
    alpha = rng.random((3, 1, 1, 1))

    def step(M, model):
        r, f = M.tensor(real), M.tensor(fake)
        x = (M.tensor(alpha) * r + (1 - M.tensor(alpha)) * f)
        x.requires_grad_(True)
        d = model(x)
        g, = M.autograd.grad(d, x, grad_outputs=M.ones_like(d),
                             create_graph=True)
        gp = ((g.reshape(3, -1).norm(2, dim=1) - 1) ** 2).mean()
        loss = model(f).mean() - model(r).mean() + 10 * gp
        loss.backward()
        return loss.item()

    assert abs(step(dtorch, dm) - step(torch, tm)) < 1e-10
    _close_grads(dm, tm)


def test_r1_penalty_matches_torch():
    def disc(M):
        nn = M.nn
        return nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.Softplus(),
                             nn.AvgPool2d(2), nn.Conv2d(3, 2, 2),
                             nn.SiLU(), nn.Flatten(),
                             nn.Linear(2, 1)).double()
    torch.manual_seed(1)
    tm, dm = disc(torch), disc(dtorch)
    _same_weights(dm, tm)
    real = np.random.default_rng(2).standard_normal((2, 2, 4, 4))

    def step(M, model):
        x = M.tensor(real).requires_grad_(True)
        out = model(x)
        g, = M.autograd.grad(out.sum(), x, create_graph=True)
        loss = M.nn.functional.softplus(-out).mean() + \
            5.0 * g.pow(2).reshape(2, -1).sum(1).mean()
        loss.backward()
        return loss.item()

    assert abs(step(dtorch, dm) - step(torch, tm)) < 1e-10
    _close_grads(dm, tm)


def _maml_forward(M, p, x):
    F_ = M.nn.functional
    h = F_.conv2d(x, p[0], p[1], padding=1)
    h = F_.batch_norm(h, None, None, p[2], p[3], training=True)
    h = F_.max_pool2d(F_.relu(h), 2)
    h = F_.avg_pool2d(h, 2)
    return F_.linear(h.flatten(1), p[4], p[5])


def test_maml_step_matches_torch():
    rng = np.random.default_rng(3)
    init = [rng.standard_normal(s) * 0.5 for s in
            [(3, 1, 3, 3), (3,), (3,), (3,), (4, 3), (4,)]]
    xs, xq = rng.standard_normal((2, 5, 1, 4, 4))
    ys, yq = rng.integers(0, 4, (2, 5))

    def step(M):
        params = [M.tensor(a, requires_grad=True) for a in init]
        loss = M.nn.functional.cross_entropy(
            _maml_forward(M, params, M.tensor(xs)), M.tensor(ys))
        grads = M.autograd.grad(loss, params, create_graph=True)
        fast = [p - 0.4 * g for p, g in zip(params, grads)]
        # a second inner step: third-order terms reach the meta-gradient
        loss2 = M.nn.functional.cross_entropy(
            _maml_forward(M, fast, M.tensor(xs)), M.tensor(ys))
        grads2 = M.autograd.grad(loss2, fast, create_graph=True)
        fast = [p - 0.4 * g for p, g in zip(fast, grads2)]
        outer = M.nn.functional.cross_entropy(
            _maml_forward(M, fast, M.tensor(xq)), M.tensor(yq))
        outer.backward()
        return outer.item(), [p.grad.numpy() for p in params]

    lo_d, g_d = step(dtorch)
    lo_t, g_t = step(torch)
    assert abs(lo_d - lo_t) < 1e-10
    for a, b in zip(g_d, g_t):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-10)


def test_hessian_vector_product_matches_torch():
    rng = np.random.default_rng(4)
    init = [rng.standard_normal(s) * 0.7 for s in [(5, 3), (5,), (2, 5)]]
    v = [rng.standard_normal(a.shape) for a in init]
    x, y = rng.standard_normal((6, 3)), rng.standard_normal((6, 2))

    def hvp(M):
        F_ = M.nn.functional
        p = [M.tensor(a, requires_grad=True) for a in init]
        h = F_.softplus(F_.linear(M.tensor(x), p[0], p[1]).tanh(), beta=2.0)
        loss = F_.mse_loss(h @ p[2].t(), M.tensor(y))
        g = M.autograd.grad(loss, p, create_graph=True)
        dot = sum((gi * M.tensor(vi)).sum() for gi, vi in zip(g, v))
        return [h.detach().numpy() for h in M.autograd.grad(dot, p)]

    for a, b in zip(hvp(dtorch), hvp(torch)):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kw", [
    dict(kernel_size=2), dict(kernel_size=3),
    dict(kernel_size=3, stride=1, padding=1),
    dict(kernel_size=2, stride=1, dilation=2),
    dict(kernel_size=3, stride=2, ceil_mode=True), dict(kernel_size=(1, 3)),
    dict(kernel_size=2, stride=2, padding=1)])
def test_max_pool_winners_match_torch(kw):
    # ties, NaN (the last NaN of a window wins) and windows of padding and
    # -inf (their first real cell wins), on every max_pool2d path: the
    # create_graph gradient and its derivative in the output gradient
    rng = np.random.default_rng(0)
    a = rng.standard_normal((2, 2, 6, 6))
    a[0, 0, 0, :2] = np.nan
    a[1, 1, 2:4, 2:4] = 3.0
    a[0, 1, 0:3, 0:3] = -np.inf
    up = rng.standard_normal(
        F.max_pool2d(dtorch.tensor(a), **kw).shape)
    v = rng.standard_normal(a.shape)
    res = []
    for M in (dtorch, torch):
        x = M.tensor(a, requires_grad=True)
        u = M.tensor(up, requires_grad=True)
        g, = M.autograd.grad(M.nn.functional.max_pool2d(x, **kw), x, u,
                             create_graph=True)
        h, = M.autograd.grad((g * M.tensor(v)).nansum(), u)
        res.append((g.detach().numpy(), h.numpy()))
    for d, t in zip(*res):
        np.testing.assert_allclose(d, t, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------ on a device --

def _program(dev):
    """Second-order gradients through most families, on device ``dev``:
    conv, leaky_relu, layer / batch norm, max / avg pool, embedding,
    gather, softmax, cross_entropy, an LSTM and a GRU."""
    dtorch.manual_seed(0)
    nn = dtorch.nn
    conv = nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.LeakyReLU(0.1),
                         nn.BatchNorm2d(3), nn.MaxPool2d(2),
                         nn.Conv2d(3, 4, 2), nn.GELU(), nn.AvgPool2d(1),
                         nn.Flatten(), nn.LayerNorm(4)).double().to(dev)
    emb = nn.Embedding(5, 4).double().to(dev)
    lstm = nn.LSTM(4, 3).double().to(dev)
    gru = nn.GRU(3, 4, bidirectional=True).double().to(dev)
    rng = np.random.default_rng(8)
    x = dtorch.tensor(rng.standard_normal((2, 2, 4, 4)), device=dev,
                      requires_grad=True)
    ids = dtorch.tensor([[1, 4], [0, 1], [3, 3]], device=dev)
    t = dtorch.tensor([1, 3], device=dev)
    h = conv(x)                                             # (2, 4)
    s = lstm(emb(ids) + h)[0]                               # (3, 2, 3)
    s = gru(s)[0].softmax(-1)                               # (3, 2, 8)
    s = s.gather(2, dtorch.tensor([[[0], [5]]] * 3, device=dev))
    loss = F.cross_entropy(h + s.sum(0), t)
    params = [x] + [p for m in (conv, emb, lstm, gru) for p in
                    m.parameters()]
    gs = dtorch.autograd.grad(loss, params, create_graph=True)
    pen = sum((g * g).sum() for g in gs)
    return [g.detach().cpu().numpy() for g in
            dtorch.autograd.grad(pen, params, allow_unused=True)
            if g is not None]


def test_double_backward_program_on_device(device):
    # the same numbers on the device as on the cpu (the CuPy paths of
    # every backward_graph; tests/fakecupy checks them without a GPU)
    ref = _program("cpu")
    got = _program(device)
    assert len(got) == len(ref) > 10
    for a, b in zip(got, ref):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-11)


DEVICE_OPS = {
    "conv_transpose2d": lambda x, d: F.conv_transpose2d(
        x, dtorch.ones(2, 3, 2, 2, dtype=D, device=d) * 0.3, stride=2),
    "grouped_conv": lambda x, d: F.conv2d(
        x, dtorch.ones(4, 1, 2, 2, dtype=D, device=d) * 0.2, groups=2),
    "pad_reflect": lambda x, d: F.pad(x, (1, 1, 2, 0), mode="reflect"),
    "max_pool_overlap": lambda x, d: F.max_pool2d(x, 3, 1, 1),
    "avg_pool_excl": lambda x, d: F.avg_pool2d(
        x, 3, 2, 1, count_include_pad=False),
    "index_ops": lambda x, d: x.flatten(1).index_select(
        1, dtorch.tensor([3, 0, 3], device=d)).index_add(
        1, dtorch.tensor([1, 1, 0], device=d), x.flatten(1)[:, :3]),
    "scatter": lambda x, d: x.flatten(1).scatter(
        1, dtorch.tensor([[2, 5], [0, 1]], device=d), x.flatten(1)[:, :2]),
    "scans": lambda x, d: x.cumsum(3) + x.cumprod(2) + x.logcumsumexp(3),
    "tril_einsum": lambda x, d: dtorch.einsum("ncij,ncjk->nik", x.tril(),
                                              x.triu(1)),
    "losses": lambda x, d: F.multi_margin_loss(
        x.flatten(1), dtorch.tensor([0, 7], device=d), p=2) + F.smooth_l1_loss(
        x, x.detach() * 0.5) + F.binary_cross_entropy_with_logits(
        x, x.detach().sigmoid()),
    "activations": lambda x, d: F.prelu(F.mish(x) + F.elu(x) + F.softplus(
        x) + F.hardswish(x), dtorch.tensor([0.2, 0.3], dtype=D, device=d)),
    "setitem": lambda x, d: _setitem(x),
}


def _setitem(x):
    y = x * 1.0
    y[:, 0, 1:3] = x[:, 1, :2] * x[:, 1, :2]
    return y


@pytest.mark.parametrize("name", sorted(DEVICE_OPS))
def test_double_backward_ops_on_device(name, device):
    rng = np.random.default_rng(9)
    xa = rng.standard_normal((2, 2, 4, 4))
    va = rng.standard_normal((2, 2, 4, 4))
    res = []
    for d in ("cpu", device):
        x = dtorch.tensor(xa, device=d, requires_grad=True)
        y = DEVICE_OPS[name](x, d)
        g, = dtorch.autograd.grad((y * y).sum(), x, create_graph=True)
        h, = dtorch.autograd.grad((g * dtorch.tensor(va, device=d)).sum(), x)
        res.append((g.detach().cpu().numpy(), h.cpu().numpy()))
    for a, b in zip(*res):
        np.testing.assert_allclose(b, a, rtol=1e-9, atol=1e-11)
