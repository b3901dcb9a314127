"""Tensor's reductions (sum, mean, var/std, max/min, argmax, all/any,
norm, logsumexp, softmax) and scans (cumsum, cumprod, cummax/cummin,
logcumsumexp, diff).

Each function takes the tensor first: it is a Tensor method (this family's
mixin, at the end, binds it; Tensor inherits the mixin) and, where PyTorch
has one, ``dtorch.<name>``. Methods that are not functions are written in
the mixin's body (the rule: dtorch/tensor.py's docstring).
"""
import numpy as np

from .. import _backend as B
from .. import ops as P
from ..ops import selection as S
from ..return_types import MinMax
from ._common import _TensorBase, methods


# ============================================================ scans =========

def cumprod(self, dim, dtype=None):
    t = self if dtype is None else self.to(dtype)
    return S.Cumprod.apply(t, dim=dim)


def _cumext(self, dim, is_min):
    ind = S.cum_extreme_indices(self._data, dim, is_min)
    vals = S.Gather.apply(self, idx=ind, dim=dim)
    return MinMax(vals, self._wrap(ind))


@B.on_own_device
def cummax(self, dim):
    return _cumext(self, dim, False)


@B.on_own_device
def cummin(self, dim):
    return _cumext(self, dim, True)


def logcumsumexp(self, dim):
    # one node with PyTorch's scan and backward (dtorch/ops/selection.py)
    return P.LogCumSumExp.apply(self, dim=S.axis_of(dim, self.ndim))


def diff(self, n=1, dim=-1, prepend=None, append=None):
    T = _TensorBase
    x = self
    d = S.axis_of(dim, self.ndim)
    if prepend is not None or append is not None:
        parts = [p if isinstance(p, T) else self._wrap(self._xp().asarray(p))
                 for p in (prepend, self, append) if p is not None]
        x = P.Cat.apply(*parts, dim=d)
    for _ in range(n):
        m = x.shape[d]
        hi = x.narrow(d, 1, m - 1) if m else x
        lo = x.narrow(d, 0, m - 1) if m else x
        x = hi.logical_xor(lo) if x.dtype is B.bool_ else hi - lo
    return x


# ================================================= the mixin =====

