"""Tensor methods that sample: multinomial, bernoulli, the in-place
exponential_/geometric_/log_normal_/cauchy_.

Each function takes the tensor first: it is a Tensor method (this family's
mixin, at the end, binds it; Tensor inherits the mixin) and, where PyTorch
has one, ``dtorch.<name>``. Methods that are not functions are written in
the mixin's body (the rule: dtorch/tensor.py's docstring).
"""
import numpy as np

from .. import _backend as B
from ..random import draw, draw_into
from ._common import _TensorBase, _arr, methods


# ============================================================ sampling ======

@B.on_own_device
def multinomial(self, num_samples, replacement=False, generator=None):
    """Category indices drawn from each row's (unnormalised) weights, on
    self's device (checks of the weights deferred there, no host sync)."""
    if self.ndim not in (1, 2):
        raise RuntimeError("prob_dist must be 1 or 2 dim")
    if not self.dtype.is_floating_point:
        raise RuntimeError("multinomial only supports floating-point dtypes "
                           "for input")
    xp = self._xp()
    p = self._data.astype(np.float64).reshape(-1, self.shape[-1])
    k = p.shape[1]
    if num_samples <= 0:
        raise RuntimeError("cannot sample n_sample <= 0 samples")
    B.check_or_defer(~(xp.isfinite(p).all() & (p >= 0).all()),
                     lambda: RuntimeError(
                         "probability tensor contains either `inf`, `nan` "
                         "or element < 0"))
    tot = p.sum(1)
    B.check_or_defer((tot <= 0).any(), lambda: RuntimeError(
        "invalid multinomial distribution (sum of probabilities <= 0)"))
    if not replacement and num_samples > k:
        raise RuntimeError("cannot sample n_sample > prob_dist.size(-1) "
                           "samples without replacement")
    rows = p.shape[0]
    dev = self.device
    if replacement:
        # inverse CDF, all rows at once: row r's CDF lives in [r, r + 1]
        cdf = xp.cumsum(p, 1) / tot[:, None]
        cdf[:, -1] = 1.0
        off = xp.arange(rows)[:, None]
        u = draw("random", size=(rows, num_samples), device=dev,
                 generator=generator, dtype=np.float64)
        idx = xp.searchsorted((cdf + off).reshape(-1), (u + off).reshape(-1),
                              side="right").reshape(rows, num_samples)
        idx = xp.minimum(idx - off * k, k - 1)
        # a zero-weight category can be hit only at a CDF plateau edge
    else:
        B.check_or_defer(((p > 0).sum(1) < num_samples).any(),
                         lambda: RuntimeError(
                             "invalid multinomial distribution (with "
                             "replacement=False, not enough non-negative "
                             "category to sample)"))
        # exponential race (Gumbel top-k): the first num_samples arrivals
        # of Exp(p_i) clocks are a draw without replacement
        e = draw("exponential", size=p.shape, device=dev,
                 generator=generator, dtype=np.float64)
        with np.errstate(divide="ignore"):
            keys = e / p
        idx = xp.argsort(keys, axis=1, kind="stable")[:, :num_samples]
    idx = idx.astype(np.int64)
    if self.ndim == 1:
        idx = idx.reshape(num_samples)
    return self._wrap(idx)


@B.on_own_device
def bernoulli(self, p=None, generator=None):
    # drawn on self's device; the range check is deferred there (no sync)
    xp = self._xp()
    prob = self._data if p is None else (
        p._data if isinstance(p, _TensorBase) else p)
    prob = self.device.send(xp.asarray(prob)) if not isinstance(
        prob, (int, float)) else prob
    bad = ~((xp.asarray(prob) >= 0) & (xp.asarray(prob) <= 1)).all()
    B.check_or_defer(bad, lambda: RuntimeError(
        "Expected p_in >= 0 && p_in <= 1 to be true, but got false."))
    vals = draw("random", size=self.shape, device=self.device,
                generator=generator) < prob
    dt = self._data.dtype if self.dtype.is_floating_point else \
        B.get_default_dtype().np
    return self._wrap(vals.astype(dt))


@B.on_own_device
def _fill_random(self, method, *args, generator=None, scale=None,
                 dtype=None, check=True):
    """Draw ``method(*args)`` into self in place (then ``scale[0] +
    scale[1] * v``), on self's device by its generator, not on the host;
    ``dtype`` is the dtype drawn in (None: the method's own)."""
    if check:
        self._check_inplace()
    draw_into(self._data, method, *args, device=self.device,
              generator=generator, dtype=dtype, then=None if scale is None
              else (lambda v: scale[0] + scale[1] * v))
    self._bump_version()
    return self._overwritten()


def exponential_(self, lambd=1.0, generator=None):
    return _fill_random(self, "exponential", 1.0 / lambd,
                        generator=generator)


def geometric_(self, p, generator=None):
    return _fill_random(self, "geometric", p, generator=generator)


def log_normal_(self, mean=1.0, std=2.0, generator=None):
    return _fill_random(self, "lognormal", mean, std, generator=generator)


def cauchy_(self, median=0.0, sigma=1.0, generator=None):
    return _fill_random(self, "standard_cauchy", generator=generator,
                        scale=(median, sigma))


# random_()'s bound by dtype: the integers a float holds exactly (PyTorch)
_RANDOM_HIGH = {"float32": 2 ** 24 + 1, "float64": 2 ** 53 + 1,
                "float16": 2 ** 11 + 1, "bfloat16": 2 ** 8 + 1, "bool": 2,
                "uint8": 2 ** 8, "int8": 2 ** 7, "int16": 2 ** 15,
                "int32": 2 ** 31, "int64": 2 ** 63 - 1}


# ================================================= the mixin =====

@methods("multinomial bernoulli exponential_ geometric_ log_normal_ cauchy_")
class SamplingMethods:
    """Tensor's random draws and in-place random fills."""
    __slots__ = ()

    # in-place random fills (nn.init builds on these)
    # drawn on the tensor's device by its generator, not on the host
    @B.on_own_device
    def uniform_(self, a=0.0, b=1.0, generator=None):
        return _fill_random(self, "uniform", a, b, generator=generator,
                            dtype=self._data.dtype)

    @B.on_own_device
    def normal_(self, mean=0.0, std=1.0, generator=None):
        return _fill_random(self, "normal", mean, std, generator=generator,
                            dtype=self._data.dtype)

    @B.on_own_device
    def bernoulli_(self, p=0.5, generator=None):
        self._check_inplace()
        u = draw("random", size=self.shape, device=self.device,
                 generator=generator)
        self._data[...] = (u < _arr(p)).astype(self._data.dtype)
        self._bump_version()
        return self._overwritten()

    @B.on_own_device
    def random_(self, low=None, high=None, generator=None):
        if low is None and high is None:     # the dtype's whole range
            low, high = 0, _RANDOM_HIGH.get(self.dtype.name, 2 ** 24 + 1)
        elif high is None:
            low, high = 0, low
        return _fill_random(self, "integers", low, high, generator=generator,
                            dtype=self._data.dtype, check=False)
