"""The autograd functions of nn.parallel that communicate: the four
tensor-parallel regions and SyncBatchNorm's op. They sit here, beside each
other, and not in ``dtorch.ops``: their forward and backward call
collectives, and ops/ is below the distributed layer."""
import numpy as np

from ... import distributed as dist
from ..._backend import get_array_module
from ...autograd.function import once_differentiable
from ...ops.base import Op
from ...tensor import Tensor


# ================================================================ arrays ==

def resolve_group(group):
    """``group``, or the calling thread's default group (an error naming
    the missing init_process_group when there is none)."""
    if group is not None:
        return group
    g = dist.group.WORLD
    if g is None:
        raise RuntimeError(
            "Default process group has not been initialized, please make "
            "sure to call init_process_group.")
    return g


def _size(group):
    return 1 if group is None else dist.get_world_size(group)


def _sum_(group, arr):
    """In place: ``arr`` (contiguous) becomes the sum over ``group``."""
    if _size(group) > 1:
        dist.all_reduce(Tensor._wrap(arr), group=group)


def _all_reduce(group, x):
    # a fresh contiguous buffer: the collective works in place, and x may
    # be an input or a gradient that someone else still holds
    out = get_array_module(x).array(x, order="C", copy=True)
    _sum_(group, out)
    return out


def _split_last(group, x, what):
    n, size = x.shape[-1], _size(group)
    if n % size:
        raise ValueError(
            f"{what}: the last dim of shape {list(x.shape)} ({n}) is not "
            f"divisible by the tensor-parallel size {size}")
    k, r = n // size, dist.get_rank(group)
    xp = get_array_module(x)
    return xp.ascontiguousarray(x[..., r * k:(r + 1) * k])


def gather_along(group, x, dim):
    """The full array from every rank's slice of ``x`` along ``dim``."""
    size = _size(group)
    if size == 1:
        return x
    xp = get_array_module(x)
    x = xp.ascontiguousarray(x)
    out = xp.empty((size,) + x.shape, x.dtype)
    dist.all_gather_into_tensor(Tensor._wrap(out), Tensor._wrap(x),
                                group=group)
    return xp.concatenate(list(out), axis=dim)


def _gather_last(group, x):
    return gather_along(group, x, -1)


# =============================================================== regions ==

def _region_grad(ctx, g, collective, conjugate):
    """A region's backward: ``collective(group, g)`` on arrays (None: g
    itself); under create_graph the conjugate region's op, whose forward
    is that same collective, so the gradient is itself differentiable
    (double backward through TP layers) with the same values."""
    if ctx._gmake is not None:
        return conjugate.apply(g, group=ctx.group)
    return g if collective is None else collective(ctx.group, g)


class CopyToTP(Op):
    """Identity forward; backward sums the input gradient over the group
    (each rank used the input for its own shard of the output)."""

    @staticmethod
    def forward(ctx, x, group=None):
        ctx.group = group
        return x.copy()

    @staticmethod
    def backward(ctx, g):
        return _region_grad(ctx, g, _all_reduce, ReduceFromTP)


class ReduceFromTP(Op):
    """Sum of the ranks' partial results forward; the gradient of a sum
    reaches every term unchanged."""

    @staticmethod
    def forward(ctx, x, group=None):
        ctx.group = group
        return _all_reduce(group, x)

    @staticmethod
    def backward(ctx, g):
        return _region_grad(ctx, g, None, CopyToTP)


class ScatterToTP(Op):
    """Keep this rank's slice of the last dim; backward all-gathers."""

    @staticmethod
    def forward(ctx, x, group=None):
        ctx.group = group
        return _split_last(group, x, "scatter_to_tp_region")

    @staticmethod
    def backward(ctx, g):
        return _region_grad(ctx, g, _gather_last, GatherFromTP)


class GatherFromTP(Op):
    """Concatenate the ranks' last-dim slices; backward keeps this rank's
    slice of the gradient."""

    @staticmethod
    def forward(ctx, x, group=None):
        ctx.group = group
        return _gather_last(group, x)

    @staticmethod
    def backward(ctx, g):
        return _region_grad(ctx, g, lambda group, a: _split_last(
            group, a, "gather_from_tp_region backward"), ScatterToTP)


# ============================================================ SyncBatchNorm ==

class _SyncBN(Op):
    @staticmethod
    def forward(ctx, x, w, b, eps=1e-5, group=None, stats=None):
        xp = get_array_module(x)
        axes = (0,) + tuple(range(2, x.ndim))
        C_ = x.shape[1]
        n_local = x.size // C_
        x64 = x.astype(np.float64)
        sums = xp.concatenate([x64.sum(axis=axes),
                               (x64 * x64).sum(axis=axes),
                               xp.array([float(n_local)])])
        _sum_(group, sums)
        n = sums[-1]
        mean = sums[:C_] / n
        var = xp.maximum(sums[C_:2 * C_] / n - mean * mean, 0.0)
        shape = (1, C_) + (1,) * (x.ndim - 2)
        invstd = 1.0 / xp.sqrt(var + eps)
        xhat = ((x64 - mean.reshape(shape)) * invstd.reshape(shape))
        out = xhat
        if w is not None:
            out = out * w.reshape(shape) + b.reshape(shape)
        ctx.xhat, ctx.invstd, ctx.n, ctx.w = xhat, invstd, n, w
        ctx.axes, ctx.shape, ctx.group, ctx.xd = axes, shape, group, x.dtype
        stats.update(mean=mean, var=var, n=n)
        return out.astype(x.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        xp = get_array_module(g)
        g64 = g.astype(np.float64)
        xhat, shape, axes = ctx.xhat, ctx.shape, ctx.axes
        gw = (g64 * xhat).sum(axis=axes)
        gb = g64.sum(axis=axes)
        gxhat = g64 * ctx.w.reshape(shape) if ctx.w is not None else g64
        sums = xp.concatenate([gxhat.sum(axis=axes),
                               (gxhat * xhat).sum(axis=axes)])
        _sum_(ctx.group, sums)
        C_ = xhat.shape[1]
        s_g = sums[:C_].reshape(shape)
        s_gx = sums[C_:].reshape(shape)
        gx = ctx.invstd.reshape(shape) * (gxhat - s_g / ctx.n
                                          - xhat * s_gx / ctx.n)
        w = ctx.w
        return (gx.astype(ctx.xd),
                gw.astype(w.dtype) if w is not None else None,
                gb.astype(w.dtype) if w is not None else None)
