"""The tensor namespace: the NumPy names a backward body uses, over tensors.

One derivative per op (issue 30). An op's ``backward`` is written once
against an array namespace ``xp = grad_xp(g)``: on the fast path ``g`` is
a NumPy/CuPy array and ``xp`` that array module; under
``create_graph=True`` ``g`` is a tensor and ``xp`` is a ``Namespace``
bound to it, whose functions have NumPy's names and signatures and record
the graph with dtorch's own ops. The arrays that forward saved enter the
body through ``ctx.input(i, a)`` / ``ctx.output(a)`` (connected to the
graph on the tensor path, the array itself on the fast path) or
``ctx.const(a)`` (a constant: masks, indices). So the body computes the
same values, in the same order, on both paths: the create_graph gradient
is bitwise the plain one.

Each function here is one line over an existing op; a body that needs a
NumPy name this namespace lacks gets an AttributeError naming it (never a
silent array that would cut the graph): add the line here.
"""
import operator

import numpy as np

from .._backend import from_np, get_array_module
from . import base
from .arith import Where, Maximum, Minimum
from . import activation, einsum as _einsum
from .elementwise import Exp, Log, Sqrt, Abs, Tanh, Log1p, Expm1, Sigmoid, \
    Sin, Cos, Sinh, Cosh, Erf, Erfinv, Digamma
from .movement import Cast, Cat, stack, Expand, Permute
from .reduce import Sum, Prod
from .matmul import MatMul
from .selection import Cumsum, Cumprod, Tril, Gather


def _np_dtype(dt):
    """A NumPy dtype from a NumPy or a dtorch dtype."""
    return getattr(dt, "np", None) or np.dtype(dt)


