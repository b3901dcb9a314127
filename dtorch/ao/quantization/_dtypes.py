"""Quantized dtype names (``dtorch.qint8``, ``dtorch.quint8``,
``dtorch.qint32``). They name a quantization scheme for APIs such as
``quantize_dynamic(..., dtype=dtorch.qint8)``; tensors are not created with
them (quantized modules store plain int8 arrays plus float32 scales)."""
import numpy as np

from ... import _backend as B


class _QDtype(B.dtype):
    __slots__ = ()

    def __reduce__(self):
        return (_by_name, (self.name,))


def _by_name(name):
    return {"qint8": qint8, "quint8": quint8, "qint32": qint32}[name]


# integer kind (1); not in _backend's tables, so never an array's dtype
qint8 = _QDtype("qint8", np.dtype(np.int8), 1, 1)
quint8 = _QDtype("quint8", np.dtype(np.uint8), 1, 0)
qint32 = _QDtype("qint32", np.dtype(np.int32), 1, 3)
