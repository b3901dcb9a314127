"""dtorch's differentiable primitives: forward and backward side by side.

Every class here works on raw arrays (``_array_api = True``) of either NumPy
or CuPy; ``get_array_module`` is the only device switch. The public Tensor API
(dtorch/tensor.py) is composed from these. Backward of a broadcasting op
undoes the broadcast in one place, ``unbroadcast``.
"""
import numpy as np

from .._backend import put_along_axis
from .._backend import get_array_module, from_np, result_type, \
    get_default_dtype, device_of
from ..autograd.function import Function


class Op(Function):
    _array_api = True


def unbroadcast(g, shape, dtype=None):
    """Sum ``g`` down to ``shape``: the backward of NumPy broadcasting."""
    if g.shape != shape:
        extra = g.ndim - len(shape)
        if extra:
            g = g.sum(axis=tuple(range(extra)))
        axes = tuple(i for i, n in enumerate(shape)
                     if n == 1 and g.shape[i] != 1)
        if axes:
            g = g.sum(axis=axes, keepdims=True)
        if g.shape != shape:
            g = g.reshape(shape)
    if dtype is not None and g.dtype != dtype:
        g = g.astype(dtype)
    return g


_SCALARS = (int, float, bool)


def _device_error(op, x, y):
    return RuntimeError(
        f"Expected all tensors to be on the same device, but found at least "
        f"two devices, {device_of(x)} and {device_of(y)}! (in {op})")


def promote(x, y, op="binary op", true_div=False):
    """Cast two operands (arrays or Python scalars) to PyTorch's result dtype.

    Python scalars stay scalars: NumPy treats them as weak, as PyTorch does.
    """
    tx, ty = type(x), type(y)
    if (ty is float or ty is int) and tx is not float and tx is not int \
            and x.dtype.kind == "f":
        return x, y      # the common case: a float tensor and a number
    if ty in _SCALARS:
        if tx in _SCALARS:
            raise TypeError(f"{op}: expected at least one tensor operand")
        dx = from_np(x.dtype)
        rt = result_type(dx, ty, x.ndim > 0, False)
        if true_div and not rt.is_floating_point:
            rt = get_default_dtype()
        if rt is not dx:
            x = x.astype(rt.np)
        return x, y
    if tx in _SCALARS:
        dy = from_np(y.dtype)
        rt = result_type(tx, dy, False, y.ndim > 0)
        if true_div and not rt.is_floating_point:
            rt = get_default_dtype()
        if rt is not dy:
            y = y.astype(rt.np)
        return x, y
    if tx is not ty:
        raise _device_error(op, x, y)
    if x.dtype == y.dtype and not (true_div and x.dtype.kind in "biu"):
        return x, y
    rt = result_type(from_np(x.dtype), from_np(y.dtype), x.ndim > 0,
                     y.ndim > 0)
    if true_div and not rt.is_floating_point:
        rt = get_default_dtype()
    if x.dtype != rt.np:
        x = x.astype(rt.np)
    if y.dtype != rt.np:
        y = y.astype(rt.np)
    return x, y


def _shape_error(op, x, y):
    return RuntimeError(
        f"{op}: the shapes {list(np.shape(x))} and {list(np.shape(y))} "
        f"cannot be broadcast together")


def _meta(ctx, x, y):
    # what backward needs to shape gradients: shapes and dtypes of inputs
    ctx.xs = x.shape if not type(x) in _SCALARS else None
    ctx.ys = y.shape if not type(y) in _SCALARS else None
    ctx.xd = getattr(x, "dtype", None)
    ctx.yd = getattr(y, "dtype", None)


def keep_grad(xp, cond, g):
    """g where ``cond``, else 0: PyTorch's masking in backward. A bare
    ``g * cond`` is wrong where g holds inf or NaN and cond is False
    (inf * 0 = NaN, PyTorch gives 0). On NumPy the product is still
    computed first: np.where over a random mask is 5-10x slower than a
    product (measured 256x1024 float32: 2.2-3.0 ms against 0.19 ms), and
    the product is exact unless it made a NaN, which its max shows; only
    then the where() runs. CuPy's where costs what a product costs."""
    zero = xp.zeros((), g.dtype)
    if xp is not np:
        return xp.where(cond, g, zero)
    r = g * cond
    if r.dtype.kind == "f" and r.size and np.isnan(r.max()):
        r = np.where(cond, g, zero)
    return r


def sgn(xp, x):
    """PyTorch's sign for gradients: -1, 0 or 1, and 0 at NaN."""
    return (x > 0).astype(x.dtype) - (x < 0).astype(x.dtype)


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


# ============================================================ elementwise ==

class Add(Op):
    @staticmethod
    def forward(ctx, x, y):
        x2, y2 = promote(x, y, "add")
        _meta(ctx, x, y)
        try:
            return x2 + y2
        except ValueError:
            raise _shape_error("add", x, y) from None

    @staticmethod
    def backward(ctx, g):
        n = ctx.needs_input_grad
        return (unbroadcast(g, ctx.xs, ctx.xd) if n[0] else None,
                unbroadcast(g, ctx.ys, ctx.yd) if n[1] else None)