@methods("cumprod cummax cummin logcumsumexp diff")
class ReduceMethods:
    """Tensor's reductions and scans."""
    __slots__ = ()

    # ------------------------------------------------------- reductions ---
    def sum(self, dim=None, keepdim=False, dtype=None):
        return P.Sum.apply(self, dim=dim, keepdim=keepdim,
                           dtype=B.numpy_dtype(dtype))

    def mean(self, dim=None, keepdim=False, dtype=None):
        if not self.dtype.is_floating_point and dtype is None:
            raise RuntimeError(
                f"mean(): could not infer output dtype. Input dtype must be "
                f"either a floating point or complex dtype. Got: "
                f"{self.dtype.name.capitalize()}")
        t = self if dtype is None else self.to(dtype)
        n = self._count(dim)
        return t.sum(dim, keepdim) * (1.0 / n if n else float("nan"))

    def _count(self, dim):
        if dim is None:
            return self._data.size
        dims = (dim,) if isinstance(dim, int) else dim
        n = 1
        for d in dims:
            n *= self._data.shape[self._dim(d)] if self.ndim else 1
        return n

    def var(self, dim=None, unbiased=None, keepdim=False, correction=None):
        if correction is None:
            correction = 1 if unbiased is None or unbiased else 0
        dof = self._count(dim) - correction
        d = self - self.mean(dim, keepdim=True)
        # PyTorch gives nan (not an error) when there are too few samples
        return (d * d).sum(dim, keepdim) * (1.0 / dof if dof > 0
                                            else float("nan"))

    def std(self, dim=None, unbiased=None, keepdim=False, correction=None):
        return P.StdSqrt.apply(self.var(dim, unbiased, keepdim, correction))

    def prod(self, dim=None, keepdim=False, dtype=None):
        t = self if dtype is None else self.to(dtype)
        return P.Prod.apply(t, dim=dim, keepdim=keepdim)

    def cumsum(self, dim, dtype=None):
        t = self if dtype is None else self.to(dtype)
        return P.Cumsum.apply(t, dim=dim)

    def _minmax(self, dim, keepdim, is_min):
        if dim is None:
            return P.Amax.apply(self, is_min=is_min, evenly=True)
        if isinstance(dim, _TensorBase):   # max(other): elementwise
            return (P.Minimum if is_min else P.Maximum).apply(self, dim)
        vals = P.MaxDim.apply(self, dim=dim, keepdim=keepdim, is_min=is_min)
        fn = vals.grad_fn
        idx = self._minmax_idx(dim, keepdim, is_min) if fn is None else \
            self._wrap(fn.indices)
        return MinMax(vals, idx)

    def _minmax_idx(self, dim, keepdim, is_min):
        return self.argmin(dim, keepdim) if is_min else \
            self.argmax(dim, keepdim)

    def max(self, dim=None, keepdim=False):
        return self._minmax(dim, keepdim, False)

    def min(self, dim=None, keepdim=False):
        return self._minmax(dim, keepdim, True)

    def amax(self, dim=None, keepdim=False):
        return P.Amax.apply(self, dim=dim, keepdim=keepdim)

    def amin(self, dim=None, keepdim=False):
        return P.Amax.apply(self, dim=dim, keepdim=keepdim, is_min=True)

    @B.on_own_device
    def _arg(self, fn, dim, keepdim):
        xp = self._xp()
        if dim is None:
            out = getattr(xp, fn)(self._data.reshape(-1))
            out = xp.asarray(out, dtype=np.int64)
            if keepdim:
                out = out.reshape((1,) * self.ndim)
            return self._wrap(out)
        d = self._dim(dim)
        if self.ndim == 0:
            return self._wrap(xp.zeros((), np.int64))
        out = getattr(xp, fn)(self._data, axis=d, keepdims=keepdim)
        return self._wrap(out.astype(np.int64, copy=False))

    def argmax(self, dim=None, keepdim=False):
        return self._arg("argmax", dim, keepdim)

    def argmin(self, dim=None, keepdim=False):
        return self._arg("argmin", dim, keepdim)

    @B.on_own_device
    def all(self, dim=None, keepdim=False):
        return self._wrap(self._xp().asarray(self._data.astype(bool).all(
            axis=None if dim is None else self._dim(dim), keepdims=keepdim)))

    @B.on_own_device
    def any(self, dim=None, keepdim=False):
        return self._wrap(self._xp().asarray(self._data.astype(bool).any(
            axis=None if dim is None else self._dim(dim), keepdims=keepdim)))

    @B.on_own_device
    def count_nonzero(self, dim=None):
        return self._wrap(self._xp().asarray(self._xp().count_nonzero(
            self._data, axis=dim), dtype=np.int64))

    def norm(self, p="fro", dim=None, keepdim=False):
        if self.dtype in (B.float16, B.bfloat16):
            # accumulate in float32 (a sum of squares overflows float16
            # above a norm of 256), return the input's dtype, as PyTorch
            return self.float().norm(p, dim, keepdim).to(self.dtype)
        # one node with PyTorch's backward (0 at a zero norm, not NaN)
        return P.Norm.apply(self, p=2.0 if p == "fro" else float(p),
                            dim=dim, keepdim=keepdim)

    def logsumexp(self, dim, keepdim=False):
        x = self if self.dtype.is_floating_point else \
            self.to(B.get_default_dtype())
        if x.numel() == 0:        # over an empty dim: log(0) = -inf
            m = 0.0
        else:
            m = x.detach().amax(dim, keepdim=True)
            m = m.masked_fill(~m.isfinite(), 0)
        out = (x - m).exp().sum(dim, keepdim=True).log() + m
        return out if keepdim else out.squeeze(dim)

    def softmax(self, dim, dtype=None):
        return self._softmax(P.Softmax, dim, dtype)

    def log_softmax(self, dim, dtype=None):
        return self._softmax(P.LogSoftmax, dim, dtype)

    def _softmax(self, op, dim, dtype):
        x = self if dtype is None else self.to(dtype)
        if x.ndim == 0:
            return op.apply(x.reshape(1), dim=0).reshape(())
        return op.apply(x, dim=x._dim(dim))
