"""Elementwise maths, forward and backward side by side: exp/log/sqrt and
their one-step variants, abs, reciprocal, the trigonometric and hyperbolic
functions and their inverses, tanh/sigmoid/relu, erf/erfc/erfinv, exp2,
logit, atan2, hypot, xlogy, lgamma/digamma.

The less common unary ops are small Op classes made by ``_unary`` from
their value and their derivative, both written for any array module.
Integer inputs give the default float dtype, as in PyTorch.
"""
import math

import numpy as np

from .. import _kernels
from .._backend import get_array_module
from ..autograd.function import once_differentiable
from .base import Op, _float_input, _meta, keep_grad, promote, sgn, \
    unbroadcast, const, keep_grad_t, unbroadcast_t, zero_link_t, \
    grad_xp, zero_link


class Neg(Op):
    @staticmethod
    def forward(ctx, x):
        if x.dtype == np.bool_:
            raise RuntimeError(
                "Negation, the `-` operator, on a bool tensor is not "
                "supported. If you are trying to invert a mask, use the `~` "
                "or `logical_not()` operator instead.")
        return -x

    @staticmethod
    def backward(ctx, g):
        return -g


class Exp(Op):
    @staticmethod
    def forward(ctx, x):
        out = get_array_module(x).exp(_float_input(x))
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, g):
        return g * ctx.output(ctx.to_save[0])


class Log(Op):
    @staticmethod
    def forward(ctx, x):
        x = _float_input(x)
        ctx.save_for_backward(x)
        with np.errstate(divide="ignore", invalid="ignore"):
            return get_array_module(x).log(x)

    @staticmethod
    def backward(ctx, g):
        return g / ctx.input(0, ctx.to_save[0])


class Sqrt(Op):
    @staticmethod
    def forward(ctx, x):
        with np.errstate(invalid="ignore"):
            out = get_array_module(x).sqrt(_float_input(x))
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, g):
        with np.errstate(divide="ignore"):
            return g / (2 * ctx.output(ctx.to_save[0]))


class StdSqrt(Sqrt):
    """sqrt of a variance: std(). The gradient is 0 where the std is 0
    (PyTorch's std_backward), not g / 0 times a zero deviation (NaN)."""
    @staticmethod
    def backward(ctx, g):
        out = ctx.to_save[0]
        xp = grad_xp(g)
        with np.errstate(divide="ignore", invalid="ignore"):
            return xp.where(out == 0, 0.0, g / (2 * ctx.output(out)))


class Rsqrt(Op):
    @staticmethod
    def forward(ctx, x):
        with np.errstate(divide="ignore", invalid="ignore"):
            out = 1 / get_array_module(x).sqrt(_float_input(x))
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, g):
        out = ctx.output(ctx.to_save[0])
        # PyTorch's order: out^3 may overflow where g is 0 (NaN there too)
        with np.errstate(over="ignore", invalid="ignore"):
            return (-0.5 * g) * (out * out * out)


class Abs(Op):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return abs(x)

    @staticmethod
    def backward(ctx, g):
        # a product, as in PyTorch (inf * 0 is NaN there too); sgn(NaN) = 0;
        # joined to x by a zero derivative, as PyTorch's (sgn's)
        x = ctx.to_save[0]
        return zero_link(ctx, g * ctx.const(sgn(None, x)), 0, x.shape,
                         x.dtype)


class NanToNum(Op):
    """nan_to_num: the gradient passes where x is finite and is zero where
    a NaN or an infinity was replaced (PyTorch: grad * isfinite(x))."""
    @staticmethod
    def forward(ctx, x, nan=0.0, posinf=None, neginf=None):
        ctx.save_for_backward(x)     # as PyTorch: x, not the mask
        return get_array_module(x).nan_to_num(
            x, nan=nan, posinf=posinf, neginf=neginf)

    @staticmethod
    def backward(ctx, g):
        x = ctx.to_save[0]
        return g * ctx.const(get_array_module(x).isfinite(x))


