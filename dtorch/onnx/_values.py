"""The arguments a converter of _ops.py receives (``Value``: a dynamic value
of the graph; ``Const``: a constant tensor) and the dtype map, shared by
the tracer (_export.py) and the converters."""
import numpy as np


def _to_numpy(a):
    if isinstance(a, np.ndarray):
        return a
    if hasattr(a, "get"):          # CuPy
        return a.get()
    return np.asarray(a)


class Value:
    """A dynamic value of the ONNX graph: its name and traced shape/dtype."""
    __slots__ = ("name", "shape", "dtype")

    def __init__(self, name, shape, dtype):
        self.name, self.shape, self.dtype = name, tuple(shape), dtype


class Const:
    """A constant tensor argument: its array (and state_dict name)."""
    __slots__ = ("array", "pname")

    def __init__(self, array, pname):
        self.array, self.pname = array, pname

    @property
    def shape(self):
        return tuple(self.array.shape)

    @property
    def dtype(self):
        return np.dtype(self.array.dtype)

    def numpy(self):
        return _to_numpy(self.array)


def _onnx_type(onnx, dtype):
    return onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
