"""``dtorch.sparse``: PyTorch's ``torch.sparse`` for COO tensors (the
tensor itself is ``dtorch.tensor.SparseTensor``, its methods in
``dtorch/_tensor_methods/sparse.py``)::

    adj = dtorch.sparse_coo_tensor(edges, weights, (n, n))
    h = dtorch.sparse.mm(adj, x @ w)        # gradients to x, w (and weights)
"""
from .._tensor_methods.sparse import coo_size, sparse_coo as _coo
from ..tensor import SparseTensor, Tensor, tensor

__all__ = ["mm", "sum", "addmm", "spmm", "sparse_coo_tensor"]


def sparse_coo_tensor(indices, values, size=None, *, dtype=None,
                      device=None, requires_grad=False,
                      check_invariants=None, is_coalesced=None):
    """A sparse COO tensor of ``size`` holding ``values[i]`` at
    ``indices[:, i]`` (repeats are summed by ``coalesce`` / ``to_dense``).
    Tensor values keep their autograd graph."""
    if isinstance(values, Tensor):
        vals = values.to(device=device, dtype=dtype) \
            if dtype is not None or device is not None else values
    else:
        vals = tensor(values, dtype=dtype, device=device)
    idx = indices if isinstance(indices, Tensor) else tensor(indices)
    if idx.dtype.is_floating_point or idx.dtype.name == "bool":
        raise RuntimeError(f"indices must be an int64 tensor, got "
                           f"{idx.dtype}")
    idx = idx.to(device=vals.device).long()
    size = coo_size(idx, vals, size)
    if requires_grad:
        vals.requires_grad_(True)
    return SparseTensor._new(idx, vals, size, bool(is_coalesced))


def _check_sparse(t, name):
    if not getattr(t, "is_sparse", False):
        raise RuntimeError(f"{name}: expected a sparse COO tensor as the "
                           f"first argument, got layout dtorch.strided")


def mm(mat1, mat2):
    """sparse (m x k) @ dense (k x n) -> dense, differentiable in the
    dense matrix and in the sparse values."""
    _check_sparse(mat1, "sparse.mm")
    return mat1.mm(mat2)


spmm = mm


def addmm(mat, mat1, mat2, *, beta=1.0, alpha=1.0):
    """beta * mat + alpha * (mat1 @ mat2) with sparse mat1."""
    _check_sparse(mat1, "sparse.addmm")
    return mat * beta + mat1.mm(mat2) * alpha


def sum(input, dim=None, dtype=None):
    """All elements (dense 0-d) or over ``dim`` (sparse while sparse dims
    remain), as ``torch.sparse.sum``."""
    _check_sparse(input, "sparse.sum")
    return input.sum(dim, dtype=dtype)


del _coo
