"""Activations, forward and backward side by side: softmax and log_softmax,
GELU, and the piecewise and smooth activations of ``torch.nn.functional``.

Each activation is one node with PyTorch's own backward formula. Composed
from relu / abs / where pieces, a function takes those pieces'
subgradients at its kinks (softplus'(0) came out 0, not 1/2), and a branch
that where() discards but that overflows (elu's exp at +inf) turns its
zero gradient into 0 * inf = NaN (tests/core/test_boundary_grads.py
compares them with PyTorch at 0, +-inf, NaN, kinks and ties). relu, tanh
and sigmoid are Tensor methods and live in ``elementwise.py``.
"""
import math

import numpy as np

from .. import _kernels
from .._backend import get_array_module
from .base import Op, Pointwise, keep_grad, unbroadcast, is_float, grad_xp, \
    zero_link, astype, array_dtype
from .elementwise import _erf, _special


# ==================================================== softmax family ==

def _zero(xp, g):
    return xp.zeros((), g.dtype)


class AlongDim(Op):
    """The family of softmax and log_softmax along ``ctx.dim``, which save
    their output y: a member's ``value(x, dim, **kw)`` is y; the shell's
    backward runs the compiled, threaded row kernel ``_kernel`` where it
    applies (arrays, the last dim), else the member's ``grad(ctx, xp, g,
    y)``, written once for both orders (y through ctx.output, ``xp =
    grad_xp(g)``)."""
    @classmethod
    def forward(cls, ctx, x, dim=-1, **kw):
        y = cls.value(x, dim, **kw)
        ctx.save_for_backward(y)
        ctx.dim = dim
        return y

    @classmethod
    def backward(cls, ctx, g):
        y, = ctx.to_save
        out = _row_kernel(ctx, cls._kernel, y, g)
        if out is not None:
            return out
        return cls.grad(ctx, grad_xp(g), g, ctx.output(y))


class Softmax(AlongDim):
    """softmax along ``dim``. ``safe``: PyTorch's _safe_softmax (its
    scaled_dot_product_attention): a slice that is -inf throughout (a
    fully masked attention row) gives 0, and so a zero gradient, not
    NaN."""
    @staticmethod
    def value(x, dim, safe=False):
        xp = get_array_module(x)
        k = _kernels.kernels(x, reduces=True) if _last(x, dim) else None
        if k is not None:           # one fused, threaded pass per row
            e = np.empty_like(x)
            k.softmax_fwd(_rows(x), _rows(e))
        else:
            with np.errstate(invalid="ignore"):
                e = xp.exp(x - _row_max(x, dim))
                e /= e.sum(axis=dim, keepdims=True)
        if safe and is_float(x.dtype):
            dead = (x == -np.inf).all(axis=dim, keepdims=True)
            if bool(dead.any()):
                e = xp.where(dead, _zero(xp, e), e)
        return e

    _kernel = "softmax_bwd"

    @staticmethod
    def grad(ctx, xp, g, y):
        gy = g * y
        return gy - y * xp.sum(gy, axis=ctx.dim, keepdims=True)


def _row_kernel(ctx, name, y, g):
    """The fused, threaded row kernel ``name``'s gradient, on arrays only
    (None under create_graph, along another dim, or without numba)."""
    if ctx._gmake is not None or not _last(y, ctx.dim):
        return None
    k = _kernels.kernels(y, g, reduces=True)
    if k is None:
        return None
    out = np.empty_like(y)
    getattr(k, name)(_rows(y), _rows(g), _rows(out))
    return out


def _last(x, dim):
    """``dim`` is ``x``'s last axis (the kernels' row layout)."""
    return x.ndim > 0 and (dim == -1 or dim == x.ndim - 1)


def _rows(a):
    return a.reshape(-1, a.shape[-1])


def _row_max(x, dim):
    """The max along ``dim`` that softmax subtracts (0 for an empty
    tensor, whose softmax is empty, as in PyTorch)."""
    if x.size == 0:
        return x.dtype.type(0)
    return x.max(axis=dim, keepdims=True)


def _log_softmax(x, dim):
    k = _kernels.kernels(x, reduces=True) if _last(x, dim) else None
    if k is not None:
        s = np.empty_like(x)
        k.log_softmax_fwd(_rows(x), _rows(s))
        return s
    xp = get_array_module(x)
    s = x - _row_max(x, dim)
    s -= xp.log(xp.exp(s).sum(axis=dim, keepdims=True))
    return s