class Reciprocal(Op):
    """1 / x, with PyTorch's backward -g (out * out)."""
    @staticmethod
    def forward(ctx, x):
        with np.errstate(divide="ignore"):
            out = 1 / _float_input(x)
        ctx.save_for_backward(out)
        return out.astype(_float_input(x).dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        out = ctx.output(ctx.to_save[0])
        with np.errstate(over="ignore", invalid="ignore"):
            return -g * (out * out)


class Expm1(Op):
    """e^x - 1 in one step (exact near 0); backward g (out + 1), as in
    PyTorch (so inf * 0 is NaN where e^x underflows, as there)."""
    @staticmethod
    def forward(ctx, x):
        with np.errstate(over="ignore"):
            out = get_array_module(x).expm1(_float_input(x))
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, g):
        with np.errstate(invalid="ignore"):
            return g * (ctx.to_save[0] + 1)

    @staticmethod
    def backward_graph(ctx, g):
        with np.errstate(invalid="ignore"):
            return g * (ctx.graph_output(ctx.to_save[0]) + 1)


class Log1p(Op):
    """log(1 + x) in one step (exact near 0); backward g / (x + 1)."""
    @staticmethod
    def forward(ctx, x):
        x = _float_input(x)
        ctx.save_for_backward(x)
        with np.errstate(divide="ignore", invalid="ignore"):
            return get_array_module(x).log1p(x)

    @staticmethod
    def backward(ctx, g):
        with np.errstate(divide="ignore", invalid="ignore"):
            return g / (ctx.to_save[0] + 1)

    @staticmethod
    def backward_graph(ctx, g):
        with np.errstate(divide="ignore", invalid="ignore"):
            return g / (ctx.graph_input(0, ctx.to_save[0]) + 1)


class Tanh(Op):
    @staticmethod
    def forward(ctx, x):
        out = get_array_module(x).tanh(_float_input(x))
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, g):
        out = ctx.to_save[0]
        return g * (1 - out * out)

    @staticmethod
    def backward_graph(ctx, g):
        out = ctx.graph_output(ctx.to_save[0])
        return g * (1 - out * out)


class Sigmoid(Op):
    @staticmethod
    def forward(ctx, x):
        xp = get_array_module(x)
        x = _float_input(x)
        # PyTorch's 1 / (1 + e^-x): e^-x overflows to inf below about -88
        # (float32), giving exactly 0 there as in PyTorch (no denormals)
        with np.errstate(over="ignore"):
            out = (1 / (1 + xp.exp(-x))).astype(x.dtype, copy=False)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, g):
        out = ctx.to_save[0]
        return g * out * (1 - out)

    @staticmethod
    def backward_graph(ctx, g):
        out = ctx.graph_output(ctx.to_save[0])
        return g * out * (1 - out)


class Relu(Op):
    @staticmethod
    def forward(ctx, x):
        if x.dtype == np.bool_:
            raise RuntimeError("Boolean inputs not supported for relu")
        # one fused pass each way; measured one thread, float32, forward +
        # backward: 2^14 elements 14 -> 5 us, 2^20 778 -> 275 us
        k = _kernels.kernels(x)
        if k is not None:
            out = np.empty_like(x)
            k.relu_fwd(_kernels.flat(x), _kernels.flat(out))
        else:
            out = get_array_module(x).maximum(x, 0).astype(x.dtype,
                                                          copy=False)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, g):
        # PyTorch's threshold_backward: 0 where out <= 0 (NaN passes g)
        k = _kernels.kernels(g, ctx.to_save[0])
        if k is not None:
            gx = np.empty_like(g)
            if not k.relu_bwd(_kernels.flat(ctx.to_save[0]),
                              _kernels.flat(g), _kernels.flat(gx)):
                return gx
        xp = get_array_module(g)
        keep = _relu_keep(xp, ctx.to_save[0])
        return keep_grad(xp, keep, g)

    @staticmethod
    def backward_graph(ctx, g):
        # joined to x by a zero derivative, as PyTorch's threshold_backward
        out = ctx.to_save[0]
        keep = _relu_keep(get_array_module(out), out)
        return zero_link_t(keep_grad_t(keep, g), ctx, 0, out.shape,
                           out.dtype)


def _relu_keep(xp, out):
    """Where relu passes its gradient: not (out <= 0), so that NaN passes
    it, as PyTorch's threshold_backward (both backward paths use this)."""
    keep = xp.asarray(out <= 0)         # an array also for a 0-d out
    xp.logical_not(keep, out=keep)      # in place: no second mask
    return keep


# ================================================= special functions ==

def _erf(xp, x):
    if xp is np:
        try:
            from scipy.special import erf
            return erf(x)
        except ImportError:  # Abramowitz-Stegun 7.1.26, |error| < 1.5e-7
            s = np.sign(x)
            a = np.abs(x)
            t = 1.0 / (1.0 + 0.3275911 * a)
            y = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741)
                        * t - 0.284496736) * t + 0.254829592) * t \
                * np.exp(-a * a)
            return (s * y).astype(x.dtype, copy=False)
    from cupyx.scipy.special import erf
    return erf(x)


