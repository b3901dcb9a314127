"""Arithmetic operators, forward and backward side by side: + - * / **,
maximum/minimum, fmod/remainder, lerp, where, clamp (number or tensor
bounds) and hardtanh. Binary ops promote their operands with ``promote``
and sum their gradients back to each operand's shape with ``unbroadcast``.
"""
import operator

import numpy as np

from .._backend import get_array_module
from .base import Op, Binary, Pointwise, _SCALARS, _meta, keep_grad, promote, unbroadcast, \
    grad_xp, is_float, zero_link, promote_meta


def _shape_error(op, x, y):
    return RuntimeError(
        f"{op}: the shapes {list(np.shape(x))} and {list(np.shape(y))} "
        f"cannot be broadcast together")


def pow_scalar(xp, x, e):
    """x ** e for a float array and a Python number, by the kernels that
    PyTorch picks for special exponents (sqrt for 0.5, rsqrt for -0.5,
    products for 2, 3, -2, reciprocal for -1), so that values at -0.0
    and -inf agree with it (rsqrt(-0.0) is -inf, pow(-0.0, -0.5) is
    inf)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if e == 0:
            return xp.ones_like(x)
        if e == 1:
            return x.copy()
        if e == 0.5:
            return xp.sqrt(x)
        if e == -0.5:
            return (1 / xp.sqrt(x)).astype(x.dtype, copy=False)
        if e == -1:
            return (1 / x).astype(x.dtype, copy=False)
        if e == 2:
            return x * x
        if e == 3:
            return x * x * x
        if e == -2:
            return (1 / (x * x)).astype(x.dtype, copy=False)
        return x ** e


# ============================================================ binary ==

class Add(Op):
    """x + y; Sub is the same but for the operator and y's gradient sign."""
    _name, _f, _neg_y = "add", staticmethod(operator.add), False

    @classmethod
    def forward(cls, ctx, x, y):
        x2, y2 = promote_meta(ctx, x, y, cls._name)
        try:
            return cls._f(x2, y2)
        except ValueError:
            raise _shape_error(cls._name, x, y) from None

    @classmethod
    def backward(cls, ctx, g):
        n = ctx.needs_input_grad
        return (unbroadcast(g, ctx.xs, ctx.xd) if n[0] else None,
                unbroadcast(-g if cls._neg_y else g, ctx.ys, ctx.yd)
                if n[1] else None)


class Sub(Add):
    _name, _f, _neg_y = "sub", staticmethod(operator.sub), True

    @classmethod
    def forward(cls, ctx, x, y):
        check_sub_operands(x, y)
        return super().forward(ctx, x, y)


def check_sub_operands(x, y):
    """PyTorch refuses bool subtraction (NumPy gives its own error or a
    silent int result), with its own advice."""
    bx, by = _is_bool(x), _is_bool(y)
    if bx and by:
        raise RuntimeError(
            "Subtraction, the `-` operator, with two bool tensors is not "
            "supported. Use the `^` or `logical_xor()` operator instead.")
    if bx or by:
        raise RuntimeError(
            "Subtraction, the `-` operator, with a bool tensor is not "
            "supported. If you are trying to invert a mask, use the `~` "
            "or `logical_not()` operator instead.")


def _is_bool(a):
    a = getattr(a, "_data", a)          # a tensor's array
    return isinstance(a, (bool, np.bool_)) or \
        getattr(a, "dtype", None) == np.bool_


class Mul(Op):
    @staticmethod
    def forward(ctx, x, y):
        x2, y2 = promote_meta(ctx, x, y, "mul")
        n = ctx.needs_input_grad
        # keep only what backward reads, so that a later in-place change to
        # an unneeded operand is legal (x * 3 saves nothing of x)
        ctx.to_save = (x if n[1] else None, y if n[0] else None)
        try:
            return x2 * y2
        except ValueError:
            raise _shape_error("mul", x, y) from None

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.to_save
        if ctx._gmake is not None:      # create_graph (the note below Div)
            x, y = ctx.input(0, x), ctx.input(1, y)
        n = ctx.needs_input_grad
        return (unbroadcast(g * y, ctx.xs, ctx.xd) if n[0] else None,
                unbroadcast(g * x, ctx.ys, ctx.yd) if n[1] else None)


class Div(Op):
    @staticmethod
    def forward(ctx, x, y):
        x2, y2 = promote_meta(ctx, x, y, "div", true_div=True)
        # the promoted operands: backward computes in the result dtype, as
        # PyTorch (an int64 x: -gx * x / y in float32, not float64)
        ctx.to_save = (x2 if ctx.needs_input_grad[1] else None, y2)
        try:
            return x2 / y2
        except ValueError:
            raise _shape_error("div", x, y) from None

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.to_save
        if ctx._gmake is not None:      # create_graph (the note below Div)
            x, y = ctx.input(0, x), ctx.input(1, y)
        n = ctx.needs_input_grad
        gx = g / y
        gy = unbroadcast(-gx * x / y, ctx.ys, ctx.yd) if n[1] else None
        return (unbroadcast(gx, ctx.xs, ctx.xd) if n[0] else None, gy)


