"""Tensor methods for selection, gather/scatter, triangles, scans, sampling
and more elementwise maths (issue 14: names real scripts call).

Each function takes the tensor first, so it serves both as a method (the
Tensor class body binds these names) and as ``dtorch.<name>(input, ...)``.
Differentiable work is done by the Ops in ``dtorch/ops/selection.py`` and
``dtorch/ops/elementwise.py`` or composed from existing Tensor methods; this
module never loops over elements in Python.
"""
import numpy as np

from . import _backend as B
from .autograd import function as _function
from .ops import selection as S
from .ops import elementwise as E


# Tensor is known here through autograd's TensorBase protocol: this module
# sits below dtorch/tensor.py (whose class body binds these functions), and
# new tensors are made by the _wrap of the tensor at hand.
_TensorBase = _function.TensorBase


def _arr(x):
    return x._data if isinstance(x, _TensorBase) else x


def _index_array(self, index, op):
    """An index argument as an int64 array on self's device."""
    a = _arr(index)
    xp = self._xp()
    if not hasattr(a, "dtype"):
        a = xp.asarray(a, dtype=np.int64)
    if type(a) is not type(self._data):
        raise RuntimeError(
            f"{op}(): Expected all tensors to be on the same device, but "
            f"found index on {B.device_of(a)} and input on {self.device}")
    if a.dtype.kind not in "iu":
        raise RuntimeError(f"{op}(): Expected dtype int64 for index")
    return a


def _inplace(self, compute):
    """Run ``compute(self)`` and write it into self (PyTorch's in-place
    semantics, autograd included)."""
    if self._tracked():
        return self._rebase(compute)
    self._check_inplace()
    res = compute(self.detach())
    self._data[...] = res._data
    self._vc[0] += 1
    return self


# ================================================================ triangles ==

def tril(self, diagonal=0):
    return S.Tril.apply(self, diagonal=int(diagonal))


def triu(self, diagonal=0):
    return S.Tril.apply(self, diagonal=int(diagonal), upper=True)


@B.on_own_device
def tril_(self, diagonal=0):
    return _inplace(self, lambda t: tril(t, diagonal))


@B.on_own_device
def triu_(self, diagonal=0):
    return _inplace(self, lambda t: triu(t, diagonal))


# ================================================================== sorting ==

def _selected(self, idx, axis, keepdim=True):
    vals = S.Select.apply(self, idx=idx, axis=axis, keepdim=keepdim)
    ind = idx if keepdim or not self.ndim else self._xp().squeeze(idx, axis)
    return vals, self._wrap(ind)


@B.on_own_device
def sort(self, dim=-1, descending=False, stable=False):
    """Values and indices along dim; ties keep their order (stable)."""
    from .return_types import sort as _rt
    if isinstance(dim, bool):     # sort(x, True) is sort(descending=...)
        raise TypeError("sort(): dim must be an int")
    idx = S.sort_indices(self._data, dim, descending)
    return _rt(*_selected(self, idx, S.axis_of(dim, self.ndim)))


@B.on_own_device
def argsort(self, dim=-1, descending=False, stable=False):
    return self._wrap(S.sort_indices(self._data, dim, descending))


@B.on_own_device
def msort(self):
    return sort(self, 0).values


@B.on_own_device
def topk(self, k, dim=-1, largest=True, sorted=True):
    """The k largest (smallest) values along dim and their indices."""
    from .return_types import topk as _rt
    if isinstance(k, _TensorBase):
        k = int(k.item())
    idx = S.topk_indices(self._data, int(k), dim, largest)
    return _rt(*_selected(self, idx, S.axis_of(dim, self.ndim)))


@B.on_own_device
def kthvalue(self, k, dim=-1, keepdim=False):
    from .return_types import kthvalue as _rt
    axis = S.axis_of(dim, self.ndim)
    n = self.shape[axis] if self.ndim else 1
    if not 1 <= k <= n:
        raise IndexError(f"kthvalue(): selected number k out of range for "
                         f"dimension {axis}")
    xp = self._xp()
    idx = S.sort_indices(self._data, dim, False)
    if self.ndim:
        idx = xp.take(idx, xp.arange(k - 1, k), axis=axis)
    return _rt(*_selected(self, idx, axis, keepdim))


