"""Tensor methods on shapes and matrices' layout: diagonal/diag, movedim,
repeat_interleave, unfold, tile, in-place reshapes, predicates, resize_.

Each function takes the tensor first: it is a Tensor method (this family's
mixin, at the end, binds it; Tensor inherits the mixin) and, where PyTorch
has one, ``dtorch.<name>``. Methods that are not functions are written in
the mixin's body (the rule: dtorch/tensor.py's docstring).
"""
import builtins
import math

import numpy as np

from .. import _backend as B
from .. import ops as P
from ..autograd.function import autocast_op
from ..ops import selection as S
from ._common import _TensorBase, _arr, _dims, methods
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


# ================================================= the mixin =====

@methods("diagonal diag diag_embed movedim repeat_interleave unfold "
         "sum_to_size tile squeeze_ unsqueeze_ t_ transpose_ is_complex "
         "is_pinned storage_offset resize_")
class ShapeMethods:
    """Tensor's views and shape changes."""
    __slots__ = ()

    H = property(H)
    moveaxis = movedim

    def view(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], (B.dtype, type)):
            raise NotImplementedError("view(dtype) is not supported")
        shape = _dims(shape)
        if not self._data.flags.c_contiguous and self.numel() > 1:
            try:
                B.reshape_view(self._data, self._infer(shape))
            except ValueError:
                raise RuntimeError(
                    "view size is not compatible with input tensor's size "
                    "and stride (at least one dimension spans across two "
                    "contiguous subspaces). Use .reshape(...) instead.")
        return P.Reshape.apply(self, shape=self._infer(shape))

    def _infer(self, shape):
        shape = tuple(map(int, shape))
        if shape.count(-1) > 1:
            raise RuntimeError("only one dimension can be inferred")
        n = self._data.size
        if -1 in shape:
            rest = 1
            for s in shape:
                if s != -1:
                    rest *= s
            if rest == 0 or n % rest:
                raise RuntimeError(f"shape '{list(shape)}' is invalid for "
                                   f"input of size {n}")
            shape = tuple(n // rest if s == -1 else s for s in shape)
        elif math.prod(shape) != n:
            raise RuntimeError(f"shape '{list(shape)}' is invalid for "
                               f"input of size {n}")
        return shape

    def reshape(self, *shape):
        shape = self._infer(_dims(shape))
        if shape == self._data.shape:
            return self
        return P.Reshape.apply(self, shape=shape)

    def view_as(self, other):
        return self.view(other.shape)

    def reshape_as(self, other):
        return self.reshape(other.shape)

    def flatten(self, start_dim=0, end_dim=-1):
        if self.ndim == 0:
            return self.reshape(1)
        s = self._dim(start_dim)
        e = self._dim(end_dim)
        if s > e:
            raise RuntimeError("flatten() has invalid args: start_dim cannot "
                               "come after end_dim")
        shp = self.shape
        return self.reshape(shp[:s] + (math.prod(shp[s:e + 1]),)
                            + shp[e + 1:])

    def unflatten(self, dim, sizes):
        d = self._dim(dim)
        shp = self.shape
        return self.reshape(shp[:d] + tuple(sizes) + shp[d + 1:])

    def permute(self, *dims):
        dims = _dims(dims)
        if len(dims) != self.ndim:
            raise RuntimeError(
                f"permute: number of dimensions in the tensor input does "
                f"not match the length of the desired ordering of "
                f"dimensions i.e. input.dim() = {self.ndim} is not equal "
                f"to len(dims) = {len(dims)}")
        dims = tuple(self._dim(d) for d in dims)
        if len(set(dims)) != len(dims):
            raise RuntimeError("permute(): duplicate dims are not allowed.")
        return P.Permute.apply(self, dims=dims)

    def transpose(self, dim0, dim1):
        nd = self._data.ndim
        if nd == 0:
            return self
        order = list(range(nd))
        a, b = self._dim(dim0), self._dim(dim1)
        order[a], order[b] = order[b], order[a]
        return P.Permute.apply(self, dims=tuple(order))

    swapaxes = transpose

    def t(self):
        nd = self._data.ndim
        if nd > 2:
            raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, "
                               f"but self is {nd}D")
        # a view also for 0-d/1-d (never self), as PyTorch
        return self[...] if nd < 2 else self.transpose(0, 1)

    @property
    def T(self):
        return self.permute(tuple(reversed(range(self.ndim))))

    @property
    def mT(self):
        return self.transpose(-2, -1)

    def unsqueeze(self, dim):
        d = self._dim(dim, self.ndim + 1)
        shp = self.shape
        return P.Reshape.apply(self, shape=shp[:d] + (1,) + shp[d:])

    def squeeze(self, dim=None):
        shp = self.shape
        if dim is None:
            new = tuple(s for s in shp if s != 1)
        else:
            dims = (dim,) if isinstance(dim, int) else dim
            ds = {self._dim(d) for d in dims} if self.ndim else set()
            new = tuple(s for i, s in enumerate(shp)
                        if not (i in ds and s == 1))
        if new == shp:
            return self[...]      # a view (never self), as PyTorch
        return P.Reshape.apply(self, shape=new)

    def expand(self, *sizes):
        sizes = _dims(sizes)
        shp = self.shape
        if len(sizes) < len(shp):
            raise RuntimeError(
                f"expand: the number of sizes provided ({len(sizes)}) must "
                f"be greater or equal to the number of dimensions in the "
                f"tensor ({len(shp)})")
        lead = len(sizes) - len(shp)
        out = []
        for i, s in enumerate(sizes):
            cur = shp[i - lead] if i >= lead else 1
            if s == -1:
                if i < lead:
                    raise RuntimeError("expand: -1 not allowed in leading, "
                                       "non-existing dimension")
                s = cur
            elif cur != 1 and cur != s:
                raise RuntimeError(
                    f"The expanded size of the tensor ({s}) must match the "
                    f"existing size ({cur}) at non-singleton dimension {i}. "
                    f" Target sizes: {list(sizes)}.  Tensor sizes: "
                    f"{list(shp)}")
            out.append(s)
        return P.Expand.apply(self, shape=tuple(out))

    def expand_as(self, other):
        return self.expand(other.shape)

    def broadcast_to(self, shape):
        return self.expand(shape)

    def repeat(self, *sizes):
        sizes = _dims(sizes)
        if len(sizes) < self.ndim:
            raise RuntimeError(
                "Number of dimensions of repeat dims can not be smaller than "
                "number of dimensions of tensor")
        shape = (1,) * (len(sizes) - self.ndim) + tuple(self.shape)
        # repeat = a size-1 axis before each axis, expanded to the repeat
        # count, then merged: the gradient of expand sums the copies back
        ones_between, expanded = [], []
        for r, n in zip(sizes, shape):
            ones_between += [1, n]
            expanded += [r, n]
        t = self.reshape(ones_between).expand(expanded)
        return t.reshape([r * n for r, n in zip(sizes, shape)])

    def narrow(self, dim, start, length):
        d = self._dim(dim)
        n = self.shape[d]
        if start < 0:
            start += n
        if not 0 <= start <= n or length < 0 or start + length > n:
            raise RuntimeError(f"start ({start}) + length ({length}) exceeds "
                               f"dimension size ({n}).")
        key = (slice(None),) * d + (slice(start, start + length),)
        return self[key]

    def split(self, split_size_or_sections, dim=0):
        d = self._dim(dim)
        n = self.shape[d]
        if isinstance(split_size_or_sections, int):
            step = split_size_or_sections
            sizes = [builtins.min(step, n - i) for i in range(0, n, step)] \
                or [0]
        else:
            sizes = list(split_size_or_sections)
            if sum(sizes) != n:
                raise RuntimeError(
                    f"split_with_sizes expects split_sizes to sum exactly to "
                    f"{n} (input tensor's size at dimension {d}), but got "
                    f"split_sizes={sizes}")
        out, start = [], 0
        for s in sizes:
            out.append(self.narrow(d, start, s))
            start += s
        return tuple(out)

    def chunk(self, chunks, dim=0):
        n = self.shape[self._dim(dim)]
        if n == 0:          # PyTorch: ``chunks`` empty pieces
            return tuple(self.narrow(dim, 0, 0) for _ in range(chunks))
        step = -(-n // chunks)
        return self.split(builtins.max(step, 1), dim)

    def unbind(self, dim=0):
        d = self._dim(dim)
        return tuple(self[(slice(None),) * d + (i,)]
                     for i in range(self.shape[d]))

    def flip(self, *dims):
        dims = _dims(dims)
        key = [slice(None)] * self.ndim
        for d in dims:
            key[self._dim(d)] = slice(None, None, -1)
        return self[tuple(key)]

    def roll(self, shifts, dims=None):
        if dims is None:
            return self.flatten().roll(shifts, 0).view(self.shape)
        if isinstance(shifts, int):
            shifts, dims = (shifts,), (dims,)
        t = self
        for s, d in zip(shifts, dims):
            d = self._dim(d)
            n = self.shape[d]
            if n == 0:
                continue
            s %= n
            if s:
                a, b = t.split([n - s, s], d)
                t = P.Cat.apply(b, a, dim=d)
        return t

    @B.on_own_device
    def masked_fill(self, mask, value):
        m = _arr(mask)
        if not hasattr(m, "dtype") or m.dtype != np.bool_:
            raise RuntimeError(
                f"masked_fill_ only supports boolean masks, but got mask "
                f"with dtype {getattr(m, 'dtype', type(m).__name__)}")
        if isinstance(value, _TensorBase):
            if value.ndim != 0:
                raise RuntimeError(
                    f"masked_fill_ only supports a 0-dimensional value "
                    f"tensor, but got tensor with {value.ndim} dimension(s).")
            return P.Where.apply(m, value.to(self.dtype), self)
        if isinstance(value, float) and not self.dtype.is_floating_point:
            raise RuntimeError(f"value cannot be converted to type "
                               f"{self.dtype} without overflow")
        return P.Where.apply(m, self._xp().asarray(value, self._data.dtype),
                             self)