# The hot ops (mul, div, matmul, linear) test ctx._gmake once rather than
# call ctx.input per operand: two calls cost a 4x4 mul's backward 0.25 us
# (1.1 -> 1.35 us, measured); under create_graph the operands become the
# same connected tensors.


def _negative_int_power(x, y):
    kind = lambda a: getattr(a, "dtype", np.dtype(type(a))).kind  # noqa
    return kind(x) in "iu" and kind(y) in "iu" and bool((y < 0).any()
                                                       if hasattr(y, "any")
                                                       else y < 0)


def _int_pow(xp, x, y):
    """PyTorch's integer power, where NumPy raises for a negative
    exponent: 0 then, except for the bases 1 and -1."""
    neg = y < 0
    out = x ** xp.where(neg, 0, y)
    unit = xp.where(x == 1, 1, xp.where(x == -1, 1 - 2 * (y % 2), 0))
    return xp.where(neg, unit, out).astype(out.dtype, copy=False)


class Pow(Binary):
    @staticmethod
    def forward(ctx, x, y):
        x2, y2 = promote(x, y, "pow")
        _meta(ctx, x, y)
        if type(y2) in _SCALARS and type(x2) not in _SCALARS \
                and is_float(x2.dtype):
            out = pow_scalar(get_array_module(x2), x2, y2)
        elif _negative_int_power(x2, y2):
            out = _int_pow(get_array_module(x2), x2, y2)
        else:
            with np.errstate(divide="ignore", invalid="ignore"):
                out = x2 ** y2
        ctx.save_for_backward(x2, y2, out)
        return out

    @staticmethod
    def grads(ctx, xp, g, n):
        # PyTorch's pow_backward_self / pow_backward_exponent
        x, y, out = ctx.to_save
        xt, yt = ctx.input(0, x), ctx.input(1, y)
        gx = gy = None
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            if n[0]:
                if type(y) in _SCALARS:
                    # a zero exponent gives zeros, whatever g holds
                    gx = xp.zeros_like(g) if y == 0 else \
                        g * (y * _pow(xp, xt, y - 1))
                else:
                    gx = xp.where(_mask(y == 0), 0.0,
                                  g * (yt * xt ** (yt - 1)))
            if n[1]:
                lx = xp.log(xt) if type(x) not in _SCALARS else np.log(x)
                # d/dy x**y = x**y log x, taken as 0 where x == 0 and
                # y >= 0 (there x**y is 0 or 1 on both sides)
                zero = _mask((x == 0) & (y >= 0))
                gy = g * xp.where(zero, 0.0, ctx.output(out) * lx)
        return gx, gy


def _pow(xp, x, e):
    """x ** e for a number e: ``pow_scalar`` on an array; on a tensor
    Pow, whose forward is pow_scalar (the same values)."""
    return x ** e if hasattr(x, "_make") else pow_scalar(xp, x, e)


def _mask(m):
    """A mask computed from saved arrays (and maybe numbers) as an array
    (CuPy's where needs one)."""
    return get_array_module(m).asarray(m)


class Maximum(Binary):
    """Elementwise maximum; ties split the gradient evenly, and where
    either side is NaN both get the whole gradient (PyTorch: g, halved
    where x == y, zeroed where the other side wins)."""
    _lose = staticmethod(np.less)        # x loses where x < y

    @classmethod
    def forward(cls, ctx, x, y):
        x, y = promote(x, y, cls.__name__.lower())
        _meta(ctx, x, y)
        ctx.save_for_backward(x, y)
        # xp.maximum / xp.minimum: NaN propagates, as in PyTorch
        return getattr(get_array_module(x, y), cls.__name__.lower())(x, y)

    @classmethod
    def grads(cls, ctx, xp, g, n):
        x, y = ctx.to_save
        tie = x == y
        if get_array_module(tie) is not np or bool(tie.any()):
            g = xp.where(tie, g / 2, g)
        return (keep_grad(xp, ~cls._lose(x, y), g) if n[0] else None,
                keep_grad(xp, ~cls._lose(y, x), g) if n[1] else None)


class Minimum(Maximum):
    """Elementwise minimum; ties split the gradient evenly."""
    _lose = staticmethod(np.greater)


