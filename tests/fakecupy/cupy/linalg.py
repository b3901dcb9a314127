"""cupy.linalg of the stand-in: only what dtorch uses (qr, as CuPy 13's
``cupy.linalg.qr(a, mode='reduced')``), backed by NumPy on the array's
(current) device."""
import numpy as _np

from . import ndarray, _check_dev, _cur


def qr(a, mode="reduced"):
    if not isinstance(a, ndarray):
        raise TypeError(f"Unsupported type {type(a)}")
    if mode not in ("reduced", "complete", "r", "raw"):
        raise ValueError(f"Unrecognized mode '{mode}'")
    dev = _cur()
    _check_dev(a, dev)
    r = _np.linalg.qr(a._a, mode=mode)
    if isinstance(r, tuple):
        return tuple(ndarray._new(_np.asarray(x), dev) for x in r)
    return ndarray._new(_np.asarray(r), dev)