class Sub(Op):
    @staticmethod
    def forward(ctx, x, y):
        x2, y2 = promote(x, y, "sub")
        _meta(ctx, x, y)
        try:
            return x2 - y2
        except ValueError:
            raise _shape_error("sub", x, y) from None

    @staticmethod
    def backward(ctx, g):
        n = ctx.needs_input_grad
        return (unbroadcast(g, ctx.xs, ctx.xd) if n[0] else None,
                unbroadcast(-g, ctx.ys, ctx.yd) if n[1] else None)


class Mul(Op):
    @staticmethod
    def forward(ctx, x, y):
        x2, y2 = promote(x, y, "mul")
        _meta(ctx, x, y)
        n = ctx.needs_input_grad
        # keep only what backward reads, so that a later in-place change to
        # an unneeded operand is legal (x * 3 saves nothing of x)
        ctx.save_for_backward(x if n[1] else None, y if n[0] else None)
        try:
            return x2 * y2
        except ValueError:
            raise _shape_error("mul", x, y) from None

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.to_save
        n = ctx.needs_input_grad
        return (unbroadcast(g * y, ctx.xs, ctx.xd) if n[0] else None,
                unbroadcast(g * x, ctx.ys, ctx.yd) if n[1] else None)


class Div(Op):
    @staticmethod
    def forward(ctx, x, y):
        x2, y2 = promote(x, y, "div", true_div=True)
        _meta(ctx, x, y)
        ctx.save_for_backward(x if ctx.needs_input_grad[1] else None, y)
        try:
            return x2 / y2
        except ValueError:
            raise _shape_error("div", x, y) from None

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.to_save
        n = ctx.needs_input_grad
        gx = g / y
        gy = unbroadcast(-gx * x / y, ctx.ys, ctx.yd) if n[1] else None
        return (unbroadcast(gx, ctx.xs, ctx.xd) if n[0] else None, gy)


class Pow(Op):
    @staticmethod
    def forward(ctx, x, y):
        x2, y2 = promote(x, y, "pow")
        _meta(ctx, x, y)
        if type(y2) in _SCALARS and type(x2) not in _SCALARS \
                and x2.dtype.kind == "f":
            out = pow_scalar(get_array_module(x2), x2, y2)
        else:
            with np.errstate(divide="ignore", invalid="ignore"):
                out = x2 ** y2
        ctx.save_for_backward(x2, y2, out)
        return out

    @staticmethod
    def backward(ctx, g):
        # PyTorch's pow_backward_self / pow_backward_exponent
        x, y, out = ctx.to_save
        n = ctx.needs_input_grad
        xp = get_array_module(g)
        gx = gy = None
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            if n[0]:
                if type(y) in _SCALARS:
                    # a zero exponent gives zeros, whatever g holds
                    gx = xp.zeros_like(g) if y == 0 else \
                        g * (y * pow_scalar(xp, x, y - 1))
                else:
                    gx = xp.where(y == 0, xp.zeros((), g.dtype),
                                  g * (y * x ** (y - 1)))
                gx = unbroadcast(gx, ctx.xs, ctx.xd)
            if n[1]:
                lx = xp.log(x) if type(x) not in _SCALARS else np.log(x)
                # d/dy x**y = x**y log x, taken as 0 where x == 0 and
                # y >= 0 (there x**y is 0 or 1 on both sides)
                # (x may be a Python scalar: CuPy's where needs an array)
                zero = xp.asarray((x == 0) & (y >= 0))
                gy = g * xp.where(zero, xp.zeros((), g.dtype), out * lx)
                gy = unbroadcast(gy, ctx.ys, ctx.yd)
        return gx, gy


class Maximum(Op):
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
    def backward(cls, ctx, g):
        x, y = ctx.to_save
        xp = get_array_module(g)
        tie = x == y
        if xp is not np or bool(tie.any()):
            g = xp.where(tie, g / 2, g)
        n = ctx.needs_input_grad
        gx = gy = None
        if n[0]:
            gx = unbroadcast(keep_grad(xp, ~cls._lose(x, y), g), ctx.xs,
                             ctx.xd)
        if n[1]:
            gy = unbroadcast(keep_grad(xp, ~cls._lose(y, x), g), ctx.ys,
                             ctx.yd)
        return gx, gy


class Minimum(Maximum):
    """Elementwise minimum; ties split the gradient evenly."""
    _lose = staticmethod(np.greater)


def _float_input(x):
    # unary maths on integer tensors gives the default float dtype (PyTorch)
    if x.dtype.kind in "biu":
        return x.astype(get_default_dtype().np)
    return x


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
        return g * ctx.to_save[0]


class Log(Op):
    @staticmethod
    def forward(ctx, x):
        x = _float_input(x)
        ctx.save_for_backward(x)
        with np.errstate(divide="ignore", invalid="ignore"):
            return get_array_module(x).log(x)

    @staticmethod
    def backward(ctx, g):
        return g / ctx.to_save[0]


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
            return g / (2 * ctx.to_save[0])


