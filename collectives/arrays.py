"""Reduce ops and the array helpers every backend shares: which module owns
an array (numpy or cupy; collectives cannot use dtorch._backend, which sits
above it), buffer checks, descriptions for error messages, reductions in
rank order."""
from __future__ import annotations
import sys
from enum import Enum
from types import ModuleType
from typing import Any, Union

import numpy as np

# A NumPy or CuPy ndarray (CuPy is optional, so it has no static type here)
Array = Any
# a per-rank buffer: an [n, ...] array or a list of n arrays
PerRank = Union[Array, list]


class ReduceOp(str, Enum):
    """Reductions; plain strings ('sum', 'avg', ...) are accepted too."""
    SUM = 'sum'
    AVG = 'avg'
    MAX = 'max'
    MIN = 'min'
    PRODUCT = 'product'

    def __str__(self):
        return self.value


# str-Enum members hash like their values, so one dict serves both spellings
_OPS = {op.value: op for op in ReduceOp}
_OPS.update({op: op for op in ReduceOp})


def reduce_op(op: str | ReduceOp) -> ReduceOp:
    """Normalise 'sum' / ReduceOp.SUM / ... to a ReduceOp, or raise."""
    try:
        return _OPS[op]
    except (KeyError, TypeError):
        names = ', '.join(repr(o.value) for o in ReduceOp)
        raise ValueError(f"unknown reduce op {op!r}; expected one of "
                         f"{names}") from None


def get_array_module(arr: Any) -> ModuleType:
    """numpy or cupy, whichever owns `arr` (cupy only if already loaded)."""
    if type(arr) is np.ndarray:
        return np
    cp = sys.modules.get('cupy')
    if cp is not None and isinstance(arr, cp.ndarray):
        return cp
    return np


def is_cupy(arr):
    return type(arr) is not np.ndarray and hasattr(
        arr, '__cuda_array_interface__')


def describe(arr):
    """'[2, 3] float32' for an array; '' for None; first item of a list."""
    if isinstance(arr, (list, tuple)):
        if not arr:
            return '[] (empty list)'
        return f"{len(arr)} x {describe(arr[0])}"
    if arr is None or not hasattr(arr, 'shape'):
        return ''
    return f"{list(arr.shape)} {arr.dtype}"


def row(buf, i):
    """Writable view of entry i of a per-rank buffer: a list's item, or
    ``buf[i, ...]`` of an array (plain ``buf[i]`` of a 1-D array is a
    NumPy scalar: assigning into it or reshaping it writes nothing)."""
    if isinstance(buf, (list, tuple)):
        return buf[i]
    return buf[i, ...]


def check_buffer(arr, what='arr'):
    """Raise TypeError / ValueError unless arr is a contiguous array."""
    if not isinstance(arr, np.ndarray) and not is_cupy(arr):
        raise TypeError(f"{what} must be a NumPy or CuPy array, "
                        f"got {type(arr).__name__}")
    if not arr.flags.c_contiguous:
        raise ValueError(
            f"{what} must be C-contiguous (collectives work in place on "
            f"one buffer); got a non-contiguous {describe(arr)} view with "
            f"strides {arr.strides}: pass a contiguous copy")


# the elementwise function of each op (avg sums, then divides)
UFUNC_NAMES = {ReduceOp.SUM: 'add', ReduceOp.AVG: 'add',
                ReduceOp.MAX: 'maximum', ReduceOp.MIN: 'minimum',
                ReduceOp.PRODUCT: 'multiply'}


def ufunc(op, xp=np):
    """xp's binary ufunc for a ReduceOp (np.add for SUM and AVG, ...)."""
    return getattr(xp, UFUNC_NAMES[op])


def reduce_into(out, vals, op, size):
    """out <- op(vals[0], vals[1], ...) in list order (so every rank that
    reduces the same list gets bitwise the same result)."""
    op = reduce_op(op)
    out[...] = vals[0]
    f = ufunc(op, get_array_module(out))
    for v in vals[1:]:
        f(out, v, out=out)
    if op is ReduceOp.AVG:
        divide_avg(out, size)


def divide_avg(arr, size):
    if arr.dtype.kind not in 'fc':
        raise TypeError(f"reduce op 'avg' needs a floating dtype, got "
                        f"{arr.dtype}; use 'sum' and divide yourself")
    arr /= size
