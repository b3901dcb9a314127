"""Tensor methods on shapes and matrices' layout: diagonal/diag, movedim,
repeat_interleave, unfold, tile, in-place reshapes, predicates, resize_.

Each function takes the tensor first: it is a Tensor method (the class body
of dtorch/tensor.py binds it) and, where PyTorch has one, ``dtorch.<name>``.
"""
import numpy as np

from .. import _backend as B
from ..autograd.function import autocast_op
from ..ops import selection as S
from ._common import _arr, _dims
from .selection import scatter, index_select


# ======================================================= matrices & shapes ==

@B.on_own_device
def diagonal(self, offset=0, dim1=0, dim2=1):
    a = S.axis_of(dim1, self.ndim)
    b = S.axis_of(dim2, self.ndim)
    if a == b:
        raise RuntimeError("diagonal dimensions cannot be identical "
                           f"{dim1}, {dim2}")
    n, m = self.shape[a], self.shape[b]
    i0 = max(-offset, 0)
    j0 = max(offset, 0)
    k = max(min(n - i0, m - j0), 0)
    xp = self._xp()
    rows = xp.arange(i0, i0 + k)
    cols = xp.arange(j0, j0 + k)
    key = [slice(None)] * self.ndim
    key[a] = self._wrap(rows)
    key[b] = self._wrap(cols)
    # advanced indices on two dims: NumPy puts the result dim first when
    # they are not adjacent; PyTorch puts it last
    out = self[tuple(key)]
    pos = 0 if b - a != 1 else a
    return out.movedim(pos, -1)


@B.on_own_device
def diag(self, diagonal=0):
    if self.ndim == 1:
        n = self.shape[0] + abs(diagonal)
        z = self.new_zeros((n, n))
        xp = self._xp()
        r = xp.arange(self.shape[0]) + max(-diagonal, 0)
        c = xp.arange(self.shape[0]) + max(diagonal, 0)
        pos = self._wrap((r * n + c).astype(np.int64))
        return scatter(z.reshape(-1), 0, pos, self).reshape(n, n)
    if self.ndim == 2:
        return self.diagonal(diagonal)
    raise RuntimeError("diag(): Supports 1D or 2D tensors. Got "
                       f"{self.ndim}D")


@autocast_op("none")                # a placement, never lowered
@B.on_own_device
def diag_embed(self, offset=0, dim1=-2, dim2=-1):
    m = self.shape[-1]
    n = m + abs(offset)
    xp = self._xp()
    # element i goes to (i + max(-offset, 0), i + max(offset, 0)): a matmul
    # with a one-hot (m, n * n) placement matrix, differentiable for free
    pos = (xp.arange(m) + max(-offset, 0)) * n + xp.arange(m) + max(offset, 0)
    place = xp.zeros((m, n * n), self._data.dtype)
    place[xp.arange(m), pos] = 1
    out = (self @ self._wrap(place)).unflatten(-1, (n, n))
    nd = out.ndim
    d1, d2 = dim1 % nd, dim2 % nd
    if (d1, d2) != (nd - 2, nd - 1):
        out = out.movedim((nd - 2, nd - 1), (d1, d2))
    return out


def movedim(self, source, destination):
    src = (source,) if isinstance(source, int) else tuple(source)
    dst = (destination,) if isinstance(destination, int) else \
        tuple(destination)
    if len(src) != len(dst):
        raise RuntimeError(
            f"movedim: Invalid source or destination dims: source "
            f"({list(src)} dims) should contain the same number of dims as "
            f"destination ({list(dst)} dims)")
    nd = self.ndim
    src = [S.axis_of(s, nd) for s in src]
    dst = [S.axis_of(d, nd) for d in dst]
    order = [i for i in range(nd) if i not in src]
    for d, s in sorted(zip(dst, src)):
        order.insert(d, s)
    return self.permute(order) if order != list(range(nd)) else self


