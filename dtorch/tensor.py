"""``Tensor``: an array (NumPy or CuPy) plus autograd metadata.

The array lives in the ``_data`` slot. ``t.data`` is PyTorch's: a tensor that
shares memory with ``t`` and is not tracked by autograd. Every differentiable
method is composed from the primitives in ``dtorch/ops``.
"""
import builtins
import copy
import functools
import math
import weakref

import numpy as np

from . import _backend as B
from . import ops as P
from ._format import format_tensor
from ._tensor_methods._common import _dims, _operand
from .autograd import backward as _backward
from .autograd import function as _function
from .autograd.grad_mode import _state
from .random import draw as _draw, draw_into as _draw_into
from .return_types import MinMax
from ._tensor_methods.sparse import SparseCOO, strided, sparse_coo

_SCALARS = (int, float, bool)
_ndarray = np.ndarray
_TensorBase = _function.TensorBase

# PyTorch's legacy typed-tensor names for t.type('torch.LongTensor')
# (dtorch/_legacy.py builds its classes from this table)
_LEGACY_DTYPES = {
    "FloatTensor": B.float32, "DoubleTensor": B.float64,
    "HalfTensor": B.float16, "BFloat16Tensor": B.bfloat16,
    "LongTensor": B.int64, "IntTensor": B.int32, "ShortTensor": B.int16,
    "ByteTensor": B.uint8, "CharTensor": B.int8, "BoolTensor": B.bool_}


class Size(tuple):
    """Tensor shape, a tuple (``torch.Size``)."""

    def numel(self):
        n = 1
        for s in self:
            n *= s
        return n

    def __repr__(self):
        return f"dtorch.Size({list(self)})"


def _arr(x):
    return x._data if isinstance(x, Tensor) else x


# random_()'s bound by dtype: the integers a float holds exactly (PyTorch)
_RANDOM_HIGH = {"float32": 2 ** 24 + 1, "float64": 2 ** 53 + 1,
                "float16": 2 ** 11 + 1, "bfloat16": 2 ** 8 + 1, "bool": 2,
                "uint8": 2 ** 8, "int8": 2 ** 7, "int16": 2 ** 15,
                "int32": 2 ** 31, "int64": 2 ** 63 - 1}


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


def _finish(data, dtype, device, requires_grad):
    device = B.factory_device(device)
    if device is not None:
        # to any device, cpu included: tensor(cuda_t, device='cpu') copies
        # to the host; 'cuda:i' allocates on device i
        data = B.to_device(device).send(data)
    t = Tensor._make(data, False, None)
    if requires_grad:
        t.requires_grad_(True)
    return t


def _np_dtype(dtype):
    return (B.to_dtype(dtype) or B.get_default_dtype()).np


def _infer_dtype(a):
    """PyTorch's dtype of data given as Python numbers / nested lists."""
    if a.dtype.kind == "f" and a.dtype != np.float64:
        return a.dtype
    if a.dtype.kind == "f":
        return B.get_default_dtype().np
    if a.dtype.kind in "iu":
        return np.dtype(np.int64)
    if a.dtype.kind == "b":
        return np.dtype(np.bool_)
    raise TypeError(f"Could not infer dtype of {a.dtype}")


def _leaf_dtype(x):
    """PyTorch's dtype of one leaf of nested data: a tensor or array keeps
    its own, Python bools/ints/floats give bool/int64/the default float."""
    if isinstance(x, Tensor):
        return x.dtype
    # NumPy scalars first: np.float64 is a subclass of float
    if isinstance(x, (np.ndarray, np.generic)) or B.is_cupy_array(x):
        return B.from_np(x.dtype)
    if isinstance(x, bool):
        return B.bool_
    if isinstance(x, int):
        return B.int64
    if isinstance(x, float):
        return B.get_default_dtype()
    raise TypeError(f"Could not infer dtype of {type(x).__name__}")


def _seq_dtype(data):
    """The dtype PyTorch infers for nested lists/tuples: the promotion of
    every leaf's dtype (so [[1., 2.]] is float32, [t64, 2.] float64)."""
    if isinstance(data, (list, tuple)):
        dt = None
        for d in data:
            e = _seq_dtype(d)
            if e is not None:
                dt = e if dt is None else B.promote_types(dt, e)
        return dt
    return _leaf_dtype(data)


def _to_array(data):
    """Array from data: nested lists may hold 0-d tensors."""
    if isinstance(data, Tensor):
        return data._data
    if isinstance(data, (list, tuple)) and data and any(
            isinstance(d, (Tensor, list, tuple)) for d in data):
        parts = [_to_array(d) for d in data]
        if any(B.is_cupy_array(p) for p in parts):
            cp = B.check_cuda_available()
            return cp.stack([cp.asarray(p) for p in parts])
        return np.array([np.asarray(p) for p in parts])
    return data


def tensor(data, dtype=None, device=None, requires_grad=False,
           pin_memory=False):
    """A new tensor (a copy) from data: numbers, nested lists, arrays or
    tensors. Python floats give the default dtype (float32), ints int64.

    Example::

        x = dtorch.tensor([[1., 2.], [3., 4.]], requires_grad=True)
    """
    src = _to_array(data)
    if B.is_cupy_array(src):
        a = src.copy()
    else:
        a = np.array(src)
        if a.dtype == object:
            raise TypeError(f"Could not infer dtype of "
                            f"{type(data).__name__}: ragged or non-numeric "
                            f"data")
        if dtype is None and isinstance(data, (list, tuple)):
            # the leaves' dtypes decide, not NumPy's (float64 for floats)
            inferred = _seq_dtype(data) if a.size else None
            a = a.astype(inferred.np if inferred is not None
                         else _infer_dtype(a), copy=False)
        elif dtype is None and not isinstance(src, np.ndarray):
            a = a.astype(_infer_dtype(a), copy=False)
    if dtype is not None:
        a = a.astype(B.to_dtype(dtype).np, copy=False)
    elif a.dtype not in B._BY_NP and not B.is_bfloat16_np(a.dtype):
        a = a.astype(_infer_dtype(a))
    if device is None and isinstance(data, Tensor):
        device = data.device
    return _finish(a, dtype, device, requires_grad)


def _fill(fill, size, dtype, device, requires_grad):
    shape = _dims(size)
    dev = B.factory_device(device)
    if dev is None or dev.type == "cpu":
        a = np.full(shape, fill, dtype=_np_dtype(dtype))
    elif dev.type == "meta":
        a = B.MetaArray(shape, _np_dtype(dtype))
    else:
        B.check_cuda_dtype(B.to_dtype(dtype))
        with dev.context():     # cuda:i allocates on device i
            a = dev.xp.full(shape, fill, dtype=_np_dtype(dtype))
    t = Tensor._make(a, False, None)
    if requires_grad:
        t.requires_grad_(True)
    return t


