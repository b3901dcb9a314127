"""Sparse COO tensors at the level graph networks use (``torch.sparse_coo``).

``SparseCOO`` holds the methods of ``dtorch.tensor.SparseTensor`` (a Tensor
subclass, so ``isinstance(s, Tensor)`` and the reflected ``dense @ s`` /
``dense + s`` work): int64 ``indices`` (sparse_dim x nnz), dense ``values``
(nnz x dense dims, an ordinary tensor that carries the autograd graph: a
gradient reaches the values, and through them whatever made them) and the
size. What runs on it: ``to_dense``, ``coalesce``, ``indices`` /
``values``, ``sparse @ dense`` (``mm``, ``matmul``, ``spmm``,
``dtorch.sparse.mm``; gradients to the dense operand and to the values),
``dense @ sparse``, ``dense + sparse``, ``sparse + sparse``, ``sparse *
number`` / ``* dense``, ``sum``, ``t`` / ``transpose``, ``to(device or
dtype)``, ``detach``, ``clone``, ``requires_grad_``. Every other (dense) op
raises NotImplementedError naming itself: the dense array (``_data``) of a
sparse tensor does not exist, so no dense kernel ever sees one, and the
dense ops pay nothing for this.
"""
import sys

import numpy as np

from .. import _backend as B
from ..autograd.function import Function
from ..ops import Cat
from ..ops.index import index_add0
from ._common import methods


class layout:
    """A tensor's memory layout (``torch.layout``)."""
    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"torch.{self.name}"      # as dtorch.memory_format

    def __reduce__(self):
        return self.name


strided = layout("strided")
sparse_coo = layout("sparse_coo")

_SUPPORTED = ("to_dense, coalesce, indices/values, mm/matmul/@ with a dense "
              "matrix, + (dense + sparse, sparse + sparse), * a number or a "
              "dense tensor, sum, t/transpose, to/cpu/cuda, detach, clone")


def _unsupported():
    """NotImplementedError naming the dense op that met a sparse tensor
    (the first public dtorch frame above the access)."""
    name = "this operation"
    f = sys._getframe(2)
    while f is not None:
        code = f.f_code
        if "dtorch" in code.co_filename and not code.co_name.startswith(
                "_") and code.co_name not in ("apply", "fn", "wrapper"):
            name = code.co_name
            break
        f = f.f_back
    return NotImplementedError(
        f"{name}: not supported for sparse COO tensors (layout="
        f"dtorch.sparse_coo) in dtorch; a sparse tensor supports "
        f"{_SUPPORTED}. Call .to_dense() first.")


def _plan(r, c, m):
    """The entries sorted by their output row ``r`` (of m), made once per
    sparse tensor so that no product sorts: (order or None when r is
    sorted already, as a coalesced tensor's rows are; the sorted column
    indices; the CSR row pointer; reduceat's segment starts and rows)."""
    if B.get_array_module(r) is not np:
        return None                   # CuPy: add.at is fast on the GPU
    order = None
    if r.size > 1 and (r[1:] < r[:-1]).any():
        order = np.argsort(r, kind="stable")
        r, c = r[order], c[order]
    starts = np.flatnonzero(np.r_[True, r[1:] != r[:-1]]) \
        if r.size else np.zeros(0, np.int64)
    return order, c, np.searchsorted(r, np.arange(m + 1)), starts, \
        r[starts]


_CSR_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _scipy_sparse():
    """scipy.sparse when installed (not a dependency; imported at the
    first sparse product, not with dtorch), else None."""
    try:
        import scipy.sparse
        return scipy.sparse
    except ImportError:
        return None


def _csr_product(v, d, plan, m):
    """sum over entries of v * d[c] into their rows, on NumPy: a CSR
    product through scipy.sparse when it is there (measured: 2708 nodes,
    10.5k entries, 16 features: 0.07 ms, against 0.96 ms for the NumPy
    reduceat below; 512 features: 1.0 against 30 ms), else reduceat."""
    order, c, indptr, starts, targets = plan
    if order is not None:
        v = v[order]
    sp = _scipy_sparse() if v.dtype in _CSR_DTYPES and \
        v.dtype == d.dtype else None
    if sp is not None:
        return np.asarray(sp.csr_matrix((v, c, indptr),
                                        shape=(m, d.shape[0])) @ d)
    contrib = v.reshape((-1,) + (1,) * (d.ndim - 1)) * d[c]
    out = np.zeros((m,) + d.shape[1:], contrib.dtype)
    if contrib.shape[0]:
        out[targets] = np.add.reduceat(contrib, starts, axis=0)
    return out


