"""Tensor methods of elementwise maths: inverse trigonometry, special
functions, remainder/fmod, bitwise and logical ops, nansum/nanmean.

Each function takes the tensor first: it is a Tensor method (this family's
mixin, at the end, binds it; Tensor inherits the mixin) and, where PyTorch
has one, ``dtorch.<name>``. Methods that are not functions are written in
the mixin's body (the rule: dtorch/tensor.py's docstring).
"""
import numpy as np

from .. import _backend as B
from .. import ops as P
from ..autograd import _capture
from ..autograd import function as _function
from ..ops.base import is_float
from ..ops import elementwise as E
from ._common import _TensorBase, _arr, _operand, _ranked_matmul, methods


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


def _step_fn(name, decimals=0):
    """The array function of a piecewise-constant op (``P.Step``)."""
    if name == "round":
        return lambda xp, x, y: xp.round(x, decimals)
    if name == "sign":
        return _sign
    return lambda xp, x, y: getattr(xp, name)(x)


def _sign(xp, x, y):
    # PyTorch: sign(NaN) is 0
    out = xp.sign(x)
    return xp.where(xp.isnan(x), 0, out).astype(out.dtype) \
        if out.dtype.kind == "f" else out


def _floor_div(xp, x, y):
    x, y = P.promote(x, y, "floor_divide")
    if x.dtype.kind in "biu":
        return xp.floor_divide(x, y)
    with np.errstate(divide="ignore", invalid="ignore"):
        return P.arith._div_floor(xp, x, y)


def _trunc_div(xp, x, y):
    x, y = P.promote(x, y, "div")
    if x.dtype.kind in "biu":     # exact: C's truncating division
        q = xp.floor_divide(x, y)
        return q + ((q < 0) & (q * y != x))
    with np.errstate(divide="ignore", invalid="ignore"):
        return xp.trunc(x / y).astype(x.dtype, copy=False)


# ================================================= the mixin =====

def _operators(op, name):
    """Tensor's ``__<name>__`` and ``__r<name>__``: the binary ``op`` with
    the other operand (a tensor or a number) on the right, then on the
    left. The other operand is most often a tensor: tested inline, as
    _operand's call costs more than the test on tiny tensors."""
    def forward(self, other):
        return op.apply(self, other if isinstance(other, _TensorBase)
                        else _operand(other, self))

    def reflected(self, other):
        return op.apply(_operand(other, self), self)
    for f, n in ((forward, f"__{name}__"), (reflected, f"__r{name}__")):
        f.__name__, f.__qualname__ = n, f"MathsMethods.{n}"
    return forward, reflected


def _comparison(ufunc_name, name):
    """Tensor's ``__<name>__``: the NumPy comparison ``ufunc_name``."""
    def cmp(self, other):
        return self._cmp(ufunc_name, other)
    cmp.__name__, cmp.__qualname__ = f"__{name}__", f"MathsMethods.__{name}__"
    return cmp


@methods("erf erfc erfinv asin acos atan sinh cosh asinh acosh atanh exp2 "
         "frac sinc logit atan2 hypot xlogy remainder fmod floor_divide "
         "float_power logical_xor bitwise_and bitwise_or bitwise_xor "
         "bitwise_not signbit heaviside copysign nansum nanmean lgamma "
         "digamma fmax fmin sgn")
