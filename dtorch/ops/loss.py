"""Losses, forward and backward side by side: nll and cross-entropy (reduced
here, one node from logits to loss), and unreduced per-element losses each
with PyTorch's backward formula (the functional API reduces them).
Gradients are returned for every input that asks, target included, as in
PyTorch. CTC is in ``ctc.py``.
"""
import numpy as np

from .. import _kernels
from .._backend import get_array_module, put_along_axis
from .activation import _log_sigmoid, _log_softmax, _zero, Softmax
from .base import Op, Binary, grad_xp, astype, zero_link
from .index import scatter_to
from .recompute import pin


class NllLoss(Op):
    """Per-element ``-w[t] * logp[n, t, ...]`` picked along the class axis 1;
    ignored targets give 0. ``reduction`` is 'none', 'sum' or 'mean'
    (weighted mean, as in PyTorch)."""
    @staticmethod
    def forward(ctx, logp, target, weight=None, ignore_index=-100,
                reduction="mean"):
        xp = get_array_module(logp)
        keep = target != ignore_index
        t = xp.where(keep, target, 0)
        picked = xp.take_along_axis(logp, xp.expand_dims(t, 1), axis=1)
        picked = xp.squeeze(picked, 1)
        w = keep.astype(logp.dtype)
        if weight is not None:
            w = w * weight[t]
        # ignored targets give 0, even where their log-probability is -inf
        loss = xp.where(keep, -(picked * w), xp.zeros((), logp.dtype))
        ctx.t, ctx.w, ctx.shape, ctx.keep = t, w, logp.shape, keep
        ctx.reduction = reduction
        if reduction == "none":
            return loss
        total = loss.sum()
        if reduction == "sum":
            return total
        ctx.denom = w.sum()
        return total / ctx.denom

    @staticmethod
    def backward(ctx, g):
        xp = grad_xp(g)
        coef = -_nll_coef(ctx, xp, g)
        gx = scatter_to(xp, ctx.shape, ctx.w.dtype, _class_key(ctx), coef)
        # piecewise linear: joined to the log-probabilities by a zero
        # derivative under create_graph, as PyTorch's
        return zero_link(ctx, gx, 0, ctx.shape, ctx.w.dtype), None, None


class CrossEntropy(NllLoss):
    """log_softmax over axis 1, then NllLoss, as one node: backward is
    ``softmax * coef`` with ``coef`` taken off at the targets, instead of
    NllLoss's scatter into zeros followed by LogSoftmax's backward (three
    passes over the (N, C, ...) logits saved). (The compiled backward
    kernel measured no faster than NumPy's path at 256x1024 float32:
    0.55 against 0.54 ms forward + backward, process CPU time, load 14;
    the one node is what counts.)"""
    @staticmethod
    def forward(ctx, x, target, weight=None, ignore_index=-100,
                reduction="mean"):
        logp = ctx.logp = _log_softmax(x, 1)
        return NllLoss.forward(ctx, logp, target, weight, ignore_index,
                               reduction)

    @staticmethod
    def backward(ctx, g):
        xp = grad_xp(g)
        coef = _nll_coef(ctx, xp, g)
        gx = _cross_entropy_grad(ctx, getattr(coef, "_data", coef))
        if ctx._gmake is None:
            return gx, None, None
        # under create_graph, the same values (pinned: the kernel's) with
        # the derivative of softmax(x) coef - coef at the targets;
        # log_softmax(logp) = logp: the saved log-probabilities stand for
        # the logits (softmax is invariant to a shift along axis 1, so its
        # derivatives are the same at both points)
        p = Softmax.apply(ctx.input(0, ctx.logp), dim=1)
        return pin(p * xp.expand_dims(coef, 1) - scatter_to(
            xp, ctx.shape, ctx.w.dtype, _class_key(ctx), coef), gx), \
            None, None


