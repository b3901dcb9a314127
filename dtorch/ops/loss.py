"""Losses, forward and backward side by side: nll and cross-entropy (reduced
here, one node from logits to loss), and unreduced per-element losses each
with PyTorch's backward formula (the functional API reduces them).
Gradients are returned for every input that asks, target included, as in
PyTorch. CTC is in ``ctc.py``.
"""
import numpy as np

from .. import _kernels
from .._backend import get_array_module, put_along_axis
from .activation import _log_sigmoid, _log_softmax, _zero
from .base import Op, unbroadcast, const, keep_grad_t, unbroadcast_t, \
    zero_link_t


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
        xp = get_array_module(g)
        w = ctx.w
        with np.errstate(divide="ignore", invalid="ignore"):
            if ctx.reduction == "mean":
                coef = -(w * (g / ctx.denom))
            else:
                coef = -(w * g)
        # ignored targets get 0 whatever g is (PyTorch skips them)
        coef = xp.where(ctx.keep, coef, xp.zeros((), coef.dtype))
        gx = xp.zeros(ctx.shape, coef.dtype)
        put_along_axis(xp, gx, xp.expand_dims(ctx.t, 1),
                       xp.expand_dims(coef, 1), axis=1)
        return gx, None, None

    @staticmethod
    def backward_graph(ctx, g):
        gx = -_nll_pick_t(ctx, _nll_coef_t(ctx, g))
        return zero_link_t(gx, ctx, 0, ctx.shape, g._data.dtype), None, None


class CrossEntropy(NllLoss):
    """log_softmax over axis 1, then NllLoss, as one node: backward is
    ``softmax * coef`` with ``coef`` taken off at the targets, instead of
    NllLoss's scatter into zeros followed by LogSoftmax's backward (three
    passes over the (N, C, ...) logits saved)."""
    @staticmethod
    def forward(ctx, x, target, weight=None, ignore_index=-100,
                reduction="mean"):
        logp = ctx.logp = _log_softmax(x, 1)
        return NllLoss.forward(ctx, logp, target, weight, ignore_index,
                               reduction)

    @staticmethod
    def backward(ctx, g):
        xp = get_array_module(g)
        w = ctx.w
        with np.errstate(divide="ignore", invalid="ignore"):
            coef = w * (g / ctx.denom) if ctx.reduction == "mean" else w * g
        coef = xp.where(ctx.keep, coef, xp.zeros((), coef.dtype))
        k = _kernels.kernels(ctx.logp, coef) if ctx.logp.ndim == 2 else None
        if k is not None:           # exp, scale and target fix in one pass
            gx = np.empty_like(ctx.logp)
            k.cross_entropy_bwd(ctx.logp, coef, ctx.t, gx)
            return gx, None, None
        coef = xp.expand_dims(coef, 1)
        gx = xp.exp(ctx.logp)
        gx *= coef
        t = xp.expand_dims(ctx.t, 1)
        put_along_axis(xp, gx, t, xp.take_along_axis(gx, t, axis=1) - coef,
                       axis=1)
        return gx, None, None

    @staticmethod
    def backward_graph(ctx, g):
        coef = _nll_coef_t(ctx, g)
        # log_softmax(logp) = logp: the saved log-probabilities stand for
        # the logits (softmax is invariant to a shift along axis 1, so its
        # derivatives are the same at both points)
        from .activation import Softmax
        p = Softmax.apply(ctx.graph_input(0, ctx.logp), dim=1)
        return p * coef.unsqueeze(1) - _nll_pick_t(ctx, coef), None, None


class SoftMargin(Op):
    """log(1 + e^(-t x)), PyTorch's formula; backward -t z / (1 + z) g with
    z = e^(-t x) (so inf / inf = NaN where -t x is +inf, as there)."""
    @staticmethod
    def forward(ctx, x, t):
        xp = get_array_module(x)
        ctx.save_for_backward(x, t)
        with np.errstate(over="ignore", invalid="ignore"):
            return xp.log1p(xp.exp(-x * t))

    @staticmethod
    def backward(ctx, g):
        x, t = ctx.to_save
        xp = get_array_module(g)
        with np.errstate(over="ignore", invalid="ignore"):
            z = xp.exp(-x * t)
            return unbroadcast(-t * z / (1 + z) * g, x.shape), None

    @staticmethod
    def backward_graph(ctx, g):
        xa, ta = ctx.to_save
        x = ctx.graph_input(0, xa)
        t = ctx.graph_input(1, ta) if hasattr(ta, "shape") else ta
        with np.errstate(over="ignore", invalid="ignore"):
            gx = -t * (-x * t).sigmoid() * g
        return unbroadcast_t(gx, xa.shape), None


