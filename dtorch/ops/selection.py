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
from .base import Op, axis_of, is_float, grad_xp, astype
from .index import index_add0, scatter_add_flat, scatter_to, zero_at
from .recompute import backward_by_recompute, pin_all


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
        xp = grad_xp(g)
        return xp.triu(g, ctx.diagonal) if ctx.upper else \
            xp.tril(g, ctx.diagonal)


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
        ctx.xshape, ctx.xd = x.shape, x.dtype
        out = xp.take_along_axis(src, i1, axis)
        return out.reshape(idx.shape)

    @staticmethod
    def backward(ctx, g):
        am = get_array_module(ctx.idx)
        sub = tuple(len(range(n)[s]) for n, s in zip(ctx.shape, ctx.sl))
        lin = flat_along(am, sub, ctx.idx, ctx.axis)
        gs = scatter_add_flat(am, int(np.prod(sub)), lin, g, ctx.xd)
        gx = scatter_to(grad_xp(g), ctx.shape, ctx.xd, ctx.sl,
                        gs.reshape(sub))
        return gx.reshape(ctx.xshape)


class Select(Gather):
    """sort/topk/kthvalue/median's values: Gather at ``idx`` (a
    precomputed int64 array) along ``axis``, squeezed there unless
    ``keepdim`` (in forward: the result is no view, so an in-place op on
    it stays legal). Gather's backward (it reshapes g itself)."""
    @staticmethod
    def forward(ctx, x, idx=None, axis=0, keepdim=True):
        out = Gather.forward(ctx, x, idx=idx, dim=axis)
        if not keepdim and x.ndim:
            out = get_array_module(out).squeeze(out, axis)
        return out


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
        ctx.xd = x.dtype
        ctx.src_shape = getattr(src, "shape", None)
        return out

    @staticmethod
    def backward(ctx, g):
        n = ctx.needs_input_grad
        gx = gs = None
        flat = g.reshape(-1)
        if n[0]:
            if ctx.add:
                gx = g
            else:
                gx = zero_at(flat, ctx.lin).reshape(g.shape)
        if n[1] and ctx.src_shape is not None:
            # with duplicate indices in scatter the last write wins; the
            # gradient goes to every source element that was written, as
            # PyTorch's backward (a gather) does
            part = flat[ctx.const(ctx.lin)].reshape(ctx.idx_shape)
            gs = scatter_to(grad_xp(g), ctx.src_shape, ctx.xd, tuple(
                slice(0, k) for k in ctx.idx_shape), part)
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
        ctx.xd = x.dtype
        out = xp.take(x1, idx, axis=axis)
        return out.reshape(x.shape) if x.ndim == 0 else out

    @staticmethod
    def backward(ctx, g):
        xp = grad_xp(g)
        ax, shape = ctx.axis, ctx.shape
        moved = xp.moveaxis(g.reshape(
            shape[:ax] + (ctx.idx.size,) + shape[ax + 1:]), ax, 0)
        shp = (shape[ax],) + shape[:ax] + shape[ax + 1:]
        gx = index_add0(xp, shp, ctx.xd, ctx.idx, moved)
        return xp.moveaxis(gx, 0, ax).reshape(ctx.xshape)


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
        xp = grad_xp(g)
        n = ctx.needs_input_grad
        gx = gs = None
        if n[0]:
            if ctx.copy:
                gx = zero_at(g, (slice(None),) * ctx.axis + (ctx.idx,)) \
                    if ctx.nd else zero_at(g.reshape(1), ctx.idx).reshape(())
            else:
                gx = g
        if n[1]:
            gm = xp.moveaxis(g, ctx.axis, 0) if ctx.nd else g.reshape(1)
            gs = gm[ctx.const(ctx.idx)]
            if not ctx.copy and ctx.alpha != 1:
                gs = gs * ctx.alpha
            gs = xp.moveaxis(gs, 0, ctx.axis) if ctx.nd else gs.reshape(())
        return gx, gs


# ============================================================= scans ==

class Scan(Op):
    """The family of scans along one dim (cumsum, cumprod, logcumsumexp):
    the shell takes the dim (PyTorch's range check) and gives a 0-d input
    back as its own value and gradient; a member's ``scan(ctx, xp, x,
    axis)`` computes the value (saving what its gradient needs) and its
    ``grad(ctx, xp, g, axis)`` the gradient, written once for both orders
    (``xp = grad_xp(g)``). Members keep their class (grad_fn) names."""
    @classmethod
    def forward(cls, ctx, x, dim=0):
        if x.ndim == 0:
            ctx.axis = None
            return x.copy()
        ctx.axis = axis = axis_of(dim, x.ndim)
        return cls.scan(ctx, get_array_module(x), x, axis)

    @classmethod
    def backward(cls, ctx, g):
        if ctx.axis is None:
            return g
        return cls.grad(ctx, grad_xp(g), g, ctx.axis)


class Cumsum(Scan):
    @staticmethod
    def scan(ctx, xp, x, axis):
        dt = np.int64 if x.dtype.kind in "biu" else None
        return xp.cumsum(x, axis=axis, dtype=dt)

    @staticmethod
    def grad(ctx, xp, g, ax):
        return xp.flip(xp.cumsum(xp.flip(g, ax), ax), ax)


