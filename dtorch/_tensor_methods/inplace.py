"""Tensor's in-place methods: the maths (``add_``, ``clamp_``, ...),
``fill_``/``zero_``/``copy_``/``masked_fill_``, and the machinery that
gives them PyTorch's semantics under autograd (``_rebase``).
"""
import numpy as np

from .. import _backend as B
from .. import ops as P
from ..autograd import _capture
from ..autograd.grad_mode import _state
from ._common import _TensorBase, _arr, _operand


def _unary(name):
    """The in-place method ``t.<name>_()`` of the unary ``t.<name>()``."""
    def method(self):
        return self._unary_(name)
    method.__name__ = method.__qualname__ = name + "_"
    return method


class InplaceMethods:
    """Tensor's in-place methods."""
    __slots__ = ()

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
        old = self._make(_capture.array_copy(self._data,
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
        return any(isinstance(o, _TensorBase) and o.requires_grad for o in others)

    @B.on_own_device
    def _ufunc_(self, name, other):
        """self = self <op> other, in memory, without autograd."""
        o = _operand(other, self)
        oa = _arr(o)
        if isinstance(o, _TensorBase) and type(oa) is not type(self._data):
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

    # add_ and sub_ stay written out: optimizers' updates call them, and
    # a shared helper cost a call (1.34 -> 1.36-1.43 us per add_)
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

    neg_, exp_, log_, sqrt_, abs_, tanh_, sigmoid_ = (
        _unary(n) for n in ("neg", "exp", "log", "sqrt", "abs", "tanh",
                            "sigmoid"))

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
        if isinstance(value, _TensorBase):
            value = value.item()
        self._data.fill(value)
        self._bump_version()
        return self._overwritten()

    @B.on_own_device
    def copy_(self, src, non_blocking=False):
        if not isinstance(src, _TensorBase):
            src = self._wrap(self._xp().asarray(src))
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
        return self._ufunc_("add", self._wrap(prod))

    @B.on_own_device
    def addcdiv_(self, t1, t2, value=1):
        if self._tracked(t1, t2):
            return self._rebase(lambda t: t.addcdiv(t1, t2, value))
        q = _arr(t1) / _arr(t2)
        if value != 1:
            q *= value
        return self._ufunc_("add", self._wrap(q))

    @B.on_own_device
    def lerp_(self, end, weight):
        if self._tracked(end, weight):
            return self._rebase(lambda t: t.lerp(end, weight))
        d = _arr(end) - self._data
        d *= _arr(weight)
        return self._ufunc_("add", self._wrap(d))

    def maximum_(self, other):
        return self._ufunc_("maximum", other)
