"""Selection, gather/scatter, triangle and scan ops, forward and backward side
by side: tril/triu, sort/topk/kthvalue, gather/scatter/scatter_add,
index_select/index_add/index_copy/index_fill, cumsum, cumprod,
cummax/cummin, logcumsumexp.

Arrays in, arrays out (NumPy or CuPy, ``get_array_module`` is the only device
switch). A gradient that several outputs send to one input element is summed
with ``scatter_add_flat`` (``bincount`` on the CPU), never a Python loop.
"""
import numpy as np

from .._backend import get_array_module
from .base import Op, _axes, axis_of, is_float, const, keep_grad_t
from .index import index_add0


def scatter_add_flat(xp, size, lin, vals, dtype):
    """zeros(size) with vals added at the flat positions lin (repeats sum)."""
    lin = lin.reshape(-1)
    vals = vals.reshape(-1)
    if xp is np and is_float(vals.dtype):
        out = np.bincount(lin, weights=vals, minlength=size)
        return out.astype(dtype, copy=False)
    out = xp.zeros(size, dtype)
    xp.add.at(out, lin, vals)
    return out


def flat_along(xp, shape, idx, axis):
    """Flat positions in an array of ``shape`` of the elements that
    ``take_along_axis(_, idx, axis)`` reads."""
    grids = list(xp.indices(idx.shape, sparse=True))
    grids[axis] = idx
    return xp.ravel_multi_index(
        tuple(xp.broadcast_to(gr, idx.shape) for gr in grids), shape,
        mode="wrap") if idx.size else xp.zeros(0, np.int64)


def _check_index(idx, size, op, dim):
    if idx.size and (int(idx.max()) >= size or int(idx.min()) < -size):
        bad = int(idx.max()) if int(idx.max()) >= size else int(idx.min())
        raise IndexError(f"{op}(): index {bad} is out of bounds for "
                         f"dimension {dim} with size {size}")


# ========================================================= triangles ==

class Tril(Op):
    """tril/triu: keep the elements on and below (above) the diagonal
    ``diagonal`` of the last two dims; the gradient is masked the same way."""
    @staticmethod
    def forward(ctx, x, diagonal=0, upper=False):
        if x.ndim < 2:
            raise RuntimeError(
                f"{'triu' if upper else 'tril'}: input tensor must have at "
                f"least 2 dimensions")
        xp = get_array_module(x)
        ctx.diagonal, ctx.upper = diagonal, upper
        return xp.triu(x, diagonal) if upper else xp.tril(x, diagonal)

    @staticmethod
    def backward(ctx, g):
        xp = get_array_module(g)
        return xp.triu(g, ctx.diagonal) if ctx.upper else \
            xp.tril(g, ctx.diagonal)

    @staticmethod
    def backward_graph(ctx, g):
        return Tril.apply(g, diagonal=ctx.diagonal, upper=ctx.upper)


# =========================================================== sorting ==

def _sort_indices(xp, x, axis, descending):
    """Stable argsort along axis; NaN counts as the largest value, as in
    PyTorch (last ascending, first descending)."""
    if x.dtype.kind == "b":
        x = x.astype(np.int8)
    if not descending:
        return xp.argsort(x, axis=axis, kind="stable")
    # an order-reversing key keeps a stable ascending sort stable
    if is_float(x.dtype):
        key = -x
        nan = xp.isnan(x)
        if bool(nan.any()):
            # primary key: not-NaN (NaN first); secondary: -x
            key = xp.where(nan, 0, key)
            return xp.lexsort((key, ~nan), axis=axis)
    elif x.dtype.kind == "i":
        key = ~x              # -x - 1: no overflow at the minimum
    else:
        key = -x.astype(np.int64)
    return xp.argsort(key, axis=axis, kind="stable")


