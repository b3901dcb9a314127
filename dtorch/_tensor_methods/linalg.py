"""Tensor methods of linear algebra: trace, outer, mv, addmm/baddbmm/addbmm/addmv,
and torch.linalg's functions under their Tensor names (inverse, det, svd...).

Each function takes the tensor first: it is a Tensor method (this family's
mixin, at the end, binds it; Tensor inherits the mixin) and, where PyTorch
has one, ``dtorch.<name>``. Methods that are not functions are written in
the mixin's body (the rule: dtorch/tensor.py's docstring).
"""
from .. import _backend as B
from ..autograd import function as _function
from ._common import _ranked_matmul, methods


@_function.autocast_op({"cpu": "fp32"})      # PyTorch's CPU fp32 list
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


@_function.autocast_op("none")      # not lowered (PyTorch's lists)
def mv(self, vec):
    return _ranked_matmul(self, vec, (2, 1), "vector + matrix @ vector "
                          "expected, got {}, {}")


def addmm(self, mat1, mat2, beta=1, alpha=1):
    prod = mat1.mm(mat2)
    return _scaled(_autocast_like(self, prod), beta) + _scaled(prod, alpha)


def baddbmm(self, batch1, batch2, beta=1, alpha=1):
    prod = batch1.bmm(batch2)
    return _scaled(_autocast_like(self, prod), beta) + _scaled(prod, alpha)


def _autocast_like(t, prod):
    # under autocast addmm/baddbmm run whole in the low dtype (PyTorch's
    # lower-precision list): the added input follows the autocast product
    if _function._autocast is not None and t.dtype is B.float32 and \
            prod.dtype in (B.bfloat16, B.float16):
        return t.to(prod.dtype)
    return t


def addbmm(self, batch1, batch2, beta=1, alpha=1):
    return _scaled(self, beta) + _scaled(batch1.bmm(batch2).sum(0), alpha)


def addmv(self, mat, vec, beta=1, alpha=1):
    return _scaled(self, beta) + _scaled(mat.mv(vec), alpha)


def _scaled(t, c):
    # beta=0 ignores the input entirely (NaN included), as PyTorch does
    if c == 0:
        return t.detach() * 0 if not t.requires_grad else t * 0
    return t if c == 1 else t * c


# ------------------------------------------------- torch.linalg as methods --
# Tensor.inverse / det / ... and torch.inverse / det / ...: the linalg
# functions under their older names (torch.svd returns V, not Vh)
from .. import linalg as _la  # noqa: E402
from .. import return_types as _rt  # noqa: E402


def inverse(self):
    return _la.inv(self)


def det(self):
    return _la.det(self)


def logdet(self):
    return _la.logdet(self)


def slogdet(self):
    return _rt.slogdet(*_la.slogdet(self))


def cholesky(self, upper=False):
    return _la.cholesky(self, upper=upper)


@_la._fp32_on_cpu
def cholesky_solve(self, input2, upper=False):
    """X with A X = self, A = L L^T given its factor ``input2``: solve()
    of the product, whose gradient in the factor is PyTorch's (the whole
    matrix, not only its triangle)."""
    L = input2.mT if upper else input2
    return _la.solve(L @ L.mT, self)


@_la._fp32_on_cpu
def cholesky_inverse(self, upper=False):
    L = self.mT if upper else self
    eye = _la.eye_like(L, L.shape[-1])
    return cholesky_solve(eye, L)


def qr(self, some=True):
    return _rt.qr(*_la.qr(self, "reduced" if some else "complete"))


def svd(self, some=True, compute_uv=True):
    U, S, Vh = _la.svd(self, full_matrices=not some)
    if not compute_uv:
        # PyTorch returns zero-filled U and V then
        return _rt.svd(U.detach() * 0, S, Vh.mT.detach() * 0)
    return _rt.svd(U, S, Vh.mT)


@_la._fp32_on_cpu
def pinverse(self, rcond=1e-15):
    return _la.pinv(self, rtol=rcond)


def cross(self, other, dim=None):
    """linalg.cross along ``dim``; None is torch.cross's old default, the
    first dim of length 3."""
    if dim is None:
        dim = next((i for i, n in enumerate(self.shape) if n == 3), -1)
    return _la.cross(self, other, dim=dim)


def matrix_power(self, n):
    return _la.matrix_power(self, n)


def matrix_exp(self):
    return _la.matrix_exp(self)


# ================================================= the mixin =====

@methods("trace outer mv addmm baddbmm addbmm addmv inverse det logdet "
         "slogdet cholesky cholesky_solve cholesky_inverse qr svd pinverse "
         "matrix_power matrix_exp cross")
class LinalgMethods:
    """Tensor's matrix products and torch.linalg's older method names."""
    __slots__ = ()