def _unary(name, f, df, dt=None, saves="x"):
    """An Op computing f(xp, x), with gradient g * df(xp, x, out); with
    ``dt(x, out)``, the same derivative written on tensors, its gradient
    can be differentiated again (create_graph=True). ``saves`` ("x",
    "out", "both" or "": what df reads) follows PyTorch's saved tensors,
    which decide which later in-place ops are legal: the one not saved
    reaches df as None."""
    def forward(ctx, x):
        x = _float_input(x)
        xp = get_array_module(x)
        with np.errstate(all="ignore"):
            out = f(xp, x)
        out = out.astype(x.dtype, copy=False)
        ctx.save_for_backward(x if saves in ("x", "both") else None,
                              out if saves in ("out", "both") else None)
        return out

    def backward(ctx, g):
        x, out = ctx.to_save
        xp = get_array_module(g)
        with np.errstate(all="ignore"):
            return (g * df(xp, x, out)).astype(g.dtype, copy=False)

    def backward_graph(ctx, g):
        x, out = ctx.to_save
        with np.errstate(all="ignore"):
            return g * dt(None if x is None else ctx.graph_input(0, x),
                          None if out is None else ctx.graph_output(out))

    methods = {"forward": staticmethod(forward),
               "backward": staticmethod(backward)}
    if dt is not None:
        methods["backward_graph"] = staticmethod(backward_graph)
    else:
        once_differentiable(backward)
    return type(name, (Op,), methods)


def erfinv(xp, y):
    """Inverse error function: Giles' single-precision approximation, then
    two Newton steps on erf (float64-accurate), no per-element loop."""
    if xp is np:
        try:
            from scipy.special import erfinv as _e
            return _e(y)
        except ImportError:
            pass
    else:
        from cupyx.scipy.special import erfinv as _e
        return _e(y)
    y = y.astype(np.float64)
    w = -np.log((1.0 - y) * (1.0 + y))
    small = w < 5.0
    ws = w - 2.5
    p1 = 2.81022636e-08
    for c in (3.43273939e-07, -3.5233877e-06, -4.39150654e-06,
              0.00021858087, -0.00125372503, -0.00417768164, 0.246640727,
              1.50140941):
        p1 = c + p1 * ws
    wl = np.sqrt(np.maximum(w, 5.0)) - 3.0
    p2 = -0.000200214257
    for c in (0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
              -0.0076224613, 0.00943887047, 1.00167406, 2.83297682):
        p2 = c + p2 * wl
    x = np.where(small, p1, p2) * y
    for _ in range(2):
        err = _erf(np, x) - y
        x = x - err / (2.0 / math.sqrt(math.pi) * np.exp(-x * x))
    x = np.where(np.abs(y) == 1, np.sign(y) * np.inf, x)
    return np.where(np.abs(y) > 1, np.nan, x)


_2_SQRT_PI = 2.0 / math.sqrt(math.pi)


Sin = _unary("Sin", lambda xp, x: xp.sin(x),
             lambda xp, x, o: xp.cos(x),
             dt=lambda x, o: x.cos())


Cos = _unary("Cos", lambda xp, x: xp.cos(x),
             lambda xp, x, o: -xp.sin(x),
             dt=lambda x, o: -x.sin())


Asin = _unary("Asin", lambda xp, x: xp.arcsin(x),
              lambda xp, x, o: 1 / xp.sqrt(1 - x * x),
             dt=lambda x, o: (1 - x * x).rsqrt())


Acos = _unary("Acos", lambda xp, x: xp.arccos(x),
              lambda xp, x, o: -1 / xp.sqrt(1 - x * x),
             dt=lambda x, o: -(1 - x * x).rsqrt())


Atan = _unary("Atan", lambda xp, x: xp.arctan(x),
              lambda xp, x, o: 1 / (1 + x * x),
             dt=lambda x, o: 1 / (1 + x * x))


Sinh = _unary("Sinh", lambda xp, x: xp.sinh(x),
              lambda xp, x, o: xp.cosh(x),
             dt=lambda x, o: x.cosh())


Cosh = _unary("Cosh", lambda xp, x: xp.cosh(x),
              lambda xp, x, o: xp.sinh(x),
             dt=lambda x, o: x.sinh())


Asinh = _unary("Asinh", lambda xp, x: xp.arcsinh(x),
               lambda xp, x, o: 1 / xp.sqrt(x * x + 1),
             dt=lambda x, o: (x * x + 1).rsqrt())