class Select(Op):
    """Values picked along ``axis`` at ``idx`` (a precomputed int64 array,
    as sort/topk/kthvalue/median produce); backward scatters the gradient
    back to those positions. ``ctx.indices`` holds the indices."""
    @staticmethod
    def forward(ctx, x, idx=None, axis=0, keepdim=True):
        xp = get_array_module(x)
        ctx.shape, ctx.axis, ctx.idx = x.shape, axis, idx
        out = xp.take_along_axis(x, idx, axis) if x.ndim else x.copy()
        if not keepdim and x.ndim:
            out = xp.squeeze(out, axis)
            ctx.indices = xp.squeeze(idx, axis)
        else:
            ctx.indices = idx
        ctx.keepdim = keepdim
        return out

    @staticmethod
    def backward(ctx, g):
        xp = get_array_module(g)
        if not ctx.shape:
            return g
        idx = ctx.idx
        g = g.reshape(idx.shape)
        lin = flat_along(xp, ctx.shape, idx, ctx.axis)
        size = int(np.prod(ctx.shape))
        return scatter_add_flat(xp, size, lin, g, g.dtype).reshape(ctx.shape)

    @staticmethod
    def backward_graph(ctx, g):
        if not ctx.shape:
            return g
        xp = get_array_module(ctx.idx)
        lin = flat_along(xp, ctx.shape, ctx.idx, ctx.axis)
        return scatter_flat_t(g, lin, ctx.shape)


def sort_indices(x, dim=-1, descending=False):
    xp = get_array_module(x)
    if x.ndim == 0:
        return xp.zeros((), np.int64)
    axis = axis_of(dim, x.ndim)
    return _sort_indices(xp, x, axis, descending).astype(np.int64, copy=False)


def topk_indices(x, k, dim=-1, largest=True):
    xp = get_array_module(x)
    if x.ndim == 0:
        if k > 1:
            raise RuntimeError("selected index k out of range")
        return xp.zeros((), np.int64)
    axis = axis_of(dim, x.ndim)
    n = x.shape[axis]
    if not 0 <= k <= n:
        raise RuntimeError("selected index k out of range")
    if k < n and x.dtype.kind in "iuf" and n > 64:
        # partition first, then order only the k winners
        key = -x.astype(np.float64) if largest else x
        if is_float(x.dtype):
            key = xp.where(xp.isnan(x), -np.inf if largest else np.inf, key)
        part = xp.argpartition(key, k - 1, axis=axis) if k else \
            xp.zeros(x.shape[:axis] + (0,) + x.shape[axis + 1:], np.int64)
        part = xp.take(part, xp.arange(k), axis=axis)
        sub = xp.take_along_axis(x, part, axis)
        o = _sort_indices(xp, sub, axis, largest)
        return xp.take_along_axis(part, o, axis).astype(np.int64)
    idx = _sort_indices(xp, x, axis, largest)
    return xp.take(idx, xp.arange(k), axis=axis).astype(np.int64)


# ==================================================== gather/scatter ==

def _check_same_rank(x, idx, op):
    if idx.ndim != x.ndim and not (x.ndim == 0 and idx.ndim <= 1):
        raise RuntimeError(f"Index tensor must have the same number of "
                           f"dimensions as input tensor ({op})")


class Gather(Op):
    @staticmethod
    def forward(ctx, x, idx=None, dim=0):
        xp = get_array_module(x)
        if idx.dtype != np.int64:
            raise RuntimeError("gather(): Expected dtype int64 for index")
        _check_same_rank(x, idx, "gather")
        axis = axis_of(dim, x.ndim)
        x1 = x.reshape(1) if x.ndim == 0 else x
        i1 = idx.reshape(-1) if x.ndim == 0 else idx
        for d in range(x1.ndim):
            if d != axis and i1.shape[d] > x1.shape[d]:
                raise RuntimeError(
                    f"Size does not match at dimension {d} expected index "
                    f"{list(idx.shape)} to be no larger than self "
                    f"{list(x.shape)} apart from dimension {axis}")
        _check_index(i1, x1.shape[axis], "gather", axis)
        # index may be smaller than x off the gather axis: compare a slice
        sl = tuple(slice(0, i1.shape[d]) if d != axis else slice(None)
                   for d in range(x1.ndim))
        src = x1[sl]
        i1 = xp.where(i1 < 0, i1 + x1.shape[axis], i1)
        ctx.shape, ctx.axis, ctx.idx, ctx.sl = x1.shape, axis, i1, sl
        ctx.xshape = x.shape
        out = xp.take_along_axis(src, i1, axis)
        return out.reshape(idx.shape)

    @staticmethod
    def backward(ctx, g):
        xp = get_array_module(g)
        sub = xp.empty(ctx.shape)[ctx.sl].shape
        lin = flat_along(xp, sub, ctx.idx, ctx.axis)
        gs = scatter_add_flat(xp, int(np.prod(sub)), lin, g, g.dtype)
        gx = xp.zeros(ctx.shape, g.dtype)
        gx[ctx.sl] = gs.reshape(sub)
        return gx.reshape(ctx.xshape)

    @staticmethod
    def backward_graph(ctx, g):
        # idx is no larger than x off the gather axis: its positions are
        # those of the full shape
        xp = get_array_module(ctx.idx)
        lin = flat_along(xp, ctx.shape, ctx.idx, ctx.axis)
        return scatter_flat_t(g, lin, ctx.shape).reshape(ctx.xshape)