class LogSoftmax(AlongDim):
    value = staticmethod(_log_softmax)

    _kernel = "log_softmax_bwd"

    @staticmethod
    def grad(ctx, xp, g, y):
        return g - xp.exp(y) * xp.sum(g, axis=ctx.dim, keepdims=True)


# ======================================================= activations ==

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_GELU_MIN = 1 << 16     # elements from which the GELU kernel wins


class Gelu(Pointwise):
    @staticmethod
    def forward(ctx, x, approximate="none"):
        xp = get_array_module(x)
        ctx.save_for_backward(x)
        ctx.approx = approximate
        if approximate == "tanh":
            t = _gelu_tanh(xp, x)
            ctx.t = t
            return (0.5 * x * (1 + t)).astype(x.dtype, copy=False)
        # small inputs stay on NumPy: measured 0.76-0.98x at 4K elements
        k = _kernels.kernels(x, reduces=True) if x.size >= _GELU_MIN else None
        if k is not None:           # out and cdf in one threaded pass
            out, cdf = np.empty_like(x), np.empty_like(x)
            f = _kernels.flat
            k.gelu_fwd(f(x), f(out), f(cdf), *_kernels.scalars(
                x, 1 / math.sqrt(2), 0.5, 1))
            ctx.cdf = cdf
            return out
        cdf = _gelu_cdf(xp, x)
        ctx.cdf = cdf
        return (x * cdf).astype(x.dtype, copy=False)

    @staticmethod
    def grad(ctx, xp, g, x, xa):
        fast = ctx._gmake is None
        if ctx.approx == "tanh":
            # t and the cdf: saved on the fast path; under create_graph
            # recomputed from x by the same ops (the same values), so that
            # their derivative reaches x
            t = ctx.t if fast else _gelu_tanh(xp, x)
            dt = (1 - t * t) * _SQRT_2_OVER_PI * (1 + 3 * 0.044715 * x * x)
            d = 0.5 * (1 + t) + 0.5 * x * dt
        else:
            k = _kernels.kernels(x, ctx.cdf, g, reduces=True) \
                if fast and x.size >= _GELU_MIN else None
            if k is not None:       # the fused kernel, on arrays only
                out = np.empty_like(x)
                f = _kernels.flat
                k.gelu_bwd(f(x), f(ctx.cdf), f(g), f(out), *_kernels.scalars(
                    x, 0.5, 1 / math.sqrt(2 * math.pi)))
                return out
            cdf = ctx.cdf if fast else _gelu_cdf(xp, x)
            pdf = xp.exp(-0.5 * x * x) * (1 / math.sqrt(2 * math.pi))
            d = cdf + x * pdf
        return astype(g * d, array_dtype(g))


def _gelu_tanh(xp, x):
    """GELU's tanh(sqrt(2 / pi) (x + 0.044715 x^3)), x^3 as x x x (as
    PyTorch's kernel)."""
    return xp.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * (x * x * x)))


def _gelu_cdf(xp, x):
    """The normal CDF of x, GELU's exact form."""
    return 0.5 * (1 + _special(xp, x * (1 / math.sqrt(2)), "erf", _erf))


class LeakyRelu(Pointwise):
    linear = True

    @staticmethod
    def forward(ctx, x, slope=0.01):
        ctx.save_for_backward(x)
        ctx.slope = slope
        return get_array_module(x).where(x > 0, x, x * slope)

    @staticmethod
    def grad(ctx, xp, g, x, xa):
        return xp.where(xa > 0, g, g * ctx.slope)


class Elu(Pointwise):
    """scale x for x > 0, scale alpha (e^(input_scale x) - 1) otherwise:
    elu, and selu / celu with PyTorch's scales. NaN takes the exp branch,
    so its gradient is NaN, as in PyTorch's vectorised loop."""
    @staticmethod
    def forward(ctx, x, alpha=1.0, scale=1.0, input_scale=1.0):
        xp = get_array_module(x)
        ctx.save_for_backward(x)
        ctx.coef = (alpha * scale, scale, input_scale)
        with np.errstate(over="ignore", invalid="ignore"):
            neg = xp.expm1(x * input_scale) * (alpha * scale)
            return xp.where(x > 0, x * scale if scale != 1 else x,
                            neg).astype(x.dtype, copy=False)

    @staticmethod
    def grad(ctx, xp, g, x, xa):
        neg, pos, ins = ctx.coef
        with np.errstate(over="ignore", invalid="ignore"):
            return astype(xp.where(xa > 0, g * pos if pos != 1 else g,
                                   g * (ins * neg * xp.exp(x * ins))),
                          array_dtype(g))