def _where(cond, input, other):
    """``where(cond, input, other)`` on a condition array (dtorch.where
    and Tensor.where)."""
    if cond.dtype != np.bool_:
        raise RuntimeError(f"where expected condition to be a boolean "
                           f"tensor, but got a tensor with dtype "
                           f"{B.from_np(cond.dtype)}")
    if isinstance(input, Tensor) or not isinstance(other, Tensor):
        ref = input
    else:
        ref = other
    if not isinstance(ref, Tensor):
        # two Python numbers: PyTorch's dtype of the pair (where(c, 1, 0)
        # is int64, where(c, 1., 0) the default float dtype)
        dt = B.result_type(type(input), type(other), False, False)
        ref = Tensor._wrap(B.get_array_module(cond).asarray(input, dt.np))
        other = Tensor._wrap(B.get_array_module(cond).asarray(other, dt.np))
    return P.Where.apply(cond, _operand(input, ref), _operand(other, ref))


class Tensor(_function.TensorBase):
    """A multi-dimensional array with autograd, as ``torch.Tensor``."""
    __slots__ = ("_data", "requires_grad", "_grad", "grad_fn", "_output_nr",
                 "_vc", "_base", "_accum", "_hooks", "_post_hooks",
                 "_retains", "__weakref__", "__dict__")

    # ------------------------------------------------------------ making --
    def __init__(self, *args, dtype=None, device=None):
        # torch.Tensor(data) / torch.Tensor(*sizes): float tensors
        if len(args) == 1 and not isinstance(args[0], int):
            src = tensor(args[0], dtype=dtype or B.get_default_dtype(),
                         device=device)
        else:
            src = _fill(0, args, dtype, device, False)
        self._init(src._data, False)

    def _init(self, data, req):
        self._data = data
        self.requires_grad = req
        self._grad = None
        self.grad_fn = None
        self._output_nr = 0
        self._vc = [0]
        self._base = None
        self._accum = None
        self._hooks = None
        self._post_hooks = None
        self._retains = False

    @classmethod
    def _make(cls, data, req, fn):
        t = object.__new__(Tensor)
        if type(data) is not _ndarray and isinstance(data, np.generic):
            data = np.asarray(data)
        t._data = data
        t.requires_grad = req
        t._grad = None
        t.grad_fn = fn
        t._output_nr = 0
        t._vc = [0]
        t._base = None
        t._accum = None
        t._hooks = None
        t._post_hooks = None
        t._retains = False
        return t

    @classmethod
    def _wrap(cls, data):
        return cls._make(data, False, None)

    def _alias(self):
        """A new untracked tensor over the same memory and version counter."""
        t = Tensor._make(self._data, False, None)
        t._vc = self._vc
        t._base = self if self._base is None else self._base
        return t

    def _xp(self):
        return B.get_array_module(self._data)

    # -------------------------------------------------------- properties --
    @property
    def data(self):
        t = Tensor._make(self._data, False, None)
        t._base = self if self._base is None else self._base
        return t

    @data.setter
    def data(self, value):
        if not isinstance(value, Tensor):
            raise TypeError(f"data must be a Tensor, not "
                            f"{type(value).__name__}")
        self._data = value._data

    @property
    def grad(self):
        return self._grad

    @grad.setter
    def grad(self, value):
        if value is not None:
            if not isinstance(value, Tensor):
                raise TypeError(f"assigned grad expected to be a Tensor or "
                                f"None but got grad of type "
                                f"{type(value).__name__}")
            if value.shape != self.shape:
                raise RuntimeError(
                    f"assigned grad has data of a different size: "
                    f"{list(value.shape)} for a tensor of size "
                    f"{list(self.shape)}")
            if value.device != self.device:
                raise RuntimeError(
                    f"assigned grad has data located on {value.device}, "
                    f"different from the tensor's device {self.device}")
        self._grad = value

    @property
    def shape(self):
        return Size(self._data.shape)

    def size(self, dim=None):
        if dim is None:
            return Size(self._data.shape)
        return self._data.shape[self._dim(dim)]

    @property
    def dtype(self):
        return B.from_np(self._data.dtype)

    @property
    def device(self):
        return B.device_of(self._data)

    @property
    def is_cuda(self):
        return self.device.type == "cuda"

    @property
    def is_leaf(self):
        return self.grad_fn is None

    @property
    def ndim(self):
        return self._data.ndim

    def dim(self):
        return self._data.ndim

    ndimension = dim

    def numel(self):
        return int(self._data.size)

    nelement = numel

    def element_size(self):
        return self._data.itemsize

    @property
    def itemsize(self):
        return self._data.itemsize

    @property
    def nbytes(self):
        return self._data.nbytes

    @property
    def _version(self):
        return self._vc[0]

    def _bump_version(self):
        """Record an in-place change of this tensor's memory (shared with
        its views): the one place that advances the version counter, so
        that backward detects a modified saved tensor."""
        self._vc[0] += 1
        if _function._capture is not None:    # a dtorch.compile capture
            _function._capture.mutated(self)

    def is_floating_point(self):
        return self.dtype.is_floating_point

    def is_contiguous(self, memory_format=None):
        return bool(self._data.flags.c_contiguous)

    def stride(self, dim=None):
        st = tuple(s // self._data.itemsize for s in self._data.strides)
        return st if dim is None else st[self._dim(dim)]

    def data_ptr(self):
        if B.is_cupy_array(self._data):
            return self._data.data.ptr
        return self._data.ctypes.data

    def get_device(self):
        d = self.device
        return -1 if d.type == "cpu" else (d.index or 0)

    def _dim(self, d, ndim=None):
        n = self._data.ndim if ndim is None else ndim
        m = max(n, 1)
        if not -m <= d < m:
            raise IndexError(
                f"Dimension out of range (expected to be in range of "
                f"[{-m}, {m - 1}], but got {d})")
        return d % m

    # ------------------------------------------------------- conversions --
    def item(self):
        if self._data.size != 1:
            raise RuntimeError(
                f"a Tensor with {self._data.size} elements cannot be "
                f"converted to Scalar")
        if _function._capture is not None:    # a graph break
            _function._capture.host_read(self, "Tensor.item()")
        if B._pending_checks:
            B.flush_checks()    # a host sync: deferred device checks raise
        return self._data.reshape(()).item()

    def tolist(self):
        if _function._capture is not None:
            _function._capture.host_read(self, "Tensor.tolist()")
        if B.is_cupy_array(self._data):
            B.flush_checks()
            return self._data.get().tolist()
        return self._data.tolist()

    def numpy(self, force=False):
        if self.requires_grad and not force:
            raise RuntimeError(
                "Can't call numpy() on Tensor that requires grad. Use "
                "tensor.detach().numpy() instead.")
        if _function._capture is not None:
            _function._capture.host_read(self, "Tensor.numpy()")
        if B.is_cupy_array(self._data):
            if not force:
                raise TypeError(
                    f"can't convert {self.device} device type tensor to "
                    f"numpy. Use Tensor.cpu() to copy the tensor to host "
                    f"memory first.")
            B.flush_checks()
            return self._data.get()
        return self._data

    def __array__(self, dtype=None, copy=None):
        a = self.detach().cpu()._data
        return a if dtype is None else a.astype(dtype)

    def to(self, *args, **kwargs):
        """to(device), to(dtype), to(device, dtype), to(other_tensor)."""
        dev = kwargs.get("device")
        dt = kwargs.get("dtype")
        copy = kwargs.get("copy", False)
        for a in args:
            if isinstance(a, Tensor):
                dev, dt = a.device, a.dtype
            elif isinstance(a, B.dtype) or (
                    isinstance(a, type) and issubclass(a, np.generic)):
                dt = a
            elif a is not None:
                dev = a
        t = self
        if dev is not None:
            dev = B.to_device(dev).resolve()   # 'cuda': the current device
            if dev != t.device:
                t = P.ToDevice.apply(t, device=dev)
        if dt is not None:
            dt = B.to_dtype(dt)
            if dt.np != t._data.dtype:
                if dt is B.bfloat16 and t.is_cuda:
                    B.check_cuda_dtype(dt)
                t = P.Cast.apply(t, np_dtype=dt.np)
                if t.requires_grad and not dt.is_floating_point:
                    t = t.detach()     # integers never require grad (torch)
        if copy and t is self:
            t = self.clone()
        return t

    def cpu(self):
        return self.to("cpu")

    def cuda(self, device=None, non_blocking=False):
        if isinstance(device, int):
            device = B.device("cuda", device)
        return self.to(device or "cuda")

    def type(self, dtype=None):
        if dtype is None:
            return {"float32": "dtorch.FloatTensor",
                    "float64": "dtorch.DoubleTensor",
                    "float16": "dtorch.HalfTensor",
                    "int64": "dtorch.LongTensor",
                    "int32": "dtorch.IntTensor",
                    "bool": "dtorch.BoolTensor"}.get(self.dtype.name,
                                                     str(self.dtype))
        if isinstance(dtype, str) and dtype.endswith("Tensor"):
            # t.type('torch.LongTensor') (dtorch/_legacy.py)
            dtype = _LEGACY_DTYPES[dtype.rsplit(".", 1)[-1]]
        return self.to(getattr(dtype, "_legacy_dtype", dtype))

    def float(self):
        return self.to(B.float32)

    def double(self):
        return self.to(B.float64)

    def half(self):
        return self.to(B.float16)

    def bfloat16(self):
        return self.to(B.bfloat16)

    def long(self):
        return self.to(B.int64)

    def int(self):
        return self.to(B.int32)

    def bool(self):
        return self.to(B.bool_)

    def type_as(self, other):
        return self.to(other.dtype)

    def clone(self, memory_format=None):
        return P.Cast.apply(self, np_dtype=self._data.dtype)

    def detach(self):
        t = Tensor._make(self._data, False, None)
        t._vc = self._vc
        t._base = self if self._base is None else self._base
        return t

    def detach_(self):
        self.grad_fn = None
        self.requires_grad = False
        return self

    def requires_grad_(self, requires_grad=True):
        if requires_grad and not self.dtype.is_floating_point:
            raise RuntimeError(
                f"only Tensors of floating point dtype can require "
                f"gradients, got {self.dtype}")
        if not requires_grad and self.grad_fn is not None:
            raise RuntimeError(
                "you can only change requires_grad flags of leaf variables. "
                "If you want to use a computed variable in a subgraph that "
                "doesn't require differentiation use var_no_grad = "
                "var.detach().")
        self.requires_grad = requires_grad
        return self

    def contiguous(self, memory_format=None):
        if self._data.flags.c_contiguous:
            return self
        return P.Copy.apply(self)

    # --------------------------------------------------------- autograd ---
    def backward(self, gradient=None, retain_graph=None, create_graph=False,
                 inputs=None):
        """Accumulate the gradient of this tensor into the leaves' ``.grad``.

        Example::

            x = dtorch.tensor(2.0, requires_grad=True)
            (x * 3 + 1).backward()
            x.grad          # tensor(3.)
        """
        _backward(self, gradient, retain_graph, create_graph, inputs=inputs)

    def register_hook(self, hook):
        """Call ``hook(grad)`` when this tensor's gradient is computed; a
        returned tensor replaces the gradient."""
        if not self.requires_grad:
            raise RuntimeError("cannot register a hook on a tensor that "
                               "doesn't require gradient")
        if self.grad_fn is not None:
            fn = self.grad_fn
            if fn._hooks is None:
                fn._hooks = {}
            lst = fn._hooks.setdefault(self._output_nr, [])
        else:
            if self._hooks is None:
                self._hooks = []
            lst = self._hooks
        # autograd calls hooks with arrays (dtorch/autograd/function.py)
        h = _GradHook(hook)
        lst.append(h)
        return _RemovableHandle(lst, h)

    def register_post_accumulate_grad_hook(self, hook):
        """Call ``hook(tensor)`` after the gradient has been accumulated into
        this leaf's ``.grad`` (DDP uses this to start all-reduces early)."""
        if self.grad_fn is not None:
            raise RuntimeError("post accumulate grad hooks cannot be "
                               "registered on non-leaf tensors")
        if self._post_hooks is None:
            self._post_hooks = []
        self._post_hooks.append(hook)
        return _RemovableHandle(self._post_hooks, hook)

    def retain_grad(self):
        if self.grad_fn is None or self._retains:
            return
        ref = weakref.ref(self)

        def keep(g):
            t = ref()
            if t is not None:
                g = g.detach().clone()
                t._grad = g if t._grad is None else t._grad + g
        self._retains = True
        self.register_hook(keep)

    @property
    def retains_grad(self):
        return self._retains

    # ------------------------------------------------------- arithmetic ---
    # the other operand is most often a tensor: tested inline, as
    # _operand's call costs more than the test on tiny tensors
    def __add__(self, other):
        return P.Add.apply(self, other if isinstance(other, _TensorBase)
                            else _operand(other, self))

    def __radd__(self, other):
        return P.Add.apply(_operand(other, self), self)

    def __sub__(self, other):
        return P.Sub.apply(self, other if isinstance(other, _TensorBase)
                            else _operand(other, self))

    def __rsub__(self, other):
        return P.Sub.apply(_operand(other, self), self)

    def __mul__(self, other):
        return P.Mul.apply(self, other if isinstance(other, _TensorBase)
                            else _operand(other, self))

    def __rmul__(self, other):
        return P.Mul.apply(_operand(other, self), self)

    def __truediv__(self, other):
        return P.Div.apply(self, other if isinstance(other, _TensorBase)
                            else _operand(other, self))

    def __rtruediv__(self, other):
        return P.Div.apply(_operand(other, self), self)

    def __pow__(self, other):
        return P.Pow.apply(self, other if isinstance(other, _TensorBase)
                            else _operand(other, self))

    def __rpow__(self, other):
        return P.Pow.apply(_operand(other, self), self)

    def __matmul__(self, other):
        return P.MatMul.apply(self, other if isinstance(other, _TensorBase)
                               else _operand(other, self))

    def __rmatmul__(self, other):
        return P.MatMul.apply(_operand(other, self), self)

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
        if not isinstance(o, Tensor):      # a number: a 0-d operand
            o = Tensor._wrap(self._xp().asarray(o))
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
        if self.ndim != 2 or other.ndim != 2:
            raise RuntimeError(f"mm: expected 2D tensors, got {self.ndim}D "
                               f"and {other.ndim}D")
        return self @ other

    def bmm(self, other):
        if self.ndim != 3 or other.ndim != 3:
            raise RuntimeError(f"batch1 and batch2 must be 3D tensors, got "
                               f"{self.ndim}D and {other.ndim}D")
        return self @ other

    @_function.autocast_op("none")      # not lowered (PyTorch's lists)
    def dot(self, other):
        if self.ndim != 1 or other.ndim != 1:
            raise RuntimeError(f"1D tensors expected, but got {self.ndim}D "
                               f"and {other.ndim}D tensors")
        return self @ other

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
        if isinstance(min, Tensor) or isinstance(max, Tensor):
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
        return Tensor._wrap(self._xp().isnan(self._data))

    @B.on_own_device
    def isinf(self):
        return Tensor._wrap(self._xp().isinf(self._data))

    @B.on_own_device
    def isfinite(self):
        return Tensor._wrap(self._xp().isfinite(self._data))

    def nan_to_num(self, nan=0.0, posinf=None, neginf=None):
        return P.NanToNum.apply(self, nan=nan, posinf=posinf, neginf=neginf)

    # ------------------------------------------------------- comparison ---
    @B.on_own_device
    @_function.array_source      # a dtorch.compile replay compares again
    def _cmp(self, ufunc_name, other):
        o = _operand(other, self)
        x, y = P.promote(self._data, _arr(o), ufunc_name)
        return Tensor._wrap(getattr(self._xp(), ufunc_name)(x, y))

    def __eq__(self, other):
        if other is None:
            return False
        return self._cmp("equal", other)

    def __ne__(self, other):
        if other is None:
            return True
        return self._cmp("not_equal", other)

    def __lt__(self, other):
        return self._cmp("less", other)

    def __le__(self, other):
        return self._cmp("less_equal", other)

    def __gt__(self, other):
        return self._cmp("greater", other)

    def __ge__(self, other):
        return self._cmp("greater_equal", other)

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
        if not isinstance(other, Tensor):
            raise TypeError(f"isclose(): argument 'other' (position 1) must "
                            f"be Tensor, not {type(other).__name__}")
        if other.dtype is not self.dtype:
            raise RuntimeError(f"{P.base.dtype_name(self._data.dtype)} did "
                               f"not match "
                               f"{P.base.dtype_name(other._data.dtype)}")
        return Tensor._wrap(self._xp().isclose(self._data, _arr(other), rtol,
                                               atol, equal_nan))

    @B.on_own_device
    def _logical(self, name, other):
        o = _arr(_operand(other, self))
        return Tensor._wrap(getattr(self._xp(), name)(self._data, o))

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
        return Tensor._wrap(~self._data)

    @B.on_own_device
    def logical_not(self):
        return Tensor._wrap(self._xp().logical_not(self._data))

    def logical_and(self, other):
        return self._logical("logical_and", other)

    def logical_or(self, other):
        return self._logical("logical_or", other)

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
        if isinstance(dim, Tensor):   # max(other): elementwise
            return (P.Minimum if is_min else P.Maximum).apply(self, dim)
        vals = P.MaxDim.apply(self, dim=dim, keepdim=keepdim, is_min=is_min)
        fn = vals.grad_fn
        idx = self._minmax_idx(dim, keepdim, is_min) if fn is None else \
            Tensor._wrap(fn.indices)
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
            return Tensor._wrap(out)
        d = self._dim(dim)
        if self.ndim == 0:
            return Tensor._wrap(xp.zeros((), np.int64))
        out = getattr(xp, fn)(self._data, axis=d, keepdims=keepdim)
        return Tensor._wrap(out.astype(np.int64, copy=False))

    def argmax(self, dim=None, keepdim=False):
        return self._arg("argmax", dim, keepdim)

    def argmin(self, dim=None, keepdim=False):
        return self._arg("argmin", dim, keepdim)

    @B.on_own_device
    def all(self, dim=None, keepdim=False):
        return Tensor._wrap(self._xp().asarray(self._data.astype(bool).all(
            axis=None if dim is None else self._dim(dim), keepdims=keepdim)))

    @B.on_own_device
    def any(self, dim=None, keepdim=False):
        return Tensor._wrap(self._xp().asarray(self._data.astype(bool).any(
            axis=None if dim is None else self._dim(dim), keepdims=keepdim)))

    @B.on_own_device
    def count_nonzero(self, dim=None):
        return Tensor._wrap(self._xp().asarray(self._xp().count_nonzero(
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

    # --------------------------------------------------------- movement ---
    def view(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], (B.dtype, type)):
            raise NotImplementedError("view(dtype) is not supported")
        shape = _dims(shape)
        if not self._data.flags.c_contiguous and self.numel() > 1:
            try:
                B.reshape_view(self._data, self._infer(shape))
            except ValueError:
                raise RuntimeError(
                    "view size is not compatible with input tensor's size "
                    "and stride (at least one dimension spans across two "
                    "contiguous subspaces). Use .reshape(...) instead.")
        return P.Reshape.apply(self, shape=self._infer(shape))

    def _infer(self, shape):
        shape = tuple(map(int, shape))
        if shape.count(-1) > 1:
            raise RuntimeError("only one dimension can be inferred")
        n = self._data.size
        if -1 in shape:
            rest = 1
            for s in shape:
                if s != -1:
                    rest *= s
            if rest == 0 or n % rest:
                raise RuntimeError(f"shape '{list(shape)}' is invalid for "
                                   f"input of size {n}")
            shape = tuple(n // rest if s == -1 else s for s in shape)
        elif math.prod(shape) != n:
            raise RuntimeError(f"shape '{list(shape)}' is invalid for "
                               f"input of size {n}")
        return shape

    def reshape(self, *shape):
        shape = self._infer(_dims(shape))
        if shape == self._data.shape:
            return self
        return P.Reshape.apply(self, shape=shape)

    def view_as(self, other):
        return self.view(other.shape)

    def reshape_as(self, other):
        return self.reshape(other.shape)

    def flatten(self, start_dim=0, end_dim=-1):
        if self.ndim == 0:
            return self.reshape(1)
        s = self._dim(start_dim)
        e = self._dim(end_dim)
        if s > e:
            raise RuntimeError("flatten() has invalid args: start_dim cannot "
                               "come after end_dim")
        shp = self.shape
        return self.reshape(shp[:s] + (Size(shp[s:e + 1]).numel(),)
                            + shp[e + 1:])

    def unflatten(self, dim, sizes):
        d = self._dim(dim)
        shp = self.shape
        return self.reshape(shp[:d] + tuple(sizes) + shp[d + 1:])

    def permute(self, *dims):
        dims = _dims(dims)
        if len(dims) != self.ndim:
            raise RuntimeError(
                f"permute: number of dimensions in the tensor input does "
                f"not match the length of the desired ordering of "
                f"dimensions i.e. input.dim() = {self.ndim} is not equal "
                f"to len(dims) = {len(dims)}")
        dims = tuple(self._dim(d) for d in dims)
        if len(set(dims)) != len(dims):
            raise RuntimeError("permute(): duplicate dims are not allowed.")
        return P.Permute.apply(self, dims=dims)

    def transpose(self, dim0, dim1):
        nd = self._data.ndim
        if nd == 0:
            return self
        order = list(range(nd))
        a, b = self._dim(dim0), self._dim(dim1)
        order[a], order[b] = order[b], order[a]
        return P.Permute.apply(self, dims=tuple(order))

    swapaxes = transpose

    def t(self):
        nd = self._data.ndim
        if nd > 2:
            raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, "
                               f"but self is {nd}D")
        # a view also for 0-d/1-d (never self), as PyTorch
        return self[...] if nd < 2 else self.transpose(0, 1)

    @property
    def T(self):
        return self.permute(tuple(reversed(range(self.ndim))))

    @property
    def mT(self):
        return self.transpose(-2, -1)

    def unsqueeze(self, dim):
        d = self._dim(dim, self.ndim + 1)
        shp = self.shape
        return P.Reshape.apply(self, shape=shp[:d] + (1,) + shp[d:])

    def squeeze(self, dim=None):
        shp = self.shape
        if dim is None:
            new = tuple(s for s in shp if s != 1)
        else:
            dims = (dim,) if isinstance(dim, int) else dim
            ds = {self._dim(d) for d in dims} if self.ndim else set()
            new = tuple(s for i, s in enumerate(shp)
                        if not (i in ds and s == 1))
        if new == shp:
            return self[...]      # a view (never self), as PyTorch
        return P.Reshape.apply(self, shape=new)

    def expand(self, *sizes):
        sizes = _dims(sizes)
        shp = self.shape
        if len(sizes) < len(shp):
            raise RuntimeError(
                f"expand: the number of sizes provided ({len(sizes)}) must "
                f"be greater or equal to the number of dimensions in the "
                f"tensor ({len(shp)})")
        lead = len(sizes) - len(shp)
        out = []
        for i, s in enumerate(sizes):
            cur = shp[i - lead] if i >= lead else 1
            if s == -1:
                if i < lead:
                    raise RuntimeError("expand: -1 not allowed in leading, "
                                       "non-existing dimension")
                s = cur
            elif cur != 1 and cur != s:
                raise RuntimeError(
                    f"The expanded size of the tensor ({s}) must match the "
                    f"existing size ({cur}) at non-singleton dimension {i}. "
                    f" Target sizes: {list(sizes)}.  Tensor sizes: "
                    f"{list(shp)}")
            out.append(s)
        return P.Expand.apply(self, shape=tuple(out))

    def expand_as(self, other):
        return self.expand(other.shape)

    def broadcast_to(self, shape):
        return self.expand(shape)

    def repeat(self, *sizes):
        sizes = _dims(sizes)
        if len(sizes) < self.ndim:
            raise RuntimeError(
                "Number of dimensions of repeat dims can not be smaller than "
                "number of dimensions of tensor")
        shape = (1,) * (len(sizes) - self.ndim) + tuple(self.shape)
        # repeat = a size-1 axis before each axis, expanded to the repeat
        # count, then merged: the gradient of expand sums the copies back
        ones_between, expanded = [], []
        for r, n in zip(sizes, shape):
            ones_between += [1, n]
            expanded += [r, n]
        t = self.reshape(ones_between).expand(expanded)
        return t.reshape([r * n for r, n in zip(sizes, shape)])

    def narrow(self, dim, start, length):
        d = self._dim(dim)
        n = self.shape[d]
        if start < 0:
            start += n
        if not 0 <= start <= n or length < 0 or start + length > n:
            raise RuntimeError(f"start ({start}) + length ({length}) exceeds "
                               f"dimension size ({n}).")
        key = (slice(None),) * d + (slice(start, start + length),)
        return self[key]

    def split(self, split_size_or_sections, dim=0):
        d = self._dim(dim)
        n = self.shape[d]
        if isinstance(split_size_or_sections, int):
            step = split_size_or_sections
            sizes = [builtins.min(step, n - i) for i in range(0, n, step)] \
                or [0]
        else:
            sizes = list(split_size_or_sections)
            if sum(sizes) != n:
                raise RuntimeError(
                    f"split_with_sizes expects split_sizes to sum exactly to "
                    f"{n} (input tensor's size at dimension {d}), but got "
                    f"split_sizes={sizes}")
        out, start = [], 0
        for s in sizes:
            out.append(self.narrow(d, start, s))
            start += s
        return tuple(out)

    def chunk(self, chunks, dim=0):
        n = self.shape[self._dim(dim)]
        if n == 0:          # PyTorch: ``chunks`` empty pieces
            return tuple(self.narrow(dim, 0, 0) for _ in range(chunks))
        step = -(-n // chunks)
        return self.split(builtins.max(step, 1), dim)

    def unbind(self, dim=0):
        d = self._dim(dim)
        return tuple(self[(slice(None),) * d + (i,)]
                     for i in range(self.shape[d]))

    def flip(self, *dims):
        dims = _dims(dims)
        key = [slice(None)] * self.ndim
        for d in dims:
            key[self._dim(d)] = slice(None, None, -1)
        return self[tuple(key)]

    def roll(self, shifts, dims=None):
        if dims is None:
            return self.flatten().roll(shifts, 0).view(self.shape)
        if isinstance(shifts, int):
            shifts, dims = (shifts,), (dims,)
        t = self
        for s, d in zip(shifts, dims):
            d = self._dim(d)
            n = self.shape[d]
            if n == 0:
                continue
            s %= n
            if s:
                a, b = t.split([n - s, s], d)
                t = P.Cat.apply(b, a, dim=d)
        return t

    @B.on_own_device
    def masked_fill(self, mask, value):
        m = _arr(mask)
        if not hasattr(m, "dtype") or m.dtype != np.bool_:
            raise RuntimeError(
                f"masked_fill_ only supports boolean masks, but got mask "
                f"with dtype {getattr(m, 'dtype', type(m).__name__)}")
        if isinstance(value, Tensor):
            if value.ndim != 0:
                raise RuntimeError(
                    f"masked_fill_ only supports a 0-dimensional value "
                    f"tensor, but got tensor with {value.ndim} dimension(s).")
            return P.Where.apply(m, value.to(self.dtype), self)
        if isinstance(value, float) and not self.dtype.is_floating_point:
            raise RuntimeError(f"value cannot be converted to type "
                               f"{self.dtype} without overflow")
        return P.Where.apply(m, self._xp().asarray(value, self._data.dtype),
                             self)

    def where(self, condition, other):
        return _where(_arr(condition), self, other)

    # --------------------------------------------------------- indexing ---
    @B.on_own_device
    def _key(self, key):
        """Turn tensors and lists inside an index into arrays."""
        if type(key) is tuple:
            return tuple(self._key1(k) for k in key)
        return self._key1(key)

    def _key1(self, k):
        if isinstance(k, Tensor):
            if type(k._data) is not type(self._data):
                raise RuntimeError(
                    f"indices should be either on cpu or on the same device "
                    f"as the indexed tensor ({self.device}), got {k.device}")
            if k._data.dtype.kind == "f":
                raise IndexError("tensors used as indices must be long, int, "
                                 "byte or bool tensors")
            return k._data
        if isinstance(k, list):
            return self._xp().asarray(k)
        if isinstance(k, np.ndarray) and not isinstance(self._data,
                                                        np.ndarray):
            return self._xp().asarray(k)
        return k

    def __getitem__(self, key):
        key = self._key(key)
        if P._is_basic(key):
            return P.IndexView.apply(self, key=key)
        return P.Index.apply(self, key=key)

    @B.on_own_device
    def __setitem__(self, key, value):
        key = self._key(key)
        if isinstance(value, Tensor):
            if type(value._data) is not type(self._data):
                raise P._device_error("index_put_", self._data, value._data)
            v = value
        else:
            v = self._xp().asarray(value, dtype=self._data.dtype) \
                if not isinstance(value, _SCALARS) else value
        if _state.enabled and (self.requires_grad or (
                isinstance(v, Tensor) and v.requires_grad)):
            if isinstance(v, Tensor) and v.dtype != self.dtype:
                v = v.to(self.dtype)
            self._rebase(lambda t: P.SetIndex.apply(t, v, key=key))
            return
        self._data[key] = _arr(v)
        self._bump_version()

    def __len__(self):
        if self.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self._data.shape[0]

    def __iter__(self):
        if self.ndim == 0:
            raise TypeError("iteration over a 0-d tensor")
        return iter(self.unbind(0))

    def __bool__(self):
        if self._data.size != 1:
            raise RuntimeError(
                "Boolean value of Tensor with more than one value is "
                "ambiguous")
        if _function._capture is not None:
            _function._capture.host_read(self, "bool(Tensor)")
        return bool(self._data.reshape(()))

    def __float__(self):
        return float(self.item())

    def __int__(self):
        return int(self.item())

    def __index__(self):
        if self.dtype.is_floating_point or self.numel() != 1:
            raise TypeError("only integer tensors of a single element can be "
                            "converted to an index")
        return int(self.item())

    def __contains__(self, element):
        return bool((self._data == _arr(element)).any())

    def __reduce_ex__(self, proto):
        raise TypeError("dtorch tensors are not pickled; use dtorch.save, "
                        "which writes safetensors files")

    def __deepcopy__(self, memo):
        # copy.deepcopy(model.state_dict()) is common PyTorch code; it
        # copies memory here, while pickling stays refused
        if not self.is_leaf:
            raise RuntimeError(
                "Only Tensors created explicitly by the user (graph leaves) "
                "support the deepcopy protocol at the moment.")
        if id(self) in memo:
            return memo[id(self)]
        t = object.__new__(type(self))
        t._init(self._data.copy(), self.requires_grad)
        memo[id(self)] = t
        if self._grad is not None:
            t._grad = copy.deepcopy(self._grad, memo)
        t.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return t

    # ---------------------------------------------------------- in-place --
    def _check_inplace(self):
        if _state.enabled and self.requires_grad and self.grad_fn is None:
            raise RuntimeError(
                "a leaf Variable that requires grad is being used in an "
                "in-place operation.")

    def _rebase(self, compute):
        """Run an in-place op as ``compute(old)`` out of place, write the
        result into this tensor's memory, and take over its graph node, so
        that backward sees the op (PyTorch's in-place semantics)."""
        self._check_inplace()
        if self._base is not None and (self._base.requires_grad
                                       or self.requires_grad):
            raise RuntimeError(
                "dtorch does not support autograd through an in-place "
                "operation on a view of a tensor that requires grad; use an "
                "out-of-place operation or clone() the view first")
        old = Tensor._make(_function.array_copy(self._data,
                                                self.requires_grad),
                           self.requires_grad, self.grad_fn)
        old._output_nr = self._output_nr
        res = compute(old)
        if res._data.dtype != self._data.dtype:
            self._check_cast(res._data.dtype)
        self._data[...] = res._data
        self._bump_version()
        if res.requires_grad:
            self.grad_fn = res.grad_fn
            self._output_nr = res._output_nr
            self.requires_grad = True
        return self

    def _check_cast(self, src):
        if not np.can_cast(src, self._data.dtype, "same_kind"):
            raise RuntimeError(
                f"result type {B.from_np(src).name.capitalize()} can't be "
                f"cast to the desired output type "
                f"{self.dtype.name.capitalize()}")

    def _tracked(self, *others):
        if not _state.enabled:
            return False
        if self.requires_grad:
            return True
        return any(isinstance(o, Tensor) and o.requires_grad for o in others)

    @B.on_own_device
    def _ufunc_(self, name, other):
        """self = self <op> other, in memory, without autograd."""
        o = _operand(other, self)
        oa = _arr(o)
        if isinstance(o, Tensor) and type(oa) is not type(self._data):
            raise P._device_error(name, self._data, oa)
        xp = self._xp()
        try:
            getattr(xp, name)(self._data, oa, out=self._data,
                              casting="same_kind")
        except TypeError:
            self._check_cast(xp.result_type(self._data, oa))
            raise
        except ValueError:
            raise RuntimeError(
                f"output with shape {list(self.shape)} doesn't match the "
                f"broadcast shape {list(np.broadcast_shapes(self.shape, np.shape(oa)))}") \
                from None
        self._bump_version()
        return self

    def add_(self, other, alpha=1):
        if self._tracked(other):
            return self._rebase(lambda t: t.add(other, alpha=alpha))
        if alpha != 1:
            other = _arr(_operand(other, self)) * alpha
        return self._ufunc_("add", other)

    def sub_(self, other, alpha=1):
        if self._tracked(other):
            return self._rebase(lambda t: t.sub(other, alpha=alpha))
        if alpha != 1:
            other = _arr(_operand(other, self)) * alpha
        return self._ufunc_("subtract", other)

    def mul_(self, other):
        if self._tracked(other):
            return self._rebase(lambda t: t * other)
        return self._ufunc_("multiply", other)

    def div_(self, other, rounding_mode=None):
        if self._tracked(other) or rounding_mode is not None:
            return self._rebase(lambda t: t.div(other, rounding_mode))
        if not self.dtype.is_floating_point:
            self._check_cast(np.dtype(np.float32))
        return self._ufunc_("true_divide", other)

    def pow_(self, exponent):
        if self._tracked(exponent):
            return self._rebase(lambda t: t ** exponent)
        return self._ufunc_("power", exponent)

    def __iadd__(self, other):
        return self.add_(other)

    def __isub__(self, other):
        return self.sub_(other)

    def __imul__(self, other):
        return self.mul_(other)

    def __itruediv__(self, other):
        return self.div_(other)

    def _unary_(self, method):
        if self._tracked():
            return self._rebase(lambda t: getattr(t, method)())
        res = getattr(self.detach(), method)()
        self._data[...] = res._data
        self._bump_version()
        return self

    def neg_(self):
        return self._unary_("neg")

    def exp_(self):
        return self._unary_("exp")

    def log_(self):
        return self._unary_("log")

    def sqrt_(self):
        return self._unary_("sqrt")

    def abs_(self):
        return self._unary_("abs")

    def tanh_(self):
        return self._unary_("tanh")

    def sigmoid_(self):
        return self._unary_("sigmoid")

    @B.on_own_device
    def relu_(self):
        if self._tracked():
            return self._rebase(lambda t: t.relu())
        self._xp().maximum(self._data, 0, out=self._data)
        self._bump_version()
        return self

    @B.on_own_device
    def clamp_(self, min=None, max=None):
        if self._tracked(min, max):
            return self._rebase(lambda t: t.clamp(min, max))
        self._data[...] = self.detach().clamp(min, max)._data
        self._bump_version()
        return self

    clip_ = clamp_

    @B.on_own_device
    def zero_(self):
        self._check_inplace()
        self._data.fill(0)
        self._bump_version()
        return self._overwritten()

    def _overwritten(self):
        """After an in-place fill (zero_, fill_, the random fills) a tensor
        in a graph keeps its place there with a zero derivative to what it
        held (PyTorch's FillBackward), not its old history's gradient."""
        if self.requires_grad and self.grad_fn is not None and \
                _state.enabled:
            new = self._data.copy()
            self._rebase(lambda old: P.Step.apply(
                old, None, lambda xp, x, y: new))
        return self

    @B.on_own_device
    def fill_(self, value):
        self._check_inplace()
        if isinstance(value, Tensor):
            value = value.item()
        self._data.fill(value)
        self._bump_version()
        return self._overwritten()

    @B.on_own_device
    def copy_(self, src, non_blocking=False):
        if not isinstance(src, Tensor):
            src = Tensor._wrap(self._xp().asarray(src))
        if self._tracked(src) and self.dtype.is_floating_point:
            # the old value gets a zero derivative (no t * 0: inf * 0 = NaN)
            return self._rebase(lambda t: P.Step.apply(
                t, None, lambda xp, x, y: xp.zeros_like(x))
                + src.to(device=self.device, dtype=self.dtype))
        self._check_inplace()
        a = src._data
        if type(a) is not np.ndarray or type(self._data) is not np.ndarray:
            a = self.device.send(a)     # from the host or another GPU
        try:
            self._data[...] = a
        except ValueError:
            raise RuntimeError(
                f"The size of tensor a ({list(self.shape)}) must match the "
                f"size of tensor b ({list(src.shape)}) (copy_)") from None
        self._bump_version()
        return self

    @B.on_own_device
    def masked_fill_(self, mask, value):
        if self._tracked(value):
            return self._rebase(lambda t: t.masked_fill(mask, value))
        self._data[...] = self.detach().masked_fill(mask, value)._data
        self._bump_version()
        return self

    @B.on_own_device
    def addcmul_(self, t1, t2, value=1):
        if self._tracked(t1, t2):
            return self._rebase(lambda t: t.addcmul(t1, t2, value))
        prod = _arr(t1) * _arr(t2)
        if value != 1:
            prod *= value
        return self._ufunc_("add", Tensor._wrap(prod))

    @B.on_own_device
    def addcdiv_(self, t1, t2, value=1):
        if self._tracked(t1, t2):
            return self._rebase(lambda t: t.addcdiv(t1, t2, value))
        q = _arr(t1) / _arr(t2)
        if value != 1:
            q *= value
        return self._ufunc_("add", Tensor._wrap(q))

    @B.on_own_device
    def lerp_(self, end, weight):
        if self._tracked(end, weight):
            return self._rebase(lambda t: t.lerp(end, weight))
        d = _arr(end) - self._data
        d *= _arr(weight)
        return self._ufunc_("add", Tensor._wrap(d))

    def maximum_(self, other):
        return self._ufunc_("maximum", other)

    # in-place random fills (nn.init builds on these)
    # drawn on the tensor's device by its generator, not on the host
    @B.on_own_device
    def uniform_(self, a=0.0, b=1.0, generator=None):
        return self._fill_random("uniform", a, b, generator=generator)

    @B.on_own_device
    def normal_(self, mean=0.0, std=1.0, generator=None):
        return self._fill_random("normal", mean, std, generator=generator)

    @B.on_own_device
    def bernoulli_(self, p=0.5, generator=None):
        self._check_inplace()
        u = _draw("random", size=self.shape, device=self.device,
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
        return self._fill_random("integers", low, high, generator=generator,
                                 check=False)

    def _fill_random(self, method, *args, generator=None, check=True):
        if check:
            self._check_inplace()
        _draw_into(self._data, method, *args, device=self.device,
                   generator=generator, dtype=self._data.dtype)
        self._bump_version()
        return self._overwritten()

    # --------------------------------------------------------- new_* ------
    def new_zeros(self, *size, dtype=None, device=None, requires_grad=False):
        return _fill(0, size, dtype or self.dtype, device or self.device,
                     requires_grad)

    def new_ones(self, *size, dtype=None, device=None, requires_grad=False):
        return _fill(1, size, dtype or self.dtype, device or self.device,
                     requires_grad)

    def new_full(self, size, fill_value, dtype=None, device=None,
                 requires_grad=False):
        return _fill(fill_value, (tuple(size),), dtype or self.dtype,
                     device or self.device, requires_grad)

    def new_empty(self, *size, dtype=None, device=None, requires_grad=False):
        return self.new_zeros(*size, dtype=dtype, device=device,
                              requires_grad=requires_grad)

    def new_tensor(self, data, dtype=None, device=None, requires_grad=False):
        return tensor(data, dtype=dtype or self.dtype,
                      device=device or self.device,
                      requires_grad=requires_grad)

    # ------------- selection, scatter, triangles, scans, sampling, maths --
    # (dtorch/_tensor_methods/, by family: each is also dtorch.<name>)
    from ._tensor_methods import (  # noqa: E402
        tril, triu, tril_, triu_, sort, argsort, msort, topk, kthvalue,
        median, quantile, nanquantile, gather, take_along_dim, take, scatter,
        scatter_add, scatter_, scatter_add_, scatter_reduce, index_select,
        index_add, index_copy, index_fill, index_add_, index_copy_,
        index_fill_, index_put, index_put_, masked_select, masked_scatter,
        cumprod, cummax, cummin, logcumsumexp, diff, diagonal, diag,
        diag_embed, trace, outer, movedim, repeat_interleave, unfold,
        sum_to_size, erf, erfc, erfinv, asin, acos, atan, sinh, cosh, asinh,
        acosh, atanh, exp2, frac, sinc, logit, atan2, hypot, xlogy,
        remainder, fmod, floor_divide, float_power, logical_xor, bitwise_and,
        bitwise_or, bitwise_xor, bitwise_not, signbit, heaviside, copysign,
        nansum, nanmean, mv, addmm, baddbmm, addbmm, addmv, tile, unique,
        unique_consecutive, multinomial, bernoulli, exponential_, geometric_,
        log_normal_, cauchy_, squeeze_, unsqueeze_, t_, transpose_,
        is_complex, is_pinned, storage_offset, H, lgamma, digamma, nonzero,
        mode, put_, resize_)
    from ._tensor_methods import fmax, fmin, sgn  # noqa: E402
    from ._tensor_methods import (  # noqa: E402  (torch.linalg's older names)
        inverse, det, logdet, slogdet, cholesky, cholesky_solve,
        cholesky_inverse, qr, svd, pinverse, matrix_power, matrix_exp,
        cross)
    H = property(H)
    arctan2, arcsin, arccos, arctan = atan2, asin, acos, atan
    moveaxis = movedim
    # dense tensors are strided; SparseTensor (below) is the COO layout
    is_sparse = is_quantized = is_mkldnn = is_xpu = False
    layout = strided

    @property
    def is_meta(self):
        return type(self._data) is B.MetaArray

    def to_sparse(self, sparse_dim=None, *, layout=None):
        """The COO form: the non-zero entries (along the first
        ``sparse_dim`` dims; all when None)."""
        if layout not in (None, sparse_coo):
            raise NotImplementedError(f"to_sparse: layout {layout} is not "
                                      f"supported in dtorch (only "
                                      f"dtorch.sparse_coo)")
        return SparseTensor._from_dense(self, sparse_dim)

    def to_sparse_coo(self):
        return self.to_sparse()

    from ._tensor_methods.sparse import (  # noqa: E402  (they raise)
        coalesce, indices, values, is_coalesced, _nnz, _indices, _values,
        sparse_dim, dense_dim)

    def to_dense(self, dtype=None, *, masked_grad=None):
        return self if dtype is None else self.to(dtype)

    # --------------------------------------------------------- printing ---
    def __repr__(self):
        return format_tensor(self)

    __str__ = __repr__

    def __format__(self, spec):
        if self.ndim == 0:
            return format(self.item(), spec)
        return format(repr(self), spec)


def numpy_aliases(fn):
    """``fn`` also taking NumPy's ``axis=`` for ``dim=`` and ``keepdims=``
    for ``keepdim=``, as PyTorch's argument parser does wherever a
    function has a dim (keepdim) argument. A call without keywords costs
    one extra Python frame (~0.1 us)."""
    @functools.wraps(fn)
    def aliased(*args, **kwargs):
        if kwargs:
            if "axis" in kwargs:
                if "dim" in kwargs:
                    raise TypeError(f"{fn.__name__}() got both dim and "
                                    f"axis (an alias of dim)")
                kwargs["dim"] = kwargs.pop("axis")
            if "keepdims" in kwargs:
                if "keepdim" in kwargs:
                    raise TypeError(f"{fn.__name__}() got both keepdim and "
                                    f"keepdims (an alias of keepdim)")
                kwargs["keepdim"] = kwargs.pop("keepdims")
        return fn(*args, **kwargs)
    return aliased


# the reductions, scans and dim-taking methods NumPy users reach for
for _name in ("sum mean std var prod amax amin argmax argmin max min all "
              "any cumsum cumprod logsumexp nansum nanmean median mode "
              "count_nonzero softmax log_softmax sort argsort squeeze "
              "unsqueeze").split():
    setattr(Tensor, _name, numpy_aliases(getattr(Tensor, _name)))
del _name


class SparseTensor(SparseCOO, Tensor):
    """A sparse COO tensor (``layout == dtorch.sparse_coo``): made by
    ``dtorch.sparse_coo_tensor`` or ``Tensor.to_sparse``; its methods are
    ``SparseCOO``'s, and dense ops on it raise (it has no dense array)."""
    __slots__ = ()


class _GradHook:
    """A user's tensor hook as autograd calls it: array in, array out."""
    __slots__ = ("hook",)

    def __init__(self, hook):
        self.hook = hook

    def __call__(self, g):
        r = self.hook(Tensor._wrap(g))
        if r is None:
            return g
        return r._data if isinstance(r, Tensor) else r


class _RemovableHandle:
    def __init__(self, lst, item):
        self._lst, self._item = lst, item

    def remove(self):
        try:
            self._lst.remove(self._item)
        except ValueError:
            pass