def _scatter_positions(xp, x, idx, dim, op):
    _check_same_rank(x, idx, op)
    axis = axis_of(dim, x.ndim)
    for d in range(x.ndim):
        if d != axis and idx.shape[d] > x.shape[d]:
            raise RuntimeError(
                f"Expected index {list(idx.shape)} to be no larger than "
                f"self {list(x.shape)} apart from dimension {axis} ({op})")
    _check_index(idx, x.shape[axis], op, axis)
    idx = xp.where(idx < 0, idx + x.shape[axis], idx)
    if x.ndim == 0:
        return axis, xp.zeros(idx.size, np.int64)
    grids = list(xp.indices(idx.shape, sparse=True))
    grids[axis] = idx
    lin = xp.ravel_multi_index(
        tuple(xp.broadcast_to(gr, idx.shape) for gr in grids), x.shape)
    return axis, lin.reshape(-1)


def _src_part(xp, src, idx):
    """The leading idx.shape block of src (PyTorch reads only that)."""
    if not hasattr(src, "shape"):
        return src
    sl = tuple(slice(0, n) for n in idx.shape)
    return src[sl] if src.ndim else src


class Scatter(Op):
    """out = x.clone(); out[positions of idx along dim] = src (or += src
    with ``reduce='add'``, PyTorch's scatter_add). src may be a number."""
    @staticmethod
    def forward(ctx, x, src, idx=None, dim=0, add=False):
        xp = get_array_module(x)
        if idx.dtype != np.int64:
            raise RuntimeError("scatter(): Expected dtype int64 for index")
        _, lin = _scatter_positions(xp, x, idx, dim,
                                    "scatter_add" if add else "scatter")
        s = _src_part(xp, src, idx)
        out = x.copy()
        flat = out.reshape(-1)
        if add:
            vals = xp.broadcast_to(xp.asarray(s, x.dtype), idx.shape)
            flat += scatter_add_flat(xp, flat.size, lin, vals, x.dtype)
        else:
            flat[lin] = xp.broadcast_to(xp.asarray(s, x.dtype),
                                        idx.shape).reshape(-1)
        ctx.lin, ctx.add, ctx.idx_shape = lin, add, idx.shape
        ctx.src_shape = getattr(src, "shape", None)
        return out

    @staticmethod
    def backward(ctx, g):
        xp = get_array_module(g)
        n = ctx.needs_input_grad
        gx = gs = None
        flat = g.reshape(-1)
        if n[0]:
            if ctx.add:
                gx = g
            else:
                gx = g.copy()
                gx.reshape(-1)[ctx.lin] = 0
        if n[1] and ctx.src_shape is not None:
            # with duplicate indices in scatter the last write wins; the
            # gradient goes to every source element that was written, as
            # PyTorch's backward (a gather) does
            part = flat[ctx.lin].reshape(ctx.idx_shape)
            gs = xp.zeros(ctx.src_shape, g.dtype)
            gs[tuple(slice(0, k) for k in ctx.idx_shape)] = part
        return gx, gs

    @staticmethod
    def backward_graph(ctx, g):
        n = ctx.needs_input_grad
        gx = gs = None
        if n[0]:
            if ctx.add:
                gx = g
            else:
                xp = get_array_module(ctx.lin)
                keep = xp.ones(g.shape, bool)
                keep.reshape(-1)[ctx.lin] = False
                gx = keep_grad_t(keep, g)
        if n[1] and ctx.src_shape is not None:
            gs = IndexSelect.apply(g.reshape(-1), idx=ctx.lin,
                                   dim=0).reshape(ctx.idx_shape)
            if tuple(ctx.src_shape) != tuple(ctx.idx_shape):
                # src larger than the index: zeros where it was not read
                from .index import SetIndex
                zeros = get_array_module(ctx.lin).zeros(ctx.src_shape,
                                                        g._data.dtype)
                gs = SetIndex.apply(const(g, zeros), gs, key=tuple(
                    slice(0, k) for k in ctx.idx_shape))
        return gx, gs