class MathsMethods:
    """Tensor's elementwise maths: the functions above as methods, the
    operators, comparisons and logical ops."""
    __slots__ = ()

    arctan2, arcsin, arccos, arctan = atan2, asin, acos, atan

    # ------------------------------------------------------- arithmetic ---
    __add__, __radd__ = _operators(P.Add, "add")
    __sub__, __rsub__ = _operators(P.Sub, "sub")
    __mul__, __rmul__ = _operators(P.Mul, "mul")
    __truediv__, __rtruediv__ = _operators(P.Div, "truediv")
    __pow__, __rpow__ = _operators(P.Pow, "pow")
    __matmul__, __rmatmul__ = _operators(P.MatMul, "matmul")

    def __neg__(self):
        return P.Neg.apply(self)

    def __pos__(self):
        return self

    def __abs__(self):
        return P.Abs.apply(self)

    def __floordiv__(self, other):
        return self._divide(other, "floor_divide")

    def __rfloordiv__(self, other):
        o = _operand(other, self)
        if not isinstance(o, _TensorBase):      # a number: a 0-d operand
            o = self._wrap(self._xp().asarray(o))
        return o._divide(self, "floor_divide")

    def __mod__(self, other):
        return self.remainder(other)

    @B.on_own_device
    def _divide(self, other, mode):
        """Division rounded down (``floor_divide``, ``floor``) or toward
        zero (``trunc``): exact on integers (a zero divisor raises, as in
        PyTorch), else PyTorch's float rounding with a zero derivative
        (none at all for floor_divide, as there)."""
        x, y = P.promote(self._data, _arr(_operand(other, self)), mode)
        if x.dtype.kind in "biu":
            P.int_division("div_floor" if mode != "trunc" else "div_trunc",
                           x, y)
        return P.Step.apply(self, other,
                            _trunc_div if mode == "trunc" else _floor_div,
                            "floor_divide" if mode == "floor_divide"
                            else None, True)

    def add(self, other, alpha=1):
        if alpha != 1:
            other = _operand(other, self) * alpha
        return self + other

    def sub(self, other, alpha=1):
        if alpha != 1:
            other = _operand(other, self)
            P.arith.check_sub_operands(self, other)   # before bool * alpha
            other = other * alpha
        return self - other

    subtract = sub

    def mul(self, other):
        return self * other

    multiply = mul

    @B.on_own_device
    def div(self, other, rounding_mode=None):
        if rounding_mode is None:
            return self / other
        if rounding_mode in ("floor", "trunc"):
            return self._divide(other, rounding_mode)
        raise ValueError(f"div expected rounding_mode to be one of None, "
                         f"'trunc', or 'floor' but found '{rounding_mode}'")

    divide = div
    true_divide = div

    def pow(self, exponent):
        return self ** exponent

    def matmul(self, other):
        return self @ other

    def mm(self, other):
        return _ranked_matmul(self, other, (2, 2), "mm: expected 2D "
                              "tensors, got {}D and {}D")

    def bmm(self, other):
        return _ranked_matmul(self, other, (3, 3), "batch1 and batch2 must "
                              "be 3D tensors, got {}D and {}D")

    @_function.autocast_op("none")      # not lowered (PyTorch's lists)
    def dot(self, other):
        return _ranked_matmul(self, other, (1, 1), "1D tensors expected, "
                              "but got {}D and {}D tensors")

    def neg(self):
        return P.Neg.apply(self)

    negative = neg

    def exp(self):
        return P.Exp.apply(self)

    def log(self):
        return P.Log.apply(self)

    def log1p(self):
        return P.Log1p.apply(self)

    def log2(self):
        return self.log() / float(np.log(2.0))

    def log10(self):
        return self.log() / float(np.log(10.0))

    def expm1(self):
        return P.Expm1.apply(self)

    def sqrt(self):
        return P.Sqrt.apply(self)

    def rsqrt(self):
        return P.Rsqrt.apply(self)

    def square(self):
        return self * self

    def abs(self):
        return P.Abs.apply(self)

    absolute = abs

    def reciprocal(self):
        return P.Reciprocal.apply(self)

    def sin(self):
        return P.Sin.apply(self)

    def cos(self):
        return P.Cos.apply(self)

    def tan(self):
        return self.sin() / self.cos()

    def tanh(self):
        return P.Tanh.apply(self)

    def sigmoid(self):
        return P.Sigmoid.apply(self)

    def relu(self):
        return P.Relu.apply(self)

    def clamp(self, min=None, max=None):
        if min is None and max is None:
            raise RuntimeError("torch.clamp: At least one of 'min' or 'max' "
                               "must not be None")
        if isinstance(min, _TensorBase) or isinstance(max, _TensorBase):
            return P.ClampT.apply(
                self, None if min is None else _operand(min, self),
                None if max is None else _operand(max, self))
        return P.Clamp.apply(self, min=min, max=max)

    clip = clamp

    def clamp_min(self, min):
        return self.clamp(min=min)

    def clamp_max(self, max):
        return self.clamp(max=max)

    def maximum(self, other):
        return P.Maximum.apply(self, _operand(other, self))

    def minimum(self, other):
        return P.Minimum.apply(self, _operand(other, self))

    def lerp(self, end, weight):
        return P.Lerp.apply(self, _operand(end, self), _operand(weight, self))

    def addcmul(self, t1, t2, value=1):
        return self + t1 * t2 * value

    def addcdiv(self, t1, t2, value=1):
        return self + t1 / t2 * value

    def sign(self):
        if self.dtype is B.bool_:
            return self.clone()
        return P.Step.apply(self, None, _step_fn("sign"))

    def floor(self):
        return self._rounding("floor")

    def ceil(self):
        return self._rounding("ceil")

    def round(self, decimals=0):
        return self._rounding("round", decimals)

    def trunc(self):
        return self._rounding("trunc")

    def _rounding(self, name, decimals=0):
        # PyTorch has no bool kernel, nor an integer one with decimals
        if self.dtype is B.bool_ or decimals and \
                not self.dtype.is_floating_point:
            raise NotImplementedError(
                f'"{name}_cpu" not implemented for '
                f'\'{"Bool" if self.dtype is B.bool_ else "Long"}\'')
        if not self.dtype.is_floating_point:
            return self.clone()
        return P.Step.apply(self, None, _step_fn(name, decimals))

    @B.on_own_device
    def isnan(self):
        return self._wrap(self._xp().isnan(self._data))

    @B.on_own_device
    def isinf(self):
        return self._wrap(self._xp().isinf(self._data))

    @B.on_own_device
    def isfinite(self):
        return self._wrap(self._xp().isfinite(self._data))

    def nan_to_num(self, nan=0.0, posinf=None, neginf=None):
        return P.NanToNum.apply(self, nan=nan, posinf=posinf, neginf=neginf)

    # ------------------------------------------------------- comparison ---
    @B.on_own_device
    @_capture.array_source      # a dtorch.compile replay compares again
    def _cmp(self, ufunc_name, other):
        o = _operand(other, self)
        x, y = P.promote(self._data, _arr(o), ufunc_name)
        return self._wrap(getattr(self._xp(), ufunc_name)(x, y))

    def __eq__(self, other):
        if other is None:
            return False
        return self._cmp("equal", other)

    def __ne__(self, other):
        if other is None:
            return True
        return self._cmp("not_equal", other)

    __lt__ = _comparison("less", "lt")
    __le__ = _comparison("less_equal", "le")
    __gt__ = _comparison("greater", "gt")
    __ge__ = _comparison("greater_equal", "ge")

    eq = __eq__
    ne = __ne__
    lt = __lt__
    le = __le__
    gt = __gt__
    ge = __ge__

    def __hash__(self):
        return id(self)

    def equal(self, other):
        return bool(self.shape == other.shape
                    and (self._data == other._data).all())

    @B.on_own_device
    def allclose(self, other, rtol=1e-05, atol=1e-08, equal_nan=False):
        return bool(self._xp().allclose(self._data, _arr(other), rtol, atol,
                                        equal_nan))

    @B.on_own_device
    def isclose(self, other, rtol=1e-05, atol=1e-08, equal_nan=False):
        if not isinstance(other, _TensorBase):
            raise TypeError(f"isclose(): argument 'other' (position 1) must "
                            f"be Tensor, not {type(other).__name__}")
        if other.dtype is not self.dtype:
            raise RuntimeError(f"{P.base.dtype_name(self._data.dtype)} did "
                               f"not match "
                               f"{P.base.dtype_name(other._data.dtype)}")
        return self._wrap(self._xp().isclose(self._data, _arr(other), rtol,
                                               atol, equal_nan))

    @B.on_own_device
    def _logical(self, name, other):
        o = _arr(_operand(other, self))
        return self._wrap(getattr(self._xp(), name)(self._data, o))

    def __and__(self, other):
        return self._logical("bitwise_and", other)

    def __or__(self, other):
        return self._logical("bitwise_or", other)

    def __xor__(self, other):
        return self._logical("bitwise_xor", other)

    __rand__ = __and__
    __ror__ = __or__
    __rxor__ = __xor__

    @B.on_own_device
    def __invert__(self):
        return self._wrap(~self._data)

    @B.on_own_device
    def logical_not(self):
        return self._wrap(self._xp().logical_not(self._data))

    def logical_and(self, other):
        return self._logical("logical_and", other)

    def logical_or(self, other):
        return self._logical("logical_or", other)