class StdSqrt(Sqrt):
    """sqrt of a variance: std(). The gradient is 0 where the std is 0
    (PyTorch's std_backward), not g / 0 times a zero deviation (NaN)."""
    @staticmethod
    def backward(ctx, g):
        out = ctx.to_save[0]
        xp = get_array_module(g)
        with np.errstate(divide="ignore", invalid="ignore"):
            return xp.where(out == 0, xp.zeros((), g.dtype), g / (2 * out))


class Rsqrt(Op):
    @staticmethod
    def forward(ctx, x):
        with np.errstate(divide="ignore", invalid="ignore"):
            out = 1 / get_array_module(x).sqrt(_float_input(x))
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, g):
        out = ctx.to_save[0]
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
        # a product, as in PyTorch (inf * 0 is NaN there too); sgn(NaN) = 0
        return g * sgn(get_array_module(g), ctx.to_save[0])


def xlogy_grad_x(xp, g, x, y):
    """PyTorch's d xlogy(x, y) / dx: xlogy(g, y) (g log y, 0 where g == 0
    unless y is NaN), masked to 0 where x == 0 and y <= 0."""
    zero = xp.zeros((), g.dtype)
    with np.errstate(divide="ignore", invalid="ignore"):
        gx = xp.where((g == 0) & ~xp.isnan(y), zero, g * xp.log(y))
    return xp.where((x == 0) & (y <= 0), zero, gx)


class XLogY(Op):
    """x log y, 0 where x == 0 (unless y is NaN), PyTorch's xlogy, with
    its gradients (``xlogy_grad_x``; g x / y)."""
    @staticmethod
    def forward(ctx, x, y):
        x2, y2 = promote(x, y, "xlogy", true_div=True)
        xp = get_array_module(x2, y2)
        _meta(ctx, x, y)
        ctx.save_for_backward(x2, y2)
        with np.errstate(divide="ignore", invalid="ignore"):
            out = xp.where(x2 == 0, xp.zeros((), x2.dtype), x2 * xp.log(y2))
            return xp.where(xp.isnan(y2), y2, out)

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.to_save
        xp = get_array_module(g)
        n = ctx.needs_input_grad
        gx = gy = None
        with np.errstate(divide="ignore", invalid="ignore"):
            if n[0]:
                gx = unbroadcast(xlogy_grad_x(xp, g, x, y), ctx.xs, ctx.xd)
            if n[1]:
                gy = unbroadcast(g * x / y, ctx.ys, ctx.yd)
        return gx, gy


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
        out = ctx.to_save[0]
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
        ctx.save_for_backward(a2, b2, w)
        with np.errstate(invalid="ignore", over="ignore"):
            d = b2 - a2
            out = xp.where(xp.asarray(w < 0.5), a2 + w * d,
                           b2 - d * (1 - w))
        return out.astype(xp.result_type(a2, b2), copy=False)

    @staticmethod
    def backward(ctx, g):
        a, b, w = ctx.to_save
        n = ctx.needs_input_grad
        with np.errstate(invalid="ignore", over="ignore"):
            return (unbroadcast(g * (1 - w), ctx.xs, ctx.xd) if n[0] else None,
                    unbroadcast(g * w, ctx.ys, ctx.yd) if n[1] else None,
                    unbroadcast(g * (b - a), ctx.wshape, ctx.wd)
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


class Mod(Op):
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
    def backward(ctx, g):
        x, y = ctx.to_save
        xp = get_array_module(g)
        n = ctx.needs_input_grad
        gy = None
        if n[1]:
            with np.errstate(divide="ignore", invalid="ignore"):
                q = _div_floor(xp, x, y) if ctx.floor else xp.trunc(x / y)
                gy = unbroadcast(-g * q, ctx.ys, ctx.yd)
        return (unbroadcast(g, ctx.xs, ctx.xd) if n[0] else None, gy)


def _logcumsumexp(xp, x, axis):
    """Running log-add-exp along ``axis`` (PyTorch's scan: exact for
    entries far below the running maximum, +-inf handled). NumPy has it
    as one ufunc accumulate; elsewhere shift by the slice's finite max."""
    if xp is np:
        with np.errstate(invalid="ignore", over="ignore"):
            return np.logaddexp.accumulate(x, axis=axis)
    m = xp.max(x, axis=axis, keepdims=True)
    m = xp.where(xp.isfinite(m), m, 0)
    return xp.log(xp.cumsum(xp.exp(x - m), axis=axis)) + m


class LogCumSumExp(Op):
    """log(cumsum(exp(x))) along ``dim``; backward is PyTorch's (after
    TensorFlow's): exp(reverse_logcumsumexp(log|g| - out) + x) for the
    positive and for the negative parts of g, so that -inf entries and
    infinite results give what PyTorch gives, not 0 * inf."""
    @staticmethod
    def forward(ctx, x, dim=0):
        xp = get_array_module(x)
        if x.ndim == 0:
            ctx.axis = None
            return x.copy()
        axis = dim % x.ndim
        out = _logcumsumexp(xp, x, axis)
        ctx.axis = axis
        ctx.save_for_backward(x, out)
        return out

    @staticmethod
    def backward(ctx, g):
        if ctx.axis is None or g.size == 0:
            return g
        x, out = ctx.to_save
        xp = get_array_module(g)
        ax = ctx.axis
        low = np.finfo(g.dtype).min

        def rev(v):
            return xp.flip(_logcumsumexp(xp, xp.flip(v, ax), ax), ax)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            lg = xp.log(abs(g))
            pos = xp.where(g > 0, lg, low)
            neg = xp.where(g < 0, lg, low)
            return (xp.exp(rev(pos - out) + x)
                    - xp.exp(rev(neg - out) + x)).astype(g.dtype, copy=False)


class MedianAll(Op):
    """The lower median of all elements (NaN if any is NaN); backward
    shares g evenly among the elements equal to it, or among the NaN ones
    (PyTorch's evenly_distribute_backward)."""
    @staticmethod
    def forward(ctx, x):
        xp = get_array_module(x)
        flat = x.reshape(-1)
        if flat.size == 0:
            out = xp.asarray(np.nan, dtype=x.dtype)
        elif x.dtype.kind == "f" and bool(xp.isnan(flat).any()):
            out = xp.asarray(np.nan, dtype=x.dtype)
        else:
            k = (flat.size - 1) // 2
            out = xp.partition(flat, k)[k]
        ctx.save_for_backward(x, out)
        return xp.asarray(out)

    @staticmethod
    def backward(ctx, g):
        x, out = ctx.to_save
        xp = get_array_module(g)
        mask = xp.isnan(x) if bool(xp.isnan(out)) else x == out
        with np.errstate(divide="ignore", invalid="ignore"):
            return keep_grad(xp, mask, g / mask.sum())


class Sin(Op):
    @staticmethod
    def forward(ctx, x):
        x = _float_input(x)
        ctx.save_for_backward(x)
        return get_array_module(x).sin(x)

    @staticmethod
    def backward(ctx, g):
        return g * get_array_module(g).cos(ctx.to_save[0])


class Cos(Op):
    @staticmethod
    def forward(ctx, x):
        x = _float_input(x)
        ctx.save_for_backward(x)
        return get_array_module(x).cos(x)

    @staticmethod
    def backward(ctx, g):
        return -g * get_array_module(g).sin(ctx.to_save[0])


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


class Relu(Op):
    @staticmethod
    def forward(ctx, x):
        out = get_array_module(x).maximum(x, 0).astype(x.dtype, copy=False)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, g):
        # PyTorch's threshold_backward: 0 where out <= 0 (NaN passes g)
        keep = ctx.to_save[0] <= 0
        xp = get_array_module(g)
        xp.logical_not(keep, out=keep)      # in place: no second mask
        return keep_grad(xp, keep, g)