class Hardswish(Pointwise):
    """x relu6(x + 3) / 6; gradient 0 up to -3 included, g from 3 on,
    g (x / 3 + 1/2) between (NaN: NaN), PyTorch's vectorised loop."""
    @staticmethod
    def forward(ctx, x):
        xp = get_array_module(x)
        ctx.save_for_backward(x)
        return x * xp.minimum(xp.maximum(x + 3, 0), 6) / 6

    @staticmethod
    def grad(ctx, xp, g, x, xa):
        mid = g * (x / 3 + 0.5)
        # NaN takes the middle branch
        return xp.where(xa <= -3, 0.0, xp.where(xa >= 3, g, mid))


class Hardsigmoid(Pointwise):
    """relu6(x + 3) / 6; gradient g / 6 strictly inside (-3, 3), else 0."""
    linear = True

    @staticmethod
    def forward(ctx, x):
        xp = get_array_module(x)
        ctx.save_for_backward(x)
        return xp.minimum(xp.maximum(x + 3, 0), 6) / 6

    @staticmethod
    def grad(ctx, xp, g, x, xa):
        # PyTorch multiplies by the float32 constant 1/6, in float64 too
        return keep_grad(xp, (xa > -3) & (xa < 3), g * _SIXTH)


_SIXTH = float(np.float32(1.0) / np.float32(6.0))


class Shrink(Pointwise):
    """hardshrink (soft=False): x outside [-lambd, lambd], else 0;
    softshrink: x -+ lambd outside, else 0 (0 * x, so NaN stays NaN).
    The gradient is g strictly outside the interval, else 0 (NaN: 0), as
    PyTorch's vectorised loop."""
    linear = True

    @staticmethod
    def forward(ctx, x, lambd=0.5, soft=False):
        xp = get_array_module(x)
        ctx.save_for_backward(x)
        ctx.lambd = lambd
        inside = (x >= -lambd) & (x <= lambd)
        if not soft:
            return xp.where(inside, _zero(xp, x), x)
        with np.errstate(invalid="ignore"):
            return xp.where(x > lambd, x - lambd,
                            xp.where(x < -lambd, x + lambd, x * 0))

    @staticmethod
    def grad(ctx, xp, g, x, xa):
        lam = ctx.lambd
        return keep_grad(xp, (xa < -lam) | (xa > lam), g)


class Threshold(Pointwise):
    """x where x > threshold, else value; gradient g where x > threshold
    (NaN included: 'x <= threshold' is False there). x is saved, as
    PyTorch saves it (an in-place change to x after is refused)."""
    linear = True

    @staticmethod
    def forward(ctx, x, threshold=0.0, value=0.0):
        xp = get_array_module(x)
        ctx.save_for_backward(x)
        ctx.threshold = threshold
        return xp.where(x <= threshold, xp.asarray(value, dtype=x.dtype), x)

    @staticmethod
    def grad(ctx, xp, g, x, xa):
        return keep_grad(xp, ~(xa <= ctx.threshold), g)


class PRelu(Op):
    """x for x > 0, w x otherwise, w broadcast over x (one weight, or one
    per channel on axis 1). Gradients: g or w g for x; x g where x <= 0
    (or NaN), summed to w's shape."""
    @staticmethod
    def forward(ctx, x, w):
        xp = get_array_module(x)
        ctx.save_for_backward(x, w)
        return xp.where(x > 0, x, w * x).astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.to_save
        xp = grad_xp(g)
        pos = x > 0
        n = ctx.needs_input_grad
        # joined to x by a zero derivative (piecewise linear in x)
        gx = zero_link(ctx, astype(xp.where(pos, g, ctx.input(1, w) * g),
                                   array_dtype(g)), 0, x.shape, x.dtype) \
            if n[0] else None
        gw = unbroadcast(xp.where(pos, 0.0, ctx.input(0, x) * g), w.shape) \
            if n[1] else None
        return gx, gw


