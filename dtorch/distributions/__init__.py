"""``dtorch.distributions``: the distributions training scripts use most
(Categorical for policy gradients, Normal for VAEs and Gaussian policies,
Bernoulli), with ``sample``/``rsample``, ``log_prob``, ``entropy`` and
``kl_divergence`` following PyTorch's formulas and shape rules
(sample_shape + batch_shape + event_shape)."""
import math

import numpy as np

from .. import _backend as B
from ..tensor import Tensor, Size
from ..autograd.grad_mode import no_grad
from .._creation import tensor as _tensor

__all__ = ["Distribution", "Categorical", "Normal", "Bernoulli",
           "kl_divergence", "register_kl"]


def _as_tensor(x, like=None):
    if isinstance(x, Tensor):
        return x
    dt = like.dtype if like is not None else B.get_default_dtype()
    return _tensor(x, dtype=dt)


class Distribution:
    has_rsample = False

    def __init__(self, batch_shape=(), event_shape=(), validate_args=None):
        self._batch_shape = Size(batch_shape)
        self._event_shape = Size(event_shape)

    @property
    def batch_shape(self):
        return self._batch_shape

    @property
    def event_shape(self):
        return self._event_shape

    def _extended_shape(self, sample_shape=()):
        return Size(tuple(sample_shape) + tuple(self._batch_shape)
                    + tuple(self._event_shape))

    def sample(self, sample_shape=()):
        with no_grad():
            return self.rsample(sample_shape)

    def rsample(self, sample_shape=()):
        raise NotImplementedError(f"{type(self).__name__} has no rsample")

    def sample_n(self, n):
        return self.sample((n,))

    @property
    def stddev(self):
        return self.variance.sqrt()

    def perplexity(self):
        return self.entropy().exp()

    def __repr__(self):
        return f"{type(self).__name__}()"


class Categorical(Distribution):
    """Categories 0..K-1 with ``probs`` (normalised along the last dim) or
    ``logits`` (unnormalised log-probabilities)."""

    def __init__(self, probs=None, logits=None, validate_args=None):
        if (probs is None) == (logits is None):
            raise ValueError("Either `probs` or `logits` must be specified, "
                             "but not both.")
        if probs is not None:
            probs = _as_tensor(probs)
            if probs.ndim < 1:
                raise ValueError("`probs` parameter must be at least "
                                 "one-dimensional.")
            self.probs = probs / probs.sum(-1, keepdim=True)
            eps = float(np.finfo(self.probs._data.dtype).eps)
            self.logits = self.probs.clamp(eps, 1 - eps).log()
            self._param = self.probs
        else:
            logits = _as_tensor(logits)
            if logits.ndim < 1:
                raise ValueError("`logits` parameter must be at least "
                                 "one-dimensional.")
            self.logits = logits - logits.logsumexp(-1, keepdim=True)
            self.probs = self.logits.softmax(-1)
            self._param = self.logits
        self._num_events = self._param.shape[-1]
        super().__init__(self._param.shape[:-1])

    @property
    def param_shape(self):
        return self._param.shape

    def sample(self, sample_shape=()):
        sample_shape = Size(sample_shape)
        n = 1
        for s in sample_shape:
            n *= s
        p2 = self.probs.detach().reshape(-1, self._num_events)
        draws = p2.multinomial(n, True).t()          # (n, prod(batch))
        return draws.reshape(self._extended_shape(sample_shape))

    def log_prob(self, value):
        value = _as_tensor(value).long().unsqueeze(-1)
        shape = tuple(np.broadcast_shapes(
            tuple(value.shape), tuple(self.logits.shape)))
        v = value.expand(shape[:-1] + (1,))
        return self.logits.expand(shape).gather(-1, v).squeeze(-1)

    def entropy(self):
        from .._settings import finfo
        lo = finfo(self.logits.dtype).min
        return -(self.logits.clamp(min=lo) * self.probs).sum(-1)

    @property
    def mean(self):
        return self.probs.new_full(self._extended_shape(), float("nan"))

    @property
    def mode(self):
        return self.probs.argmax(-1)

    def enumerate_support(self, expand=True):
        from .._creation import arange
        v = arange(self._num_events, device=self.probs.device)
        v = v.reshape((-1,) + (1,) * len(self._batch_shape))
        return v.expand((-1,) + tuple(self._batch_shape)) if expand else v


