"""``Tensor``: an array (NumPy or CuPy) plus autograd metadata.

The array lives in the ``_data`` slot. ``t.data`` is PyTorch's: a tensor that
shares memory with ``t`` and is not tracked by autograd. Every differentiable
method is composed from the primitives in ``dtorch/ops``.

Where a method lives (one rule):
- here, the class core: the slots and construction (``tensor()``,
  ``_make``, ``new_*``), metadata (shape, dtype, device, strides), the
  autograd state and hooks (``requires_grad_``, ``backward``,
  ``register_hook``), moves between devices, dtypes and layouts (``to``,
  ``clone``, ``detach``, ``contiguous``, ``to_sparse``), copying, pickling
  and printing: whatever makes or describes a tensor, and the methods that
  must name the ``Tensor`` class;
- every other method in the mixin of its API family, one class per file
  in ``dtorch/_tensor_methods/``, which ``Tensor`` inherits:
  ``maths`` (operators, elementwise maths, comparisons, logical ops),
  ``reduce`` (reductions, scans), ``shape`` (views, reshapes, movement),
  ``selection`` (indexing, gather/scatter, sort, masks), ``inplace``
  (``add_``, ``copy_``, ``fill_`` and their autograd rebase), ``linalg``,
  ``sampling`` (random draws and fills), ``convert`` (dtype shorthands,
  Python values) and ``sparse`` (the COO names on dense tensors).
A family method that is also a function ``dtorch.<name>`` is written as a
module function taking the tensor first and bound by ``@methods``; one that
is only a method is written in the mixin's body. The families sit below
this module: they know a tensor through autograd's ``TensorBase`` and make
new ones with ``self._wrap``. Lookup through the mixins costs nothing per
call (CPython caches attribute lookups per type).
"""
import copy
import weakref

import numpy as np

from . import _backend as B
from . import ops as P
from ._format import format_tensor
from ._tensor_methods._common import _arr, _dims, _infer_dtype, _operand, \
    _seq_dtype, _to_array
from ._tensor_methods._common import numpy_aliases  # noqa: F401 (dtorch.*)
from ._tensor_methods.convert import ConvertMethods
from ._tensor_methods.inplace import InplaceMethods
from ._tensor_methods.linalg import LinalgMethods
from ._tensor_methods.maths import MathsMethods
from ._tensor_methods.reduce import ReduceMethods
from ._tensor_methods.sampling import SamplingMethods
from ._tensor_methods.selection import SelectionMethods
from ._tensor_methods.shape import ShapeMethods
from .autograd import backward as _backward
from .autograd import _capture
from .autograd import function as _function
from ._tensor_methods.sparse import SparseCOO, SparseMethods, sparse_coo

_ndarray = np.ndarray


class Size(tuple):
    """Tensor shape, a tuple (``torch.Size``)."""

    def numel(self):
        n = 1
        for s in self:
            n *= s
        return n

    def __repr__(self):
        return f"dtorch.Size({list(self)})"




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


class Tensor(MathsMethods, ReduceMethods, ShapeMethods, SelectionMethods,
             InplaceMethods, LinalgMethods, SamplingMethods, ConvertMethods,
             SparseMethods, _function.TensorBase):
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
        # _make's fields, written out as there: a loop over the slots
        # made Parameter(...) 2.4x slower (0.5 -> 1.2 us)
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
        if _capture.active is not None:    # a dtorch.compile capture
            _capture.active.mutated(self)

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
        # ops.base.axis_of's check inline: size(dim), transpose, ... are
        # on the hot path (the call cost 0.02 of size(0)'s 0.23 us)
        n = self._data.ndim if ndim is None else ndim
        m = max(n, 1)
        if not -m <= d < m:
            raise P.base.dim_error(d, n)
        return d % m

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

    def clone(self, memory_format=None):
        return P.Cast.apply(self, np_dtype=self._data.dtype)

    def detach(self):
        """A new untracked tensor over the same memory and version counter."""
        t = Tensor._make(self._data, False, None)
        t._vc = self._vc
        t._base = self if self._base is None else self._base
        return t

    _alias = detach     # (autograd's TensorBase protocol)

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

    def where(self, condition, other):
        return _where(_arr(condition), self, other)

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