class Clamp(Op):
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
    def backward(ctx, g):
        # g where lo <= x <= hi (bounds included; NaN gets 0), as PyTorch
        x = ctx.to_save[0]
        if ctx.lo is not None and ctx.hi is not None:
            keep = (x >= ctx.lo) & (x <= ctx.hi)
        elif ctx.lo is not None:
            keep = x >= ctx.lo
        else:
            keep = x <= ctx.hi
        return keep_grad(get_array_module(g), keep, g)


class Hardtanh(Clamp):
    """clamp(x, lo, hi) whose gradient is 0 at the bounds themselves
    (PyTorch's hardtanh_backward: g only where lo < x < hi); relu6 is
    hardtanh(0, 6)."""
    @staticmethod
    def backward(ctx, g):
        x = ctx.to_save[0]
        xp = get_array_module(g)
        # NaN gets 0 too (PyTorch)
        return keep_grad(xp, (x > ctx.lo) & (x < ctx.hi), g)


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
        xp = get_array_module(g)
        zero = xp.zeros((), g.dtype)
        n = ctx.needs_input_grad
        gx = glo = ghi = None
        if lo is not None and hi is not None:
            if n[0]:
                gx = xp.where((x >= lo) & (x <= hi), g, zero)
            if n[1]:
                glo = xp.where((x < lo) & (lo < hi), g, zero)
            if n[2]:
                ghi = xp.where((x > hi) | (hi < lo), g, zero)
        elif lo is not None:
            if n[0]:
                gx = xp.where(x >= lo, g, zero)
            if n[1]:
                glo = xp.where(x < lo, g, zero)
        else:
            if n[0]:
                gx = xp.where(x <= hi, g, zero)
            if n[2]:
                ghi = xp.where(x > hi, g, zero)
        return (None if gx is None else unbroadcast(gx, ctx.xs, ctx.xd),
                None if glo is None else unbroadcast(glo, ctx.ls, ctx.ld),
                None if ghi is None else unbroadcast(ghi, ctx.hs, ctx.hd))


class Copy(Op):
    """A C-contiguous copy (``contiguous()``)."""
    @staticmethod
    def forward(ctx, x):
        return get_array_module(x).ascontiguousarray(x)

    @staticmethod
    def backward(ctx, g):
        return g


class Cast(Op):
    @staticmethod
    def forward(ctx, x, np_dtype=None):
        ctx.src = x.dtype
        return x.astype(np_dtype)

    @staticmethod
    def backward(ctx, g):
        return g.astype(ctx.src)