class Lerp(Op):
    """a + w (b - a), PyTorch's two-sided form (b - (b - a)(1 - w) for
    w >= 1/2, so lerp(a, b, 1) is b exactly); gradients g (1 - w), g w and
    g (b - a), without the NaN that composing gives at infinite ends."""
    @staticmethod
    def forward(ctx, a, b, w=0.5):
        a2, b2 = promote(a, b, "lerp")
        xp = get_array_module(a2, b2)
        _meta(ctx, a, b)
        ctx.wshape = getattr(w, "shape", None)
        ctx.wd = getattr(w, "dtype", None)
        # the ends only for w's gradient (a number w has none), as PyTorch
        ends = hasattr(w, "shape")
        ctx.save_for_backward(a2 if ends else None, b2 if ends else None, w)
        with np.errstate(invalid="ignore", over="ignore"):
            d = b2 - a2
            out = xp.where(xp.asarray(w < 0.5), a2 + w * d,
                           b2 - d * (1 - w))
        return out.astype(xp.result_type(a2, b2), copy=False)

    @staticmethod
    def backward(ctx, g):
        a, b, w = ctx.to_save
        n = ctx.needs_input_grad
        w = ctx.input(2, w) if len(n) > 2 else w
        with np.errstate(invalid="ignore", over="ignore"):
            return (unbroadcast(g * (1 - w), ctx.xs, ctx.xd) if n[0] else None,
                    unbroadcast(g * w, ctx.ys, ctx.yd) if n[1] else None,
                    unbroadcast(g * (ctx.input(1, b) - ctx.input(0, a)),
                                ctx.wshape, ctx.wd)
                    if len(n) > 2 and n[2] else None)


def _div_floor(xp, a, b):
    """PyTorch's floor division of floats (c10::div_floor_floating): from
    fmod, so that 1 // -inf is -1 (floor(1 / -inf) would be -0)."""
    mod = xp.fmod(a, b)
    div = (a - mod) / b
    div = xp.where((mod != 0) & ((b < 0) != (mod < 0)), div - 1, div)
    fl = xp.floor(div)
    fl = xp.where(div - fl > 0.5, fl + 1, fl)
    return xp.where(b == 0, a / b,
                    xp.where(div != 0, fl, xp.copysign(0.0 * div, a / b)))


class Mod(Binary):
    """fmod (``floor=False``: C's, sign of the dividend) or remainder
    (Python's, sign of the divisor) of floats, computed by NumPy (exact,
    and x itself for an infinite divisor); gradients g and -g q, q the
    quotient rounded toward zero or down (PyTorch)."""
    @staticmethod
    def forward(ctx, x, y, floor=False):
        x2, y2 = promote(x, y, "remainder" if floor else "fmod")
        xp = get_array_module(x2, y2)
        _meta(ctx, x, y)
        ctx.floor = floor
        ctx.save_for_backward(x2, y2)
        with np.errstate(divide="ignore", invalid="ignore"):
            return (xp.remainder if floor else xp.fmod)(x2, y2)

    @staticmethod
    def grads(ctx, xp, g, n):
        x, y = ctx.to_save
        gy = None
        if n[1]:
            am = get_array_module(x, y)
            with np.errstate(divide="ignore", invalid="ignore"):
                q = _div_floor(am, x, y) if ctx.floor else am.trunc(x / y)
                gy = -g * ctx.const(q)
        return g if n[0] else None, gy


class Step(Op):
    """A piecewise-constant op of one or two operands (round, floor, ceil,
    trunc, sign, div with a rounding mode): the value ``f(xp, x, y)``,
    the derivative zero, as PyTorch's (``zeros_like(grad)``). It stays in
    the graph, so ``x.round().sum().backward()`` works and gives zeros.
    ``undefined`` names an op PyTorch gives no derivative at all
    (floor_divide): its output requires grad and backward raises
    PyTorch's error. ``save``: keep the operands, as PyTorch does for the
    divisions, so an in-place change to them is caught."""
    @staticmethod
    def forward(ctx, x, y, f, undefined=None, save=False):
        ctx.undefined = undefined
        ctx.meta = [(getattr(a, "shape", None), getattr(a, "dtype", None))
                    for a in (x, y)]
        if save:        # PyTorch's div with a rounding mode saves both
            ctx.save_for_backward(x, y)
        return f(get_array_module(x), x, y)

    @staticmethod
    def backward(ctx, g):
        if ctx.undefined:
            raise RuntimeError(
                f"derivative for aten::{ctx.undefined} is not implemented")
        xp = grad_xp(g)
        return tuple(xp.zeros(s, d) if s is not None and n
                     else None for (s, d), n in
                     zip(ctx.meta, ctx.needs_input_grad))


