"""Reductions, forward and backward side by side: sum, prod, amax/amin
(and max()/min() over everything), vector norms, max/min along one dim,
median of all elements. Backward reshapes the reduced gradient with
``_expand_back`` so that it broadcasts over the input.
"""
import numpy as np

from .._backend import get_array_module, put_along_axis
from .base import Op, _axes, _float_input, keep_grad, sgn, \
    is_float, grad_xp, astype
from .arith import _pow


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
        g = grad_xp(g).broadcast_to(g, ctx.shape)
        # an array: a contiguous copy, as before (not a broadcast view)
        return g.astype(ctx.xd) if ctx._gmake is None else astype(g, ctx.xd)


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
        xp = grad_xp(g)
        axis = ctx.axis
        if x.ndim == 0:
            return g
        has_zero = bool((x == 0).any())
        x = ctx.input(0, x)
        if not has_zero:
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
        def head(a):        # the first n - 1 entries along axis
            return a[(slice(None),) * axis + (slice(0, a.shape[axis] - 1),)]
        ones = xp.ones_like(x[(slice(None),) * axis + (slice(0, 1),)])
        left = xp.cumprod(xp.concatenate([ones, head(x)], axis=axis),
                          axis=axis)
        right = xp.flip(xp.cumprod(xp.concatenate(
            [ones, head(xp.flip(x, axis=axis))], axis=axis), axis=axis),
            axis=axis)
        others = left * right
        if flat:
            return (g * others).reshape(shape)
        if not ctx.keepdim:
            g = xp.expand_dims(g, axis)
        return g * others


def _nonempty(x, axes, op):
    """PyTorch's check that an empty tensor is not reduced over an empty
    dim by an op without identity (max, min): over the other dims the
    result is empty."""
    if axes is None or axes == ():
        raise RuntimeError(
            f"{op}(): Expected reduction dim to be specified for input."
            "numel() == 0. Specify the reduction dim with the 'dim' "
            "argument.")
    for a in axes:
        if x.shape[a] == 0:
            raise IndexError(
                f"{op}(): Expected reduction dim {a} to have non-zero size.")


class Amax(Op):
    """max/min over dims; ties share the gradient evenly (PyTorch amax:
    (g / count) * mask). ``evenly`` is max()/min() over everything, whose
    PyTorch backward (evenly_distribute_backward) also shares it among
    the NaN entries when the result is NaN, and writes zeros elsewhere."""
    @staticmethod
    def forward(ctx, x, dim=None, keepdim=False, is_min=False, evenly=False):
        xp = get_array_module(x)
        axes = _axes(dim, x.ndim) if x.ndim else None
        if x.size == 0:
            _nonempty(x, axes, ("min" if is_min else "max")
                      if evenly else ("amin" if is_min else "amax"))
        f = xp.amin if is_min else xp.amax
        out = f(x, axis=axes, keepdims=keepdim)
        ctx.save_for_backward(x, out)
        ctx.axes, ctx.keepdim, ctx.evenly = axes, keepdim, evenly
        return out

    @staticmethod
    def backward(ctx, g):
        x, out = ctx.to_save
        xp = get_array_module(x)
        o = _expand_back(out, x.shape, ctx.axes, ctx.keepdim)
        g = _expand_back(g, x.shape, ctx.axes, ctx.keepdim)
        with np.errstate(divide="ignore", invalid="ignore"):
            if ctx.evenly:
                mask = xp.isnan(x) if bool(xp.isnan(out)) else x == o
                return keep_grad(grad_xp(g), mask, g / int(mask.sum()))
            mask = x == o
            count = mask.sum(axis=ctx.axes, keepdims=True)
            return g / ctx.const(count) * ctx.const(mask)


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
        xa, out = ctx.to_save
        xp = grad_xp(g)
        am = get_array_module(xa)
        p, axes = ctx.p, ctx.axes
        g = _expand_back(g, xa.shape, axes, ctx.keepdim)
        na = _expand_back(out, xa.shape, axes, ctx.keepdim)
        n = _expand_back(ctx.output(out), xa.shape, axes, ctx.keepdim)
        x = ctx.input(0, xa)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            if p == 0:
                return xp.zeros(xa.shape, g.dtype)
            if p == 2:
                return g * xp.where(na == 0, 0.0, x / n)
            sign = ctx.const(sgn(am, xa))
            if p == 1:
                return sign * g
            a = abs(x)
            if p in (np.inf, -np.inf):
                mask = (abs(xa) == na) | am.isnan(xa)
                count = mask.sum(axis=axes, keepdims=True)
                return sign * ((g / ctx.const(count)) * ctx.const(mask))
            # powers by pow_scalar's kernels on both paths (_pow)
            if p < 1:
                s = sign * xp.where(xa == 0, 0.0, _pow(xp, a, p - 1))
                return s * g * _pow(xp, n, 1 - p)
            s = sign * _pow(xp, a, p - 1) if p < 2 else \
                x * _pow(xp, a, p - 2)
            return s * xp.where(na == 0, 0.0, g / _pow(xp, n, p - 1))


class MaxDim(Op):
    """values of max/min along one dim; the gradient goes to the index
    that argmax/argmin picked, as in PyTorch's ``max(dim)``."""
    @staticmethod
    def forward(ctx, x, dim=0, keepdim=False, is_min=False):
        xp = get_array_module(x)
        axis = _axes(dim, x.ndim)[0] if x.ndim else None
        if x.ndim == 0:
            ctx.idx = None
            ctx.indices = xp.zeros((), np.int64)
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
        g = g.reshape(ctx.idx.shape)
        if ctx._gmake is not None:      # no tensor is written in place
            return g.new_zeros(ctx.shape).scatter(
                ctx.axis, ctx.const(ctx.idx), g)
        gx = get_array_module(g).zeros(ctx.shape, g.dtype)
        put_along_axis(get_array_module(g), gx, ctx.idx, g, axis=ctx.axis)
        return gx


class MedianAll(Amax):
    """The lower median of all elements (NaN if any is NaN). Backward is
    Amax's ``evenly`` one: g shared evenly among the elements equal to the
    result, or among the NaN ones (PyTorch's evenly_distribute_backward)."""
    @staticmethod
    def forward(ctx, x):
        xp = get_array_module(x)
        flat = x.reshape(-1)
        if flat.size == 0:
            out = xp.asarray(np.nan, dtype=x.dtype)
        elif is_float(x.dtype) and bool(xp.isnan(flat).any()):
            out = xp.asarray(np.nan, dtype=x.dtype)
        else:
            k = (flat.size - 1) // 2
            out = xp.partition(flat, k)[k]
        ctx.save_for_backward(x, out)
        ctx.axes, ctx.keepdim, ctx.evenly = None, False, True
        return xp.asarray(out)