class SpMM(Function):
    """sparse (m x k, given as rows, cols, values) @ dense (k x ...):
    out[r] += v * dense[c] per stored entry (``_csr_product`` on NumPy,
    ``plans``: the entries sorted by rows and by cols, made once per
    sparse tensor). Backward: the dense gradient is the transposed product
    (the same op, rows and cols swapped); the values' gradient is
    sum(g[r] * dense[c]). Both are tensor ops, so create_graph=True
    differentiates them again."""
    @staticmethod
    def forward(ctx, values, dense, rows, cols, m, plans):
        v, d = values._data, dense._data
        if plans[0] is not None:
            out = _csr_product(v, d, plans[0], m)
        else:
            xp = B.get_array_module(d)
            contrib = v.reshape((-1,) + (1,) * (d.ndim - 1)) * \
                d[cols._data]
            out = index_add0(xp, (m,) + d.shape[1:], contrib.dtype,
                             rows._data, contrib)
        ctx.save_for_backward(values, dense, rows, cols)
        ctx.k, ctx.plans = d.shape[0], plans
        return dense._make(out, False, None)

    @staticmethod
    def backward(ctx, g):
        values, dense, rows, cols = ctx.saved_tensors
        need = ctx.needs_input_grad
        gv = gd = None
        if need[1]:
            gd = SpMM.apply(values, g, cols, rows, ctx.k, ctx.plans[::-1])
        if need[0]:
            gv = g[rows] * dense[cols]
            if gv.ndim > 1:
                gv = gv.sum(tuple(range(1, gv.ndim)))
        return gv, gd, None, None, None, None


def _flat(idx, shape, xp):
    """Row-major linear positions of the index columns."""
    flat = xp.zeros(idx.shape[1], np.int64)
    for i, n in enumerate(shape):
        flat = flat * n + idx[i]
    return flat


