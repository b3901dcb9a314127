"""Helpers shared by the Tensor method families."""
import numpy as np

from .. import _backend as B
from ..autograd import function as _function


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