def _broadcast(*vals):
    ts = [v for v in vals if isinstance(v, Tensor)]
    like = ts[0] if ts else None
    vals = [_as_tensor(v, like) for v in vals]
    shape = tuple(np.broadcast_shapes(
        *[tuple(v.shape) for v in vals]))
    return [v.expand(shape) for v in vals]


class Normal(Distribution):
    """Gaussian with mean ``loc`` and standard deviation ``scale``."""
    has_rsample = True

    def __init__(self, loc, scale, validate_args=None):
        self.loc, self.scale = _broadcast(loc, scale)
        super().__init__(self.loc.shape)

    @property
    def mean(self):
        return self.loc

    @property
    def mode(self):
        return self.loc

    @property
    def stddev(self):
        return self.scale

    @property
    def variance(self):
        return self.scale.pow(2)

    def rsample(self, sample_shape=()):
        shape = self._extended_shape(sample_shape)
        eps = self.loc.new_empty(shape).normal_().detach()
        return self.loc + eps * self.scale

    def log_prob(self, value):
        value = _as_tensor(value, self.loc)
        var = self.scale ** 2
        return -((value - self.loc) ** 2) / (2 * var) - self.scale.log() \
            - math.log(math.sqrt(2 * math.pi))

    def entropy(self):
        return 0.5 + 0.5 * math.log(2 * math.pi) + self.scale.log()

    def cdf(self, value):
        value = _as_tensor(value, self.loc)
        return 0.5 * (1 + ((value - self.loc) / (self.scale * math.sqrt(2)))
                      .erf())


class Bernoulli(Distribution):
    """0/1 outcomes with ``probs`` or ``logits``."""

    def __init__(self, probs=None, logits=None, validate_args=None):
        if (probs is None) == (logits is None):
            raise ValueError("Either `probs` or `logits` must be specified, "
                             "but not both.")
        if probs is not None:
            self.probs = _as_tensor(probs)
            eps = float(np.finfo(self.probs._data.dtype).eps)
            p = self.probs.clamp(eps, 1 - eps)
            self.logits = p.log() - (1 - p).log()
        else:
            self.logits = _as_tensor(logits)
            self.probs = self.logits.sigmoid()
        super().__init__(self.probs.shape)

    @property
    def mean(self):
        return self.probs

    @property
    def variance(self):
        return self.probs * (1 - self.probs)

    def sample(self, sample_shape=()):
        shape = self._extended_shape(sample_shape)
        with no_grad():
            return self.probs.detach().expand(shape).bernoulli()

    def log_prob(self, value):
        from ..nn.functional import binary_cross_entropy_with_logits as bce
        logits, value = _broadcast(self.logits, _as_tensor(value,
                                                           self.logits))
        return -bce(logits, value, reduction="none")

    def entropy(self):
        from ..nn.functional import binary_cross_entropy_with_logits as bce
        return bce(self.logits, self.probs, reduction="none")


_KL = {}


def register_kl(type_p, type_q):
    def deco(fn):
        _KL[(type_p, type_q)] = fn
        return fn
    return deco


def kl_divergence(p, q):
    fn = _KL.get((type(p), type(q)))
    if fn is None:
        raise NotImplementedError(f"No KL(p || q) is implemented for "
                                  f"{type(p).__name__} and "
                                  f"{type(q).__name__}")
    return fn(p, q)


@register_kl(Normal, Normal)
def _kl_normal_normal(p, q):
    var_ratio = (p.scale / q.scale).pow(2)
    t1 = ((p.loc - q.loc) / q.scale).pow(2)
    return 0.5 * (var_ratio + t1 - 1 - var_ratio.log())


@register_kl(Categorical, Categorical)
def _kl_categorical_categorical(p, q):
    t = p.probs * (p.logits - q.logits)
    t = t.masked_fill((q.probs == 0).expand(t.shape), float("inf"))
    t = t.masked_fill((p.probs == 0).expand(t.shape), 0.0)
    return t.sum(-1)


@register_kl(Bernoulli, Bernoulli)
def _kl_bernoulli_bernoulli(p, q):
    from ..nn.functional import softplus
    t1 = p.probs * (softplus(-q.logits) - softplus(-p.logits))
    t2 = (1 - p.probs) * (softplus(q.logits) - softplus(p.logits))
    return t1 + t2
