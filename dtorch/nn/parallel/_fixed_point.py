"""The exact, order-free sum of deterministic data parallelism (issue 26):
values rounded once onto a fixed-point grid of integers held in float64,
which add exactly in any order and grouping, here and in any backend's
all-reduce (the reasons and figures: ``_deterministic``'s docstring)."""
import math

import numpy as np

from ... import distributed as dist
from ..._backend import get_array_module
from ..._kernels import kernels
from ...tensor import Tensor


def fixed_point_sum(grads, shards, group, regions=None):
    """[sum over all ranks' shards of grads[i]] as float64 arrays, exact
    on a fixed-point grid and so independent of the order and grouping of
    the additions. ``grads[i]``: this rank's shard gradients of parameter
    i; ``shards``: the global number of shards (bounds the sum).
    ``regions``: element counts that tile the parameters laid end to end
    (ZeRO-2's buckets): each is reduce-scattered, so this rank gets the sum
    on its chunk of each (chunk ceil(n / world), rank r's r-th) and zeros
    elsewhere, for half the bytes of an all-reduce.

    The grid points are integers held in float64: below 2^53 every sum of
    them is exact in any order, here, in the all-reduce of any backend, so
    no int64 conversion is needed (measured: 3 passes over a gradient per
    shard instead of 7). Two all-reduces: the per-parameter maximum
    exponent (and whether any shard is not finite), then one float64
    buffer of all parameters."""
    # one process with no group: the sum of its own shards (get_world_size
    # raises before init_process_group, as PyTorch's)
    world = 1 if group is None and not dist.is_initialized() \
        else dist.get_world_size(group)
    prec = 52 - max(1, math.ceil(math.log2(shards)))
    top = np.empty(2 * len(grads), np.float64)
    for i, gs in enumerate(grads):
        m = 0.0
        for g in gs:
            if g.size:
                m = max(m, float(g.max()), -float(g.min()))
        bad = not math.isfinite(m)       # nan propagates through max/min
        if bad:
            m = max([float(get_array_module(g).where(
                get_array_module(g).isfinite(g), abs(g), 0).max())
                for g in gs if g.size])
        top[2 * i] = math.frexp(m)[1] if m > 0 else -1100
        top[2 * i + 1] = bad
    if world > 1:
        dist.all_reduce(Tensor._wrap(top), op=dist.ReduceOp.MAX, group=group)
    # the exponent of the grid's unit (all-zero parameters: any will do;
    # float64 gradients below 2^-971 would need a scale beyond 2^1023)
    exps = [max(int(e) - prec, -1023) if e > -1100 else 0
            for e in top[0::2]]
    sizes = [gs[0].size for gs in grads]
    xp = get_array_module(grads[0][0]) if grads else np
    flat = xp.zeros(sum(sizes), np.float64)
    off = 0
    for gs, e, n in zip(grads, exps, sizes):
        acc = flat[off:off + n]
        # the scaled values stay below 2^52: float32 holds them (and their
        # rounding to integers) exactly unless the scale itself overflows
        # it, and float32 passes cost half the memory traffic
        dt = np.float32 if gs[0].dtype == np.float32 and -e <= 126 \
            else np.float64
        t = None
        scale = dt(math.ldexp(1.0, -e))
        for g in gs:
            g = g.reshape(-1)
            # exact: a power-of-two scaling (inf and nan are put right by
            # _nonfinite); the compiled kernel fuses the three passes
            k = kernels(g) if g.dtype == dt else None
            if k is not None:
                k.fixed_point_add(acc, g, scale)
                continue
            if t is None:
                t = xp.empty(n, dt)
            xp.multiply(g, scale, out=t, dtype=dt)
            xp.rint(t, out=t)
            with np.errstate(invalid="ignore"):
                acc += t
        off += n
    if top[1::2].any():
        flat[~xp.isfinite(flat)] = 0.0
    owned = None
    if regions is not None:
        owned = _reduce_scatter(flat, regions, group, world)
    elif world > 1:
        dist.all_reduce(Tensor._wrap(flat), group=group)
    out, off = [], 0
    for gs, e, n in zip(grads, exps, sizes):
        out.append((flat[off:off + n] * math.ldexp(1.0, e))
                   .reshape(gs[0].shape))
        off += n
    if top[1::2].any():
        _nonfinite(grads, out, top[1::2], group, world)
    if owned is not None:
        off = 0
        for o in out:
            o.reshape(-1)[~owned[off:off + o.size]] = 0.0
            off += o.size
    return out


def _reduce_scatter(flat, regions, group, world):
    """In place: each region of ``flat`` becomes the sum over ranks on this
    rank's chunk of it and zero elsewhere; returns the mask of the chunks
    (as ZeRO-2's hook cuts a bucket)."""
    xp = get_array_module(flat)
    rank = dist.get_rank(group) if world > 1 else 0
    owned = xp.zeros(flat.size, bool)
    off = 0
    for n in regions:
        seg = flat[off:off + n]
        chunk = -(-n // world)
        send = xp.zeros(chunk * world, flat.dtype)
        send[:n] = seg
        part = send[rank * chunk:(rank + 1) * chunk].copy()
        if world > 1:
            dist.reduce_scatter_tensor(Tensor._wrap(part), Tensor._wrap(send),
                                       group=group)
        lo, hi = min(rank * chunk, n), min((rank + 1) * chunk, n)
        seg[...] = 0.0
        seg[lo:hi] = part[:hi - lo]
        owned[off + lo:off + hi] = True
        off += n
    return owned


def _nonfinite(grads, out, bad, group, world):
    """Elements where some shard is nan or inf take IEEE's order-free
    answer: nan if any nan or both infinities, else the infinity."""
    idx = [i for i in range(len(grads)) if bad[i]]
    xp = get_array_module(grads[0][0])
    counts = xp.concatenate([xp.stack([
        sum((xp.isnan(g) for g in grads[i])),
        sum((xp.isinf(g) & (g > 0) for g in grads[i])),
        sum((xp.isinf(g) & (g < 0) for g in grads[i]))]).astype(
            np.int64).ravel() for i in idx])
    if world > 1:
        dist.all_reduce(Tensor._wrap(counts), group=group)
    off = 0
    for i in idx:
        n = out[i].size
        c = counts[off:off + 3 * n].reshape(3, *out[i].shape)
        off += 3 * n
        o = out[i]
        o[c[1] > 0] = math.inf
        o[c[2] > 0] = -math.inf
        o[(c[0] > 0) | ((c[1] > 0) & (c[2] > 0))] = math.nan