class SparseCOO:
    """The methods of a sparse COO tensor (see the module docstring)."""
    __slots__ = ()
    is_sparse = True
    layout = sparse_coo

    # ------------------------------------------------------ no dense data --
    @property
    def _data(self):
        raise _unsupported()

    # ---------------------------------------------------------- making --
    @classmethod
    def _new(cls, indices, values, shape, coalesced=False):
        t = object.__new__(cls)
        t._idx = indices           # int64 tensor, sparse_dim x nnz
        t._vals = values           # tensor, nnz x dense dims
        t._size = tuple(int(n) for n in shape)
        t._is_coalesced = coalesced
        t._grad = None
        t._output_nr = 0
        t._vc = [0]
        t._base = t._accum = t._hooks = t._post_hooks = None
        t._retains = False
        return t

    @classmethod
    def _from_dense(cls, x, sparse_dim=None):
        nd = x.ndim
        k = nd if sparse_dim is None else sparse_dim
        if not 0 <= k <= nd:
            raise RuntimeError(f"sparse_dim argument must be in [0, {nd}] "
                               f"range, but {k} is given")
        a = x.detach()._data
        xp = B.get_array_module(a)
        mask = a != 0 if k == nd else (
            a != 0).reshape(a.shape[:k] + (-1,)).any(-1)
        if k == 0:
            mask = xp.asarray(True).reshape(())
        pos = xp.stack(xp.nonzero(mask)) if k else xp.zeros((0, 1),
                                                            np.int64)
        pos = pos.astype(np.int64)
        idx = x._make(pos, False, None)
        vals = x[tuple(x._make(p, False, None) for p in pos)] if k else \
            x.unsqueeze(0)
        return cls._new(idx, vals, x.shape, coalesced=True)

    # ----------------------------------------------------- attributes --
    @property
    def shape(self):
        return type(self._vals.shape)(self._size)

    def size(self, dim=None):
        return self.shape if dim is None else self._size[dim]

    @property
    def dtype(self):
        return self._vals.dtype

    @property
    def device(self):
        return self._vals.device

    @property
    def ndim(self):
        return len(self._size)

    def dim(self):
        return len(self._size)

    def numel(self):
        return int(np.prod(self._size, dtype=np.int64))

    def __len__(self):
        return self._size[0]

    def sparse_dim(self):
        return self._idx.shape[0]

    def dense_dim(self):
        return len(self._size) - self._idx.shape[0]

    def _nnz(self):
        return self._vals.shape[0]

    def is_coalesced(self):
        return self._is_coalesced

    def _indices(self):
        return self._idx

    def _values(self):
        return self._vals

    def indices(self):
        if not self._is_coalesced:
            raise RuntimeError("Cannot get indices on an uncoalesced tensor, "
                               "please call .coalesce() first")
        return self._idx

    def values(self):
        if not self._is_coalesced:
            raise RuntimeError("Cannot get values on an uncoalesced tensor, "
                               "please call .coalesce() first")
        return self._vals

    # ---------------------------------------------------------- autograd --
    @property
    def requires_grad(self):
        return self._vals.requires_grad

    @requires_grad.setter
    def requires_grad(self, value):
        self._vals.requires_grad = value

    @property
    def grad_fn(self):
        return self._vals.grad_fn

    @property
    def is_leaf(self):
        return self._vals.grad_fn is None

    @property
    def grad(self):
        """The gradient of a leaf's values, as a sparse tensor of the
        same indices."""
        g = self._vals.grad
        return None if g is None else self._new(self._idx, g, self._size,
                                                self._is_coalesced)

    def requires_grad_(self, requires_grad=True):
        self._vals.requires_grad_(requires_grad)
        return self

    def detach(self):
        return self._new(self._idx, self._vals.detach(), self._size,
                         self._is_coalesced)

    def clone(self, memory_format=None):
        return self._new(self._idx.clone(), self._vals.clone(), self._size,
                         self._is_coalesced)

    def to(self, *args, **kwargs):
        vals = self._vals.to(*args, **kwargs)
        idx = self._idx.to(vals.device)
        return self._new(idx, vals, self._size, self._is_coalesced)

    def to_sparse(self, sparse_dim=None, *, layout=None):
        return self

    to_sparse_coo = to_sparse

    # ----------------------------------------------------- conversions --
    def to_dense(self, dtype=None, *, masked_grad=None):
        """The dense tensor (repeated indices summed), differentiable in
        the values."""
        k = self.sparse_dim()
        vals = self._vals if dtype is None else self._vals.to(dtype)
        xp = B.get_array_module(self._idx._data)
        lead = int(np.prod(self._size[:k], dtype=np.int64))
        flat = self._idx._make(_flat(self._idx._data, self._size[:k], xp),
                               False, None)
        out = vals.new_zeros((lead,) + self._size[k:])
        return out.index_add(0, flat, vals).reshape(self._size)

    def coalesce(self):
        """Indices sorted and unique, the values of repeats summed."""
        if self._is_coalesced:
            return self
        k = self.sparse_dim()
        idx = self._idx._data
        xp = B.get_array_module(idx)
        flat = _flat(idx, self._size[:k], xp)
        uniq, inverse = xp.unique(flat, return_inverse=True)
        pos = []
        rest = uniq
        for n in reversed(self._size[:k]):
            pos.append(rest % n)
            rest = rest // n
        new_idx = xp.stack(pos[::-1]) if k else xp.zeros((0, uniq.size),
                                                         np.int64)
        vals = self._vals.new_zeros((int(uniq.size),)
                                    + tuple(self._vals.shape[1:]))
        vals = vals.index_add(0, self._idx._make(
            inverse.reshape(-1), False, None), self._vals)
        return self._new(self._idx._make(new_idx.astype(np.int64), False,
                                         None), vals, self._size, True)

    # --------------------------------------------------------- products --
    def _mm(self, dense):
        if self.sparse_dim() != 2 or self.dense_dim() != 0:
            raise RuntimeError(
                f"sparse @ dense: expected a 2-D sparse matrix (2 sparse "
                f"dims, no dense dims), got sparse_dim={self.sparse_dim()}, "
                f"dense_dim={self.dense_dim()}")
        if getattr(dense, "is_sparse", False):
            raise NotImplementedError(
                "sparse @ sparse is not supported in dtorch: call "
                ".to_dense() on one operand")
        if dense.ndim not in (1, 2):
            raise RuntimeError(f"sparse @ dense: expected a 1-D or 2-D dense "
                               f"operand, got {dense.ndim}-D")
        if dense.shape[0] != self._size[1]:
            raise RuntimeError(
                f"mat1 and mat2 shapes cannot be multiplied ({self._size[0]}x"
                f"{self._size[1]} and "
                f"{'x'.join(map(str, dense.shape))})")
        if dense.dtype != self.dtype:
            raise RuntimeError(f"expected scalar type "
                               f"{_name(self.dtype)} but found "
                               f"{_name(dense.dtype)}")
        if dense.device != self.device:
            raise RuntimeError(
                f"Expected all tensors to be on the same device, but found "
                f"at least two devices, {self.device} and {dense.device}!")
        plans = self.__dict__.get("_plans")
        if plans is None:    # the indices never change: sort them once
            r, c = self._idx._data
            plans = self._plans = (_plan(r, c, self._size[0]),
                                   _plan(c, r, self._size[1]))
        return SpMM.apply(self._vals, dense, self._idx[0], self._idx[1],
                          self._size[0], plans)

    def mm(self, mat2):
        return self._mm(mat2)

    def matmul(self, other):
        return self._mm(other)

    __matmul__ = matmul

    def __rmatmul__(self, other):
        # dense @ sparse = (sparse^T @ dense^T)^T
        if other.ndim == 1:
            return self.t()._mm(other)
        return self.t()._mm(other.t()).t()

    def t(self):
        if self.ndim > 2:
            raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, "
                               f"but self is {self.ndim}D")
        return self.transpose(0, 1) if self.ndim == 2 else self

    def transpose(self, dim0, dim1):
        n = self.ndim
        d0, d1 = dim0 % n, dim1 % n
        k = self.sparse_dim()
        if (d0 < k) != (d1 < k):
            raise RuntimeError("transpose: cannot swap a sparse dim with a "
                               "dense dim")
        size = list(self._size)
        size[d0], size[d1] = size[d1], size[d0]
        if d0 < k:
            order = list(range(k))
            order[d0], order[d1] = order[d1], order[d0]
            idx = self._idx[order] if k > 1 else self._idx
            return self._new(idx, self._vals, size)
        vals = self._vals.transpose(d0 - k + 1, d1 - k + 1)
        return self._new(self._idx, vals, size, self._is_coalesced)

    # ------------------------------------------------------- arithmetic --
    def __add__(self, other):
        if getattr(other, "is_sparse", False):
            if tuple(other.shape) != self._size:
                raise RuntimeError(
                    f"add: expected 'self' and 'other' to have same size, "
                    f"but self has size {list(self._size)} while other has "
                    f"size {list(other.shape)}")
            idx = Cat.apply(self._idx, other._idx, dim=1)
            vals = Cat.apply(self._vals, other._vals.to(self.dtype), dim=0)
            return self._new(idx, vals, self._size).coalesce()
        raise RuntimeError("add(sparse, dense) is not supported. Use "
                           "add(dense, sparse) instead.")

    def add(self, other, alpha=1):
        return self + (other * alpha if alpha != 1 else other)

    def __radd__(self, other):
        # dense + sparse: dense (PyTorch's add(dense, sparse))
        return other + self.to_dense()

    def __mul__(self, other):
        if isinstance(other, (int, float, bool)):
            return self._new(self._idx, self._vals * other, self._size,
                             self._is_coalesced)
        if getattr(other, "is_sparse", False):
            raise NotImplementedError("sparse * sparse is not supported in "
                                      "dtorch: call .to_dense() first")
        # sparse * dense: sparse, the dense values at the stored entries
        k = self.sparse_dim()
        full = other.broadcast_to(self._size)
        at = full[tuple(self._idx[i] for i in range(k))]
        return self._new(self._idx, self._vals * at, self._size,
                         self._is_coalesced)

    __rmul__ = __mul__
    mul = __mul__

    def __truediv__(self, other):
        if not isinstance(other, (int, float)):
            raise NotImplementedError("sparse / tensor is not supported in "
                                      "dtorch: call .to_dense() first")
        return self * (1.0 / other)

    div = __truediv__

    def __neg__(self):
        return self * -1

    def sum(self, dim=None, keepdim=False, dtype=None):
        """All elements (a dense 0-d tensor), or over ``dim``: a sparse
        tensor while sparse dims remain, else dense (torch.sparse.sum)."""
        vals = self._vals if dtype is None else self._vals.to(dtype)
        if dim is None:
            return vals.sum()
        if keepdim:
            raise NotImplementedError("sparse sum with keepdim=True is not "
                                      "supported in dtorch")
        n, k = self.ndim, self.sparse_dim()
        dims = {d % n for d in ((dim,) if isinstance(dim, int) else dim)}
        dense_axes = tuple(d - k + 1 for d in sorted(dims) if d >= k)
        if dense_axes:
            vals = vals.sum(dense_axes)
        keep = [d for d in range(k) if d not in dims]
        size = [self._size[d] for d in range(n) if d not in dims]
        if not keep:
            return vals.sum(0)
        idx = self._idx[keep]
        return self._new(idx, vals, size).coalesce()

    # -------------------------------------------------------- printing --
    def __repr__(self):
        ind = repr(self._idx).replace("\n", "\n" + " " * 15)
        val = repr(self._vals).replace("\n", "\n" + " " * 7)
        return (f"tensor(indices={ind},\n       values={val},\n       "
                f"size={self._size}, nnz={self._nnz()}, "
                f"layout=dtorch.sparse_coo)")

    __str__ = __repr__