class MultiMargin(Op):
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
        ctx.z, ctx.active, ctx.t, ctx.p, ctx.w = z, active, t, p, w
        return h.sum(1) / c

    @staticmethod
    def backward(ctx, g):
        xp = get_array_module(g)
        z, active, t = ctx.z, ctx.active, ctx.t
        c = z.shape[1]
        with np.errstate(invalid="ignore", over="ignore"):
            h = xp.ones_like(z) if ctx.p == 1 else 2 * z
            h = h / c
            if ctx.w is not None:
                h = h * ctx.w[t].reshape(-1, 1)
            h = xp.where(active, h, _zero(xp, z))
            h[xp.arange(z.shape[0]), t] = -h.sum(1)
            return h * g.reshape(-1, 1), None, None

    @staticmethod
    def backward_graph(ctx, g):
        za, active, t = ctx.z, ctx.active, ctx.t
        xp = get_array_module(za)
        n, c = za.shape
        h = 1.0 / c
        if ctx.p != 1:
            # z depends on x only through x - x[t] per row: x - x[t] =
            # z - margin stands for x (the same derivatives)
            zt = za[xp.arange(n), t].reshape(-1, 1)     # the margin
            z = ctx.graph_input(0, za - zt)
            z = z - z.gather(1, const(g, t.reshape(-1, 1))) + const(g, zt)
            h = z * (2.0 / c)
        if ctx.w is not None:
            h = const(g, ctx.w[t].reshape(-1, 1)) * h
        if isinstance(h, float):
            h = const(g, xp.full(za.shape, h, g._data.dtype))
        h = keep_grad_t(active, h)
        onehot = xp.arange(c).reshape(1, -1) == t.reshape(-1, 1)
        h = h - keep_grad_t(onehot, h.sum(1, keepdim=True))
        return h * g.reshape(-1, 1), None, None


_BCE_EPS = np.float32(1e-12)


class BinaryCrossEntropy(Op):
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
        ctx.save_for_backward(x, t, w)
        if w is not None:
            loss = loss * w
        return loss.astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        x, t, w = ctx.to_save
        xp = get_array_module(g)
        n = ctx.needs_input_grad
        gw = g if w is None else g * w
        gx = gt = None
        with np.errstate(divide="ignore", invalid="ignore"):
            if n[0]:
                # PyTorch's EPSILON is the float 1e-12 (9.9999999600e-13)
                gx = gw * (x - t) / xp.maximum((1 - x) * x,
                                               x.dtype.type(_BCE_EPS))
                gx = unbroadcast(gx.astype(g.dtype, copy=False), x.shape)
            if n[1]:
                gt = unbroadcast(-xp.log(x / (1 - x)) * gw, t.shape)
        return gx, gt, None

    @staticmethod
    def backward_graph(ctx, g):
        xa, ta, wa = ctx.to_save
        n = ctx.needs_input_grad
        x = ctx.graph_input(0, xa)
        t = ctx.graph_input(1, ta)
        gw = g if wa is None else g * const(g, wa)
        gx = gt = None
        with np.errstate(divide="ignore", invalid="ignore"):
            if n[0]:
                eps = float(xa.dtype.type(_BCE_EPS))
                gx = unbroadcast_t(gw * (x - t) / ((1 - x) * x).clamp_min(
                    eps), xa.shape)
            if n[1]:
                gt = unbroadcast_t(-(x / (1 - x)).log() * gw, ta.shape)
        return gx, gt, None


class BinaryCrossEntropyWithLogits(Op):
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
            ctx.save_for_backward(x, t, w, pw)
            ctx.ls = ls
            if w is not None:
                loss = loss * w
        return loss.astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        x, t, w, pw = ctx.to_save
        xp = get_array_module(g)
        n = ctx.needs_input_grad
        out = [None] * 4
        with np.errstate(over="ignore", invalid="ignore"):
            if n[0]:
                s = 1 / (1 + xp.exp(-x))
                if pw is None:
                    gx = s - t
                else:
                    pt = pw * t
                    gx = (pt + 1 - t) * s - pt
                gx = gx * g
                if w is not None:
                    gx = gx * w
                out[0] = unbroadcast(gx, x.shape)
            if n[1]:
                if pw is None:
                    gt = -x * g
                else:
                    gt = (_log_sigmoid(xp, -x) - ctx.ls * pw) * g
                if w is not None:
                    gt = gt * w
                out[1] = unbroadcast(gt, t.shape)
        return tuple(out)

    @staticmethod
    def backward_graph(ctx, g):
        xa, ta, wa, pwa = ctx.to_save
        n = ctx.needs_input_grad
        x = ctx.graph_input(0, xa)
        t = ctx.graph_input(1, ta)
        w = None if wa is None else const(g, wa)
        pw = None if pwa is None else const(g, pwa)
        out = [None] * 4
        with np.errstate(over="ignore", invalid="ignore"):
            if n[0]:
                s = x.sigmoid()
                if pw is None:
                    gx = s - t
                else:
                    pt = pw * t
                    gx = (pt + 1 - t) * s - pt
                gx = gx * g
                if w is not None:
                    gx = gx * w
                out[0] = unbroadcast_t(gx, xa.shape)
            if n[1]:
                if pw is None:
                    gt = -x * g
                else:
                    from .activation import LogSigmoid
                    gt = (LogSigmoid.apply(-x) - LogSigmoid.apply(x) * pw) * g
                if w is not None:
                    gt = gt * w
                out[1] = unbroadcast_t(gt, ta.shape)
        return tuple(out)