Acosh = _unary("Acosh", lambda xp, x: xp.arccosh(x),
               lambda xp, x, o: 1 / xp.sqrt(x * x - 1),
             dt=lambda x, o: (x * x - 1).rsqrt())


Atanh = _unary("Atanh", lambda xp, x: xp.arctanh(x),
               lambda xp, x, o: 1 / (1 - x * x),
             dt=lambda x, o: 1 / (1 - x * x))


Exp2 = _unary("Exp2", lambda xp, x: xp.exp2(x),
              lambda xp, x, o: o * math.log(2.0),
              dt=lambda x, o: o * math.log(2.0), saves="out")


Erf = _unary("Erf", lambda xp, x: _erf(xp, x),
             lambda xp, x, o: _2_SQRT_PI * xp.exp(-x * x),
             dt=lambda x, o: _2_SQRT_PI * (-x * x).exp())


Erfc = _unary("Erfc", lambda xp, x: 1 - _erf(xp, x),
              lambda xp, x, o: -_2_SQRT_PI * xp.exp(-x * x),
             dt=lambda x, o: -_2_SQRT_PI * (-x * x).exp())


# PyTorch saves x and recomputes erfinv(x) in backward
Erfinv = _unary("Erfinv", erfinv,
                lambda xp, x, o: (math.sqrt(math.pi) / 2)
                * xp.exp(erfinv(xp, x) ** 2),
                dt=lambda x, o: (math.sqrt(math.pi) / 2)
                * (x.erfinv() ** 2).exp())


Frac = _unary("Frac", lambda xp, x: x - xp.trunc(x),
              lambda xp, x, o: 1, dt=lambda x, o: 1, saves="")


Sinc = _unary(
    "Sinc", lambda xp, x: xp.sinc(x),
    lambda xp, x, o: xp.where(
        x == 0, 0.0, (xp.cos(math.pi * x) - o) / xp.where(x == 0, 1, x)),
    saves="both")


def _sinc_backward(ctx, g):
    # PyTorch masks the product: 0 at x == 0 whatever g is
    x, out = ctx.to_save
    xp = get_array_module(g)
    with np.errstate(all="ignore"):
        d = (xp.cos(math.pi * x) - out) / xp.where(x == 0, 1, x)
        return xp.where(x == 0, 0, g * d).astype(g.dtype, copy=False)


def _sinc_backward_graph(ctx, g):
    x, out = ctx.to_save
    xp = get_array_module(x)
    xt = ctx.graph_input(0, x)
    # x, or 1 where x is 0 (masked below): no 0 / 0 in the graph
    safe = xt + const(g, (x == 0).astype(x.dtype))
    with np.errstate(all="ignore"):
        d = ((math.pi * xt).cos() - ctx.graph_output(out)) / safe
    return keep_grad_t(xp.asarray(x != 0), g * d)


Sinc.backward = staticmethod(_sinc_backward)
Sinc.backward_graph = staticmethod(_sinc_backward_graph)


class Logit(Op):
    @staticmethod
    def forward(ctx, x, eps=None):
        x = _float_input(x)
        xp = get_array_module(x)
        z = x if eps is None else xp.clip(x, eps, 1 - eps)
        ctx.save_for_backward(x)
        ctx.eps = eps
        with np.errstate(all="ignore"):
            return xp.log(z / (1 - z)).astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        x, = ctx.to_save
        xp = get_array_module(g)
        with np.errstate(all="ignore"):
            d = g / (x * (1 - x))
        if ctx.eps is not None:
            d = xp.where((x < ctx.eps) | (x > 1 - ctx.eps), 0, d)
        else:       # PyTorch: NaN outside [0, 1] (logit_backward)
            d = d + _outside_unit(xp, x)
        return d

    @staticmethod
    def backward_graph(ctx, g):
        x = ctx.graph_input(0, ctx.to_save[0])
        with np.errstate(all="ignore"):
            d = g / (x * (1 - x))
        xa = ctx.to_save[0]
        if ctx.eps is not None:
            d = keep_grad_t(~((xa < ctx.eps) | (xa > 1 - ctx.eps)), d)
        else:           # NaN outside [0, 1], not differentiated there
            xp = get_array_module(xa)
            d = keep_grad_t(~((xa < 0) | (xa > 1)), d) \
                + const(g, _outside_unit(xp, xa))
        return d