class ToDevice(Op):
    @staticmethod
    def forward(ctx, x, device=None):
        ctx.src = device_of(x)
        return device.send(x)

    @staticmethod
    def backward(ctx, g):
        return ctx.src.send(g)


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
        xp = get_array_module(g)
        return (None,
                unbroadcast(keep_grad(xp, cond, g), ctx.xs, ctx.xd)
                if n[1] else None,
                unbroadcast(keep_grad(xp, ~cond, g), ctx.ys, ctx.yd)
                if n[2] else None)


# ============================================================ reductions ==

def _axes(dim, ndim):
    if dim is None:
        return None
    if isinstance(dim, int):
        dim = (dim,)
    out = []
    for d in dim:
        if not -max(ndim, 1) <= d < max(ndim, 1):
            raise IndexError(
                f"Dimension out of range (expected to be in range of "
                f"[{-max(ndim, 1)}, {max(ndim, 1) - 1}], but got {d})")
        out.append(d % max(ndim, 1))
    return tuple(out)


def _expand_back(g, shape, axes, keepdim):
    """Reshape a reduced gradient so that it broadcasts over ``shape``."""
    if axes is None:
        return g.reshape((1,) * len(shape)) if len(shape) else g
    if not keepdim:
        g = g.reshape([1 if i in axes else n for i, n in enumerate(shape)])
    return g


class Sum(Op):
    @staticmethod
    def forward(ctx, x, dim=None, keepdim=False, dtype=None):
        axes = _axes(dim, x.ndim) if x.ndim else None
        ctx.shape, ctx.axes, ctx.keepdim = x.shape, axes, keepdim
        ctx.xd = x.dtype
        if dtype is None and x.dtype.kind in "biu":
            dtype = np.int64      # PyTorch sums bools and ints as int64
        return get_array_module(x).sum(x, axis=axes, keepdims=keepdim,
                                       dtype=dtype)

    @staticmethod
    def backward(ctx, g):
        g = _expand_back(g, ctx.shape, ctx.axes, ctx.keepdim)
        xp = get_array_module(g)
        return xp.broadcast_to(g, ctx.shape).astype(ctx.xd)


class Prod(Op):
    @staticmethod
    def forward(ctx, x, dim=None, keepdim=False):
        xp = get_array_module(x)
        axis = None if dim is None else _axes(dim, x.ndim)[0]
        ctx.save_for_backward(x)
        ctx.axis, ctx.keepdim = axis, keepdim
        if x.dtype.kind in "biu":
            return xp.prod(x, axis=axis, keepdims=keepdim, dtype=np.int64)
        return xp.prod(x, axis=axis, keepdims=keepdim)

    @staticmethod
    def backward(ctx, g):
        x = ctx.to_save[0]
        xp = get_array_module(x)
        axis = ctx.axis
        if x.ndim == 0:
            return g
        if not bool((x == 0).any()):
            # PyTorch: g * prod / x when no element (in the whole tensor)
            # is 0; so an infinite factor gets inf / inf = NaN there too
            out = xp.prod(x, axis=axis, keepdims=True)
            if axis is not None and not ctx.keepdim:
                g = xp.expand_dims(g, axis)
            with np.errstate(divide="ignore", invalid="ignore"):
                return g * (out / x)
        flat = axis is None
        if flat:
            shape = x.shape
            x = x.reshape(-1)
            axis = 0
        # product of all the others, without dividing (x may hold zeros):
        # exclusive cumulative products from the left and from the right
        ones = xp.ones_like(xp.take(x, [0], axis=axis))
        left = xp.cumprod(xp.concatenate(
            [ones, xp.take(x, range(x.shape[axis] - 1), axis=axis)],
            axis=axis), axis=axis)
        rx = xp.flip(x, axis=axis)
        right = xp.flip(xp.cumprod(xp.concatenate(
            [ones, xp.take(rx, range(x.shape[axis] - 1), axis=axis)],
            axis=axis), axis=axis), axis=axis)
        others = left * right
        if flat:
            return (g * others).reshape(shape)
        if not ctx.keepdim:
            g = xp.expand_dims(g, axis)
        return g * others


class Amax(Op):
    """max/min over dims; ties share the gradient evenly (PyTorch amax:
    (g / count) * mask). ``evenly`` is max()/min() over everything, whose
    PyTorch backward (evenly_distribute_backward) also shares it among
    the NaN entries when the result is NaN, and writes zeros elsewhere."""
    @staticmethod
    def forward(ctx, x, dim=None, keepdim=False, is_min=False, evenly=False):
        if x.size == 0:
            raise RuntimeError(
                "max(): Expected reduction dim to be specified for input."
                "numel() == 0. Specify the reduction dim with the 'dim' "
                "argument.")
        xp = get_array_module(x)
        axes = _axes(dim, x.ndim) if x.ndim else None
        f = xp.amin if is_min else xp.amax
        out = f(x, axis=axes, keepdims=keepdim)
        ctx.save_for_backward(x, out)
        ctx.axes, ctx.keepdim, ctx.evenly = axes, keepdim, evenly
        return out

    @staticmethod
    def backward(ctx, g):
        x, out = ctx.to_save
        xp = get_array_module(g)
        o = _expand_back(out, x.shape, ctx.axes, ctx.keepdim)
        g = _expand_back(g, x.shape, ctx.axes, ctx.keepdim)
        with np.errstate(divide="ignore", invalid="ignore"):
            if ctx.evenly:
                mask = xp.isnan(x) if bool(xp.isnan(out)) else x == o
                return keep_grad(xp, mask, g / mask.sum())
            mask = x == o
            count = mask.sum(axis=ctx.axes, keepdims=True)
            return g / count * mask