class IndexSelect(Op):
    @staticmethod
    def forward(ctx, x, idx=None, dim=0):
        xp = get_array_module(x)
        if idx.ndim > 1:
            raise IndexError("index_select(): Index is supposed to be a "
                             "vector")
        if idx.dtype.kind not in "iu":
            raise RuntimeError("index_select(): Expected dtype int32/int64 "
                               "for index")
        axis = axis_of(dim, x.ndim)
        x1 = x.reshape(1) if x.ndim == 0 else x
        idx = idx.reshape(-1)
        _check_index(idx, x1.shape[axis], "index_select", axis)
        ctx.shape, ctx.axis, ctx.idx, ctx.xshape = x1.shape, axis, idx, \
            x.shape
        out = xp.take(x1, idx, axis=axis)
        return out.reshape(x.shape) if x.ndim == 0 else out

    @staticmethod
    def backward(ctx, g):
        xp = get_array_module(g)
        moved = xp.moveaxis(g.reshape(xp.take(
            xp.empty(ctx.shape, bool), ctx.idx, ctx.axis).shape), ctx.axis, 0)
        shp = (ctx.shape[ctx.axis],) + tuple(
            s for i, s in enumerate(ctx.shape) if i != ctx.axis)
        gx = index_add0(xp, shp, g.dtype, ctx.idx, moved)
        return xp.moveaxis(gx, 0, ctx.axis).reshape(ctx.xshape)

    @staticmethod
    def backward_graph(ctx, g):
        shape = list(ctx.shape)
        shape[ctx.axis] = ctx.idx.size
        zeros = const(g, get_array_module(ctx.idx).zeros(ctx.shape,
                                                         g._data.dtype))
        return IndexAdd.apply(zeros, g.reshape(shape), idx=ctx.idx,
                              dim=ctx.axis).reshape(ctx.xshape)


class IndexAdd(Op):
    """out = x.clone(); out.index_add_(dim, idx, src, alpha) (also
    index_copy with ``copy=True``: the rows are replaced)."""
    @staticmethod
    def forward(ctx, x, src, idx=None, dim=0, alpha=1, copy=False):
        xp = get_array_module(x)
        axis = axis_of(dim, x.ndim)
        idx = idx.reshape(-1)
        _check_index(idx, x.shape[axis] if x.ndim else 1, "index_add", axis)
        idx = xp.where(idx < 0, idx + (x.shape[axis] if x.ndim else 1), idx)
        out = x.copy()
        mo = xp.moveaxis(out, axis, 0) if x.ndim else out.reshape(1)
        ms = xp.moveaxis(src, axis, 0) if src.ndim else src.reshape(1)
        if ms.shape[0] != idx.size or ms.shape[1:] != mo.shape[1:]:
            raise RuntimeError(
                f"index_add_(): Source/destination tensor must have same "
                f"slice shapes. Destination slice shape: {list(mo.shape[1:])}"
                f" at dimension {axis} and source slice shape: "
                f"{list(ms.shape[1:])} at dimension 0.")
        if copy:
            mo[idx] = ms
        else:
            add = index_add0(xp, mo.shape, x.dtype, idx, ms)
            if alpha != 1:
                add = add * alpha
            mo += add.astype(x.dtype, copy=False)
        ctx.axis, ctx.idx, ctx.alpha, ctx.copy = axis, idx, alpha, copy
        ctx.nd = x.ndim
        return out

    @staticmethod
    def backward(ctx, g):
        xp = get_array_module(g)
        n = ctx.needs_input_grad
        gm = xp.moveaxis(g, ctx.axis, 0) if ctx.nd else g.reshape(1)
        gx = gs = None
        if n[0]:
            if ctx.copy:
                gx = g.copy()
                (xp.moveaxis(gx, ctx.axis, 0) if ctx.nd
                 else gx.reshape(1))[ctx.idx] = 0
            else:
                gx = g
        if n[1]:
            gs = gm[ctx.idx]
            if not ctx.copy and ctx.alpha != 1:
                gs = gs * ctx.alpha
            gs = xp.moveaxis(gs, 0, ctx.axis) if ctx.nd else gs.reshape(())
        return gx, gs

    @staticmethod
    def backward_graph(ctx, g):
        if not ctx.nd:
            return NotImplemented
        n = ctx.needs_input_grad
        gx = gs = None
        if n[0]:
            if ctx.copy:
                xp = get_array_module(ctx.idx)
                keep = xp.ones(g.shape, bool)
                xp.moveaxis(keep, ctx.axis, 0)[ctx.idx] = False
                gx = keep_grad_t(keep, g)
            else:
                gx = g
        if n[1]:
            gs = IndexSelect.apply(g, idx=ctx.idx, dim=ctx.axis)
            if not ctx.copy and ctx.alpha != 1:
                gs = gs * ctx.alpha
        return gx, gs


