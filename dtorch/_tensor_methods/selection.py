"""Tensor methods that select: triangles, sorting (sort, topk, median,
quantile), gather/scatter and index_*, masked_*, unique, nonzero, mode.

Each function takes the tensor first: it is a Tensor method (this family's
mixin, at the end, binds it; Tensor inherits the mixin) and, where PyTorch
has one, ``dtorch.<name>``. Methods that are not functions are written in
the mixin's body (the rule: dtorch/tensor.py's docstring).
"""
import numpy as np

from .. import _backend as B
from .. import ops as P
from .. import return_types as R
from ..ops import selection as S
from ..autograd.function import autocast_op
from ..autograd.grad_mode import _state
from ._common import _SCALARS, _TensorBase, _arr, _index_array, _inplace, \
    methods


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
    if isinstance(dim, bool):     # sort(x, True) is sort(descending=...)
        raise TypeError("sort(): dim must be an int")
    idx = S.sort_indices(self._data, dim, descending)
    return R.sort(*_selected(self, idx, S.axis_of(dim, self.ndim)))


@B.on_own_device
def argsort(self, dim=-1, descending=False, stable=False):
    return self._wrap(S.sort_indices(self._data, dim, descending))


@B.on_own_device
def msort(self):
    return sort(self, 0).values


@B.on_own_device
def topk(self, k, dim=-1, largest=True, sorted=True):
    """The k largest (smallest) values along dim and their indices."""
    if isinstance(k, _TensorBase):
        k = int(k.item())
    idx = S.topk_indices(self._data, int(k), dim, largest)
    return R.topk(*_selected(self, idx, S.axis_of(dim, self.ndim)))


@B.on_own_device
def kthvalue(self, k, dim=-1, keepdim=False):
    axis = S.axis_of(dim, self.ndim)
    n = self.shape[axis] if self.ndim else 1
    if not 1 <= k <= n:
        raise IndexError(f"kthvalue(): selected number k out of range for "
                         f"dimension {axis}")
    xp = self._xp()
    idx = S.sort_indices(self._data, dim, False)
    if self.ndim:
        idx = xp.take(idx, xp.arange(k - 1, k), axis=axis)
    return R.kthvalue(*_selected(self, idx, axis, keepdim))


@B.on_own_device
def median(self, dim=None, keepdim=False):
    """The lower median (PyTorch's: no averaging of the two middle values);
    NaN if the slice holds a NaN."""
    if dim is None:
        flat = self.reshape(-1)
        n = flat.numel()
        if n == 0:      # NaN, in the graph (an empty gradient), as PyTorch
            return self.sum() * float("nan")
        # NaN if any is NaN; g shared evenly among equal elements (torch)
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
    return R.median(*_selected(self, idx, axis, keepdim))


@B.on_own_device
@autocast_op({"cpu": "fp32"})    # PyTorch's CPU fp32 list
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
    if self.numel() == 0:
        raise RuntimeError("quantile() input tensor must be non-empty")
    x = self.reshape(-1) if dim is None or self.ndim == 0 else self
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
    # lerp's two-sided form, as PyTorch: exact at infinite neighbours
    out = vlo.lerp(vhi, self._wrap(wt))
    # a slice holding NaN gives NaN, from its NaN (sorted last), as PyTorch
    nan = s.isnan().any(d, keepdim=True)
    if bool(nan.any()):
        out = s.narrow(d, n - 1, 1).where(nan, out)
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


@B.on_own_device
def nonzero(self, *, as_tuple=False):
    xp = self._xp()
    idx = xp.nonzero(self._data)
    if as_tuple:
        return tuple(self._wrap(i.astype(np.int64)) for i in idx)
    return self._wrap(xp.stack(idx, axis=1).astype(np.int64)
                      if idx else xp.zeros((0, 0), np.int64))


@B.on_own_device
def mode(self, dim=-1, keepdim=False):
    """The most frequent value along dim (the smallest among ties) and the
    index of its last occurrence, as PyTorch."""
    xp = self._xp()
    if self.ndim == 0:
        return R.mode(self.clone(), self._wrap(xp.zeros((), np.int64)))
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
    return R.mode(*_selected(self, idx, axis, keepdim))


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


# ================================================= the mixin =====

@methods("tril triu tril_ triu_ sort argsort msort topk kthvalue median "
         "quantile nanquantile gather take_along_dim take scatter "
         "scatter_add scatter_ scatter_add_ scatter_reduce index_select "
         "index_add index_copy index_fill index_add_ index_copy_ index_fill_ "
         "index_put index_put_ masked_select masked_scatter unique "
         "unique_consecutive nonzero mode put_")
class SelectionMethods:
    """Tensor's indexing, selection, sorting and scatter."""
    __slots__ = ()

    # --------------------------------------------------------- indexing ---
    @B.on_own_device
    def _key(self, key):
        """Turn tensors and lists inside an index into arrays."""
        if type(key) is tuple:
            return tuple(self._key1(k) for k in key)
        return self._key1(key)

    def _key1(self, k):
        if isinstance(k, _TensorBase):
            if type(k._data) is not type(self._data):
                raise RuntimeError(
                    f"indices should be either on cpu or on the same device "
                    f"as the indexed tensor ({self.device}), got {k.device}")
            if k._data.dtype.kind == "f":
                raise IndexError("tensors used as indices must be long, int, "
                                 "byte or bool tensors")
            return k._data
        if isinstance(k, list):
            return self._xp().asarray(k)
        if isinstance(k, np.ndarray) and not isinstance(self._data,
                                                        np.ndarray):
            return self._xp().asarray(k)
        return k

    def __getitem__(self, key):
        key = self._key(key)
        if P._is_basic(key):
            return P.IndexView.apply(self, key=key)
        return P.Index.apply(self, key=key)

    @B.on_own_device
    def __setitem__(self, key, value):
        key = self._key(key)
        if isinstance(value, _TensorBase):
            if type(value._data) is not type(self._data):
                raise P._device_error("index_put_", self._data, value._data)
            v = value
        else:
            v = self._xp().asarray(value, dtype=self._data.dtype) \
                if not isinstance(value, _SCALARS) else value
        if _state.enabled and (self.requires_grad or (
                isinstance(v, _TensorBase) and v.requires_grad)):
            if isinstance(v, _TensorBase) and v.dtype != self.dtype:
                v = v.to(self.dtype)
            self._rebase(lambda t: P.SetIndex.apply(t, v, key=key))
            return
        self._data[key] = _arr(v)
        self._bump_version()

    def __len__(self):
        if self.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self._data.shape[0]

    def __iter__(self):
        if self.ndim == 0:
            raise TypeError("iteration over a 0-d tensor")
        return iter(self.unbind(0))

    def __contains__(self, element):
        return bool((self._data == _arr(element)).any())