class Norm(Op):
    """Vector p-norm over ``dim`` (all dims when None): PyTorch's
    linalg.vector_norm, with its norm_backward as one node: the gradient
    at a zero norm is 0 (composing sqrt(sum(x * x)) gives 0 * inf = NaN);
    p = +-inf share it evenly among the entries of largest (smallest)
    magnitude, or among NaN ones; p = 0 counts non-zeros (no gradient)."""
    @staticmethod
    def forward(ctx, x, p=2.0, dim=None, keepdim=False):
        xp = get_array_module(x)
        x = _float_input(x)
        axes = _axes(dim, x.ndim) if x.ndim else None
        a = abs(x)
        kw = dict(axis=axes, keepdims=keepdim)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            if p == np.inf:
                out = xp.amax(a, **kw)
            elif p == -np.inf:
                out = xp.amin(a, **kw)
            elif p == 0:
                out = (a != 0).sum(**kw).astype(x.dtype)
            elif p == 1:
                out = a.sum(**kw)
            elif p == 2:
                out = xp.sqrt((x * x).sum(**kw))
            else:
                out = (a ** p).sum(**kw) ** (1.0 / p)
        out = xp.asarray(out, dtype=x.dtype)
        ctx.save_for_backward(x, out)
        ctx.p, ctx.axes, ctx.keepdim = p, axes, keepdim
        return out

    @staticmethod
    def backward(ctx, g):
        x, out = ctx.to_save
        xp = get_array_module(g)
        p, axes = ctx.p, ctx.axes
        g = _expand_back(g, x.shape, axes, ctx.keepdim)
        n = _expand_back(out, x.shape, axes, ctx.keepdim)
        zero = xp.zeros((), g.dtype)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            if p == 0:
                return xp.zeros(x.shape, g.dtype)
            if p == 1:
                return sgn(xp, x) * g
            if p == 2:
                return g * xp.where(n == 0, zero, x / n)
            a = abs(x)
            if p in (np.inf, -np.inf):
                mask = (a == n) | xp.isnan(a)
                count = mask.sum(axis=axes, keepdims=True)
                return sgn(xp, x) * ((g / count) * mask)
            if p < 1:
                s = sgn(xp, x) * xp.where(x == 0, zero, a ** (p - 1))
                return s * g * n ** (1 - p)
            s = sgn(xp, x) * a ** (p - 1) if p < 2 else x * a ** (p - 2)
            return s * xp.where(n == 0, zero, g / n ** (p - 1))


class MaxDim(Op):
    """values of max/min along one dim; the gradient goes to the index
    that argmax/argmin picked, as in PyTorch's ``max(dim)``."""
    @staticmethod
    def forward(ctx, x, dim=0, keepdim=False, is_min=False):
        xp = get_array_module(x)
        axis = _axes(dim, x.ndim)[0] if x.ndim else None
        if x.ndim == 0:
            ctx.idx = None
            return x.copy()
        if x.shape[axis] == 0:
            raise IndexError(
                f"max(): Expected reduction dim {axis} to have non-zero size.")
        idx = (xp.argmin if is_min else xp.argmax)(x, axis=axis)
        idx = xp.expand_dims(idx, axis)
        out = xp.take_along_axis(x, idx, axis=axis)
        ctx.idx, ctx.axis, ctx.shape = idx, axis, x.shape
        ctx.indices = idx if keepdim else xp.squeeze(idx, axis)
        return out if keepdim else xp.squeeze(out, axis)

    @staticmethod
    def backward(ctx, g):
        if ctx.idx is None:
            return g
        xp = get_array_module(g)
        gx = xp.zeros(ctx.shape, g.dtype)
        g = g.reshape(ctx.idx.shape)
        put_along_axis(xp, gx, ctx.idx, g, axis=ctx.axis)
        return gx


class Cumsum(Op):
    @staticmethod
    def forward(ctx, x, dim=0):
        axis = _axes(dim, x.ndim)[0] if x.ndim else None
        ctx.axis = axis
        xp = get_array_module(x)
        if x.ndim == 0:
            return x.copy()
        dt = np.int64 if x.dtype.kind in "biu" else None
        return xp.cumsum(x, axis=axis, dtype=dt)

    @staticmethod
    def backward(ctx, g):
        if ctx.axis is None:
            return g
        xp = get_array_module(g)
        return xp.flip(xp.cumsum(xp.flip(g, ctx.axis), ctx.axis), ctx.axis)


# ============================================================== movement ==

class Reshape(Op):
    _is_view = True

    @staticmethod
    def forward(ctx, x, shape=()):
        ctx.shape = x.shape
        try:
            return x.reshape(shape)
        except ValueError:
            raise RuntimeError(
                f"shape '{list(shape)}' is invalid for input of size "
                f"{x.size}") from None

    @staticmethod
    def backward(ctx, g):
        return g.reshape(ctx.shape)