@B.on_own_device
def repeat_interleave(self, repeats=None, dim=None, output_size=None):
    xp = self._xp()
    if repeats is None:       # repeat_interleave(repeats_tensor)
        r = self._data
        return self._wrap(xp.repeat(xp.arange(r.size), r).astype(np.int64))
    x = self.reshape(-1) if dim is None else self
    d = 0 if dim is None else S.axis_of(dim, self.ndim)
    r = _arr(repeats)
    n = x.shape[d] if x.ndim else 1
    r = xp.broadcast_to(xp.asarray(r, np.int64), (n,)) \
        if not hasattr(r, "ndim") or r.ndim == 0 or r.size == 1 else r
    if r.size != n:
        raise RuntimeError("repeats must have the same size as input along "
                           "dim")
    idx = xp.repeat(xp.arange(n), r)
    return index_select(x, d, self._wrap(idx.astype(np.int64)))


@B.on_own_device
def unfold(self, dimension, size, step):
    """Sliding windows of ``size`` with ``step`` along ``dimension``, as a
    new last dim."""
    d = S.axis_of(dimension, self.ndim)
    n = self.shape[d] if self.ndim else 1
    if size > n:
        raise RuntimeError(f"maximum size for tensor at dimension {d} is "
                           f"{n} but size is {size}")
    if step <= 0:
        raise RuntimeError(f"step is {step} but must be > 0")
    xp = self._xp()
    nw = (n - size) // step + 1
    idx = (xp.arange(nw)[:, None] * step + xp.arange(size)[None, :])
    out = index_select(self, d, self._wrap(idx.reshape(-1).astype(np.int64)))
    shp = list(self.shape)
    shp[d:d + 1] = [nw, size]
    return out.reshape(shp).movedim(d + 1, -1)


def sum_to_size(self, *size):
    shape = tuple(_dims(size))
    out = self
    lead = self.ndim - len(shape)
    if lead:
        out = out.sum(tuple(range(lead)))
    axes = tuple(i for i, s in enumerate(shape)
                 if s == 1 and out.shape[i] != 1)
    if axes:
        out = out.sum(axes, keepdim=True)
    return out


def H(self):
    if self.ndim not in (0, 2):
        raise RuntimeError("tensor.H is only supported on matrices (2-D "
                           "tensors).")
    return self.t() if self.ndim == 2 else self


def tile(self, dims):
    dims = tuple(dims)
    if len(dims) < self.ndim:
        dims = (1,) * (self.ndim - len(dims)) + dims
    return self.repeat(*dims)


# ============================================================ in-place shape ==

def _reshape_(self, res, op):
    if self._tracked():
        raise RuntimeError(
            f"{op}: dtorch does not support in-place shape changes of a "
            f"tensor that requires grad; use the out-of-place form")
    self._data = res._data
    self._bump_version()
    return self


def squeeze_(self, dim=None):
    return _reshape_(self, self.detach().squeeze(dim), "squeeze_")


def unsqueeze_(self, dim):
    return _reshape_(self, self.detach().unsqueeze(dim), "unsqueeze_")


def t_(self):
    return _reshape_(self, self.detach().t(), "t_")


def transpose_(self, dim0, dim1):
    return _reshape_(self, self.detach().transpose(dim0, dim1), "transpose_")


# ============================================================ predicates ====

def is_complex(self):
    return False


def is_pinned(self, device=None):
    return False


def storage_offset(self):
    """Elements between the start of the base tensor's memory and ours."""
    base = self._base if self._base is not None else self
    if self._data.size == 0:
        return 0
    return (self.data_ptr() - base.data_ptr()) // self._data.itemsize


@B.on_own_device
def resize_(self, *sizes, memory_format=None):
    """Reshape in place to ``sizes``, keeping the leading elements and
    zero-filling new ones (PyTorch leaves them uninitialised)."""
    shape = tuple(int(s) for s in _dims(sizes))
    if self.requires_grad:
        raise RuntimeError("cannot resize variables that require grad")
    xp = self._xp()
    n = int(np.prod(shape))
    flat = self._data.reshape(-1)
    new = xp.zeros(n, self._data.dtype)
    k = min(n, flat.size)
    new[:k] = flat[:k]
    self._data = new.reshape(shape)
    self._bump_version()
    return self