# ============================================================= scans ==

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

    @staticmethod
    def backward_graph(ctx, g):
        if ctx.axis is None:
            return g
        # the reversed cumulative sum, as total - cumsum + g
        return g.sum(ctx.axis, keepdim=True) - Cumsum.apply(
            g, dim=ctx.axis) + g


class Cumprod(Op):
    @staticmethod
    def forward(ctx, x, dim=0):
        xp = get_array_module(x)
        if x.ndim == 0:
            ctx.axis = None
            return x.copy()
        axis = axis_of(dim, x.ndim)
        out = xp.cumprod(x, axis=axis)
        ctx.axis = axis
        ctx.save_for_backward(x, out)
        return out

    @staticmethod
    def backward(ctx, g):
        if ctx.axis is None:
            return g
        x, out = ctx.to_save
        xp = get_array_module(g)
        ax = ctx.axis
        if not (x == 0).any():
            # d out_j / d x_i = out_j / x_i for j >= i
            r = xp.flip(xp.cumsum(xp.flip(g * out, ax), ax), ax)
            return r / x
        # with zeros (anywhere: PyTorch's test is global), per slice as
        # PyTorch: before the first zero z1, the reversed cumsum of out * g
        # over [0, z1) divided by x; at z1, the product before it times
        # sum_j g_j prod_(z1, j] x over [z1, z2); after z1, 0. Terms that
        # are exactly 0 are dropped, never multiplied by g. O(n).
        xm = xp.moveaxis(x, ax, -1)
        gm = xp.moveaxis(g, ax, -1)
        om = xp.moveaxis(out, ax, -1)
        isz = xm == 0
        cs = xp.cumsum(isz, -1)
        before = cs == 0
        one = xp.ones((), x.dtype)
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            w = xp.where(before, om * gm, 0)
            rc = xp.flip(xp.cumsum(xp.flip(w, -1), -1), -1)
            gi = xp.where(before, rc / xm, 0)
            first = isz & (cs == 1)
            seg = cs == 1
            pre = xp.where(before, xm, one).prod(-1, keepdims=True)
            c = xp.cumprod(xp.where(seg & ~first, xm, one), -1)
            at_z1 = pre * xp.where(seg, c * gm, 0).sum(-1, keepdims=True)
            gi = xp.where(first, at_z1, gi).astype(g.dtype, copy=False)
        return xp.moveaxis(gi, -1, ax)

    @staticmethod
    def backward_graph(ctx, g):
        if ctx.axis is None:
            return g
        xa, oa = ctx.to_save
        ax = ctx.axis
        if bool((xa == 0).any()):
            # zeros: out / x is undefined; recompute the products one by
            # one (a running Mul along the axis) and differentiate that
            from .recompute import backward_by_recompute
            return backward_by_recompute(ctx, g, lambda x: _cumprod_steps(
                x, ax), [xa])
        go = g * ctx.graph_output(oa)
        r = go.sum(ax, keepdim=True) - Cumsum.apply(go, dim=ax) + go
        return r / ctx.graph_input(0, xa)


