"""Indexing, forward and backward side by side: ``x[key]`` (a view for basic
keys), ``x[key] = v`` out of place, and embedding lookups. Gradients of
integer-array indexing along axis 0 are summed by ``index_add0`` (sort +
reduceat), never by a slow ``add.at`` on the CPU.
"""
import numpy as np

from .. import _kernels
from .._backend import get_array_module
from .base import Op, unbroadcast, is_float, grad_xp


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


def _is_tensor(a):
    return type(a) is not np.ndarray and hasattr(a, "_make")


def index_add0(xp, shape, dtype, idx, src):
    """out = zeros(shape); out[idx] += src along axis 0, repeats summed,
    by sorting + add.reduceat instead of slow ``add.at``. ``src`` may be a
    gradient tensor (create_graph): then the ``AddAt`` op, same values."""
    if _is_tensor(src):
        return AddAt.apply(src, idx=idx, shape=tuple(shape), dtype=dtype)
    out = xp.zeros(shape, dtype)
    idx = idx.reshape(-1)
    if idx.size == 0:
        return out
    src = src.reshape((idx.size,) + tuple(shape[1:]))
    idx = xp.where(idx < 0, idx + shape[0], idx)
    if xp is not np:   # CuPy's scatter add is fast on the GPU
        xp.add.at(out, idx, src)
        return out
    k = _kernels.kernels(out, src, reduces=True) if out.ndim > 1 else None
    if k is not None:   # one threaded pass, no sort
        k.index_add_rows(idx, src.reshape(idx.size, -1),
                         out.reshape(shape[0], -1))
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


def scatter_add_flat(xp, size, lin, vals, dtype):
    """zeros(size) with vals added at the flat positions lin (repeats sum;
    ``bincount`` on the CPU). ``vals`` may be a gradient tensor: then the
    ``AddAt`` op, same values."""
    if _is_tensor(vals):
        return AddAt.apply(vals, idx=lin, shape=(size,), dtype=dtype,
                           flat=True)
    lin = lin.reshape(-1)
    vals = vals.reshape(-1)
    if xp is np and is_float(vals.dtype):
        out = np.bincount(lin, weights=vals, minlength=size)
        return out.astype(dtype, copy=False)
    out = xp.zeros(size, dtype)
    xp.add.at(out, lin, vals)
    return out


class AddAt(Op):
    """The scatter-adds of backward bodies as an op (their create_graph
    form): ``index_add0`` (rows of ``src`` added at ``idx`` along axis 0
    of zeros(shape)) or, ``flat``, ``scatter_add_flat``. Forward is the
    array helper itself, so both orders give the same values; backward is
    the gather at ``idx``."""
    @staticmethod
    def forward(ctx, src, idx=None, shape=(), dtype=None, flat=False):
        ctx.idx, ctx.ss = idx.reshape(-1), src.shape
        dtype = getattr(dtype, "np", None) or src.dtype
        xp = get_array_module(src)
        if flat:
            return scatter_add_flat(xp, shape[0], idx, src, dtype)
        return index_add0(xp, shape, dtype, idx, src)

    @staticmethod
    def backward(ctx, g):
        return g[ctx.const(ctx.idx)].reshape(ctx.ss)


def scatter_to(xp, shape, dtype, key, g):
    """zeros(shape) with ``g`` at ``key`` (no repeats): an array, or the
    ``SetIndex`` op on a gradient tensor."""
    if _is_tensor(g):
        return SetIndex.apply(xp.zeros(shape, g._data.dtype), g, key=key)
    out = xp.zeros(shape, dtype)
    out[key] = g
    return out


def zero_at(g, key, own=False):
    """``g`` with zeros at ``key``: a copy (``g`` itself, changed, when
    the caller ``own``s the array), or the ``SetIndex`` op on a tensor."""
    if _is_tensor(g):
        return SetIndex.apply(g, 0, key=key)
    if not own:
        g = g.copy()
    g[key] = 0
    return g


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
        xp = grad_xp(g)
        key = ctx.key
        if _is_basic(key) or _is_mask_only(key):
            # no repeats possible: plain assignment
            return scatter_to(xp, ctx.shape, ctx.xd, key, g)
        idx = _int_axis0(key)
        if idx is not None:
            return index_add0(xp, ctx.shape, ctx.xd, idx, g)
        # general advanced indexing: the flat positions it reads, repeats
        # summed
        am = get_array_module(getattr(g, "_data", g))
        size = int(np.prod(ctx.shape))
        lin = am.arange(size).reshape(ctx.shape)[key]
        return scatter_add_flat(am, size, lin, g, ctx.xd).reshape(ctx.shape)


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
            gx = zero_at(g, ctx.key)
        if n[1]:
            gv = unbroadcast(g[ctx.key], ctx.vs, ctx.vd)
        return gx, gv


class Embedding(Op):
    """w[idx]; backward sums rows by sort + reduceat (``index_add0``); the
    ``padding_idx`` row gets no gradient; ``scale_grad_by_freq`` divides
    each row's gradient by the number of times it occurs in idx."""
    @staticmethod
    def forward(ctx, w, idx, padding_idx=None, scale_grad_by_freq=False):
        ctx.idx, ctx.shape, ctx.pad = idx, w.shape, padding_idx
        ctx.wd = w.dtype
        ctx.freq = scale_grad_by_freq
        try:
            return w[idx]
        except IndexError:
            raise IndexError("index out of range in self") from None

    @staticmethod
    def backward(ctx, g):
        am = get_array_module(ctx.idx)
        gw = index_add0(grad_xp(g), ctx.shape, ctx.wd, ctx.idx, g)
        if ctx.freq:
            n = am.bincount(ctx.idx.reshape(-1), minlength=ctx.shape[0])
            gw = gw / ctx.const(am.maximum(n, 1).astype(ctx.wd).reshape(
                (-1,) + (1,) * (len(ctx.shape) - 1)))
        if ctx.pad is not None:
            gw = zero_at(gw, ctx.pad, own=True)
        return gw, None