def _outside_unit(xp, x):
    """NaN where x is outside [0, 1], else 0: added to logit's gradient."""
    return xp.where((x < 0) | (x > 1), xp.nan, 0).astype(x.dtype)


class Atan2(Op):
    @staticmethod
    def forward(ctx, y, x):
        y2, x2 = promote(_float_input(y) if hasattr(y, "dtype") else y,
                         _float_input(x) if hasattr(x, "dtype") else x,
                         "atan2")
        _meta(ctx, y, x)
        ctx.save_for_backward(y2, x2)
        return get_array_module(y2, x2).arctan2(y2, x2)

    @staticmethod
    def backward(ctx, g):
        y, x = ctx.to_save
        n = ctx.needs_input_grad
        xp = get_array_module(g)
        with np.errstate(all="ignore"):
            d = x * x + y * y
            # 0 at the origin, as PyTorch (not 0 / 0)
            zero = xp.asarray(d == 0)
            gy = xp.where(zero, 0, g * x / d) if n[0] else None
            gx = xp.where(zero, 0, -g * y / d) if n[1] else None
        return (unbroadcast(gy, ctx.xs, ctx.xd) if n[0] else None,
                unbroadcast(gx, ctx.ys, ctx.yd) if n[1] else None)

    @staticmethod
    def backward_graph(ctx, g):
        ya, xa = ctx.to_save
        n = ctx.needs_input_grad
        y, x = _operand(ctx, 0, ya), _operand(ctx, 1, xa)
        with np.errstate(all="ignore"):
            d = x * x + y * y
            keep = get_array_module(g._data).asarray(xa * xa + ya * ya != 0)
            gy = keep_grad_t(keep, g * x / d) if n[0] else None
            gx = keep_grad_t(keep, -g * y / d) if n[1] else None
        return (unbroadcast_t(gy, ctx.xs, ctx.xd) if n[0] else None,
                unbroadcast_t(gx, ctx.ys, ctx.yd) if n[1] else None)


class Hypot(Op):
    @staticmethod
    def forward(ctx, x, y):
        x2, y2 = promote(x, y, "hypot")
        _meta(ctx, x, y)
        out = get_array_module(x2, y2).hypot(x2, y2)
        ctx.save_for_backward(x2, y2, out)
        return out

    @staticmethod
    def backward(ctx, g):
        x, y, out = ctx.to_save
        n = ctx.needs_input_grad
        with np.errstate(all="ignore"):
            return (unbroadcast(g * x / out, ctx.xs, ctx.xd) if n[0] else None,
                    unbroadcast(g * y / out, ctx.ys, ctx.yd) if n[1] else None)

    @staticmethod
    def backward_graph(ctx, g):
        xa, ya, out = ctx.to_save
        n = ctx.needs_input_grad
        out = ctx.graph_output(out)
        with np.errstate(all="ignore"):
            return (unbroadcast_t(g * _operand(ctx, 0, xa) / out, ctx.xs,
                                  ctx.xd) if n[0] else None,
                    unbroadcast_t(g * _operand(ctx, 1, ya) / out, ctx.ys,
                                  ctx.yd) if n[1] else None)


def xlogy_grad_x(xp, g, x, y):
    """PyTorch's d xlogy(x, y) / dx: xlogy(g, y) (g log y, 0 where g == 0
    unless y is NaN), masked to 0 where x == 0 and y <= 0."""
    zero = xp.zeros((), g.dtype)
    with np.errstate(divide="ignore", invalid="ignore"):
        gx = xp.where((g == 0) & ~xp.isnan(y), zero, g * xp.log(y))
    return xp.where((x == 0) & (y <= 0), zero, gx)