class Permute(Op):
    _is_view = True

    @staticmethod
    def forward(ctx, x, dims=()):
        ctx.dims = dims
        return x.transpose(dims)

    @staticmethod
    def backward(ctx, g):
        return g.transpose(np.argsort(ctx.dims))


class Expand(Op):
    _is_view = True

    @staticmethod
    def forward(ctx, x, shape=()):
        ctx.shape = x.shape
        return get_array_module(x).broadcast_to(x, shape)

    @staticmethod
    def backward(ctx, g):
        return unbroadcast(g, ctx.shape)


def _is_basic(key):
    """True when indexing with ``key`` returns a view (no arrays in it)."""
    if type(key) is tuple:
        return all(k is None or k is Ellipsis or type(k) in (int, slice)
                   for k in key)
    return key is None or key is Ellipsis or type(key) in (int, slice)


def _is_mask_only(key):
    keys = key if type(key) is tuple else (key,)
    has_mask = False
    for k in keys:
        if hasattr(k, "dtype"):
            if k.dtype != np.bool_:
                return False
            has_mask = True
    return has_mask


def _int_axis0(key):
    """The index array when key is one integer array on axis 0."""
    if type(key) is tuple:
        if len(key) != 1:
            return None
        key = key[0]
    if hasattr(key, "dtype") and key.dtype.kind in "iu":
        return key
    return None


def index_add0(xp, shape, dtype, idx, src):
    """out = zeros(shape); out[idx] += src along axis 0, repeats summed,
    by sorting + add.reduceat instead of slow ``add.at``."""
    out = xp.zeros(shape, dtype)
    idx = idx.reshape(-1)
    if idx.size == 0:
        return out
    src = src.reshape((idx.size,) + tuple(shape[1:]))
    idx = xp.where(idx < 0, idx + shape[0], idx)
    if xp is not np:   # CuPy's scatter add is fast on the GPU
        xp.add.at(out, idx, src)
        return out
    order = np.argsort(idx, kind="stable")
    sidx = idx[order]
    starts = np.flatnonzero(np.r_[True, sidx[1:] != sidx[:-1]])
    if src.size >= 1024 * starts.size:
        # long rows: add.reduceat along axis 0 walks each column down the
        # rows (measured 9.2 ms for 2048 x 1024 into 256 rows); gathering
        # each segment's rows and reducing them row-wise takes 2.6 ms
        bounds = starts.tolist() + [idx.size]
        for k, a, b in zip(sidx[starts].tolist(), bounds, bounds[1:]):
            np.add.reduce(src[order[a:b]], axis=0, out=out[k])
        return out
    out[sidx[starts]] = np.add.reduceat(src[order], starts, axis=0)
    return out


class Index(Op):
    @staticmethod
    def forward(ctx, x, key=None):
        ctx.shape, ctx.key, ctx.xd = x.shape, key, x.dtype
        try:
            return x[key]
        except IndexError as e:
            raise IndexError(f"{e} (indexing a tensor of shape "
                             f"{list(x.shape)})") from None

    @staticmethod
    def backward(ctx, g):
        xp = get_array_module(g)
        key = ctx.key
        if _is_basic(key) or _is_mask_only(key):
            gx = xp.zeros(ctx.shape, g.dtype)
            gx[key] = g          # no repeats possible: plain assignment
            return gx
        idx = _int_axis0(key)
        if idx is not None:
            return index_add0(xp, ctx.shape, g.dtype, idx, g)
        gx = xp.zeros(ctx.shape, g.dtype)
        xp.add.at(gx, key, g)    # general advanced indexing, repeats summed
        return gx


class IndexView(Index):
    """Basic indexing (ints, slices, None, Ellipsis): the result is a view."""
    _is_view = True


class SetIndex(Op):
    """out = x with out[key] = value (out of place; ``__setitem__`` builds on
    it)."""
    @staticmethod
    def forward(ctx, x, value, key=None):
        out = x.copy()
        out[key] = value
        ctx.key = key
        ctx.vs = value.shape if hasattr(value, "shape") else None
        ctx.vd = getattr(value, "dtype", None)
        return out

    @staticmethod
    def backward(ctx, g):
        n = ctx.needs_input_grad
        gx = gv = None
        if n[0]:
            gx = g.copy()
            gx[ctx.key] = 0
        if n[1]:
            gv = unbroadcast(g[ctx.key], ctx.vs, ctx.vd)
        return gx, gv