def int_division(name, a, b):
    """PyTorch's checks before integer division ``name`` (floor_divide,
    remainder, fmod, div trunc) of arrays/ints ``a`` by ``b``: bool by
    bool is not implemented, a zero divisor raises."""
    if getattr(a, "dtype", None) == np.bool_ and \
            getattr(b, "dtype", None) == np.bool_:
        raise NotImplementedError(
            f'"{name}_cpu" not implemented for \'Bool\'')
    if not bool((b != 0).all() if hasattr(b, "all") else b != 0):
        raise RuntimeError("ZeroDivisionError")


# ================================================ selection by value ==

class Where(Op):
    """where(cond, x, y); cond is a plain bool array (not differentiable)."""
    @staticmethod
    def forward(ctx, cond, x, y):
        x2, y2 = promote(x, y, "where")
        xp = get_array_module(cond, x2, y2)
        _meta(ctx, x, y)
        ctx.save_for_backward(cond)
        return xp.where(cond, x2, y2)

    @staticmethod
    def backward(ctx, g):
        cond = ctx.to_save[0]
        n = ctx.needs_input_grad
        xp = grad_xp(g)
        return (None,
                unbroadcast(keep_grad(xp, cond, g), ctx.xs, ctx.xd)
                if n[1] else None,
                unbroadcast(keep_grad(xp, ~cond, g), ctx.ys, ctx.yd)
                if n[2] else None)


class Clamp(Pointwise):
    """clamp(x, min, max) with number bounds (either may be None)."""
    @staticmethod
    def forward(ctx, x, min=None, max=None):
        xp = get_array_module(x)
        ctx.save_for_backward(x)
        ctx.lo, ctx.hi = min, max
        out = x
        if min is not None:
            out = xp.maximum(out, min)
        if max is not None:
            out = xp.minimum(out, max)
        if out is x:
            out = x.copy()
        if type(min) is float or type(max) is float:
            return out.astype(promote(x, 1.0)[0].dtype, copy=False)
        return out.astype(x.dtype, copy=False)

    @staticmethod
    def grad(ctx, xp, g, x, xa):
        # g where lo <= x <= hi (bounds included; NaN gets 0), as PyTorch
        lo, hi = ctx.lo, ctx.hi
        keep = ((xa >= lo) & (xa <= hi) if hi is not None else xa >= lo) \
            if lo is not None else xa <= hi
        return keep_grad(xp, keep, g)


class Hardtanh(Clamp):
    """clamp(x, lo, hi) whose gradient is 0 at the bounds themselves
    (PyTorch's hardtanh_backward: g only where lo < x < hi; NaN gets 0
    too); relu6 is hardtanh(0, 6). Unlike clamp's, the gradient is joined
    to x by a zero derivative under create_graph (PyTorch's
    hardtanh_backward takes x as a differentiable input)."""
    linear = True

    @staticmethod
    def grad(ctx, xp, g, x, xa):
        return keep_grad(xp, (xa > ctx.lo) & (xa < ctx.hi), g)


class ClampT(Op):
    """clamp(x, lo, hi) with tensor bounds (either may be None), PyTorch's
    clamp_backward_min_max: x gets g where lo <= x <= hi; lo where x < lo
    (and lo < hi); hi where x > hi, or everywhere if hi < lo (then hi is
    the result)."""
    @staticmethod
    def forward(ctx, x, lo=None, hi=None):
        xp = get_array_module(x)
        _meta(ctx, x, lo if lo is not None else hi)
        ctx.ls = getattr(lo, "shape", None)      # a bound may be a number
        ctx.hs = getattr(hi, "shape", None)
        ctx.ld = getattr(lo, "dtype", None)
        ctx.hd = getattr(hi, "dtype", None)
        out = x
        if lo is not None:
            out, lo = promote(out, lo, "clamp")
            out = xp.maximum(out, lo)
        if hi is not None:
            out, hi = promote(out, hi, "clamp")
            out = xp.minimum(out, hi)
        ctx.save_for_backward(x, lo, hi)
        return out

    @staticmethod
    def backward(ctx, g):
        x, lo, hi = ctx.to_save
        xp = grad_xp(g)
        n = ctx.needs_input_grad
        if lo is not None and hi is not None:
            mx, ml, mh = (x >= lo) & (x <= hi), (x < lo) & (lo < hi), \
                (x > hi) | (hi < lo)
        elif lo is not None:
            mx, ml, mh = x >= lo, x < lo, None
        else:
            mx, ml, mh = x <= hi, None, x > hi
        gx = unbroadcast(xp.where(mx, g, 0.0), ctx.xs, ctx.xd) \
            if n[0] else None
        glo = unbroadcast(xp.where(ml, g, 0.0), ctx.ls, ctx.ld) \
            if len(n) > 1 and n[1] and ml is not None else None
        ghi = unbroadcast(xp.where(mh, g, 0.0), ctx.hs, ctx.hd) \
            if len(n) > 2 and n[2] and mh is not None else None
        return gx, glo, ghi