def _cross_entropy_grad(ctx, coef):
    """CrossEntropy's gradient on arrays: exp(logp) coef, minus coef at
    the targets; the compiled kernel does it in one pass."""
    xp = get_array_module(coef)
    k = _kernels.kernels(ctx.logp, coef, reduces=True) if ctx.logp.ndim == 2 else None
    if k is not None:           # exp, scale and target fix in one pass
        gx = np.empty_like(ctx.logp)
        k.cross_entropy_bwd(ctx.logp, coef, ctx.t, gx)
        return gx
    coef = xp.expand_dims(coef, 1)
    gx = xp.exp(ctx.logp)
    gx *= coef
    t = xp.expand_dims(ctx.t, 1)
    put_along_axis(xp, gx, t, xp.take_along_axis(gx, t, axis=1) - coef,
                   axis=1)
    return gx


class SoftMargin(Binary):
    """log(1 + e^(-t x)), PyTorch's formula; backward -t z / (1 + z) g with
    z = e^(-t x) (so inf / inf = NaN where -t x is +inf, as there); no
    gradient for the target, as PyTorch. (A composition softplus(-t x)
    is not PyTorch's: softplus switches to the identity above its
    threshold 20, and its grad_fn name would change.)"""
    @staticmethod
    def forward(ctx, x, t):
        xp = get_array_module(x)
        _loss_meta(ctx, x, t)
        ctx.save_for_backward(x, t)
        with np.errstate(over="ignore", invalid="ignore"):
            return xp.log1p(xp.exp(-x * t))

    @staticmethod
    def grads(ctx, xp, g, n):
        xa, ta = ctx.to_save
        x, t = ctx.input(0, xa), ctx.input(1, ta)
        with np.errstate(over="ignore", invalid="ignore"):
            z = xp.exp(-x * t)
            return -t * z / (1 + z) * g, None


class MultiMargin(Binary):
    """Per sample sum over d != y of max(0, margin - x[y] + x[d]) ** p
    (times weight[y]) / C, PyTorch's multi_margin_loss. Backward selects
    the active terms (no product with a 0/1 mask): h = 1 or 2 z per
    active d, and minus their sum at y."""
    @staticmethod
    def forward(ctx, x, t, w=None, p=1, margin=1.0):
        xp = get_array_module(x)
        c = x.shape[1]
        ti = t.reshape(-1, 1)
        with np.errstate(invalid="ignore"):
            z = margin - xp.take_along_axis(x, ti, 1) + x
            active = z > 0
            active[xp.arange(x.shape[0]), t] = False
            h = z if p == 1 else z * z
            h = xp.where(active, h, _zero(xp, x))
            if w is not None:
                h = h * w[t].reshape(-1, 1)
        ctx.active, ctx.t, ctx.p, ctx.w = active, t, p, w
        ctx.margin = margin
        _loss_meta(ctx, x, t)
        ctx.save_for_backward(x)
        return h.sum(1) / c

    @staticmethod
    def grads(ctx, xp, g, n):
        xa = ctx.to_save[0]
        active, t = ctx.active, ctx.t
        n, c = xa.shape
        am = get_array_module(xa)
        with np.errstate(invalid="ignore", over="ignore"):
            if ctx.p == 1:
                h = xp.ones_like(xa)
            else:
                # z as forward made it, from x (recomputed: the same
                # values, and differentiable under create_graph)
                x = ctx.input(0, xa)
                z = ctx.margin - xp.take_along_axis(
                    x, t.reshape(-1, 1), 1) + x
                h = 2 * z
            h = h / c
            if ctx.w is not None:
                h = h * ctx.const(ctx.w[t].reshape(-1, 1))
            h = xp.where(active, h, xp.zeros((), xa.dtype))
            onehot = am.arange(c).reshape(1, -1) == t.reshape(-1, 1)
            h = xp.where(onehot, -xp.sum(h, axis=1, keepdims=True), h)
            return h * g.reshape(-1, 1), None


_BCE_EPS = np.float32(1e-12)


