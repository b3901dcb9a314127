"""Tensor methods of elementwise maths: inverse trigonometry, special
functions, remainder/fmod, bitwise and logical ops, nansum/nanmean.

Each function takes the tensor first: it is a Tensor method (the class body
of dtorch/tensor.py binds it) and, where PyTorch has one, ``dtorch.<name>``.
"""
import numpy as np

from .. import _backend as B
from .. import ops as P
from ..ops.base import is_float
from ..ops import elementwise as E
from ._common import _TensorBase, _arr, _operand


# ========================================================= elementwise =====

def erf(self):
    return E.Erf.apply(self)


def erfc(self):
    return E.Erfc.apply(self)


def erfinv(self):
    return E.Erfinv.apply(self)


def asin(self):
    return E.Asin.apply(self)


def acos(self):
    return E.Acos.apply(self)


def atan(self):
    return E.Atan.apply(self)


def sinh(self):
    return E.Sinh.apply(self)


def cosh(self):
    return E.Cosh.apply(self)


def asinh(self):
    return E.Asinh.apply(self)


def acosh(self):
    return E.Acosh.apply(self)


def atanh(self):
    return E.Atanh.apply(self)


def exp2(self):
    return E.Exp2.apply(self)


def frac(self):
    return E.Frac.apply(self)


def sinc(self):
    return E.Sinc.apply(self)


def logit(self, eps=None):
    return E.Logit.apply(self, eps=eps)


def _other(self, other):
    return _operand(other, self)


def atan2(self, other):
    return E.Atan2.apply(self, _other(self, other))


arctan2 = atan2


def hypot(self, other):
    return E.Hypot.apply(self, _other(self, other))


def xlogy(self, other):
    return E.Xlogy.apply(self, _other(self, other))


def _exact_int(self, other):
    return not self.dtype.is_floating_point and not (
        isinstance(other, float) or (isinstance(other, _TensorBase)
                                     and other.dtype.is_floating_point))


def remainder(self, other):
    """Python's modulo: the result has the sign of the divisor."""
    if _exact_int(self, other):
        return _int_mod(self, other, "remainder")
    return P.Mod.apply(self, _other(self, other), floor=True)


def fmod(self, other):
    """C's fmod: the result has the sign of the dividend."""
    if _exact_int(self, other):
        return _int_mod(self, other, "fmod")
    return P.Mod.apply(self, _other(self, other), floor=False)


@B.on_own_device
def _int_mod(self, other, name):
    # exact on integers; a zero divisor raises, as in PyTorch
    a, b = P.promote(self._data, _arr(_other(self, other)), name)
    P.int_division(name, a, b)
    return self._wrap(getattr(self._xp(), name)(a, b))


def floor_divide(self, other):
    return self // other


def float_power(self, exponent):
    e = exponent.double() if isinstance(exponent, _TensorBase) else float(exponent)
    return self.double() ** e


@B.on_own_device
def logical_xor(self, other):
    return self._wrap(self._xp().logical_xor(self._data, _arr(other)))


def bitwise_and(self, other):
    return self & other


def bitwise_or(self, other):
    return self | other


def bitwise_xor(self, other):
    return self ^ other


def bitwise_not(self):
    return ~self


def signbit(self):
    return self._wrap(self._xp().signbit(self._data))


def heaviside(self, values):
    # in the graph without a derivative, as PyTorch's (backward raises)
    return P.Step.apply(self, values, _heaviside, "heaviside")


def _heaviside(xp, x, v):
    return xp.where(x == 0, v, (x > 0)).astype(xp.result_type(x, v),
                                               copy=False)


def copysign(self, other):
    o = _arr(_other(self, other))
    sgn = self._xp().where(self._xp().signbit(o), -1.0, 1.0)
    return self.abs() * self._wrap(sgn.astype(
        self._data.dtype if self.dtype.is_floating_point
        else B.get_default_dtype().np))


def nansum(self, dim=None, keepdim=False, dtype=None):
    return self.masked_fill(self.isnan(), 0).sum(dim, keepdim, dtype=dtype)


def nanmean(self, dim=None, keepdim=False, dtype=None):
    ok = ~self.isnan()
    return nansum(self, dim, keepdim, dtype) / ok.sum(dim, keepdim).to(
        self.dtype)


def lgamma(self):
    return E.Lgamma.apply(self)


def digamma(self):
    return E.Digamma.apply(self)


# ============================================== NaN-ignoring extremes, sgn ==

def _nan_ignoring(self, other, is_max):
    # PyTorch's fmax/fmin: the other operand where one is NaN; the
    # gradient goes to self where self wins (ties too) or other is NaN
    if not isinstance(other, _TensorBase):
        raise TypeError(f"{'fmax' if is_max else 'fmin'}(): argument "
                        f"'other' must be Tensor, not "
                        f"{type(other).__name__}")
    a, b = self._data, other._data
    xp = B.get_array_module(a)
    with np.errstate(invalid="ignore"):
        pick = (a >= b) if is_max else (a <= b)
    if is_float(b.dtype):
        pick = pick | xp.isnan(b)
    return P.Where.apply(xp.asarray(pick), self, other)


def fmax(self, other):
    """max(self, other) elementwise, NaN only where both are NaN."""
    return _nan_ignoring(self, other, True)


def fmin(self, other):
    """min(self, other) elementwise, NaN only where both are NaN."""
    return _nan_ignoring(self, other, False)


def sgn(self):
    """sign(x), 0 at NaN (PyTorch's sgn, which is x / |x| for complex
    x)."""
    s = self.sign()
    return s.masked_fill(s != s, 0) if self.dtype.is_floating_point else s