class Softplus(Pointwise):
    """log(1 + e^(beta x)) / beta, and x itself where beta x > threshold."""
    @staticmethod
    def forward(ctx, x, beta=1.0, threshold=20.0):
        xp = get_array_module(x)
        ctx.save_for_backward(x)
        ctx.beta, ctx.threshold = beta, threshold
        z = x * beta
        with np.errstate(over="ignore", invalid="ignore"):
            sp = xp.log1p(xp.exp(z))
            if beta != 1:
                sp /= beta
            return xp.where(z > threshold, x, sp).astype(x.dtype, copy=False)

    @staticmethod
    def grad(ctx, xp, g, x, xa):
        # PyTorch's g e / (e + 1), e = exp(beta x), where beta x is at
        # most the threshold; e of the threshold itself past it (a branch
        # where() drops), so that no inf / inf there reaches a second order
        z = xp.minimum(x * ctx.beta, ctx.threshold)
        with np.errstate(over="ignore", invalid="ignore"):
            e = xp.exp(z)
            return xp.where(xa * ctx.beta > ctx.threshold, g,
                            g * e / (e + 1))


class Silu(Pointwise):
    @staticmethod
    def forward(ctx, x):
        xp = get_array_module(x)
        ctx.save_for_backward(x)
        k = _kernels.kernels(x, reduces=True)
        if k is not None:
            out = np.empty_like(x)
            k.silu_fwd(_kernels.flat(x), _kernels.flat(out),
                       _kernels.scalar(x, 1))
            return out
        with np.errstate(over="ignore", invalid="ignore"):
            return x / (1 + xp.exp(-x))

    @staticmethod
    def grad(ctx, xp, g, x, xa):
        if ctx._gmake is None:      # the fused kernel, on arrays only
            k = _kernels.kernels(x, g, reduces=True)
            if k is not None:
                out = np.empty_like(x)
                f = _kernels.flat
                k.silu_bwd(f(x), f(g), f(out), _kernels.scalar(x, 1))
                return out
        with np.errstate(over="ignore", invalid="ignore"):
            s = _sigmoid(xp, x)
            return g * s * (1 + x * (1 - s))


def _sigmoid(xp, x):
    """1 / (1 + e^-x), the Sigmoid op's own formula (its op on tensors)."""
    return _special(xp, x, "sigmoid", lambda xp, x: 1 / (1 + xp.exp(-x)))


class Mish(Pointwise):
    """x tanh(softplus(x))."""
    @staticmethod
    def forward(ctx, x):
        xp = get_array_module(x)
        ctx.save_for_backward(x)
        with np.errstate(over="ignore", invalid="ignore"):
            return x * xp.tanh(xp.log1p(xp.exp(x)))

    @staticmethod
    def grad(ctx, xp, g, x, xa):
        # PyTorch's infinitely differentiable form: sigmoid and softplus
        # (tanh(softplus(x)) is tanh(log1p(e^x)) exactly: both are 1 past
        # softplus' threshold 20), so no e^x overflows in a second order
        with np.errstate(over="ignore", invalid="ignore"):
            s = _sigmoid(xp, x)
            t = xp.tanh(_special(xp, x, "softplus", _softplus))
            return g * (t + x * s * (1 - t * t))


def _softplus(xp, x):
    """Softplus' forward (beta 1, threshold 20) on arrays."""
    return xp.where(x > 20, x, xp.log1p(xp.exp(x)))


def _log_sigmoid(xp, x):
    """log(sigmoid(x)) = min(x, 0) - log1p(e^-|x|): never overflows."""
    return xp.minimum(x, 0) - xp.log1p(xp.exp(-abs(x)))


def _log_sigmoid_grad(xp, x):
    """d/dx log(sigmoid(x)) = 1 - sigmoid(x), PyTorch's way (exactly 1/2
    at 0, finite at +-inf)."""
    neg = getattr(x, "_data", x) < 0
    # e^-|x|, by where() rather than abs: differentiable at 0 as well
    e = xp.exp(xp.where(neg, x, -x))
    r = e / (1 + e)
    return xp.where(neg, 1 - r, r)


class LogSigmoid(Pointwise):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return _log_sigmoid(get_array_module(x), x)

    @staticmethod
    def grad(ctx, xp, g, x, xa):
        return g * _log_sigmoid_grad(xp, x)
