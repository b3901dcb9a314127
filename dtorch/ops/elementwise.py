"""Elementwise maths, forward and backward side by side: exp/log/sqrt and
their one-step variants, abs, reciprocal, the trigonometric and hyperbolic
functions and their inverses, tanh/sigmoid/relu, erf/erfc/erfinv, exp2,
logit, atan2, hypot, xlogy, lgamma/digamma.

The one-input float maths is one table-driven family, ``Unary``: each
member is a small subclass made by ``unary`` from its value and its
derivative, both written once for any array module (and, under
create_graph=True, the tensor namespace of ops/_tnp.py).
Integer inputs give the default float dtype, as in PyTorch.
"""
import math

import numpy as np

from .. import _kernels
from .._backend import get_array_module
from ..autograd.function import once_differentiable
from .base import Op, Binary, Pointwise, _float_input, _meta, keep_grad, promote, sgn, \
    unbroadcast, grad_xp, zero_link, astype, array_dtype


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


class Unary(Op):
    """The table-driven family of one-input float maths (exp, log, sqrt,
    the trigonometric and hyperbolic functions, erf, lgamma ...): each
    member is a subclass made by ``unary`` from its value ``f(xp, x)``
    and its derivative, written once for both orders (issue 30): the
    gradient ``g * df(xp, x, out)`` or a whole ``grad(xp, g, x, out)``
    where PyTorch's formula is not a product (log's g / x), with
    ``xp = grad_xp(g)`` and x, out entering through ctx.input/ctx.output.
    Integer inputs give the default float dtype. ``saves`` ("x", "out",
    "both" or "") follows PyTorch's saved tensors, which decide which
    later in-place ops are legal: the one not saved reaches df as None.
    Members keep their own class (and so grad_fn) names: ``ExpBackward0``.
    """
    saves = "x"
    # floating-point warnings off (PyTorch has none), in forward and in
    # backward; a member whose gradient cannot warn skips the errstate
    # there (1.5 us of a 4x4 sigmoid's 2.9 us backward, measured)
    quiet = grad_quiet = True

    @staticmethod
    def f(xp, x):
        raise NotImplementedError

    df = None

    @classmethod
    def forward(cls, ctx, x):
        x = _float_input(x)
        xp = get_array_module(x)
        if cls.quiet:
            with np.errstate(all="ignore"):
                out = cls.f(xp, x)
        else:
            out = cls.f(xp, x)
        out = out.astype(x.dtype, copy=False)
        s = cls.saves
        ctx.save_for_backward(x if s == "x" or s == "both" else None,
                              out if s == "out" or s == "both" else None)
        return out

    @classmethod
    def backward(cls, ctx, g):
        x, out = ctx.to_save
        if ctx._gmake is not None:      # create_graph: connected tensors
            x, out = ctx.input(0, x), ctx.output(out)
        if not cls.grad_quiet:
            return cls.grad(grad_xp(g), g, x, out)
        with np.errstate(all="ignore"):
            return cls.grad(grad_xp(g), g, x, out)

    @classmethod
    def grad(cls, xp, g, x, out):
        return astype(g * cls.df(xp, x, out), array_dtype(g))


def unary(name, f, df=None, grad=None, saves="x", quiet=True, once=False,
          doc=None, base=Unary, grad_quiet=None):
    """A member of the ``Unary`` family: the op ``name`` computing
    ``f(xp, x)`` with derivative ``df(xp, x, out)`` (the gradient is
    g * df) or gradient ``grad(xp, g, x, out)``. ``once``: the derivative
    has no tensor form (first order only)."""
    body = {"f": staticmethod(f), "saves": saves, "quiet": quiet,
            "grad_quiet": quiet if grad_quiet is None else grad_quiet,
            "__doc__": doc, "__module__": __name__, "__qualname__": name}
    if df is not None:
        body["df"] = staticmethod(df)
    if grad is not None:
        body["grad"] = staticmethod(grad)
    if once:
        def backward(ctx, g):
            return base.backward.__func__(type(ctx), ctx, g)
        body["backward"] = staticmethod(once_differentiable(backward))
    return type(name, (base,), body)


def _special(xp, x, name, fn):
    """fn(xp, x) on arrays; under create_graph the tensor namespace's
    ``name`` (the op of that name, whose forward is fn itself)."""
    return getattr(xp, name)(x) if hasattr(x, "_make") else fn(xp, x)


Exp = unary("Exp", lambda xp, x: xp.exp(x), grad=lambda xp, g, x, o: g * o, saves="out", quiet=False)


Log = unary("Log", lambda xp, x: xp.log(x),
            grad=lambda xp, g, x, o: g / x)


Sqrt = unary("Sqrt", lambda xp, x: xp.sqrt(x),
             grad=lambda xp, g, x, o: g / (2 * o), saves="out")