class Namespace:
    """NumPy's names over tensors made like ``like`` (a gradient tensor).
    Arrays and Python numbers given to a function enter as constants."""
    __slots__ = ("like", "am")

    # NumPy constants and dtypes pass through
    inf = np.inf
    nan = np.nan
    pi = np.pi
    bool_ = np.bool_
    float16, float32, float64 = np.float16, np.float32, np.float64
    int32, int64 = np.int32, np.int64
    errstate = staticmethod(np.errstate)
    finfo = staticmethod(np.finfo)
    iinfo = staticmethod(np.iinfo)

    def __init__(self, like):
        self.like = like
        self.am = get_array_module(like._data)

    def t(self, a):
        """``a`` as a tensor: a tensor stays, an array or number becomes a
        constant."""
        if hasattr(a, "_make"):
            return a
        if not hasattr(a, "dtype"):
            a = self.am.asarray(a, dtype=self.like._data.dtype)
        return self.like._make(a, False, None)

    # ----------------------------------------------------- creation --
    def zeros(self, shape, dtype=None):
        return self.t(self.am.zeros(shape, self._dt(dtype)))

    def ones(self, shape, dtype=None):
        return self.t(self.am.ones(shape, self._dt(dtype)))

    empty = zeros

    def full(self, shape, fill, dtype=None):
        return self.t(self.am.full(shape, fill, self._dt(dtype)))

    def zeros_like(self, a, dtype=None):
        return self.zeros(a.shape, self._dt(dtype, a))

    def ones_like(self, a, dtype=None):
        return self.ones(a.shape, self._dt(dtype, a))

    empty_like = zeros_like

    def asarray(self, a, dtype=None):
        a = self.t(a)
        return a if dtype is None else self.astype(a, dtype)

    def _dt(self, dtype, like=None):
        """NumPy dtype ``dtype``, else that of ``like`` (a tensor or an
        array), else that of the gradient the namespace is bound to."""
        if dtype is not None:
            return _np_dtype(dtype)
        ref = self.like if like is None else like
        return getattr(ref, "_data", ref).dtype

    # --------------------------------------------------- arithmetic --
    # (add, subtract, multiply, divide: the operators, after the class)
    def negative(self, a):
        return -self.t(a)

    def maximum(self, a, b):
        return Maximum.apply(self.t(a), self.t(b))

    def minimum(self, a, b):
        return Minimum.apply(self.t(a), self.t(b))

    def where(self, cond, a, b):
        if hasattr(cond, "_data"):
            cond = cond._data
        return Where.apply(cond, self.t(a) if hasattr(a, "shape") else a,
                           self.t(b) if hasattr(b, "shape") else b)

    def matmul(self, a, b):
        return MatMul.apply(self.t(a), self.t(b))

    # ------------------------------------------------------- unary --
    # (exp, log, sqrt, ...: one op each, _UNARY after the class)
    def square(self, a):
        a = self.t(a)
        return a * a

    # masks: constants, the same arrays on both paths
    def isnan(self, a):
        return self.t(self.am.isnan(getattr(a, "_data", a)))

    def isfinite(self, a):
        return self.t(self.am.isfinite(getattr(a, "_data", a)))

    # --------------------------------------------- shape and dtype --
    def astype(self, a, dtype, copy=False):
        a = self.t(a)
        dt = _np_dtype(dtype)
        return a if a._data.dtype == dt else Cast.apply(a, dt)

    def reshape(self, a, shape):
        return self.t(a).reshape(shape)

    def broadcast_to(self, a, shape):
        return Expand.apply(self.t(a), tuple(shape))

    def expand_dims(self, a, axis):
        a = self.t(a)
        axes = (axis,) if isinstance(axis, int) else axis
        n = a.ndim + len(axes)
        shape = iter(a.shape)
        axes = {x % n for x in axes}
        return a.reshape(tuple(1 if i in axes else next(shape)
                               for i in range(n)))

    def transpose(self, a, axes=None):
        a = self.t(a)
        if axes is None:
            axes = tuple(range(a.ndim))[::-1]
        return Permute.apply(a, tuple(axes))

    def moveaxis(self, a, source, destination):
        return self.t(a).movedim(source, destination)

    def swapaxes(self, a, i, j):
        return self.t(a).swapaxes(i, j)

    def flip(self, a, axis=None):
        a = self.t(a)
        if axis is None:
            axis = tuple(range(a.ndim))
        return a.flip((axis,) if isinstance(axis, int) else tuple(axis))

    def concatenate(self, arrays, axis=0):
        return Cat.apply(*[self.t(a) for a in arrays], dim=axis)

    def stack(self, arrays, axis=0):
        return stack(*[self.t(a) for a in arrays], dim=axis)

    def ascontiguousarray(self, a):
        return self.t(a)

    # --------------------------------------------------- reductions --
    def sum(self, a, axis=None, keepdims=False, dtype=None):
        return Sum.apply(self.t(a), axis, keepdims,
                         None if dtype is None else _np_dtype(dtype))

    def cumsum(self, a, axis=None):
        a = self.t(a)
        return Cumsum.apply(a.reshape(-1) if axis is None else a,
                            0 if axis is None else axis)

    def cumprod(self, a, axis=None):
        a = self.t(a)
        return Cumprod.apply(a.reshape(-1) if axis is None else a,
                             0 if axis is None else axis)

    # ---- deriv-b's names (movement, selection, index, loss, norm, rnn,
    # ---- attention, conv, pool backward bodies)
    def split(self, a, indices, axis=0):
        a = self.t(a)
        bounds = [0, *indices, a.shape[axis]]
        return list(a.split([e - b for b, e in zip(bounds, bounds[1:])],
                            dim=axis))

    def take(self, a, i, axis=None):
        a = self.t(a)
        if axis is None:
            return a.reshape(-1)[i]
        return a[(slice(None),) * (axis % a.ndim) + (i,)]

    def tril(self, a, k=0):
        return Tril.apply(self.t(a), diagonal=k, upper=False)

    def triu(self, a, k=0):
        return Tril.apply(self.t(a), diagonal=k, upper=True)

    def prod(self, a, axis=None, keepdims=False):
        return Prod.apply(self.t(a), axis, keepdims)

    def take_along_axis(self, a, idx, axis):
        return Gather.apply(self.t(a), idx=getattr(idx, "_data", idx),
                            dim=axis)

    # ---- end of deriv-b's names

    def einsum(self, equation, *operands, optimize=None):
        return _einsum.Einsum.apply(*[self.t(a) for a in operands],
                                    equation=equation)

    def __getattr__(self, name):
        raise AttributeError(
            f"the tensor namespace of backward bodies (dtorch/ops/_tnp.py) "
            f"has no {name!r}: add it there (one line over an existing op) "
            f"so that this backward records its graph under "
            f"create_graph=True")


def _unary(op):
    """NumPy's one-argument function recorded as ``op``."""
    def f(self, a):
        return op.apply(self.t(a))
    return f


def _operator(fn):
    """NumPy's arithmetic function as the tensor operator ``fn``."""
    def f(self, a, b):
        return fn(self.t(a), b)
    return f


# NumPy's name -> the op it records
_UNARY = dict(exp=Exp, log=Log, sqrt=Sqrt, abs=Abs, absolute=Abs, tanh=Tanh,
              log1p=Log1p, expm1=Expm1, sigmoid=Sigmoid, sin=Sin, cos=Cos,
              sinh=Sinh, cosh=Cosh, erf=Erf, erfinv=Erfinv, digamma=Digamma,
              softplus=activation.Softplus)
_OPERATORS = dict(add=operator.add, subtract=operator.sub,
                  multiply=operator.mul, divide=operator.truediv,
                  true_divide=operator.truediv)
for _name, _op in _UNARY.items():
    setattr(Namespace, _name, _unary(_op))
for _name, _op in _OPERATORS.items():
    setattr(Namespace, _name, _operator(_op))
del _name, _op

base._tensor_namespace = Namespace
