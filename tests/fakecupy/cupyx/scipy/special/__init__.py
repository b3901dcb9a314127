"""cupyx.scipy.special.erf and erfinv (ufuncs in CuPy), backed by math.erf
and SciPy's erfinv."""
import math

import numpy as np

import cupy
from cupy import _ufunc

_erf = np.frompyfunc(math.erf, 1, 1)


def _erf_np(x, out=None, **kw):
    r = _erf(x).astype(np.result_type(x.dtype, np.float32)
                       if x.dtype.kind != "f" else x.dtype)
    if out is not None:
        out[...] = r
        return out
    return r


_erf_np.__name__ = "erf"
_erf_np.nin, _erf_np.nout, _erf_np.nargs = 1, 1, 2
erf = _ufunc(_erf_np)


def _erfinv_np(x, out=None, **kw):
    from scipy.special import erfinv as e
    r = e(x)
    if out is not None:
        out[...] = r
        return out
    return r


_erfinv_np.__name__ = "erfinv"
_erfinv_np.nin, _erfinv_np.nout, _erfinv_np.nargs = 1, 1, 2
erfinv = _ufunc(_erfinv_np)
del cupy