StdSqrt = unary(
    "StdSqrt", lambda xp, x: xp.sqrt(x),
    grad=lambda xp, g, x, o: xp.where(_zero_mask(o), 0.0, g / (2 * o)),
    saves="out", base=Sqrt,
    doc="""sqrt of a variance: std(). The gradient is 0 where the std is 0
    (PyTorch's std_backward), not g / 0 times a zero deviation (NaN).""")


def _zero_mask(a):
    """a == 0 as a plain array (a constant: an array or a tensor's)."""
    return getattr(a, "_data", a) == 0


# PyTorch's order: out^3 may overflow where g is 0 (NaN there too)
Rsqrt = unary("Rsqrt", lambda xp, x: 1 / xp.sqrt(x),
              grad=lambda xp, g, x, o: (-0.5 * g) * (o * o * o),
              saves="out")


Reciprocal = unary("Reciprocal", lambda xp, x: 1 / x,
                   grad=lambda xp, g, x, o: -g * (o * o), saves="out",
                   doc="1 / x, with PyTorch's backward -g (out * out).")


Expm1 = unary("Expm1", lambda xp, x: xp.expm1(x),
              grad=lambda xp, g, x, o: g * (o + 1), saves="out",
              doc="""e^x - 1 in one step (exact near 0); backward g (out + 1),
    as in PyTorch (so inf * 0 is NaN where e^x underflows, as there).""")


Log1p = unary("Log1p", lambda xp, x: xp.log1p(x),
              grad=lambda xp, g, x, o: g / (x + 1),
              doc="log(1 + x) in one step (exact near 0); backward "
                  "g / (x + 1).")


Tanh = unary("Tanh", lambda xp, x: xp.tanh(x),
             grad=lambda xp, g, x, o: g * (1 - o * o), saves="out",
             quiet=False)


# PyTorch's 1 / (1 + e^-x): e^-x overflows to inf below about -88
# (float32), giving exactly 0 there as in PyTorch (no denormals)
Sigmoid = unary("Sigmoid", lambda xp, x: 1 / (1 + xp.exp(-x)),
                grad=lambda xp, g, x, o: g * o * (1 - o), saves="out",
                grad_quiet=False)


class Abs(Pointwise):
    # a product, as in PyTorch (inf * 0 is NaN there too); sgn(NaN) = 0;
    # joined to x by a zero derivative, as PyTorch's (sgn's)
    linear = True

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return abs(x)

    @staticmethod
    def grad(ctx, xp, g, x, xa):
        return g * ctx.const(sgn(None, xa))