@B.on_own_device
def median(self, dim=None, keepdim=False):
    """The lower median (PyTorch's: no averaging of the two middle values);
    NaN if the slice holds a NaN."""
    from .return_types import median as _rt
    if dim is None:
        flat = self.reshape(-1)
        n = flat.numel()
        if n == 0:
            return self.new_full((), float("nan"))
        # NaN if any is NaN; g shared evenly among equal elements (torch)
        from . import ops as P
        return P.MedianAll.apply(self)
    axis = S.axis_of(dim, self.ndim)
    n = self.shape[axis] if self.ndim else 1
    xp = self._xp()
    idx = S.sort_indices(self._data, dim, False)
    if self.ndim:
        idx = xp.take(idx, xp.arange((n - 1) // 2, (n - 1) // 2 + 1),
                      axis=axis)
        if self.dtype.is_floating_point:
            # a slice holding NaN gives NaN at its first NaN (PyTorch)
            isn = xp.isnan(self._data)
            idx = xp.where(isn.any(axis, keepdims=True),
                           isn.argmax(axis, keepdims=True), idx)
    return _rt(*_selected(self, idx, axis, keepdim))


@B.on_own_device
def quantile(self, q, dim=None, keepdim=False, interpolation="linear"):
    """Quantiles by sorting and interpolating between neighbours."""
    T = _TensorBase
    scalar_q = not isinstance(q, T) and not isinstance(q, (list, tuple))
    qa = np.atleast_1d(np.asarray(_arr(q) if not isinstance(q, T)
                                  else q.detach().cpu()._data, np.float64))
    if ((qa < 0) | (qa > 1)).any():
        raise RuntimeError("quantile() q values must be in the range [0, 1]")
    if not self.dtype.is_floating_point:
        raise RuntimeError("quantile() input tensor must be either float or "
                           "double dtype")
    x = self.reshape(-1) if dim is None else self
    d = 0 if dim is None else S.axis_of(dim, self.ndim)
    s = sort(x, d).values
    n = s.shape[d] if s.ndim else 1
    pos = qa * (n - 1)
    lo = np.floor(pos).astype(np.int64)
    hi = np.ceil(pos).astype(np.int64)
    if interpolation == "lower":
        hi = lo
    elif interpolation == "higher":
        lo = hi
    elif interpolation == "nearest":
        lo = hi = np.round(pos).astype(np.int64)   # half to even, as torch
    xp = self._xp()
    vlo = index_select(s, d, xp.asarray(lo))
    vhi = index_select(s, d, xp.asarray(hi))
    if interpolation == "midpoint":
        w = np.where(hi > lo, 0.5, 0.0)
    elif interpolation == "linear":
        w = pos - lo
    else:
        w = np.zeros_like(pos)
    shape = [1] * s.ndim
    shape[d] = len(qa)
    wt = xp.asarray(w.reshape(shape), s._data.dtype)
    out = vlo + (vhi - vlo) * self._wrap(wt)
    # PyTorch puts the q dimension first
    out = out.movedim(d, 0) if s.ndim else out
    if keepdim:
        if dim is None:
            out = out.reshape((len(qa),) + (1,) * self.ndim)
        else:
            out = out.unsqueeze(d + 1)
    if scalar_q:
        out = out.squeeze(0)
    return out


@B.on_own_device
def nanquantile(self, q, dim=None, keepdim=False, interpolation="linear"):
    if not bool(self.isnan().any()):
        return quantile(self, q, dim, keepdim, interpolation)
    raise NotImplementedError("nanquantile with NaN values is not supported "
                              "by dtorch")


# ============================================================ gather/scatter ==

@B.on_own_device
def gather(self, dim, index, sparse_grad=False):
    return S.Gather.apply(self, idx=_index_array(self, index, "gather"),
                          dim=dim)


@B.on_own_device
def take_along_dim(self, indices, dim=None):
    idx = _index_array(self, indices, "take_along_dim")
    if dim is None:
        return gather(self.reshape(-1), 0, self._wrap(idx.reshape(-1)))
    d = S.axis_of(dim, self.ndim)
    shape = np.broadcast_shapes(
        tuple(s for i, s in enumerate(self.shape) if i != d),
        tuple(s for i, s in enumerate(idx.shape) if i != d))
    xs = list(shape)
    xs.insert(d, self.shape[d])
    ishape = list(shape)
    ishape.insert(d, idx.shape[d])
    xp = self._xp()
    return gather(self.expand(xs), d,
                  self._wrap(xp.broadcast_to(idx, ishape).copy()))


@B.on_own_device
def take(self, index):
    idx = _index_array(self, index, "take")
    return take_along_dim(self, self._wrap(idx.reshape(-1)), None).reshape(
        idx.shape)


def _scatter_src(self, src, value):
    if src is None:
        src = value
    if src is None:
        raise TypeError("scatter() missing 1 required positional argument: "
                        "'src' or 'value'")
    if isinstance(src, _TensorBase):
        if src.dtype != self.dtype:
            raise RuntimeError(
                f"scatter(): Expected self.dtype to be equal to src.dtype")
        return src
    return src


@B.on_own_device
def scatter(self, dim, index, src=None, value=None, reduce=None):
    """out[index[i][j]][j] = src[i][j] (dim 0); src may be a number."""
    src = _scatter_src(self, src, value)
    idx = _index_array(self, index, "scatter")
    if reduce not in (None, "add", "sum"):
        if reduce == "multiply":
            raise NotImplementedError("scatter(reduce='multiply') is not "
                                      "supported by dtorch")
        raise RuntimeError(f"reduce argument must be either add or "
                           f"multiply, got {reduce}")
    return S.Scatter.apply(self, src, idx=idx.astype(np.int64, copy=False),
                           dim=dim, add=reduce is not None)


@B.on_own_device
def scatter_add(self, dim, index, src):
    return S.Scatter.apply(self, _scatter_src(self, src, None),
                           idx=_index_array(self, index, "scatter_add")
                           .astype(np.int64, copy=False), dim=dim, add=True)


@B.on_own_device
def scatter_(self, dim, index, src=None, value=None, reduce=None):
    return _inplace(self, lambda t: scatter(t, dim, index, src, value,
                                            reduce))


def scatter_add_(self, dim, index, src):
    return _inplace(self, lambda t: scatter_add(t, dim, index, src))


def scatter_reduce(self, dim, index, src, reduce, include_self=True):
    if reduce == "sum" and include_self:
        return scatter_add(self, dim, index, src)
    raise NotImplementedError(f"scatter_reduce(reduce={reduce!r}, "
                              f"include_self={include_self}) is not "
                              f"supported by dtorch")


@B.on_own_device
def index_select(self, dim, index):
    return S.IndexSelect.apply(self, idx=_index_array(self, index,
                                                      "index_select"),
                               dim=dim)


@B.on_own_device
def index_add(self, dim, index, source, alpha=1):
    return S.IndexAdd.apply(self, source, idx=_index_array(
        self, index, "index_add"), dim=dim, alpha=alpha)


@B.on_own_device
def index_copy(self, dim, index, source):
    return S.IndexAdd.apply(self, source, idx=_index_array(
        self, index, "index_copy"), dim=dim, copy=True)


@B.on_own_device
def index_fill(self, dim, index, value):
    idx = _index_array(self, index, "index_fill").reshape(-1)
    d = S.axis_of(dim, self.ndim)
    xp = self._xp()
    shape = [1] * max(self.ndim, 1)
    n = self.shape[d] if self.ndim else 1
    shape[d] = n
    S._check_index(idx, n, "index_fill", d)
    m = xp.zeros(n, bool)
    m[idx] = True
    mask = self._wrap(m.reshape(shape) if self.ndim else m.reshape(()))
    return self.masked_fill(mask, value)


@B.on_own_device
def index_add_(self, dim, index, source, alpha=1):
    return _inplace(self, lambda t: index_add(t, dim, index, source, alpha))


@B.on_own_device
def index_copy_(self, dim, index, source):
    return _inplace(self, lambda t: index_copy(t, dim, index, source))


@B.on_own_device
def index_fill_(self, dim, index, value):
    return _inplace(self, lambda t: index_fill(t, dim, index, value))


@B.on_own_device
def index_put(self, indices, values, accumulate=False):
    out = self.clone()
    return index_put_(out, indices, values, accumulate)


@B.on_own_device
def index_put_(self, indices, values, accumulate=False):
    key = tuple(indices)
    if not accumulate:
        self[key] = values
        return self
    # accumulate: repeated indices sum, through the gather's backward
    T = _TensorBase
    xp = self._xp()
    pos = xp.arange(self.numel()).reshape(self.shape)[
        self._key(key)].reshape(-1)
    v = values if isinstance(values, T) else self._wrap(
        xp.asarray(values, self._data.dtype))
    v = v.expand(self[key].shape).reshape(-1)
    return _inplace(self, lambda t: scatter_add(
        t.reshape(-1), 0, self._wrap(pos.astype(np.int64)), v.to(t.dtype))
        .reshape(t.shape))


@B.on_own_device
def masked_select(self, mask):
    m = _arr(mask)
    if getattr(m, "dtype", None) != np.bool_:
        raise RuntimeError("masked_select: expected BoolTensor for mask")
    shape = np.broadcast_shapes(self.shape, m.shape)
    x = self.expand(shape) if tuple(self.shape) != shape else self
    return x[self._wrap(self._xp().broadcast_to(m, shape))]


@B.on_own_device
def masked_scatter(self, mask, source):
    m = _arr(mask)
    xp = self._xp()
    m = xp.broadcast_to(m, self.shape)
    pos = xp.flatnonzero(m.reshape(-1)).astype(np.int64)
    src = source.reshape(-1)[:pos.size]
    return scatter(self.reshape(-1), 0, self._wrap(pos), src).reshape(self.shape)


# ============================================================ scans =========

def cumprod(self, dim, dtype=None):
    t = self if dtype is None else self.to(dtype)
    return S.Cumprod.apply(t, dim=dim)


def _cumext(self, dim, is_min):
    from .return_types import MinMax
    vals = S.CumExtreme.apply(self, dim=dim, is_min=is_min)
    fn = vals.grad_fn
    if fn is not None:
        ind = fn.indices
    else:
        # untracked: the same forward, for its indices
        ctx = S.CumExtreme.__new__(S.CumExtreme)
        S.CumExtreme.forward(ctx, self._data, dim, is_min)
        ind = ctx.indices
    return MinMax(vals, self._wrap(ind))


@B.on_own_device
def cummax(self, dim):
    return _cumext(self, dim, False)


@B.on_own_device
def cummin(self, dim):
    return _cumext(self, dim, True)


def logcumsumexp(self, dim):
    # one node with PyTorch's scan and backward (dtorch/ops/selection.py)
    from . import ops as P
    return P.LogCumSumExp.apply(self, dim=S.axis_of(dim, self.ndim))


def diff(self, n=1, dim=-1, prepend=None, append=None):
    T = _TensorBase
    from ._creation import cat
    x = self
    d = S.axis_of(dim, self.ndim)
    if prepend is not None or append is not None:
        parts = [p if isinstance(p, T) else self._wrap(self._xp().asarray(p))
                 for p in (prepend, self, append) if p is not None]
        x = cat(parts, d)
    for _ in range(n):
        m = x.shape[d]
        hi = x.narrow(d, 1, m - 1) if m else x
        lo = x.narrow(d, 0, m - 1) if m else x
        x = hi.logical_xor(lo) if x.dtype is B.bool_ else hi - lo
    return x


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


@B.on_own_device
def trace(self):
    if self.ndim != 2:
        raise RuntimeError(f"trace: expected a matrix, but got tensor with "
                           f"dim {self.ndim}")
    return self.diagonal().sum()


def outer(self, vec2):
    if self.ndim != 1 or vec2.ndim != 1:
        raise RuntimeError("outer: expected 1D tensors")
    return self.unsqueeze(1) * vec2.unsqueeze(0)


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
    from .tensor import _dims
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


# ========================================================= elementwise =====

def erf(self):
    return E.Erf.apply(self)


def erfc(self):
    return E.Erfc.apply(self)


def erfinv(self):
    return E.Erfinv.apply(self)


def asin(self):
    return E.Asin.apply(self)


def acos(self):
    return E.Acos.apply(self)


def atan(self):
    return E.Atan.apply(self)


def sinh(self):
    return E.Sinh.apply(self)


def cosh(self):
    return E.Cosh.apply(self)


def asinh(self):
    return E.Asinh.apply(self)


def acosh(self):
    return E.Acosh.apply(self)


def atanh(self):
    return E.Atanh.apply(self)


def exp2(self):
    return E.Exp2.apply(self)


def frac(self):
    return E.Frac.apply(self)


def sinc(self):
    return E.Sinc.apply(self)


def logit(self, eps=None):
    return E.Logit.apply(self, eps=eps)


def _other(self, other):
    from .tensor import _operand
    return _operand(other, self)


def atan2(self, other):
    return E.Atan2.apply(self, _other(self, other))


arctan2 = atan2


def hypot(self, other):
    return E.Hypot.apply(self, _other(self, other))


def xlogy(self, other):
    return E.Xlogy.apply(self, _other(self, other))


def _exact_int(self, other):
    return not self.dtype.is_floating_point and not (
        isinstance(other, float) or (isinstance(other, _TensorBase)
                                     and other.dtype.is_floating_point))


def remainder(self, other):
    """Python's modulo: the result has the sign of the divisor."""
    if _exact_int(self, other):
        return self % other
    from . import ops as P
    return P.Mod.apply(self, _other(self, other), floor=True)


def fmod(self, other):
    """C's fmod: the result has the sign of the dividend."""
    if _exact_int(self, other):
        xp = self._xp()
        from .ops import promote
        a, b = promote(self._data, _arr(_other(self, other)), "fmod")
        return self._wrap(xp.fmod(a, b))
    from . import ops as P
    return P.Mod.apply(self, _other(self, other), floor=False)


def floor_divide(self, other):
    return self // other


def float_power(self, exponent):
    e = exponent.double() if isinstance(exponent, _TensorBase) else float(exponent)
    return self.double() ** e


@B.on_own_device
def logical_xor(self, other):
    return self._wrap(self._xp().logical_xor(self._data, _arr(other)))


def bitwise_and(self, other):
    return self & other


def bitwise_or(self, other):
    return self | other


def bitwise_xor(self, other):
    return self ^ other


def bitwise_not(self):
    return ~self


def signbit(self):
    return self._wrap(self._xp().signbit(self._data))


def heaviside(self, values):
    x = self._data
    xp = self._xp()
    v = _arr(values)
    return self._wrap(xp.where(x == 0, v, (x > 0)).astype(
        xp.result_type(x, v), copy=False))


def copysign(self, other):
    o = _arr(_other(self, other))
    sgn = self._xp().where(self._xp().signbit(o), -1.0, 1.0)
    return self.abs() * self._wrap(sgn.astype(
        self._data.dtype if self.dtype.is_floating_point
        else B.get_default_dtype().np))


def nansum(self, dim=None, keepdim=False, dtype=None):
    return self.masked_fill(self.isnan(), 0).sum(dim, keepdim, dtype=dtype)


def nanmean(self, dim=None, keepdim=False, dtype=None):
    ok = ~self.isnan()
    return nansum(self, dim, keepdim, dtype) / ok.sum(dim, keepdim).to(
        self.dtype)


def mv(self, vec):
    if self.ndim != 2 or vec.ndim != 1:
        raise RuntimeError(f"vector + matrix @ vector expected, got "
                           f"{self.ndim}, {vec.ndim}")
    return self @ vec


def addmm(self, mat1, mat2, beta=1, alpha=1):
    return _scaled(self, beta) + _scaled(mat1.mm(mat2), alpha)


def baddbmm(self, batch1, batch2, beta=1, alpha=1):
    return _scaled(self, beta) + _scaled(batch1.bmm(batch2), alpha)


def addbmm(self, batch1, batch2, beta=1, alpha=1):
    return _scaled(self, beta) + _scaled(batch1.bmm(batch2).sum(0), alpha)


def addmv(self, mat, vec, beta=1, alpha=1):
    return _scaled(self, beta) + _scaled(mat.mv(vec), alpha)


def _scaled(t, c):
    # beta=0 ignores the input entirely (NaN included), as PyTorch does
    if c == 0:
        return t.detach() * 0 if not t.requires_grad else t * 0
    return t if c == 1 else t * c


def tile(self, dims):
    dims = tuple(dims)
    if len(dims) < self.ndim:
        dims = (1,) * (self.ndim - len(dims)) + dims
    return self.repeat(*dims)


@B.on_own_device
def unique(self, sorted=True, return_inverse=False, return_counts=False,
           dim=None):
    xp = self._xp()
    res = xp.unique(self._data, return_inverse=return_inverse,
                    return_counts=return_counts, axis=dim)
    if not isinstance(res, tuple):
        return self._wrap(res)
    out = [self._wrap(res[0])]
    k = 1
    if return_inverse:
        inv = res[k].astype(np.int64)
        out.append(self._wrap(inv.reshape(self.shape) if dim is None else inv))
        k += 1
    if return_counts:
        out.append(self._wrap(res[k].astype(np.int64)))
    return tuple(out)


@B.on_own_device
def unique_consecutive(self, return_inverse=False, return_counts=False,
                       dim=None):
    if dim is not None:
        raise NotImplementedError("unique_consecutive(dim=...) is not "
                                  "supported by dtorch")
    xp = self._xp()
    a = self._data.reshape(-1)
    start = xp.concatenate([xp.ones(min(a.size, 1), bool), a[1:] != a[:-1]])
    out = [self._wrap(a[start])]
    if return_inverse:
        out.append(self._wrap((xp.cumsum(start) - 1).astype(np.int64)
                         .reshape(self.shape)))
    if return_counts:
        pos = xp.flatnonzero(start)
        out.append(self._wrap(xp.diff(xp.concatenate(
            [pos, xp.asarray([a.size])])).astype(np.int64)))
    return out[0] if len(out) == 1 else tuple(out)


# ============================================================ sampling ======

@B.on_own_device
def multinomial(self, num_samples, replacement=False, generator=None):
    """Category indices drawn from each row's (unnormalised) weights, on
    self's device (checks of the weights deferred there, no host sync)."""
    from .random import draw
    if self.ndim not in (1, 2):
        raise RuntimeError("prob_dist must be 1 or 2 dim")
    if not self.dtype.is_floating_point:
        raise RuntimeError("multinomial only supports floating-point dtypes "
                           "for input")
    xp = self._xp()
    p = self._data.astype(np.float64).reshape(-1, self.shape[-1])
    k = p.shape[1]
    if num_samples <= 0:
        raise RuntimeError("cannot sample n_sample <= 0 samples")
    B.check_or_defer(~(xp.isfinite(p).all() & (p >= 0).all()),
                     lambda: RuntimeError(
                         "probability tensor contains either `inf`, `nan` "
                         "or element < 0"))
    tot = p.sum(1)
    B.check_or_defer((tot <= 0).any(), lambda: RuntimeError(
        "invalid multinomial distribution (sum of probabilities <= 0)"))
    if not replacement and num_samples > k:
        raise RuntimeError("cannot sample n_sample > prob_dist.size(-1) "
                           "samples without replacement")
    rows = p.shape[0]
    dev = self.device
    if replacement:
        # inverse CDF, all rows at once: row r's CDF lives in [r, r + 1]
        cdf = xp.cumsum(p, 1) / tot[:, None]
        cdf[:, -1] = 1.0
        off = xp.arange(rows)[:, None]
        u = draw("random", size=(rows, num_samples), device=dev,
                 generator=generator, dtype=np.float64)
        idx = xp.searchsorted((cdf + off).reshape(-1), (u + off).reshape(-1),
                              side="right").reshape(rows, num_samples)
        idx = xp.minimum(idx - off * k, k - 1)
        # a zero-weight category can be hit only at a CDF plateau edge
    else:
        B.check_or_defer(((p > 0).sum(1) < num_samples).any(),
                         lambda: RuntimeError(
                             "invalid multinomial distribution (with "
                             "replacement=False, not enough non-negative "
                             "category to sample)"))
        # exponential race (Gumbel top-k): the first num_samples arrivals
        # of Exp(p_i) clocks are a draw without replacement
        e = draw("exponential", size=p.shape, device=dev,
                 generator=generator, dtype=np.float64)
        with np.errstate(divide="ignore"):
            keys = e / p
        idx = xp.argsort(keys, axis=1, kind="stable")[:, :num_samples]
    idx = idx.astype(np.int64)
    if self.ndim == 1:
        idx = idx.reshape(num_samples)
    return self._wrap(idx)


@B.on_own_device
def bernoulli(self, p=None, generator=None):
    from .random import draw
    # drawn on self's device; the range check is deferred there (no sync)
    xp = self._xp()
    prob = self._data if p is None else (
        p._data if isinstance(p, _TensorBase) else p)
    prob = self.device.send(xp.asarray(prob)) if not isinstance(
        prob, (int, float)) else prob
    bad = ~((xp.asarray(prob) >= 0) & (xp.asarray(prob) <= 1)).all()
    B.check_or_defer(bad, lambda: RuntimeError(
        "Expected p_in >= 0 && p_in <= 1 to be true, but got false."))
    vals = draw("random", size=self.shape, device=self.device,
                generator=generator) < prob
    dt = self._data.dtype if self.dtype.is_floating_point else \
        B.get_default_dtype().np
    return self._wrap(vals.astype(dt))


@B.on_own_device
def _fill_random(self, method, *args, generator=None, scale=None):
    # drawn on self's device by its generator, not on the host
    from .random import draw
    self._check_inplace()
    vals = draw(method, *args, size=self.shape, device=self.device,
                generator=generator)
    if scale is not None:
        vals = scale[0] + scale[1] * vals
    self._data[...] = vals.astype(self._data.dtype)
    self._vc[0] += 1
    return self


def exponential_(self, lambd=1.0, generator=None):
    return _fill_random(self, "exponential", 1.0 / lambd,
                        generator=generator)


def geometric_(self, p, generator=None):
    return _fill_random(self, "geometric", p, generator=generator)


def log_normal_(self, mean=1.0, std=2.0, generator=None):
    return _fill_random(self, "lognormal", mean, std, generator=generator)


def cauchy_(self, median=0.0, sigma=1.0, generator=None):
    return _fill_random(self, "standard_cauchy", generator=generator,
                        scale=(median, sigma))


# ============================================================ in-place shape ==

def _reshape_(self, res, op):
    if self._tracked():
        raise RuntimeError(
            f"{op}: dtorch does not support in-place shape changes of a "
            f"tensor that requires grad; use the out-of-place form")
    self._data = res._data
    self._vc[0] += 1
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




# ====================================================== issue 14, part 2 ==

def lgamma(self):
    return E.Lgamma.apply(self)


def digamma(self):
    return E.Digamma.apply(self)


@B.on_own_device
def nonzero(self, *, as_tuple=False):
    from ._creation import nonzero as _nz
    return _nz(self, as_tuple)


@B.on_own_device
def mode(self, dim=-1, keepdim=False):
    """The most frequent value along dim (the smallest among ties) and the
    index of its last occurrence, as PyTorch."""
    from .return_types import mode as _rt
    xp = self._xp()
    if self.ndim == 0:
        return _rt(self.clone(), self._wrap(xp.zeros((), np.int64)))
    axis = S.axis_of(dim, self.ndim)
    x = xp.moveaxis(self._data, axis, -1)
    n = x.shape[-1]
    if n == 0:
        raise IndexError("mode(): Expected reduction dim to have non-zero "
                         "size.")
    order = xp.argsort(x, axis=-1, kind="stable")
    s = xp.take_along_axis(x, order, -1)
    # run lengths: position minus the start of the run, + 1
    new = xp.ones(s.shape, bool)
    new[..., 1:] = s[..., 1:] != s[..., :-1]
    pos = xp.broadcast_to(xp.arange(n), s.shape)
    # each element's run start: the last "new" position at or before it
    # (a cumulative max; CuPy has no maximum.accumulate, so the running
    # count of run starts indexes their positions instead)
    run_id = xp.cumsum(new, axis=-1) - 1
    starts = xp.where(new, pos, n)
    starts = xp.sort(starts, axis=-1)
    start = xp.take_along_axis(starts, run_id, axis=-1)
    run = pos - start + 1
    # a run's count is final at its end; the first maximum is the smallest
    end = xp.ones(s.shape, bool)
    end[..., :-1] = new[..., 1:]
    best = xp.argmax(xp.where(end, run, 0), axis=-1)[..., None]
    idx = xp.take_along_axis(order, best, -1).astype(np.int64)
    idx = xp.moveaxis(idx, -1, axis)
    return _rt(*_selected(self, idx, axis, keepdim))


@B.on_own_device
def put_(self, index, source, accumulate=False):
    """self.view(-1)[index] = source (summed with ``accumulate``)."""
    idx = _index_array(self, index, "put_").reshape(-1)
    src = source.reshape(-1)
    flat_n = self.numel()
    S._check_index(idx, flat_n, "put_", 0)

    def compute(t):
        i64 = self._wrap(idx.astype(np.int64))
        flat = t.reshape(-1)
        out = scatter_add(flat, 0, i64, src) if accumulate else \
            scatter(flat, 0, i64, src)
        return out.reshape(t.shape)
    return _inplace(self, compute)


@B.on_own_device
def resize_(self, *sizes, memory_format=None):
    """Reshape in place to ``sizes``, keeping the leading elements and
    zero-filling new ones (PyTorch leaves them uninitialised)."""
    from .tensor import _dims
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
    self._vc[0] += 1
    return self