class Xlogy(Op):
    """x log y, 0 where x == 0 (unless y is NaN), PyTorch's xlogy (also
    kl_div's), with its gradients (``xlogy_grad_x``; g x / y). x may be a
    number."""
    @staticmethod
    def forward(ctx, x, y):
        x2, y2 = promote(_float_input(x) if hasattr(x, "dtype") else x,
                         y, "xlogy", true_div=True)
        xp = get_array_module(x2, y2)
        _meta(ctx, x, y)
        ctx.save_for_backward(x2, y2)
        with np.errstate(all="ignore"):
            out = xp.where((x2 == 0) & ~xp.isnan(y2), 0, x2 * xp.log(y2))
        return xp.asarray(out).astype(xp.result_type(x2, y2), copy=False)

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.to_save
        xp = get_array_module(g)
        n = ctx.needs_input_grad
        with np.errstate(all="ignore"):
            # PyTorch's: xlogy(g, y), 0 where x == 0 and y <= 0
            gx = xlogy_grad_x(xp, g, x, y) if n[0] else None
            gy = g * x / y if n[1] else None
        return (unbroadcast(gx, ctx.xs, ctx.xd) if n[0] else None,
                unbroadcast(gy, ctx.ys, ctx.yd) if n[1] else None)

    @staticmethod
    def backward_graph(ctx, g):
        xa, ya = ctx.to_save
        n = ctx.needs_input_grad
        xp = get_array_module(g._data)
        gx = gy = None
        with np.errstate(all="ignore"):
            y = ctx.graph_input(1, ya)
            if n[0]:
                # xlogy_grad_x's masks: g log y, 0 where g == 0 (unless y
                # is NaN) and where x == 0 and y <= 0
                keep = ~((g._data == 0) & ~xp.isnan(ya))
                keep &= ~((xa == 0) & (ya <= 0))
                gx = unbroadcast_t(keep_grad_t(keep, g * y.log()), ctx.xs,
                                   ctx.xd)
            if n[1]:
                gy = unbroadcast_t(g * _operand(ctx, 0, xa) / y, ctx.ys,
                                   ctx.yd)
        return gx, gy


# ------------------------------------------------------ gamma functions --
# Asymptotic (Stirling / de Moivre) series after shifting x up past 10 by
# the recurrences, reflection below 0.5; vectorised over the array (the
# loops run over the 10 shift terms).


def lgamma(xp, x):
    x = x.astype(np.float64)
    refl = x < 0.5
    y = xp.where(refl, 1 - x, x)
    with np.errstate(all="ignore"):
        z, acc = _shifted(xp, y, 10, xp.log)
        z2 = 1 / (z * z)
        series = (z - 0.5) * xp.log(z) - z + 0.5 * math.log(2 * math.pi) + (
            1 / z) * (1 / 12 - z2 * (1 / 360 - z2 * (1 / 1260 - z2 * (
                1 / 1680 - z2 * (1 / 1188)))))
        lg = series - acc
        s = xp.abs(xp.sin(math.pi * x))
        out = xp.where(refl, math.log(math.pi) - xp.log(s) - lg, lg)
        # poles at 0, -1, -2, ... and +-inf: +inf, as PyTorch
        return xp.where(((x <= 0) & (x == xp.floor(x))) | xp.isinf(x),
                        np.inf, out)


def _shifted(xp, x, n, term):
    acc = xp.zeros_like(x)
    for k in range(n):
        acc = acc + term(x + k)
    return x + n, acc


def digamma(xp, x):
    x = x.astype(np.float64)
    refl = x < 0.5
    y = xp.where(refl, 1 - x, x)
    with np.errstate(all="ignore"):
        z, acc = _shifted(xp, y, 10, lambda v: 1 / v)
        z2 = 1 / (z * z)
        series = xp.log(z) - 0.5 / z - z2 * (
            1 / 12 - z2 * (1 / 120 - z2 * (1 / 252 - z2 * (
                1 / 240 - z2 * (1 / 132)))))
        psi = series - acc
        out = xp.where(refl, psi - math.pi / xp.tan(math.pi * x), psi)
        # at the poles PyTorch gives -inf for 0 (+inf for -0.0) and nan
        # for negatives
        out = xp.where(x == 0, xp.copysign(np.inf, -x), out)
        return xp.where(refl & (x == xp.floor(x)) & (x != 0), np.nan, out)


def trigamma(xp, x):
    x = x.astype(np.float64)
    refl = x < 0.5
    y = xp.where(refl, 1 - x, x)
    with np.errstate(all="ignore"):
        z, acc = _shifted(xp, y, 10, lambda v: 1 / (v * v))
        z2 = 1 / (z * z)
        series = 1 / z + 0.5 * z2 + (1 / z) * z2 * (
            1 / 6 - z2 * (1 / 30 - z2 * (1 / 42 - z2 * (1 / 30))))
        t = series + acc
        s = xp.sin(math.pi * x)
        return xp.where(refl, (math.pi * math.pi) / (s * s) - t, t)


Lgamma = _unary("Lgamma", lgamma, lambda xp, x, o: digamma(xp, x),
             dt=lambda x, o: x.digamma())


Digamma = _unary("Digamma", digamma, lambda xp, x, o: trigamma(xp, x))


def _operand(ctx, i, a):
    # a number stays a number; an array is input i as a tensor
    return a if type(a) in (int, float, bool) else ctx.graph_input(i, a)
