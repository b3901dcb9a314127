"""Helpers shared by the Tensor method families (and dtorch/tensor.py)."""
import numbers

import numpy as np

from .. import _backend as B
from ..autograd import function as _function


# Tensor is known here through autograd's TensorBase protocol: this module
# sits below dtorch/tensor.py (whose class body binds these functions), and
# new tensors are made by the _wrap of the tensor at hand.
_TensorBase = _function.TensorBase
_SCALARS = (int, float, bool)


def _arr(x):
    return x._data if isinstance(x, _TensorBase) else x



def _dims(args):
    """Accept f(1, 2) and f((1, 2)) for shape-like varargs."""
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        return tuple(args[0])
    return tuple(args)


def _operand(x, like):
    """A binary op's other operand: Tensor, Python scalar, or array-like."""
    if isinstance(x, _TensorBase) or type(x) in _SCALARS:
        return x
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, numbers.Number):
        return float(x) if isinstance(x, numbers.Real) else x
    xp = like._xp()
    return like._wrap(xp.asarray(x))


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
    self._bump_version()
    return self