class BinaryCrossEntropy(Binary):
    """-w (t log x + (1 - t) log(1 - x)), the logs clamped at -100 as in
    PyTorch. Backward: g w (x - t) / max(x (1 - x), 1e-12) for x, which is
    finite at x = 0 and 1 exactly (a float32 sigmoid rounds to 1.0 from
    about 17), and -g w logit(x) for t. Like PyTorch, no gradient for
    the weight."""
    @staticmethod
    def forward(ctx, x, t, w=None):
        xp = get_array_module(x)
        with np.errstate(divide="ignore", invalid="ignore"):
            lx = xp.maximum(xp.log(x), -100)
            l1x = xp.maximum(xp.log1p(-x), -100)
        loss = (t - 1) * l1x - t * lx
        _loss_meta(ctx, x, t)
        ctx.save_for_backward(x, t, w)
        if w is not None:
            loss = loss * w
        return loss.astype(x.dtype, copy=False)

    @staticmethod
    def grads(ctx, xp, g, n):
        xa, ta, wa = ctx.to_save
        x, t, w = ctx.input(0, xa), ctx.input(1, ta), ctx.const(wa)
        gw = g if w is None else g * w
        gx = gt = None
        with np.errstate(divide="ignore", invalid="ignore"):
            if n[0]:
                # PyTorch's EPSILON is the float 1e-12 (9.9999999600e-13)
                gx = gw * (x - t) / xp.maximum(
                    (1 - x) * x, xp.full((), _BCE_EPS, xa.dtype))
                gx = astype(gx, _dtype(g))
            if n[1]:
                gt = -xp.log(x / (1 - x)) * gw
        return gx, gt


class BinaryCrossEntropyWithLogits(Binary):
    """(1 - t) x - lw log(sigmoid(x)), lw = (pos_weight - 1) t + 1, times
    w, with PyTorch's backward: g w ((pw t + 1 - t) sigmoid(x) - pw t)
    (sigmoid(x) - t without pos_weight) for x, exactly 0 at x = 0 for
    t = 1/2 (a composition took relu'(0) = abs'(0) = 0 there and gave
    g / 2); g w (log_sigmoid(-x) - pw log_sigmoid(x)) (-x g w without
    pos_weight) for t. Like PyTorch, no gradient for weight and
    pos_weight."""
    @staticmethod
    def forward(ctx, x, t, w=None, pw=None):
        xp = get_array_module(x)
        with np.errstate(over="ignore", invalid="ignore"):
            ls = _log_sigmoid(xp, x)
            lw = None if pw is None else (pw - 1) * t + 1
            loss = (1 - t) * x - (ls if lw is None else ls * lw)
            _loss_meta(ctx, x, t)
            ctx.save_for_backward(x, t, w, pw)
            ctx.ls = ls
            if w is not None:
                loss = loss * w
        return loss.astype(x.dtype, copy=False)

    @staticmethod
    def grads(ctx, xp, g, n):
        xa, ta, w, pw = ctx.to_save
        x, t = ctx.input(0, xa), ctx.input(1, ta)
        w, pw = ctx.const(w), ctx.const(pw)
        out = [None] * 2
        with np.errstate(over="ignore", invalid="ignore"):
            if n[0]:
                s = _sigmoid(xp, x)
                if pw is None:
                    gx = s - t
                else:
                    pt = pw * t
                    gx = (pt + 1 - t) * s - pt
                gx = gx * g
                if w is not None:
                    gx = gx * w
                out[0] = gx
            if n[1]:
                if pw is None:
                    gt = -x * g
                else:
                    # log_sigmoid(x): forward's, or recomputed (the same
                    # values) as a function of x under create_graph
                    ls = ctx.ls if ctx._gmake is None else \
                        _log_sigmoid(xp, x)
                    gt = (_log_sigmoid(xp, -x) - ls * pw) * g
                if w is not None:
                    gt = gt * w
                out[1] = gt
        return out


