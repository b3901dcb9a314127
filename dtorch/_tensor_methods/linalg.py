"""Tensor methods of linear algebra: trace, outer, mv, addmm/baddbmm/addbmm/addmv.

Each function takes the tensor first: it is a Tensor method (the class body
of dtorch/tensor.py binds it) and, where PyTorch has one, ``dtorch.<name>``.
"""
from .. import _backend as B
from ..autograd import function as _function


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
    if self.ndim != 2 or vec.ndim != 1:
        raise RuntimeError(f"vector + matrix @ vector expected, got "
                           f"{self.ndim}, {vec.ndim}")
    return self @ vec


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