class NanToNum(Pointwise):
    """nan_to_num: the gradient passes where x is finite and is zero where
    a NaN or an infinity was replaced (PyTorch: grad * isfinite(x))."""
    @staticmethod
    def forward(ctx, x, nan=0.0, posinf=None, neginf=None):
        ctx.save_for_backward(x)     # as PyTorch: x, not the mask
        return get_array_module(x).nan_to_num(
            x, nan=nan, posinf=posinf, neginf=neginf)

    @staticmethod
    def grad(ctx, xp, g, x, xa):
        return g * ctx.const(get_array_module(xa).isfinite(xa))


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
        # PyTorch's threshold_backward: 0 where out <= 0 (NaN passes g);
        # joined to x by a zero derivative under create_graph
        out = ctx.to_save[0]
        if ctx._gmake is None:      # the fused kernel, on arrays only
            k = _kernels.kernels(g, out)
            if k is not None:
                gx = np.empty_like(g)
                if not k.relu_bwd(_kernels.flat(out), _kernels.flat(g),
                                  _kernels.flat(gx)):
                    return gx
        keep = _relu_keep(get_array_module(out), out)
        return zero_link(ctx, keep_grad(grad_xp(g), keep, g), 0, out.shape,
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


Sin = unary("Sin", lambda xp, x: xp.sin(x), lambda xp, x, o: xp.cos(x))


Cos = unary("Cos", lambda xp, x: xp.cos(x), lambda xp, x, o: -xp.sin(x))


Asin = unary("Asin", lambda xp, x: xp.arcsin(x),
             lambda xp, x, o: 1 / xp.sqrt(1 - x * x))


Acos = unary("Acos", lambda xp, x: xp.arccos(x),
             lambda xp, x, o: -1 / xp.sqrt(1 - x * x))


Atan = unary("Atan", lambda xp, x: xp.arctan(x),
             lambda xp, x, o: 1 / (1 + x * x))


Sinh = unary("Sinh", lambda xp, x: xp.sinh(x), lambda xp, x, o: xp.cosh(x))


Cosh = unary("Cosh", lambda xp, x: xp.cosh(x), lambda xp, x, o: xp.sinh(x))


Asinh = unary("Asinh", lambda xp, x: xp.arcsinh(x),
              lambda xp, x, o: 1 / xp.sqrt(x * x + 1))


Acosh = unary("Acosh", lambda xp, x: xp.arccosh(x),
              lambda xp, x, o: 1 / xp.sqrt(x * x - 1))


Atanh = unary("Atanh", lambda xp, x: xp.arctanh(x),
              lambda xp, x, o: 1 / (1 - x * x))


Exp2 = unary("Exp2", lambda xp, x: xp.exp2(x),
             lambda xp, x, o: o * math.log(2.0), saves="out")


Erf = unary("Erf", lambda xp, x: _erf(xp, x),
            lambda xp, x, o: _2_SQRT_PI * xp.exp(-x * x))


Erfc = unary("Erfc", lambda xp, x: 1 - _erf(xp, x),
             lambda xp, x, o: -_2_SQRT_PI * xp.exp(-x * x))


# PyTorch saves x and recomputes erfinv(x) in backward
Erfinv = unary("Erfinv", erfinv,
               lambda xp, x, o: (math.sqrt(math.pi) / 2)
               * xp.exp(_special(xp, x, "erfinv", erfinv) ** 2))


Frac = unary("Frac", lambda xp, x: x - xp.trunc(x), lambda xp, x, o: 1,
             saves="")


def _sinc_grad(xp, g, x, out):
    # PyTorch masks the product: 0 at x == 0 whatever g is; x, or 1 where
    # x is 0 (masked), as the divisor: no 0 / 0
    zero = _zero_mask(x)
    d = (xp.cos(math.pi * x) - out) / xp.where(zero, 1, x)
    return astype(xp.where(zero, 0, g * d), array_dtype(g))


Sinc = unary("Sinc", lambda xp, x: xp.sinc(x), grad=_sinc_grad,
             saves="both")


class Logit(Pointwise):
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
    def grad(ctx, xp, g, x, xa):
        with np.errstate(all="ignore"):
            d = g / (x * (1 - x))
        if ctx.eps is not None:
            d = xp.where((xa < ctx.eps) | (xa > 1 - ctx.eps), 0, d)
        else:       # PyTorch: NaN outside [0, 1] (logit_backward), and
            # not differentiated there
            d = xp.where((xa < 0) | (xa > 1), 0, d) \
                + ctx.const(_outside_unit(get_array_module(xa), xa))
        return d


def _outside_unit(xp, x):
    """NaN where x is outside [0, 1], else 0: added to logit's gradient."""
    return xp.where((x < 0) | (x > 1), xp.nan, 0).astype(x.dtype)


class Atan2(Binary):
    @staticmethod
    def forward(ctx, y, x):
        y2, x2 = promote(_float_input(y) if hasattr(y, "dtype") else y,
                         _float_input(x) if hasattr(x, "dtype") else x,
                         "atan2")
        _meta(ctx, y, x)
        ctx.save_for_backward(y2, x2)
        return get_array_module(y2, x2).arctan2(y2, x2)

    @staticmethod
    def grads(ctx, xp, g, n):
        y, x = ctx.to_save
        y, x = ctx.input(0, y), ctx.input(1, x)
        with np.errstate(all="ignore"):
            d = x * x + y * y
            # 0 at the origin, as PyTorch (not 0 / 0)
            zero = _zero_mask(d)
            return (xp.where(zero, 0, g * x / d) if n[0] else None,
                    xp.where(zero, 0, -g * y / d) if n[1] else None)


class Hypot(Binary):
    @staticmethod
    def forward(ctx, x, y):
        x2, y2 = promote(x, y, "hypot")
        _meta(ctx, x, y)
        out = get_array_module(x2, y2).hypot(x2, y2)
        ctx.save_for_backward(x2, y2, out)
        return out

    @staticmethod
    def grads(ctx, xp, g, n):
        x, y, out = ctx.to_save
        out = ctx.output(out)
        with np.errstate(all="ignore"):
            return (g * ctx.input(0, x) / out if n[0] else None,
                    g * ctx.input(1, y) / out if n[1] else None)


def xlogy_grad_x(xp, g, x, y):
    """PyTorch's d xlogy(x, y) / dx: xlogy(g, y) (g log y, 0 where g == 0
    unless y is NaN), masked to 0 where x == 0 and y <= 0. The masks are
    constants: x and y's arrays; y (an array, or under create_graph its
    tensor) enters the log."""
    ya, ga = getattr(y, "_data", y), getattr(g, "_data", g)
    with np.errstate(divide="ignore", invalid="ignore"):
        gx = xp.where((ga == 0) & ~get_array_module(ga).isnan(ya), 0.0,
                      g * xp.log(y))
    return xp.where((x == 0) & (ya <= 0), 0.0, gx)


class Xlogy(Binary):
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
    def grads(ctx, xp, g, n):
        x, y = ctx.to_save
        yt = ctx.input(1, y)
        with np.errstate(all="ignore"):
            # PyTorch's: xlogy(g, y), 0 where x == 0 and y <= 0
            return (xlogy_grad_x(xp, g, x, yt) if n[0] else None,
                    g * ctx.input(0, x) / yt if n[1] else None)


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


Lgamma = unary("Lgamma", lgamma,
               lambda xp, x, o: _special(xp, x, "digamma", digamma))


# trigamma has no op: digamma's gradient is first order only
Digamma = unary("Digamma", digamma, lambda xp, x, o: trigamma(xp, x),
                once=True)
