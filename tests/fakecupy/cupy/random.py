"""cupy.random of the stand-in: one RandomState per device (as CuPy keeps
them), NumPy's PCG64 underneath, CuPy's signatures (``dtype=`` arguments,
float32/float64 only where cuRAND has only those)."""
import numpy as _np

from . import ndarray, _check_dev, _cur
from .cuda import Device


def _float_dtype(dtype):
    d = _np.dtype(dtype)
    if d.char not in "fd":
        raise TypeError(f"cupy.random only supports float32 and float64, "
                        f"got {d}")
    return d


def _param(x, dev):
    if isinstance(x, ndarray):
        _check_dev(x, dev)
        return x._a
    if isinstance(x, _np.ndarray):
        raise TypeError(f"Unsupported type {type(x)}")
    return x


class RandomState:
    def __init__(self, seed=None, method=None):
        self._dev = _cur()
        self.seed(seed)

    def seed(self, seed=None):
        if isinstance(seed, _np.ndarray):
            seed = hash(seed.tobytes())   # CuPy hashes array seeds
        self._g = _np.random.Generator(_np.random.PCG64(
            None if seed is None else int(seed) & 0xFFFF_FFFF_FFFF_FFFF))

    def _out(self, a, dtype):
        dev = _cur()
        if dev != self._dev:
            raise ValueError(
                f"RandomState of device {self._dev} used while device {dev} "
                f"is current")
        return ndarray._new(_np.asarray(a).astype(dtype, copy=False), dev)

    def random_sample(self, size=None, dtype=float):
        d = _float_dtype(dtype)
        return self._out(self._g.random(size, dtype=_np.float64), d)

    random = random_sample

    def rand(self, *size, dtype=float):
        return self.random_sample(size, dtype)

    def randn(self, *size, dtype=float):
        return self.standard_normal(size, dtype)

    def standard_normal(self, size=None, dtype=float):
        d = _float_dtype(dtype)
        return self._out(self._g.standard_normal(size), d)

    def normal(self, loc=0.0, scale=1.0, size=None, dtype=float):
        d = _float_dtype(dtype)
        dev = _cur()
        return self._out(self._g.normal(_param(loc, dev), _param(scale, dev),
                                        size), d)

    def uniform(self, low=0.0, high=1.0, size=None, dtype=float):
        d = _float_dtype(dtype)
        dev = _cur()
        return self._out(self._g.uniform(_param(low, dev),
                                         _param(high, dev), size), d)

    def exponential(self, scale=1.0, size=None, dtype=float):
        d = _float_dtype(dtype)
        return self._out(self._g.exponential(_param(scale, _cur()), size), d)

    def lognormal(self, mean=0.0, sigma=1.0, size=None, dtype=float):
        d = _float_dtype(dtype)
        dev = _cur()
        return self._out(self._g.lognormal(_param(mean, dev),
                                           _param(sigma, dev), size), d)

    def standard_cauchy(self, size=None, dtype=float):
        d = _float_dtype(dtype)
        return self._out(self._g.standard_cauchy(size), d)

    def geometric(self, p, size=None, dtype=int):
        return self._out(self._g.geometric(_param(p, _cur()), size),
                         _np.dtype(dtype))

    def poisson(self, lam=1.0, size=None, dtype=int):
        return self._out(self._g.poisson(_param(lam, _cur()), size),
                         _np.dtype(dtype))

    def randint(self, low, high=None, size=None, dtype=int):
        if high is None:
            low, high = 0, low
        return self._out(self._g.integers(low, high, size), _np.dtype(dtype))

    def permutation(self, a):
        if isinstance(a, int):
            return self._out(self._g.permutation(a), _np.int64)
        _check_dev(a, _cur())
        return self._out(self._g.permutation(a._a), a.dtype)

    def shuffle(self, a):
        _check_dev(a, _cur())
        self._g.shuffle(a._a)

    def choice(self, a, size=None, replace=True, p=None):
        dev = _cur()
        r = self._g.choice(_param(a, dev), size, replace, _param(p, dev))
        return self._out(r, _np.asarray(r).dtype)


_states = {}


def get_random_state():
    dev = Device().id
    rs = _states.get(dev)
    if rs is None:
        rs = _states[dev] = RandomState()
    return rs


def set_random_state(rs):
    _states[Device().id] = rs


def reset_states():
    _states.clear()


def seed(seed=None):
    get_random_state().seed(seed)


def _module_fn(name):
    def f(*args, **kw):
        return getattr(get_random_state(), name)(*args, **kw)
    f.__name__ = name
    return f


for _n in ("random_sample", "random", "rand", "randn", "standard_normal",
           "normal", "uniform", "randint", "permutation", "shuffle",
           "choice", "exponential", "lognormal", "standard_cauchy",
           "geometric", "poisson"):
    globals()[_n] = _module_fn(_n)
ranf = sample = random_sample