class SmoothL1(Binary):
    """|d| < beta: d^2 / (2 beta), else |d| - beta / 2 (d = x - t); the
    gradient is d / beta inside, sign(d) from the kinks on (PyTorch).
    With ``delta`` it is huber_loss: |d| < delta: d^2 / 2, else delta (|d|
    - delta / 2), gradient d inside, delta sign(d) from the kinks on (each
    by PyTorch's own formula: huber = delta * smooth_l1 only up to
    rounding)."""
    @staticmethod
    def forward(ctx, x, t, beta=1.0, delta=None):
        xp = get_array_module(x, t)
        d = x - t
        z = abs(d)
        ctx.d, ctx.beta, ctx.delta = d, beta, delta
        _loss_meta(ctx, x, t)
        if delta is not None:
            return xp.where(z < delta, 0.5 * z * z,
                            delta * (z - 0.5 * delta))
        return xp.where(z < beta, (0.5 / beta) * z * z, z - 0.5 * beta)

    @staticmethod
    def grads(ctx, xp, g, n):
        d, c = ctx.d, ctx.delta
        if c is None:
            b = ctx.beta
            gd = xp.where(d <= -b, -g, xp.where(d >= b, g,
                                                _diff(ctx, d) * g / b))
        else:
            gd = xp.where(d <= -c, -c * g, xp.where(d >= c, c * g,
                                                    _diff(ctx, d) * g))
        return gd if n[0] else None, -gd if n[1] else None


class Huber(SmoothL1):
    """huber_loss: SmoothL1 with ``delta`` (its own grad_fn name)."""
    @staticmethod
    def forward(ctx, x, t, delta=1.0):
        return SmoothL1.forward(ctx, x, t, delta=delta)


def _loss_meta(ctx, x, t):
    """The shapes a (x, target) loss's gradients sum back to (Binary's
    shell; a number has shape ()), no dtype cast: each loss's own."""
    ctx.xs, ctx.ys = getattr(x, "shape", ()), getattr(t, "shape", ())
    ctx.xd = ctx.yd = None


def _sigmoid(xp, x):
    """PyTorch's 1 / (1 + e^-x); on a tensor (create_graph) the Sigmoid
    op: the same values, and a derivative that does not overflow."""
    f = getattr(xp, "sigmoid", None)     # the tensor namespace's
    return 1 / (1 + xp.exp(-x)) if f is None else f(x)


def _dtype(g):
    """The NumPy dtype of a gradient (array or tensor)."""
    return getattr(g, "_data", g).dtype


def _nll_coef(ctx, xp, g):
    """NllLoss's per-element weight of the gradient: w g (w g / denom for
    'mean'), 0 at ignored targets whatever g is (PyTorch skips them)."""
    w = ctx.const(ctx.w)
    with np.errstate(divide="ignore", invalid="ignore"):
        coef = w * (g / ctx.const(ctx.denom)) if ctx.reduction == "mean" \
            else w * g
    return xp.where(ctx.keep, coef, xp.zeros((), ctx.w.dtype))


def _class_key(ctx):
    """The index of the targets' entries along class axis 1 of the
    (N, C, ...) input: (n, t[n, ...], ...)."""
    am = get_array_module(ctx.t)
    grids = list(am.indices(ctx.t.shape, sparse=True))
    return (grids[0], ctx.t) + tuple(grids[1:])


def _diff(ctx, d):
    """d = x - t (saved by forward); under create_graph a tensor whose
    gradient flows +1 to x and -1 to t (summed over broadcast axes): d as
    a constant plus the difference of two zeros standing for x and t."""
    if ctx._gmake is None:
        return d
    xs, ts = ctx.xs, ctx.ys
    xp = get_array_module(d)
    x0 = ctx.graph_input(0, xp.zeros(xs, d.dtype))
    t0 = ctx.graph_input(1, xp.zeros(ts, d.dtype))
    return ctx.const(d) + (x0 - t0)