class SmoothL1(Op):
    """|d| < beta: d^2 / (2 beta), else |d| - beta / 2 (d = x - t); the
    gradient is d / beta inside, sign(d) from the kinks on (PyTorch)."""
    @staticmethod
    def forward(ctx, x, t, beta=1.0):
        xp = get_array_module(x, t)
        d = x - t
        z = abs(d)
        ctx.d, ctx.beta = d, beta
        ctx.shapes = (getattr(x, "shape", ()), getattr(t, "shape", ()))
        return xp.where(z < beta, (0.5 / beta) * z * z, z - 0.5 * beta)

    @staticmethod
    def backward(ctx, g):
        d, b = ctx.d, ctx.beta
        xp = get_array_module(g)
        gd = xp.where(d <= -b, -g, xp.where(d >= b, g, d * g / b))
        n = ctx.needs_input_grad
        return (unbroadcast(gd, ctx.shapes[0]) if n[0] else None,
                unbroadcast(-gd, ctx.shapes[1]) if n[1] else None)

    @staticmethod
    def backward_graph(ctx, g):
        d, b = ctx.d, ctx.beta
        dt = _diff_t(ctx, d)
        from .arith import Where
        gd = Where.apply(d <= -b, -g, Where.apply(d >= b, g, dt * g / b))
        n = ctx.needs_input_grad
        return (unbroadcast_t(gd, ctx.shapes[0]) if n[0] else None,
                unbroadcast_t(-gd, ctx.shapes[1]) if n[1] else None)


class Huber(Op):
    """|d| < delta: d^2 / 2, else delta (|d| - delta / 2); the gradient is
    d inside, delta sign(d) from the kinks on (PyTorch)."""
    @staticmethod
    def forward(ctx, x, t, delta=1.0):
        xp = get_array_module(x, t)
        d = x - t
        z = abs(d)
        ctx.d, ctx.delta = d, delta
        ctx.shapes = (getattr(x, "shape", ()), getattr(t, "shape", ()))
        return xp.where(z < delta, 0.5 * z * z, delta * (z - 0.5 * delta))

    @staticmethod
    def backward(ctx, g):
        d, c = ctx.d, ctx.delta
        xp = get_array_module(g)
        gd = xp.where(d <= -c, -c * g, xp.where(d >= c, c * g, d * g))
        n = ctx.needs_input_grad
        return (unbroadcast(gd, ctx.shapes[0]) if n[0] else None,
                unbroadcast(-gd, ctx.shapes[1]) if n[1] else None)

    @staticmethod
    def backward_graph(ctx, g):
        d, c = ctx.d, ctx.delta
        dt = _diff_t(ctx, d)
        from .arith import Where
        gd = Where.apply(d <= -c, -c * g, Where.apply(d >= c, c * g, dt * g))
        n = ctx.needs_input_grad
        return (unbroadcast_t(gd, ctx.shapes[0]) if n[0] else None,
                unbroadcast_t(-gd, ctx.shapes[1]) if n[1] else None)


def _nll_coef_t(ctx, g):
    """NllLoss's per-element weight of the gradient, on tensors: w g (w g /
    denom for 'mean'), 0 at ignored targets."""
    with np.errstate(divide="ignore", invalid="ignore"):
        w = const(g, ctx.w)
        coef = w * (g / float(ctx.denom)) if ctx.reduction == "mean" \
            else w * g
    return keep_grad_t(ctx.keep, coef)


def _nll_pick_t(ctx, coef):
    """coef (N, ...) put at the targets of the (N, C, ...) class axis 1,
    zeros elsewhere (differentiable in coef)."""
    xp = get_array_module(ctx.t)
    c = ctx.shape[1]
    shape = [1] * len(ctx.shape)
    shape[1] = c
    onehot = xp.expand_dims(ctx.t, 1) == xp.arange(c).reshape(shape)
    return keep_grad_t(onehot, coef.unsqueeze(1))


def _diff_t(ctx, d):
    """d = x - t (saved by forward) as a tensor whose gradient flows +1 to
    x and -1 to t (summed over broadcast axes): d as a constant plus the
    difference of two zeros standing for x and t."""
    xs, ts = ctx.shapes
    xp = get_array_module(d)
    x0 = ctx.graph_input(0, xp.zeros(xs, d.dtype))
    t0 = ctx.graph_input(1, xp.zeros(ts, d.dtype))
    return const(x0, d) + (x0 - t0)