class Cumprod(Scan):
    @staticmethod
    def scan(ctx, xp, x, axis):
        out = xp.cumprod(x, axis=axis)
        ctx.save_for_backward(x, out)
        return out

    @staticmethod
    def grad(ctx, xp, g, ax):
        x, out = ctx.to_save
        if not (x == 0).any():
            # d out_j / d x_i = out_j / x_i for j >= i
            r = xp.flip(xp.cumsum(xp.flip(g * ctx.output(out), ax), ax), ax)
            return r / ctx.input(0, x)
        if ctx._gmake is None:
            return _cumprod_zeros_grad(xp, x, out, g, ax)
        # under create_graph, the O(n) form treats the zeros' positions as
        # constants and misses second-order terms through them; PyTorch,
        # too, switches to a differentiable O(n^2) form under grad mode:
        # here the products recomputed one by one, pinned to the O(n)
        # form's values
        return pin_all(backward_by_recompute(
            ctx, g, lambda x: _cumprod_steps(x, ax), [x]),
            (_cumprod_zeros_grad(get_array_module(x), x, out, g._data, ax),))


def _cumprod_zeros_grad(xp, x, out, g, ax):
    """Cumprod's gradient (arrays) where x has zeros (anywhere: PyTorch's
    test is global), per slice as PyTorch: before the first zero z1, the
    reversed cumsum of out * g over [0, z1) divided by x; at z1, the
    product before it times sum_j g_j prod_(z1, j] x over [z1, z2); after
    z1, 0. Terms that are exactly 0 are dropped, never multiplied by g.
    O(n)."""
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


def cum_extreme_indices(x, dim=0, is_min=False):
    """cummax/cummin's indices: where the running extreme is, the last one
    among ties and NaN once seen (as PyTorch); the values are the input
    gathered there (``Gather``, whose gradient goes to those indices)."""
    xp = get_array_module(x)
    if x.ndim == 0:
        return xp.zeros((), np.int64)
    axis = axis_of(dim, x.ndim)
    n = x.shape[axis]
    # the running scans are NumPy's (CuPy has no ufunc.accumulate for
    # maximum): a CuPy input is scanned on the host, then sent back
    h = x if xp is np else x.get()
    acc = (np.minimum if is_min else np.maximum).accumulate(h, axis=axis)
    if is_float(h.dtype):
        # NaN propagates: once seen, it is the running value
        seen = np.logical_or.accumulate(np.isnan(h), axis=axis)
        hit = (h == acc) | (np.isnan(h) & seen)
    else:
        hit = h == acc
    shape = [1] * h.ndim
    shape[axis] = n
    pos = np.where(hit, np.arange(n).reshape(shape), -1)
    idx = np.maximum.accumulate(pos, axis=axis).astype(np.int64)
    return idx if xp is np else xp.asarray(idx)


def _logcumsumexp(xp, x, axis):
    """Running log-add-exp along ``axis`` (PyTorch's scan: exact for
    entries far below the running maximum, +-inf handled): NumPy's ufunc
    accumulate. CuPy has no ufunc accumulate: a CuPy array is scanned on
    the host (as cummax's indices), since a shift by the slice's maximum
    loses the entries far below it (its backward, itself a logcumsumexp
    of log|g| - out, needs them). On a tensor (a backward body under
    create_graph): the op."""
    if type(x) is not np.ndarray and hasattr(x, "_make"):
        return LogCumSumExp.apply(x, dim=axis)    # a gradient tensor
    with np.errstate(invalid="ignore", over="ignore"):
        if xp is np:
            return np.logaddexp.accumulate(x, axis=axis)
        return xp.asarray(np.logaddexp.accumulate(x.get(), axis=axis))


class LogCumSumExp(Scan):
    """log(cumsum(exp(x))) along ``dim``; backward is PyTorch's (after
    TensorFlow's): exp(reverse_logcumsumexp(log|g| - out) + x) for the
    positive and for the negative parts of g, so that -inf entries and
    infinite results give what PyTorch gives, not 0 * inf."""
    @staticmethod
    def scan(ctx, xp, x, axis):
        out = _logcumsumexp(xp, x, axis)
        ctx.save_for_backward(x, out)
        return out

    @staticmethod
    def grad(ctx, xp, g, ax):
        if g.size == 0:
            return g
        xa, oa = ctx.to_save
        x, out = ctx.input(0, xa), ctx.output(oa)
        low = float(np.finfo(xa.dtype).min)   # a weak scalar: any device

        def rev(v):     # under create_graph: the LogCumSumExp op itself
            return xp.flip(_logcumsumexp(xp, xp.flip(v, ax), ax), ax)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            lg = xp.log(abs(g))
            pos = xp.where(g > 0, lg, low)
            neg = xp.where(g < 0, lg, low)
            return astype(xp.exp(rev(pos - out) + x)
                          - xp.exp(rev(neg - out) + x), xa.dtype)


def scatter_flat_t(g, lin, shape):
    """zeros(shape) with g added at the flat positions ``lin`` (repeats
    sum), differentiable in g."""
    return scatter_add_flat(None, int(np.prod(shape)), lin, g,
                            g._data.dtype).reshape(tuple(shape))


def _cumprod_steps(x, ax):
    """cumprod along ax as a running product of slices (tensor ops)."""
    key = (slice(None),) * ax
    outs = [x[key + (0,)]]
    for k in range(1, x.shape[ax]):
        outs.append(outs[-1] * x[key + (k,)])
    return grad_xp(x).stack(outs, axis=ax)
