"""The autograd functions of nn.parallel that communicate: the four
tensor-parallel regions and SyncBatchNorm's op. They sit here, beside each
other, and not in ``dtorch.ops``: their forward and backward call
collectives, and ops/ is below the distributed layer."""
import numpy as np

from ... import distributed as dist
from ..._backend import get_array_module
from ...autograd.function import Function, once_differentiable
from ...ops.base import Op
from ...tensor import Tensor
from ._fixed_point import fixed_point_sum


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

class Region(Op):
    """The family of Megatron's four tensor-parallel region ops (x, group):
    a member's ``collective(group, x)`` is its forward, ``grad(group, g)``
    its backward on arrays (None: g itself); under create_graph the
    backward is the ``conjugate`` region's op, whose forward is that same
    collective, so the gradient is itself differentiable (double backward
    through TP layers) with the same values."""
    grad = None

    @classmethod
    def forward(cls, ctx, x, group=None):
        ctx.group = group
        return cls.collective(group, x)

    @classmethod
    def backward(cls, ctx, g):
        if ctx._gmake is not None:
            return cls.conjugate.apply(g, group=ctx.group)
        return g if cls.grad is None else cls.grad(ctx.group, g)


class CopyToTP(Region):
    """Identity forward; backward sums the input gradient over the group
    (each rank used the input for its own shard of the output)."""
    collective = staticmethod(lambda group, x: x.copy())
    grad = staticmethod(_all_reduce)


class ReduceFromTP(Region):
    """Sum of the ranks' partial results forward; the gradient of a sum
    reaches every term unchanged."""
    collective = staticmethod(_all_reduce)


class ScatterToTP(Region):
    """Keep this rank's slice of the last dim; backward all-gathers."""
    collective = staticmethod(
        lambda group, x: _split_last(group, x, "scatter_to_tp_region"))
    grad = staticmethod(_gather_last)


class GatherFromTP(Region):
    """Concatenate the ranks' last-dim slices; backward keeps this rank's
    slice of the gradient."""
    collective = staticmethod(_gather_last)
    grad = staticmethod(lambda group, g: _split_last(
        group, g, "gather_from_tp_region backward"))


CopyToTP.conjugate, ReduceFromTP.conjugate = ReduceFromTP, CopyToTP
ScatterToTP.conjugate, GatherFromTP.conjugate = GatherFromTP, ScatterToTP


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


class _ShardStats(Function):
    """Deterministic SyncBatchNorm's statistics (nn/parallel/_lockstep.py):
    from the inputs of a rank's k virtual shards, the global batch's mean
    and 1/std per channel, by exact fixed-point sums over all V shards of
    every rank, as one (2, C) float64 tensor per shard. Backward sums the
    shards' gradients of them the same way, so every shard's input
    gradient sees all V shards', in the same bits on any world size."""

    @staticmethod
    def forward(ctx, eps, group, shards, stats, *xs):
        a = [x._data.astype(np.float64) for x in xs]
        axes = (0,) + tuple(range(2, a[0].ndim))
        s1, s2 = fixed_point_sum([[x.sum(axis=axes) for x in a],
                                  [(x * x).sum(axis=axes) for x in a]],
                                 shards, group)
        xp = get_array_module(s1)
        n = a[0].size // a[0].shape[1] * shards
        mean = s1 / n
        var = xp.maximum(s2 / n - mean * mean, 0.0)
        invstd = 1.0 / xp.sqrt(var + eps)
        ctx.a, ctx.axes, ctx.n, ctx.group, ctx.shards = a, axes, n, group, \
            shards
        ctx.mean, ctx.var_eps = mean, var + eps
        ctx.dtypes = [x._data.dtype for x in xs]
        stats.update(mean=mean, var=var, n=n)
        out = xp.stack([mean, invstd])
        return tuple(Tensor._wrap(out.copy()) for _ in xs)

    @staticmethod
    def backward(ctx, *gs):
        gm, gi = fixed_point_sum([[g._data[0] for g in gs],
                                  [g._data[1] for g in gs]],
                                 ctx.shards, ctx.group)
        shape = (1, -1) + (1,) * (ctx.a[0].ndim - 2)
        # d mean / dx = 1/n; d invstd / dx = -(var + eps)^-3/2 (x - mean)/n
        c0 = (gm / ctx.n).reshape(shape)
        c1 = (-gi * ctx.var_eps ** -1.5 / ctx.n).reshape(shape)
        mean = ctx.mean.reshape(shape)
        return (None, None, None, None) + tuple(
            (c0 + c1 * (x - mean)).astype(dt)
            for x, dt in zip(ctx.a, ctx.dtypes))


class _ShardNorm(Op):
    """One virtual shard's normalisation by the global statistics
    (``_ShardStats``' (2, C) mean and 1/std), in float64, as one op: its
    backward gives the shard's own gradients of the statistics."""

    @staticmethod
    def forward(ctx, x, stats, w, b):
        shape = (1, -1) + (1,) * (x.ndim - 2)
        mean, invstd = stats[0].reshape(shape), stats[1].reshape(shape)
        centred = x.astype(np.float64) - mean
        xhat = centred * invstd
        out = xhat if w is None else xhat * w.reshape(shape) \
            + b.reshape(shape)
        ctx.centred, ctx.xhat, ctx.invstd, ctx.w = centred, xhat, invstd, w
        ctx.shape, ctx.xd = shape, x.dtype
        return out.astype(x.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        xp = get_array_module(g)
        axes = (0,) + tuple(range(2, g.ndim))
        g64 = g.astype(np.float64)
        w = ctx.w
        gxhat = g64 if w is None else g64 * w.reshape(ctx.shape)
        gstats = xp.stack([-(gxhat * ctx.invstd).sum(axis=axes),
                           (gxhat * ctx.centred).sum(axis=axes)])
        gx = (gxhat * ctx.invstd).astype(ctx.xd)
        if w is None:
            return gx, gstats, None, None
        return (gx, gstats, (g64 * ctx.xhat).sum(axis=axes).astype(w.dtype),
                g64.sum(axis=axes).astype(w.dtype))