class CumExtreme(Op):
    """cummax/cummin values; the gradient goes to the index that holds the
    running extreme (the last one among ties, as PyTorch)."""
    @staticmethod
    def forward(ctx, x, dim=0, is_min=False):
        xp = get_array_module(x)
        if x.ndim == 0:
            ctx.axis = None
            ctx.indices = xp.zeros((), np.int64)
            return x.copy()
        axis = axis_of(dim, x.ndim)
        n = x.shape[axis]
        # the running scans are NumPy's (CuPy has no ufunc.accumulate for
        # maximum): a CuPy input is scanned on the host, then sent back
        h = x if xp is np else x.get()
        acc = (np.minimum if is_min else np.maximum).accumulate(h, axis=axis)
        if is_float(h.dtype):
            # NaN propagates: once seen, it is the running value
            seen = np.logical_or.accumulate(np.isnan(h), axis=axis)
            # NaN of the input's dtype: a Python nan widens bfloat16
            acc = np.where(seen, np.array(np.nan, h.dtype), acc)
            hit = (h == acc) | (np.isnan(h) & seen)
        else:
            hit = h == acc
        shape = [1] * h.ndim
        shape[axis] = n
        pos = np.where(hit, np.arange(n).reshape(shape), -1)
        idx = np.maximum.accumulate(pos, axis=axis).astype(np.int64)
        if xp is not np:
            acc, idx = xp.asarray(acc), xp.asarray(idx)
        ctx.axis, ctx.shape, ctx.idx = axis, x.shape, idx
        ctx.indices = idx
        return acc

    @staticmethod
    def backward(ctx, g):
        if ctx.axis is None:
            return g
        xp = get_array_module(g)
        lin = flat_along(xp, ctx.shape, ctx.idx, ctx.axis)
        return scatter_add_flat(xp, int(np.prod(ctx.shape)), lin, g,
                                g.dtype).reshape(ctx.shape)

    @staticmethod
    def backward_graph(ctx, g):
        if ctx.axis is None:
            return g
        xp = get_array_module(ctx.idx)
        lin = flat_along(xp, ctx.shape, ctx.idx, ctx.axis)
        return scatter_flat_t(g, lin, ctx.shape)


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

    @staticmethod
    def backward_graph(ctx, g):
        if ctx.axis is None:
            return g
        xa, oa = ctx.to_save
        xp = get_array_module(oa)
        ax = ctx.axis
        # sum_(j >= i) g_j e^(x_i - out_j), shifted by each slice's total
        # m = out[-1] (out rises along the axis): e^(x - m) <= 1, and
        # e^(m - out) is finite unless the slice spans most of the
        # dtype's exponent range (then: first order only)
        m = oa[(slice(None),) * ax + (slice(-1, None),)]
        with np.errstate(invalid="ignore", over="ignore"):
            span = m - oa
        limit = 0.9 * np.log(np.finfo(oa.dtype).max)
        if not bool(xp.isfinite(span).all()) or oa.size and \
                float(span.max()) > limit:
            return NotImplemented
        x, out = ctx.graph_input(0, xa), ctx.graph_output(oa)
        mt = const(g, m)
        w = g * (mt - out).exp()
        r = w.sum(ax, keepdim=True) - Cumsum.apply(w, dim=ax) + w
        return (x - mt).exp() * r


def scatter_flat_t(g, lin, shape):
    """zeros(shape) with g added at the flat positions ``lin`` (repeats
    sum), differentiable in g (its gradient is a gather at ``lin``)."""
    xp = get_array_module(lin)
    zeros = const(g, xp.zeros(int(np.prod(shape)), g._data.dtype))
    return IndexAdd.apply(zeros, g.reshape(-1), idx=lin.reshape(-1),
                          dim=0).reshape(tuple(shape))


def _cumprod_steps(x, ax):
    """cumprod along ax as a running product of slices (tensor ops)."""
    from .movement import Stack
    key = (slice(None),) * ax
    outs = [x[key + (0,)]]
    for k in range(1, x.shape[ax]):
        outs.append(outs[-1] * x[key + (k,)])
    return Stack.apply(*outs, dim=ax)
