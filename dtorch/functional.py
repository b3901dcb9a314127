"""``dtorch.<name>`` functions that are not Tensor methods in PyTorch (as
``torch.functional``): einsum, meshgrid, cdist, stacking helpers, index
builders, binning, splitting."""
import itertools

import numpy as np

from . import _backend as B
from .ops.base import dtype_name
from .ops.einsum import Einsum
from .autograd.function import autocast_op
from .random import draw
from .tensor import Size, Tensor
from ._creation import cat, stack, zeros

__all__ = [
    "einsum", "meshgrid", "cdist", "var_mean", "std_mean", "kron", "vdot",
    "cross", "tensordot", "inner", "searchsorted", "bucketize", "histc",
    "bincount", "hstack", "vstack", "dstack", "column_stack", "row_stack",
    "atleast_1d", "atleast_2d", "atleast_3d", "triu_indices",
    "tril_indices", "cartesian_prod", "combinations", "block_diag",
    "poisson", "broadcast_tensors", "broadcast_shapes", "split", "dsplit",
    "hsplit", "vsplit",
]


# ============================================================ linear algebra ==

def einsum(equation, *operands):
    """``einsum('bij,bjk->bik', a, b)``: Einstein summation, differentiable
    in every operand; operands may also be given as one list."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    for i, t in enumerate(operands):
        if not isinstance(t, Tensor):
            raise TypeError(f"einsum(): operand {i} must be a Tensor, not "
                            f"{type(t).__name__}")
    return Einsum.apply(*operands, equation=equation)


def kron(input, other):
    a, b = input, other
    nd = max(a.ndim, b.ndim)
    a = a.reshape((1,) * (nd - a.ndim) + tuple(a.shape))
    b = b.reshape((1,) * (nd - b.ndim) + tuple(b.shape))
    # interleave: a[i, 1, j, 1] * b[1, k, 1, l] -> (i*k, j*l)
    sa, sb = [], []
    for m, n in zip(a.shape, b.shape):
        sa += [m, 1]
        sb += [1, n]
    out = a.reshape(sa) * b.reshape(sb)
    return out.reshape([m * n for m, n in zip(a.shape, b.shape)])


def vdot(input, other):
    if input.ndim != 1 or other.ndim != 1:
        raise RuntimeError(f"1D tensors expected, but got {input.ndim}D and "
                           f"{other.ndim}D tensors")
    if input.dtype is not other.dtype:
        raise RuntimeError(
            f"dot : expected both vectors to have same dtype, but found "
            f"{dtype_name(input._data.dtype)} and "
            f"{dtype_name(other._data.dtype)}")
    return (input * other).sum()


def inner(input, other):
    if input.ndim == 0 or other.ndim == 0:
        return input * other
    return tensordot(input, other, ([-1], [-1]))


def tensordot(a, b, dims=2):
    if isinstance(dims, int):
        da = list(range(a.ndim - dims, a.ndim))
        db = list(range(dims))
    else:
        da, db = dims
        da = [da] if isinstance(da, int) else list(da)
        db = [db] if isinstance(db, int) else list(db)
    da = [d % a.ndim for d in da]
    db = [d % b.ndim for d in db]
    letters = iter("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    sa = [next(letters) for _ in range(a.ndim)]
    sb = [next(letters) for _ in range(b.ndim)]
    for i, j in zip(da, db):
        sb[j] = sa[i]
    out = [c for k, c in enumerate(sa) if k not in da] + \
        [c for k, c in enumerate(sb) if k not in db]
    return einsum("".join(sa) + "," + "".join(sb) + "->" + "".join(out),
                  a, b)


def cross(input, other, dim=None):
    return input.cross(other, dim)


@autocast_op({"cpu": "fp32"})    # PyTorch's CPU fp32 list
def cdist(x1, x2, p=2.0, compute_mode=None):
    """Pairwise p-norm distances between the rows of x1 and x2 ((B,)P,M and
    (B,)R,M -> (B,)P,R); the gradient at a zero distance is zero."""
    if x1.ndim < 2 or x2.ndim < 2:
        raise RuntimeError(f"cdist only supports at least 2D tensors, X1 got: "
                           f"{x1.ndim}D, X2 got: {x2.ndim}D")
    if x1.shape[-1] != x2.shape[-1]:
        raise RuntimeError(f"X1 and X2 must have the same number of columns. "
                           f"X1: {x1.shape[-1]} X2: {x2.shape[-1]}")
    d = x1.unsqueeze(-2) - x2.unsqueeze(-3)
    if p == 0:
        return (d != 0).sum(-1).to(x1.dtype)
    if p == float("inf"):
        return d.abs().amax(-1)
    if p == 1:
        return d.abs().sum(-1)
    a = d.abs()
    s = (a ** p).sum(-1)
    zero = s == 0
    # 0 ** (1/p) has an infinite slope; PyTorch's gradient there is 0
    safe = s.masked_fill(zero, 1.0)
    return (safe ** (1.0 / p)).masked_fill(zero, 0.0)


def var_mean(input, dim=None, unbiased=None, keepdim=False, correction=None):
    return (input.var(dim, unbiased, keepdim, correction),
            input.mean(dim, keepdim))


def std_mean(input, dim=None, unbiased=None, keepdim=False, correction=None):
    return (input.std(dim, unbiased, keepdim, correction),
            input.mean(dim, keepdim))


# ======================================================== stacking helpers ==

def atleast_1d(*ts):
    r = [t.reshape(1) if t.ndim == 0 else t for t in _flat(ts)]
    return r[0] if len(r) == 1 else tuple(r)


def atleast_2d(*ts):
    r = [t.reshape(1, -1) if t.ndim < 2 else t for t in _flat(ts)]
    return r[0] if len(r) == 1 else tuple(r)


def atleast_3d(*ts):
    out = []
    for t in _flat(ts):
        if t.ndim == 0:
            t = t.reshape(1, 1, 1)
        elif t.ndim == 1:
            t = t.reshape(1, -1, 1)
        elif t.ndim == 2:
            t = t.unsqueeze(-1)
        out.append(t)
    return out[0] if len(out) == 1 else tuple(out)


def _flat(ts):
    if len(ts) == 1 and isinstance(ts[0], (list, tuple)):
        return list(ts[0])
    return list(ts)


def hstack(tensors):
    ts = [atleast_1d(t) for t in tensors]
    return cat(ts, 0 if ts[0].ndim == 1 else 1)


def vstack(tensors):
    return cat([atleast_2d(t) for t in tensors], 0)


row_stack = vstack


def dstack(tensors):
    return cat([atleast_3d(t) for t in tensors], 2)


def column_stack(tensors):
    return cat([t.reshape(-1, 1) if t.ndim <= 1 else t for t in tensors], 1)


def block_diag(*tensors):
    ts = [t.reshape(1, -1) if t.ndim < 2 else t for t in tensors]
    if not ts:
        return zeros(1, 0)
    cols = sum(t.shape[1] for t in ts)
    dt = ts[0].dtype
    for t in ts[1:]:
        dt = B.promote_types(dt, t.dtype)
    out_rows = []
    c = 0
    for t in ts:
        left = zeros(t.shape[0], c, dtype=dt, device=t.device)
        right = zeros(t.shape[0], cols - c - t.shape[1], dtype=dt,
                      device=t.device)
        out_rows.append(cat([left, t.to(dt), right], 1))
        c += t.shape[1]
    return cat(out_rows, 0)


def broadcast_shapes(*shapes):
    return Size(np.broadcast_shapes(*[tuple(s) if not isinstance(s, int)
                                      else (s,) for s in shapes]))


def broadcast_tensors(*tensors):
    ts = _flat(tensors)
    shape = broadcast_shapes(*[t.shape for t in ts])
    return tuple(t.expand(shape) for t in ts)


def meshgrid(*tensors, indexing=None):
    """Coordinate grids; ``indexing='ij'`` (PyTorch's default) or 'xy'."""
    ts = _flat(tensors)
    if indexing is None:
        indexing = "ij"
    if indexing not in ("ij", "xy"):
        raise RuntimeError(f"torch.meshgrid: indexing must be one of \"xy\" "
                           f"or \"ij\", but received: {indexing}")
    for t in ts:
        if t.ndim > 1:
            raise RuntimeError("torch.meshgrid: Expected 0D or 1D tensor in "
                               "the tensor list")
    ts = [t.reshape(-1) for t in ts]
    shape = [t.shape[0] for t in ts]
    out = []
    for i, t in enumerate(ts):
        v = [1] * len(ts)
        v[i] = shape[i]
        out.append(t.reshape(v).expand(shape))
    if indexing == "xy" and len(ts) >= 2:
        # 'xy' is 'ij' with the first two dims swapped
        out = [o.transpose(0, 1) for o in out]
    return tuple(out)


def cartesian_prod(*tensors):
    grids = meshgrid(*tensors, indexing="ij")
    if len(grids) == 1:
        return grids[0]
    return stack([g.reshape(-1) for g in grids], 1)


def combinations(input, r=2, with_replacement=False):
    n = input.shape[0]
    f = itertools.combinations_with_replacement if with_replacement \
        else itertools.combinations
    # index tuples are built once, over positions, never over values
    idx = np.asarray(list(f(range(n), r)), np.int64).reshape(-1, r)
    if idx.size == 0:
        return input.new_zeros((0, r) if r else (0,))
    return input[Tensor._wrap(input.device.send(idx)
                              if input.device.type != "cpu" else idx)]


# ============================================================ index builders ==

def _tri_indices(row, col, offset, device, upper, dtype):
    m = np.triu(np.ones((row, col), bool), offset) if upper else \
        np.tril(np.ones((row, col), bool), offset)
    r, c = np.nonzero(m)
    out = np.stack([r, c]).astype((B.to_dtype(dtype) or B.int64).np)
    t = Tensor._wrap(out)
    return t.to(device) if device is not None else t


def triu_indices(row, col, offset=0, dtype=None, device=None, layout=None):
    return _tri_indices(row, col, offset, device, True, dtype)


def tril_indices(row, col, offset=0, dtype=None, device=None, layout=None):
    return _tri_indices(row, col, offset, device, False, dtype)


# ================================================================== binning ==

@B.on_own_device
def searchsorted(sorted_sequence, input, out_int32=False, right=False,
                 side=None, sorter=None):
    """Insertion points of ``input`` into the innermost dim of
    ``sorted_sequence`` (batched over the leading dims)."""
    if side is not None:
        right = side == "right"
    seq = sorted_sequence._data
    xp = B.get_array_module(seq)
    scalar = not isinstance(input, Tensor)
    v = xp.asarray(input._data if not scalar else input)
    if sorter is not None:
        seq = xp.take_along_axis(seq, sorter._data, -1)
    s = "right" if right else "left"
    if seq.ndim == 1:
        out = xp.searchsorted(seq, v, side=s)
    else:
        if seq.shape[:-1] != v.shape[:-1]:
            raise RuntimeError(
                "torch.searchsorted(): boundaries tensor should be 1 "
                "dimension or the first N-1 dimensions of boundaries tensor "
                "and input value tensor must match")
        # one call over all rows: offset each row into its own band
        lo = min(float(seq.min()), float(v.min())) if v.size else 0.0
        hi = max(float(seq.max()), float(v.max())) if v.size else 1.0
        span = (hi - lo) + 1.0
        rows = int(np.prod(seq.shape[:-1]))
        off = (xp.arange(rows) * span).reshape(seq.shape[:-1] + (1,))
        n = seq.shape[-1]
        flat = (seq.astype(np.float64) - lo + off).reshape(-1)
        q = (v.astype(np.float64) - lo + off)
        out = xp.searchsorted(flat, q.reshape(-1), side=s).reshape(v.shape)
        out = out - (xp.arange(rows) * n).reshape(seq.shape[:-1] + (1,))
    dt = np.int32 if out_int32 else np.int64
    return Tensor._wrap(xp.asarray(out, dt))


def bucketize(input, boundaries, out_int32=False, right=False):
    return searchsorted(boundaries, input, out_int32=out_int32, right=right)


def histc(input, bins=100, min=0, max=0):
    a = input.detach()._data
    xp = B.get_array_module(a)
    lo, hi = float(min), float(max)
    if lo == hi and a.size:
        lo, hi = float(a.min()), float(a.max())
    if lo == hi:
        lo, hi = lo - 1, hi + 1
    if lo > hi:
        raise RuntimeError("torch.histc: max must be larger than min")
    h, _ = xp.histogram(a[(a >= lo) & (a <= hi)], bins=bins, range=(lo, hi))
    return Tensor._wrap(h.astype(a.dtype))


def bincount(input, weights=None, minlength=0):
    a = input._data
    if a.ndim != 1 or a.dtype.kind not in "iu":
        raise RuntimeError("bincount only supports 1-d non-negative integral "
                           "inputs.")
    if a.size and int(a.min()) < 0:
        raise RuntimeError("bincount only supports 1-d non-negative integral "
                           "inputs.")
    xp = B.get_array_module(a)
    if weights is None:
        return Tensor._wrap(xp.bincount(a, minlength=minlength)
                            .astype(np.int64))
    w = weights._data
    out = xp.bincount(a, weights=w, minlength=minlength)
    return Tensor._wrap(out.astype(w.dtype if w.dtype.kind == "f"
                                   else np.float64))


def split(tensor, split_size_or_sections, dim=0):
    return tensor.split(split_size_or_sections, dim)


def _nsplit(t, sections, dim, name):
    if isinstance(sections, int):
        n = t.shape[dim]
        if n % sections:
            raise RuntimeError(f"torch.{name} attempted to split along "
                               f"dimension {dim}, but the size of the "
                               f"dimension {n} is not divisible by the split_"
                               f"size {sections}!")
        return t.split(n // sections, dim)
    idx = [0] + list(sections) + [t.shape[dim]]
    return tuple(t.narrow(dim, a, b - a) for a, b in zip(idx, idx[1:]))


def hsplit(t, sections):
    return _nsplit(t, sections, 0 if t.ndim == 1 else 1, "hsplit")


def vsplit(t, sections):
    return _nsplit(t, sections, 0, "vsplit")


def dsplit(t, sections):
    return _nsplit(t, sections, 2, "dsplit")


# ================================================================ sampling ==

@B.on_own_device
def poisson(input, generator=None):
    lam = input.detach()._data      # drawn on input's device
    return Tensor._wrap(draw("poisson", lam, device=input.device,
                             generator=generator, dtype=lam.dtype))
