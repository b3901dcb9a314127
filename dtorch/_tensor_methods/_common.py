"""Helpers shared by the Tensor method families (and dtorch/tensor.py)."""
import functools
import numbers
import sys

import numpy as np

from .. import _backend as B
from ..autograd import function as _function


# Tensor is known here through autograd's TensorBase protocol: this module
# sits below dtorch/tensor.py (whose class inherits the families' mixins), and
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


def _ranked_matmul(a, b, ranks, message):
    """``a @ b`` for the matmul variants whose operands must have the
    ``ranks`` (mm, bmm, dot, mv); else PyTorch's RuntimeError: ``message``
    formatted with the two ranks."""
    if (a.ndim, b.ndim) != ranks:
        raise RuntimeError(message.format(a.ndim, b.ndim))
    return a @ b


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


def methods(names):
    """Class decorator of a family's mixin: bind the module's functions
    ``names`` (space-separated; each takes the tensor first and is also
    ``dtorch.<name>`` where PyTorch has one) as methods of the class.
    A name the class body defines too is an error, not a silent override."""
    def bind(cls):
        ns = vars(sys.modules[cls.__module__])
        for name in names.split():
            if name in vars(cls):
                raise TypeError(f"{cls.__name__}.{name} is defined twice")
            setattr(cls, name, ns[name])
        return cls
    return bind


def numpy_aliases(fn):
    """``fn`` also taking NumPy's ``axis=`` for ``dim=`` and ``keepdims=``
    for ``keepdim=``, as PyTorch's argument parser does wherever a
    function has a dim (keepdim) argument. A call without keywords costs
    one extra Python frame (~0.1 us)."""
    @functools.wraps(fn)
    def aliased(*args, **kwargs):
        if kwargs:
            if "axis" in kwargs:
                if "dim" in kwargs:
                    raise TypeError(f"{fn.__name__}() got both dim and "
                                    f"axis (an alias of dim)")
                kwargs["dim"] = kwargs.pop("axis")
            if "keepdims" in kwargs:
                if "keepdim" in kwargs:
                    raise TypeError(f"{fn.__name__}() got both keepdim and "
                                    f"keepdims (an alias of keepdim)")
                kwargs["keepdim"] = kwargs.pop("keepdims")
        return fn(*args, **kwargs)
    return aliased


def _infer_dtype(a):
    """PyTorch's dtype of data given as Python numbers / nested lists."""
    if a.dtype.kind == "f" and a.dtype != np.float64:
        return a.dtype
    if a.dtype.kind == "f":
        return B.get_default_dtype().np
    if a.dtype.kind in "iu":
        return np.dtype(np.int64)
    if a.dtype.kind == "b":
        return np.dtype(np.bool_)
    raise TypeError(f"Could not infer dtype of {a.dtype}")


def _leaf_dtype(x):
    """PyTorch's dtype of one leaf of nested data: a tensor or array keeps
    its own, Python bools/ints/floats give bool/int64/the default float."""
    if isinstance(x, _TensorBase):
        return x.dtype
    # NumPy scalars first: np.float64 is a subclass of float
    if isinstance(x, (np.ndarray, np.generic)) or B.is_cupy_array(x):
        return B.from_np(x.dtype)
    if isinstance(x, bool):
        return B.bool_
    if isinstance(x, int):
        return B.int64
    if isinstance(x, float):
        return B.get_default_dtype()
    raise TypeError(f"Could not infer dtype of {type(x).__name__}")


def _seq_dtype(data):
    """The dtype PyTorch infers for nested lists/tuples: the promotion of
    every leaf's dtype (so [[1., 2.]] is float32, [t64, 2.] float64)."""
    if isinstance(data, (list, tuple)):
        dt = None
        for d in data:
            e = _seq_dtype(d)
            if e is not None:
                dt = e if dt is None else B.promote_types(dt, e)
        return dt
    return _leaf_dtype(data)


def _to_array(data):
    """Array from data: nested lists may hold 0-d tensors."""
    if isinstance(data, _TensorBase):
        return data._data
    if isinstance(data, (list, tuple)) and data and any(
            isinstance(d, (_TensorBase, list, tuple)) for d in data):
        parts = [_to_array(d) for d in data]
        if any(B.is_cupy_array(p) for p in parts):
            cp = B.check_cuda_available()
            return cp.stack([cp.asarray(p) for p in parts])
        return np.array([np.asarray(p) for p in parts])
    return data
