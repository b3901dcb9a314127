"""Tensor's conversions: dtype shorthands (``float()``, ``long()``,
``type()``, ...) and Python values (``item``, ``tolist``, ``numpy``,
``bool()``/``int()``/``float()``/``index()``).
"""
from .. import _backend as B
from ..autograd import _capture


# PyTorch's legacy typed-tensor names for t.type('torch.LongTensor')
# (dtorch/_legacy.py builds its classes from this table)
_LEGACY_DTYPES = {
    "FloatTensor": B.float32, "DoubleTensor": B.float64,
    "HalfTensor": B.float16, "BFloat16Tensor": B.bfloat16,
    "LongTensor": B.int64, "IntTensor": B.int32, "ShortTensor": B.int16,
    "ByteTensor": B.uint8, "CharTensor": B.int8, "BoolTensor": B.bool_}


def _cast(dtype):
    """The method ``t.<name>()``, which is ``t.to(dtype)``."""
    def cast(self):
        return self.to(dtype)
    cast.__name__ = cast.__qualname__ = {
        "float32": "float", "float64": "double", "float16": "half",
        "int64": "long", "int32": "int", "bool": "bool"}.get(dtype.name,
                                                             dtype.name)
    return cast


class ConvertMethods:
    """Tensor's conversions to other dtypes and to Python values."""
    __slots__ = ()

    def item(self):
        if self._data.size != 1:
            raise RuntimeError(
                f"a Tensor with {self._data.size} elements cannot be "
                f"converted to Scalar")
        if _capture.active is not None:    # a graph break
            _capture.active.host_read(self, "Tensor.item()")
        if B._pending_checks:
            B.flush_checks()    # a host sync: deferred device checks raise
        return self._data.reshape(()).item()

    def tolist(self):
        if _capture.active is not None:
            _capture.active.host_read(self, "Tensor.tolist()")
        if B.is_cupy_array(self._data):
            B.flush_checks()
            return self._data.get().tolist()
        return self._data.tolist()

    def numpy(self, force=False):
        if self.requires_grad and not force:
            raise RuntimeError(
                "Can't call numpy() on Tensor that requires grad. Use "
                "tensor.detach().numpy() instead.")
        if _capture.active is not None:
            _capture.active.host_read(self, "Tensor.numpy()")
        if B.is_cupy_array(self._data):
            if not force:
                raise TypeError(
                    f"can't convert {self.device} device type tensor to "
                    f"numpy. Use Tensor.cpu() to copy the tensor to host "
                    f"memory first.")
            B.flush_checks()
            return self._data.get()
        return self._data

    def __array__(self, dtype=None, copy=None):
        a = self.detach().cpu()._data
        return a if dtype is None else a.astype(dtype)

    def type(self, dtype=None):
        if dtype is None:
            return {"float32": "dtorch.FloatTensor",
                    "float64": "dtorch.DoubleTensor",
                    "float16": "dtorch.HalfTensor",
                    "int64": "dtorch.LongTensor",
                    "int32": "dtorch.IntTensor",
                    "bool": "dtorch.BoolTensor"}.get(self.dtype.name,
                                                     str(self.dtype))
        if isinstance(dtype, str) and dtype.endswith("Tensor"):
            # t.type('torch.LongTensor') (dtorch/_legacy.py)
            dtype = _LEGACY_DTYPES[dtype.rsplit(".", 1)[-1]]
        return self.to(getattr(dtype, "_legacy_dtype", dtype))

    float, double, half = _cast(B.float32), _cast(B.float64), \
        _cast(B.float16)
    bfloat16, long, int = _cast(B.bfloat16), _cast(B.int64), _cast(B.int32)
    bool = _cast(B.bool_)

    def type_as(self, other):
        return self.to(other.dtype)

    def __bool__(self):
        if self._data.size != 1:
            raise RuntimeError(
                "Boolean value of Tensor with more than one value is "
                "ambiguous")
        if _capture.active is not None:
            _capture.active.host_read(self, "bool(Tensor)")
        return bool(self._data.reshape(()))

    def __float__(self):
        return float(self.item())

    def __int__(self):
        return int(self.item())

    def __index__(self):
        if self.dtype.is_floating_point or self.numel() != 1:
            raise TypeError("only integer tensors of a single element can be "
                            "converted to an index")
        return int(self.item())
