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


# The solvers and factorisations dtorch.linalg calls, with CuPy 13's
# signatures. CuPy does not raise for a singular or indefinite input by
# default (cupyx.linalg's 'ignore' error mode): the result holds NaN/inf,
# as NumPy's would have where it raises here.
def _backed(name, *params):
    def fn(a, *args, **kwargs):
        if not isinstance(a, ndarray):
            raise TypeError(f"Unsupported type {type(a)}")
        dev = _cur()
        arrays = [a] + [x for x in args if isinstance(x, ndarray)]
        for x in arrays:
            _check_dev(x, dev)
        args = [x._a if isinstance(x, ndarray) else x for x in args]
        try:
            r = getattr(_np.linalg, name)(a._a, *args, **kwargs)
        except _np.linalg.LinAlgError:
            shape = a._a.shape if name != "solve" else args[0].shape
            r = _np.full(shape, _np.nan, a._a.dtype)
        if isinstance(r, tuple):
            return tuple(ndarray._new(_np.asarray(x), dev) for x in r)
        return ndarray._new(_np.asarray(r), dev)
    fn.__name__ = name
    return fn


inv = _backed("inv")
solve = _backed("solve")
cholesky = _backed("cholesky")
det = _backed("det")
slogdet = _backed("slogdet")


def eigh(a, UPLO="L"):
    return _backed("eigh")(a, UPLO=UPLO)


def svd(a, full_matrices=True, compute_uv=True):
    return _backed("svd")(a, full_matrices=full_matrices,
                          compute_uv=compute_uv)