def _name(dt):
    return {"float32": "Float", "float64": "Double", "float16": "Half",
            "bfloat16": "BFloat16", "int64": "Long", "int32": "Int"}.get(
        dt.name, dt.name)


def coo_size(idx, vals, size):
    """Check indices (int64 tensor) against values and ``size`` as
    PyTorch's check_invariants=True does (always here: an index out of
    range would give a wrong answer, not an error) and return the size,
    inferred when None."""
    if idx.ndim != 2:
        raise ValueError(f"indices must be sparse_dim x nnz, but got: "
                         f"{list(idx.shape)}")
    if vals.ndim == 0:
        raise ValueError("values must be at least 1-D (nnz x dense dims)")
    if idx.shape[1] != vals.shape[0]:
        raise RuntimeError(
            f"indices and values must have same nnz, but got nnz from "
            f"indices: {idx.shape[1]}, nnz from values: {vals.shape[0]}")
    k = idx.shape[0]
    ia = idx.detach().cpu()._data
    if ia.size and ia.min() < 0:
        d = int(np.nonzero((ia < 0).any(1))[0][0])
        raise RuntimeError(f"found negative index {int(ia[d].min())} for "
                           f"dim {d}")
    if size is None:
        top = ia.max(1) if ia.size else np.full(k, -1)
        size = tuple(int(m) + 1 for m in top) + tuple(vals.shape[1:])
    size = tuple(int(n) for n in size)
    if len(size) != k + vals.ndim - 1:
        raise RuntimeError(
            f"number of dimensions must be sparse_dim ({k}) + dense_dim "
            f"({vals.ndim - 1}), but got {len(size)}")
    if tuple(vals.shape[1:]) != size[k:]:
        raise RuntimeError(
            f"values has incorrect size, expected "
            f"{[vals.shape[0]] + list(size[k:])}, got {list(vals.shape)}")
    for d in range(k):
        if ia.size and ia[d].max() >= size[d]:
            raise RuntimeError(
                f"size is inconsistent with indices: for dim {d}, size is "
                f"{size[d]} but found index {int(ia[d].max())}")
    return size