class Cat(Op):
    @staticmethod
    def forward(ctx, *xs, dim=0):
        xp = get_array_module(*xs)
        ref = xs[0]
        axis = _axes(dim, ref.ndim)[0]
        for i, x in enumerate(xs):
            if type(x) is not type(ref):
                raise _device_error("cat", ref, x)
            if x.ndim != ref.ndim or any(
                    a != b for j, (a, b) in enumerate(zip(x.shape, ref.shape))
                    if j != axis):
                raise RuntimeError(
                    f"Sizes of tensors must match except in dimension "
                    f"{axis}. Expected {list(ref.shape)} but got "
                    f"{list(x.shape)} for tensor number {i} in the list.")
        dt = xs[0].dtype
        if any(x.dtype != dt for x in xs):
            rt = from_np(dt)
            for x in xs[1:]:
                rt = result_type(rt, from_np(x.dtype))
            dt = rt.np
        ctx.sizes = [x.shape[axis] for x in xs]
        ctx.dtypes = [x.dtype for x in xs]
        ctx.axis = axis
        return xp.concatenate(xs, axis=axis).astype(dt, copy=False)

    @staticmethod
    def backward(ctx, g):
        xp = get_array_module(g)
        splits = np.cumsum(ctx.sizes)[:-1]
        parts = xp.split(g, splits.tolist(), axis=ctx.axis)
        return tuple(p.astype(d, copy=False)
                     for p, d in zip(parts, ctx.dtypes))


class Stack(Op):
    @staticmethod
    def forward(ctx, *xs, dim=0):
        ref = xs[0]
        for i, x in enumerate(xs):
            if type(x) is not type(ref):
                raise _device_error("stack", ref, x)
            if x.shape != ref.shape:
                raise RuntimeError(
                    f"stack expects each tensor to be equal size, but got "
                    f"{list(ref.shape)} at entry 0 and {list(x.shape)} at "
                    f"entry {i}")
        axis = _axes(dim, ref.ndim + 1)[0]
        ctx.axis, ctx.n = axis, len(xs)
        ctx.dtypes = [x.dtype for x in xs]
        return get_array_module(*xs).stack(xs, axis=axis)

    @staticmethod
    def backward(ctx, g):
        xp = get_array_module(g)
        return tuple(xp.take(g, i, axis=ctx.axis).astype(d, copy=False)
                     for i, d in enumerate(ctx.dtypes))


# =============================================================== linear ==

class MatMul(Op):
    @staticmethod
    def forward(ctx, x, y):
        if x.ndim == 0 or y.ndim == 0:
            raise RuntimeError(
                f"both arguments to matmul need to be at least 1D, but they "
                f"are {x.ndim}D and {y.ndim}D")
        x, y = promote(x, y, "matmul")
        kx = x.shape[-1]
        ky = y.shape[-2] if y.ndim > 1 else y.shape[0]
        if kx != ky:
            raise RuntimeError(
                f"mat1 and mat2 shapes cannot be multiplied "
                f"({'x'.join(map(str, x.shape))} and "
                f"{'x'.join(map(str, y.shape))})")
        ctx.save_for_backward(x, y)
        return x @ y

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.to_save
        n = ctx.needs_input_grad
        xp = get_array_module(g)
        x2 = x[None, :] if x.ndim == 1 else x
        y2 = y[:, None] if y.ndim == 1 else y
        if x.ndim == 1 and y.ndim == 1:
            g2 = g.reshape(1, 1)
        elif x.ndim == 1:
            g2 = xp.expand_dims(g, -2)
        elif y.ndim == 1:
            g2 = xp.expand_dims(g, -1)
        else:
            g2 = g
        gx = gy = None
        if n[0]:
            gx = g2 @ xp.swapaxes(y2, -1, -2)
            gx = unbroadcast(gx, x2.shape).reshape(x.shape)
        if n[1]:
            gy = xp.swapaxes(x2, -1, -2) @ g2
            gy = unbroadcast(gy, y2.shape).reshape(y.shape)
        return gx, gy


class Linear(Op):
    """y = x @ w.T + b, one primitive so an MLP layer costs one node."""
    @staticmethod
    def forward(ctx, x, w, b=None):
        if x.shape[-1] != w.shape[1]:
            rows = int(np.prod(x.shape[:-1]))
            raise RuntimeError(
                f"mat1 and mat2 shapes cannot be multiplied ({rows}x"
                f"{x.shape[-1]} and {w.shape[1]}x{w.shape[0]})")
        if type(x) is not type(w):
            raise _device_error("linear", x, w)
        if x.dtype != w.dtype:
            raise RuntimeError(
                f"mat1 and mat2 must have the same dtype, but got "
                f"{from_np(x.dtype)} and {from_np(w.dtype)}")
        ctx.save_for_backward(x, w)
        if x.ndim > 2 and not x.flags.c_contiguous:
            # a strided N-D input (a batch_first transpose) would run as
            # one small GEMM per leading index: copy it once into rows
            # instead, measured 1.7x faster, and keep the copy for backward
            x2 = x.reshape(-1, x.shape[-1])
            ctx.x2 = x2
            out = (x2 @ w.T).reshape(x.shape[:-1] + (w.shape[0],))
        else:
            out = x @ w.T
        if b is not None:
            out += b
        return out

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.to_save
        n = ctx.needs_input_grad
        gx = gw = gb = None
        g2 = g.reshape(-1, g.shape[-1])
        if n[0]:
            gx = (g2 @ w).reshape(g.shape[:-1] + (w.shape[1],))
        if n[1]:
            x2 = ctx.__dict__.get("x2")
            if x2 is None:
                x2 = x.reshape(-1, x.shape[-1])
            gw = g2.T @ x2
        if len(n) > 2 and n[2]:
            gb = g2.sum(axis=0)
        return gx, gw, gb
