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
        out = x2 ** y2
        ctx.save_for_backward(x2, y2, out)
        return out

    @staticmethod
    def backward(ctx, g):
        x, y, out = ctx.to_save
        n = ctx.needs_input_grad
        xp = get_array_module(g)
        gx = gy = None
        if n[0]:
            if type(y) in _SCALARS:
                gx = g * y * x ** (y - 1) if y != 0 else g * 0
            else:
                gx = g * y * x ** (y - 1)
            gx = unbroadcast(gx, ctx.xs, ctx.xd)
        if n[1]:
            with np.errstate(divide="ignore", invalid="ignore"):
                lx = xp.log(x) if type(x) not in _SCALARS else np.log(x)
            # d/dy x**y = x**y log x, taken as 0 where x == 0 (PyTorch)
            # (x may be a Python scalar: CuPy's where needs an array)
            gy = xp.where(xp.asarray(x == 0), 0, g * out * lx)
            gy = unbroadcast(gy, ctx.ys, ctx.yd)
        return gx, gy


class Maximum(Op):
    """Elementwise maximum; ties split the gradient evenly (PyTorch)."""
    _pick = staticmethod(np.greater)

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
        w = cls._pick(x, y) + 0.5 * (x == y)
        n = ctx.needs_input_grad
        return (unbroadcast(g * w, ctx.xs, ctx.xd) if n[0] else None,
                unbroadcast(g * (1 - w), ctx.ys, ctx.yd) if n[1] else None)


class Minimum(Maximum):
    """Elementwise minimum; ties split the gradient evenly."""
    _pick = staticmethod(np.less)


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
        return g * (-0.5) * out * out * out


class Abs(Op):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return abs(x)

    @staticmethod
    def backward(ctx, g):
        return g * get_array_module(g).sign(ctx.to_save[0])


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
        # the two-sided form never overflows in exp
        e = xp.exp(-abs(x))
        out = xp.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype)
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
        return g * (ctx.to_save[0] > 0)


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
        x = ctx.to_save[0]
        keep = True
        if ctx.lo is not None:
            keep = x >= ctx.lo
        if ctx.hi is not None:
            keep = keep & (x <= ctx.hi)
        return g * keep


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
        return (None,
                unbroadcast(g * cond, ctx.xs, ctx.xd) if n[1] else None,
                unbroadcast(g * ~cond, ctx.ys, ctx.yd) if n[2] else None)


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
    """max/min over dims; ties share the gradient evenly (PyTorch amax)."""
    @staticmethod
    def forward(ctx, x, dim=None, keepdim=False, is_min=False):
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
        ctx.axes, ctx.keepdim = axes, keepdim
        return out

    @staticmethod
    def backward(ctx, g):
        x, out = ctx.to_save
        o = _expand_back(out, x.shape, ctx.axes, ctx.keepdim)
        g = _expand_back(g, x.shape, ctx.axes, ctx.keepdim)
        mask = x == o
        count = mask.sum(axis=ctx.axes, keepdims=True)
        return g * mask / count


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
