"""Tensor methods that scan along a dimension: cumprod, cummax/cummin,
logcumsumexp, diff.

Each function takes the tensor first: it is a Tensor method (the class body
of dtorch/tensor.py binds it) and, where PyTorch has one, ``dtorch.<name>``.
"""
from .. import _backend as B
from .. import ops as P
from ..ops import selection as S
from ..return_types import MinMax
from ._common import _TensorBase


# ============================================================ scans =========

def cumprod(self, dim, dtype=None):
    t = self if dtype is None else self.to(dtype)
    return S.Cumprod.apply(t, dim=dim)


def _cumext(self, dim, is_min):
    ind = S.cum_extreme_indices(self._data, dim, is_min)
    vals = S.Gather.apply(self, idx=ind, dim=dim)
    return MinMax(vals, self._wrap(ind))


@B.on_own_device
def cummax(self, dim):
    return _cumext(self, dim, False)


@B.on_own_device
def cummin(self, dim):
    return _cumext(self, dim, True)


def logcumsumexp(self, dim):
    # one node with PyTorch's scan and backward (dtorch/ops/selection.py)
    return P.LogCumSumExp.apply(self, dim=S.axis_of(dim, self.ndim))


def diff(self, n=1, dim=-1, prepend=None, append=None):
    T = _TensorBase
    x = self
    d = S.axis_of(dim, self.ndim)
    if prepend is not None or append is not None:
        parts = [p if isinstance(p, T) else self._wrap(self._xp().asarray(p))
                 for p in (prepend, self, append) if p is not None]
        x = P.Cat.apply(*parts, dim=d)
    for _ in range(n):
        m = x.shape[d]
        hi = x.narrow(d, 1, m - 1) if m else x
        lo = x.narrow(d, 0, m - 1) if m else x
        x = hi.logical_xor(lo) if x.dtype is B.bool_ else hi - lo
    return x