# ---------------------------------------- the same names on dense tensors --
# (Tensor binds these; SparseCOO's own come first for a sparse tensor)

def _needs_sparse(name, what="sparse coordinate tensor"):
    def method(self):
        raise RuntimeError(f"{name} expected {what} layout but got Strided")
    method.__name__ = name
    return method


coalesce = _needs_sparse("coalesce")
indices = _needs_sparse("indices")
values = _needs_sparse("values", "sparse tensor")
is_coalesced = _needs_sparse("is_coalesced")


def _sparse_only(name):
    def method(self):
        raise NotImplementedError(f"{name}() is only available for sparse "
                                  f"tensors (layout=torch.sparse_coo)")
    method.__name__ = name
    return method


_nnz = _sparse_only("_nnz")
_indices = _sparse_only("_indices")
_values = _sparse_only("_values")


def sparse_dim(self):
    return 0


def dense_dim(self):
    return self.ndim


# ================================================= the mixin =====

@methods("coalesce indices values is_coalesced _nnz _indices _values "
         "sparse_dim dense_dim")
class SparseMethods:
    """The sparse-only names on dense (strided) tensors: they raise."""
    __slots__ = ()

    # dense tensors are strided; SparseTensor is the COO layout
    is_sparse = is_quantized = is_mkldnn = is_xpu = False
    layout = strided
