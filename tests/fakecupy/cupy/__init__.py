"""A strict, NumPy-backed stand-in for CuPy, for testing dtorch's CUDA path
on machines without a GPU (tests put ``tests/fakecupy`` on ``sys.path`` when
``DTORCH_FAKE_CUDA=1``; it is never part of the installed package).

It checks API use, not GPU results. What it enforces, each as CuPy 13.0 does
(see tests/test_fakecupy.py for the list, with the CuPy source it follows):
- arrays are not NumPy arrays: ``np.asarray(a)``/``__array__`` raise
  TypeError; ``a.get()``/``cupy.asnumpy(a)`` copy to the host; NumPy arrays
  given to a CuPy function or mixed into an operator raise TypeError;
- the namespace is CuPy 13.0's top level (``_names_v13.txt``, extracted from
  ``cupy/__init__.py`` at tag v13.0.0) intersected with what NumPy can back:
  e.g. no ``put_along_axis`` (added in 14.0), no ``bfloat16``; ndarray methods
  are CuPy's (``reshape`` takes no ``copy=``);
- arrays remember the device they were made on (``a.device.id``,
  ``a.data.device_id``); kernels run on the current device and an operand
  on another device raises ValueError (CuPy without peer access); views keep
  their base's device; ``asarray``/``copy`` bring an array to the current
  device;
- reductions return 0-d arrays, never NumPy scalars;
- dtype rules that differ from NumPy 2: Python and NumPy scalars in ufuncs
  follow CuPy 13's value-based casting (``float16 array + 1e5`` is float32,
  ``float32 array * np.float64(2)`` is float32); ``ufunc.at`` only for
  add/subtract/maximum/minimum and the dtypes CuPy's atomics support
  (``add.at`` on int64 raises TypeError); ``where`` needs an array
  condition; ufunc operands must be arrays or scalars (no lists);
- bfloat16, object and string dtypes are refused;
- ``cuda.Device`` (context manager, ``id``, ``use()``), ``Stream``,
  ``Event``, ``runtime.getDeviceCount()`` (2 fake devices, or
  DTORCH_FAKE_CUDA_DEVICES); the current device and stream are per thread,
  as in CUDA; ``cupy.cuda.nccl`` is absent (``from cupy.cuda import nccl``
  raises ImportError);
- ``cupy.random``: one RandomState per device (seed, RandomState, the
  sampling functions with CuPy's ``dtype=`` arguments);
- host-to-device copies are recorded (``_h2d``: the element count of
  every host array or list given to ``array``/``asarray`` or ``set``), so
  tests can check that data is made on the device, not copied there.
"""
import builtins as _bi
import os as _os
import types as _types
import weakref as _weakref

import numpy as _np

__version__ = "13.0.0"
_FAKE = True   # lets tests tell the stand-in from the real CuPy

_here = _os.path.dirname(__file__)
with open(_os.path.join(_here, "_names_v13.txt")) as _f:
    _CUPY_NAMES = frozenset(l.strip() for l in _f if l.strip())

from . import cuda  # noqa: E402
from .cuda import _current_device  # noqa: E402

# ------------------------------------------------------------- dtypes ----

_SUPPORTED_KINDS = "biuf c"


def _check_dtype(dt):
    if dt is None:
        return None
    d = _np.dtype(dt)
    if d.kind not in "biufc" or d.names is not None or d.name == "bfloat16":
        raise ValueError(f"Unsupported dtype {d}")
    return d


def _kind_score(dt):
    k = dt.kind
    if k == "b":
        return 0
    if k in "iu":
        return 1
    if k in "fc":
        return 2
    return -1


def _min_scalar_type(x):
    # CuPy's _min_scalar_type: a non-negative integer that fits the signed
    # type of the same size takes the signed one (NumPy gives unsigned)
    t = _np.min_scalar_type(x)
    if t.kind == "u" and x <= _np.iinfo(t.char.lower()).max:
        return _np.dtype(t.char.lower())
    return t


_SCALARS = (bool, int, float, complex, _np.generic)

# element counts of the latest host-to-device copies (tests read and
# clear it; bounded, so a long session does not grow it)
_h2d = __import__("collections").deque(maxlen=4096)


# ------------------------------------------------------ kernel counts ----

# kernel launches on stand-in arrays, by name: each ufunc call, each call
# of a cupy function, each __setitem__, and "fuse:<kernel_name>" per call
# of a fused function (whose inner ufunc calls are one kernel, not counted).
# Tests read it (and clear it) to assert how many kernels a step launches.
_launches = __import__("collections").Counter()
_fuse_state = __import__("threading").local()


def _fusing():
    return getattr(_fuse_state, "depth", 0) > 0


def _no_fuse(what):
    # inside cupy.fuse the arguments are symbolic variables: only ufuncs
    # (operators included) and where can be applied to them
    if _fusing():
        raise TypeError(f"{what} is not supported in cupy.fuse")


class _Fusion:
    """cupy.fuse's result: calling it with stand-in arrays runs the Python
    function once on them (NumPy semantics, each ufunc checked as outside)
    and counts ONE kernel launch; with NumPy arguments only it is the plain
    function, as in CuPy."""

    def __init__(self, func, kernel_name=None):
        self.func = func
        self.name = kernel_name or func.__name__
        self.__name__ = func.__name__
        self.__doc__ = func.__doc__

    def __call__(self, *args):
        for a in args:
            if not isinstance(a, (ndarray,) + _SCALARS):
                if isinstance(a, _np.ndarray):
                    break
                raise TypeError(f"Unsupported type {type(a)}")
        else:
            if _bi.any(isinstance(a, ndarray) for a in args):
                if _fusing():
                    raise TypeError("nested cupy.fuse call")
                _launches["fuse:" + self.name] += 1
                _fuse_state.depth = 1
                try:
                    return self.func(*args)
                finally:
                    _fuse_state.depth = 0
        return self.func(*args)


def fuse(*args, **kwargs):
    """cupy.fuse(*args, **kwargs): ``@fuse``, ``@fuse()`` or
    ``@fuse(kernel_name=...)``; the arguments are bound as CuPy binds them
    (cupy/_core/fusion.pyx: ``wrapper(f, kernel_name=None)``)."""
    import functools

    def wrapper(f, kernel_name=None):
        return _Fusion(f, kernel_name)

    if len(args) == 1 and not kwargs and callable(args[0]):
        return functools.update_wrapper(wrapper(args[0]), args[0])
    return lambda f: functools.update_wrapper(wrapper(f, *args, **kwargs), f)


# ------------------------------------------------------------- arrays ----

def _cur():
    return _current_device()


def _check_dev(a, dev):
    if a._dev != dev:
        raise ValueError(
            f"The device where the array resides ({a._dev}) is different "
            f"from the current device ({dev}). Peer access is unavailable "
            f"between these devices.")


def _wrap(x, dev=None):
    """NumPy results -> stand-in arrays on `dev` (the current device)."""
    if isinstance(x, _np.ndarray):
        if x.dtype.kind not in "biufc":
            raise ValueError(f"Unsupported dtype {x.dtype}")
        return ndarray._new(x, _cur() if dev is None else dev)
    if isinstance(x, _np.generic):
        return ndarray._new(_np.asarray(x), _cur() if dev is None else dev)
    if isinstance(x, tuple):
        return tuple(_wrap(v, dev) for v in x)
    if isinstance(x, list):
        return [_wrap(v, dev) for v in x]
    return x


def _unwrap(x, dev, allow_numpy=False):
    """Stand-in arrays -> NumPy (checked to be on `dev`); NumPy arrays are
    refused as data, as CuPy's functions refuse them (an integer vector
    is accepted where a shape, axes or indices go: allow_numpy)."""
    if isinstance(x, ndarray):
        _check_dev(x, dev)
        return x._a
    if isinstance(x, _np.ndarray) and not (
            allow_numpy and x.ndim <= 1 and x.dtype.kind in "iu"):
        raise TypeError(f"Unsupported type {type(x)}")
    if isinstance(x, (list, tuple)):
        return type(x)(_unwrap(v, dev, allow_numpy) for v in x)
    return x


def _unwrap_args(args, kw, dev):
    """The first argument is data; later ones may be shapes/axes/indices."""
    args = [_unwrap(a, dev, i > 0) for i, a in enumerate(args)]
    return args, {k: _unwrap(v, dev, True) for k, v in kw.items()}


# Device memory, as CuPy's pool sees it: the NumPy buffer behind each
# array (its base owner, shared by views) is one allocation from
# cuda.get_allocator() on the array's device, held until the buffer dies.
_held = {}


def _account(a, dev):
    while isinstance(a.base, _np.ndarray):
        a = a.base
    if id(a) in _held or not a.nbytes:
        return
    prev = cuda._current_device()
    cuda._tls.device = dev
    try:
        mem = cuda.get_allocator()(a.nbytes)
    finally:
        cuda._tls.device = prev
    key = id(a)
    _held[key] = mem
    _weakref.finalize(a, _held.pop, key, None)


class _MemoryPointer:
    __slots__ = ("ptr", "device_id")

    def __init__(self, ptr, device_id):
        self.ptr, self.device_id = ptr, device_id

    def __int__(self):
        return self.ptr


# CuPy 13's ndarray methods (cupy/_core/core.pyx); NumPy backs each one
_METHODS = frozenset("""
all any argmax argmin argpartition argsort astype clip compress conj
conjugate copy cumprod cumsum diagonal dot dump dumps fill flatten item
max mean min nonzero partition prod ptp put ravel repeat round searchsorted
sort squeeze std sum swapaxes take tobytes tofile tolist trace transpose
var view""".split())
# methods that return views of the array (they keep its device; all the
# others compute, on the current device)
_VIEWS = frozenset("diagonal squeeze swapaxes transpose view ravel".split())
# methods that move data without a kernel on the current device
_HOST_OUT = frozenset("item tolist tobytes tofile dump dumps".split())


class ndarray:
    """cupy.ndarray: a NumPy array that stays on its (fake) device."""
    __slots__ = ("_a", "_dev", "__weakref__")
    __array_priority__ = 100

    def __init__(self, shape, dtype=float, memptr=None, strides=None,
                 order="C"):
        if memptr is not None or strides is not None:
            raise NotImplementedError("stand-in: memptr/strides")
        self._a = _np.empty(shape, _check_dtype(dtype), order=order)
        self._dev = _cur()
        _account(self._a, self._dev)

    @classmethod
    def _new(cls, a, dev):
        self = object.__new__(cls)
        self._a = a
        self._dev = dev
        _account(a, dev)
        return self

    # ---- refusals: this is not a NumPy array
    def __array__(self, dtype=None, copy=None):
        raise TypeError(
            "Implicit conversion to a NumPy array is not allowed. Please use "
            "`.get()` to construct a NumPy array explicitly.")

    @property
    def __array_interface__(self):
        raise AttributeError("cupy.ndarray has no __array_interface__")

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        f = globals().get(ufunc.__name__)
        if not isinstance(f, _ufunc):
            return NotImplemented
        if method == "__call__":
            return f(*inputs, **kwargs)
        return getattr(f, method)(*inputs, **kwargs)

    def __array_function__(self, func, types, args, kwargs):
        f = globals().get(func.__name__)
        if f is None or func.__name__ not in _CUPY_NAMES or \
                func.__module__.split(".")[1:2] not in ([], ["_core"]):
            return NotImplemented
        return f(*args, **kwargs)

    # ---- attributes
    shape = property(lambda s: s._a.shape)
    dtype = property(lambda s: s._a.dtype)
    ndim = property(lambda s: s._a.ndim)
    size = property(lambda s: s._a.size)
    strides = property(lambda s: s._a.strides)
    itemsize = property(lambda s: s._a.itemsize)
    nbytes = property(lambda s: s._a.nbytes)
    flags = property(lambda s: s._a.flags)

    @shape.setter
    def shape(self, v):
        self._a.shape = v

    @property
    def T(self):
        return ndarray._new(self._a.T, self._dev)

    @property
    def real(self):
        return ndarray._new(self._a.real, self._dev)

    @property
    def imag(self):
        return ndarray._new(self._a.imag, self._dev)

    @property
    def base(self):
        return None

    @property
    def device(self):
        return cuda.Device(self._dev)

    @property
    def data(self):
        return _MemoryPointer(self._a.__array_interface__["data"][0],
                              self._dev)

    @property
    def __cuda_array_interface__(self):
        a = self._a
        return {"shape": a.shape, "typestr": a.dtype.str,
                "data": (a.__array_interface__["data"][0], False),
                "strides": None if a.flags.c_contiguous else a.strides,
                "version": 3}

    # ---- host transfers
    def get(self, stream=None, order="C", out=None, blocking=True):
        if out is not None:
            out[...] = self._a
            return out
        return _np.array(self._a, order=order)

    def set(self, arr, stream=None):
        if not isinstance(arr, _np.ndarray):
            raise TypeError(f"Only numpy.ndarray can be set to cupy.ndarray, "
                            f"got {type(arr)}")
        if arr.shape != self._a.shape:
            raise ValueError(f"Shape mismatch. Old shape: {self._a.shape}, "
                             f"new shape: {arr.shape}")
        if arr.dtype != self._a.dtype:
            raise TypeError(f"{arr.dtype} array cannot be set to "
                            f"{self._a.dtype} array")
        _h2d.append(arr.size)
        self._a[...] = arr

    # ---- methods
    def reshape(self, *shape, order="C"):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return ndarray._new(self._a.reshape(shape, order=order), self._dev)

    def __getattr__(self, name):
        if name not in _METHODS:
            raise AttributeError(
                f"'cupy.ndarray' object has no attribute '{name}'")
        meth = getattr(self._a, name)

        def call(*args, **kw):
            if name in _HOST_OUT:   # CuPy switches to the array's device
                return meth(*args, **kw)
            dev = self._dev if name in _VIEWS else _cur()
            if name not in _VIEWS:
                _check_dev(self, dev)
            out = kw.get("out")
            a, k = _unwrap_args((None,) + args, kw, dev)
            r = meth(*a[1:], **k)
            if out is not None:
                return out
            if name == "astype" and r is self._a:
                return self
            return _wrap(r, dev)
        return call

    def copy(self, order="C"):
        # CuPy copies onto the current device, from any device
        return ndarray._new(self._a.copy(order=order), _cur())

    def astype(self, dtype, order="K", casting=None, subok=None, copy=True):
        _check_dev(self, _cur())
        d = _check_dtype(dtype)
        if not copy and d == self._a.dtype:
            return self
        return ndarray._new(self._a.astype(d, order=order), _cur())

    def scatter_add(self, slices, value):
        add.at(self, slices, value)

    def __len__(self):
        return len(self._a)

    def __iter__(self):
        if self._a.ndim == 0:
            raise TypeError("iteration over a 0-d array")
        return (self[i] for i in range(len(self._a)))

    def __bool__(self):
        return bool(self._a)

    def __int__(self):
        return int(self._a)

    def __float__(self):
        return float(self._a)

    def __complex__(self):
        return complex(self._a)

    def __index__(self):
        raise TypeError("only integer scalar arrays can be converted to a "
                        "scalar index")

    def __repr__(self):
        return repr(self._a)

    def __str__(self):
        return str(self._a)

    def __format__(self, spec):
        return format(self._a if self._a.ndim else self._a.item(), spec)

    def __copy__(self):
        return self.copy()

    def __deepcopy__(self, memo):
        return self.copy()

    def __reduce__(self):
        return (array, (self.get(),))

    def __hash__(self):
        raise TypeError("unhashable type: 'cupy.ndarray'")

    # ---- indexing
    @staticmethod
    def _key(key, dev):
        if isinstance(key, tuple):
            return tuple(ndarray._key(k, dev) for k in key)
        if isinstance(key, ndarray):
            _check_dev(key, dev)
            return key._a
        if isinstance(key, _np.ndarray):
            # CuPy copies NumPy index arrays to the device; allowed
            return key
        if isinstance(key, list):
            return key
        return key

    @staticmethod
    def _wrap_oob(k, shape):
        """CuPy wraps out-of-bounds integer array indices around (docs:
        difference.rst "Out-of-bounds indices"); NumPy raises."""
        ks = k if isinstance(k, tuple) else (k,)
        if _bi.any(x is None or x is Ellipsis or (
                isinstance(x, _np.ndarray) and x.dtype == bool) for x in ks):
            return k
        out = []
        for i, x in enumerate(ks):
            if isinstance(x, (_np.ndarray, list)) and i < len(shape) and \
                    shape[i] and _np.asarray(x).dtype.kind in "iu":
                x = _np.asarray(x) % shape[i]
            out.append(x)
        return tuple(out) if isinstance(k, tuple) else out[0]

    def take(self, indices, axis=None, out=None):
        dev = _cur()
        _check_dev(self, dev)
        idx = _unwrap(indices, dev, True)
        n = self._a.size if axis is None else self._a.shape[axis]
        if n:
            idx = _np.asarray(idx) % n      # CuPy's take kernel wraps
        r = self._a.take(idx, axis=axis)
        if out is not None:
            out._a[...] = r
            return out
        return ndarray._new(_np.asarray(r), dev)

    def __getitem__(self, key):
        _no_fuse("indexing")
        k = self._wrap_oob(self._key(key, self._dev), self._a.shape)
        r = self._a[k]
        if isinstance(r, _np.generic):
            r = _np.asarray(r)      # CuPy returns 0-d arrays
        dev = self._dev if _np.shares_memory(r, self._a) else _cur()
        if dev != self._dev:
            _check_dev(self, dev)   # advanced indexing runs a kernel
        return ndarray._new(r, dev)

    def __setitem__(self, key, value):
        _no_fuse("indexing")
        _launches["setitem"] += 1
        dev = _cur()
        _check_dev(self, dev)
        k = self._wrap_oob(self._key(key, dev), self._a.shape)
        if isinstance(value, ndarray):
            _check_dev(value, dev)
            value = value._a
        elif isinstance(value, _np.ndarray):
            raise TypeError(f"Unsupported type {type(value)}")
        self._a[k] = value


def _binop(name, reflected=False, inplace=False):
    def op(self, other):
        f = globals()[name]
        if not isinstance(other, (ndarray,) + _SCALARS):
            if isinstance(other, _np.ndarray):
                raise TypeError(f"Unsupported type {type(other)}")
            return NotImplemented
        if inplace:
            return f(self, other, out=self)
        return f(other, self) if reflected else f(self, other)
    return op


for _op, _uf in [("add", "add"), ("sub", "subtract"), ("mul", "multiply"),
                 ("truediv", "true_divide"), ("floordiv", "floor_divide"),
                 ("mod", "remainder"), ("pow", "power"),
                 ("matmul", "matmul"), ("and", "bitwise_and"),
                 ("or", "bitwise_or"), ("xor", "bitwise_xor"),
                 ("lshift", "left_shift"), ("rshift", "right_shift")]:
    setattr(ndarray, f"__{_op}__", _binop(_uf))
    setattr(ndarray, f"__r{_op}__", _binop(_uf, reflected=True))
    setattr(ndarray, f"__i{_op}__", _binop(_uf, inplace=True))
for _op, _uf in [("lt", "less"), ("le", "less_equal"), ("gt", "greater"),
                 ("ge", "greater_equal"), ("eq", "equal"),
                 ("ne", "not_equal")]:
    setattr(ndarray, f"__{_op}__", _binop(_uf))
ndarray.__neg__ = lambda s: negative(s)
ndarray.__pos__ = lambda s: positive(s)
ndarray.__abs__ = lambda s: absolute(s)
ndarray.__invert__ = lambda s: invert(s)


# ------------------------------------------------------------- ufuncs ----

_AT_DTYPES = {
    # cupy/_core/_routines_indexing.pyx (v13.0.0), _scatter_op_single
    "add": ("int32", "float16", "float32", "float64", "uint32", "uint64"),
    "subtract": ("int32", "uint32"),
    "maximum": ("int32", "float32", "float64", "uint32", "uint64"),
    "minimum": ("int32", "float32", "float64", "uint32", "uint64"),
}


class _ufunc:
    """A CuPy ufunc backed by NumPy's, with CuPy 13's operand and dtype
    rules."""

    def __init__(self, npu):
        self._u = npu
        self.__name__ = npu.__name__
        self.name = "cupy_" + npu.__name__
        self.nin, self.nout, self.nargs = npu.nin, npu.nout, npu.nargs

    def __repr__(self):
        return f"<ufunc '{self.name}'>"

    def _operands(self, ins, dev, dtype):
        arrays, scalars = [], []
        for x in ins:
            if isinstance(x, ndarray):
                _check_dev(x, dev)
                arrays.append(x._a)
            elif isinstance(x, _SCALARS):
                scalars.append(x)
            else:
                raise TypeError(f"Unsupported type {type(x)}")
        if not scalars or dtype is not None:
            return [x._a if isinstance(x, ndarray) else x for x in ins]
        # CuPy 13 _check_should_use_min_scalar: value-based scalar types
        # when no scalar is of a higher kind than every array
        a_kind = _bi.max((_kind_score(a.dtype) for a in arrays), default=-1)
        s_kind = _bi.max(_kind_score(_np.asarray(s).dtype) for s in scalars)
        use_min = arrays and a_kind >= s_kind
        if not use_min:
            return [x._a if isinstance(x, ndarray) else _np.asarray(x)
                    for x in ins]
        # the scalar's minimal type only chooses the routine; its value is
        # passed at the routine's input type (the common type), not rounded
        # to the minimal type
        common = _np.result_type(*[a.dtype for a in arrays],
                                 *[_min_scalar_type(s) for s in scalars])
        return [x._a if isinstance(x, ndarray) else
                _np.asarray(x, dtype=common) for x in ins]

    def __call__(self, *args, out=None, dtype=None, **kw):
        dev = _cur()
        if _fusing():
            if self.__name__ == "matmul":
                raise TypeError("matmul is not supported in cupy.fuse")
        else:
            _launches[self.__name__] += 1
        ins, outs = args[:self.nin], args[self.nin:]
        if outs:
            out = outs[0] if len(outs) == 1 else outs
        ops = self._operands(ins, dev, dtype)
        if out is not None:
            for o in (out if isinstance(out, tuple) else (out,)):
                if not isinstance(o, ndarray):
                    raise TypeError("Output arguments must be cupy.ndarray")
                _check_dev(o, dev)
            kw["out"] = out._a if isinstance(out, ndarray) else tuple(
                o._a for o in out)
        if dtype is not None:
            kw["dtype"] = _check_dtype(dtype)
        if "casting" not in kw and out is not None:
            kw["casting"] = "unsafe"   # CuPy casts into out= freely
        with _np.errstate(all="ignore"):   # GPUs do not warn
            r = self._u(*ops, **kw)
        if out is not None:
            return out
        if isinstance(r, tuple):
            return tuple(ndarray._new(_np.asarray(v), dev) for v in r)
        return ndarray._new(_np.asarray(r), dev)

    def at(self, a, indices, b=None):
        allowed = _AT_DTYPES.get(self.__name__)
        if allowed is None:
            raise NotImplementedError(f"`{self.name}.at` is not supported yet")
        if not isinstance(a, ndarray):
            raise TypeError(f"Unsupported type {type(a)}")
        dev = _cur()
        _check_dev(a, dev)
        idx = ndarray._key(indices, dev)
        adv = _bi.any(isinstance(k, (_np.ndarray, list)) for k in
                  (idx if isinstance(idx, tuple) else (idx,)))
        if adv and a.dtype.name not in allowed:
            raise TypeError(f"cupy.{self.__name__}.at only supports "
                            f"{', '.join(allowed)} as data type")
        if isinstance(b, ndarray):
            _check_dev(b, dev)
            b = b._a
        elif isinstance(b, _np.ndarray):
            raise TypeError(f"Unsupported type {type(b)}")
        self._u.at(a._a, idx, b)

    def reduce(self, array, axis=0, dtype=None, out=None, keepdims=False):
        if self.__name__ not in ("add", "multiply"):
            raise NotImplementedError(
                f"`{self.name}.reduce` is not supported yet")
        m = array.sum if self.__name__ == "add" else array.prod
        return m(axis=axis, dtype=dtype, out=out, keepdims=keepdims)

    def accumulate(self, array, axis=0, dtype=None, out=None):
        if self.__name__ not in ("add", "multiply"):
            raise NotImplementedError(
                f"`{self.name}.accumulate` is not supported yet")
        m = array.cumsum if self.__name__ == "add" else array.cumprod
        return m(axis=axis, dtype=dtype, out=out)

    def reduceat(self, array, indices, axis=0, dtype=None, out=None):
        if self.__name__ != "add":
            raise NotImplementedError(
                f"`{self.name}.reduceat` is not supported yet")
        dev = _cur()
        return _wrap(_np.add.reduceat(_unwrap(array, dev),
                                      _unwrap(indices, dev), axis=axis,
                                      dtype=dtype), dev)

    def outer(self, A, B, **kw):
        if not (isinstance(A, ndarray) and isinstance(B, ndarray)):
            raise TypeError("Unsupported type")
        return self(A.reshape(A.shape + (1,) * B.ndim), B, **kw)


# ----------------------------------------------------------- functions ----

# functions that take host data (NumPy arrays, lists) and make device arrays
_FROM_HOST = frozenset("array asarray asanyarray".split())
# functions about dtypes and shapes: no kernel, no device check
_META = frozenset("""result_type can_cast promote_types min_scalar_type
dtype iinfo finfo issubdtype ndim shape size isscalar""".split())


def _fn(npf, name):
    if name in _META:
        def f(*args, **kw):
            args = [a._a if isinstance(a, ndarray) else a for a in args]
            return npf(*args, **kw)
    else:
        def f(*args, **kw):
            _no_fuse(f"cupy.{name}")
            _launches[name] += 1
            dev = _cur()
            if "dtype" in kw:
                _check_dtype(kw["dtype"])
            out = kw.get("out")
            a, k = _unwrap_args(args, kw, dev)
            r = npf(*a, **k)
            if out is not None:
                return out
            return _wrap(r, dev)
    f.__name__ = name
    f.__qualname__ = name
    return f


def array(obj, dtype=None, copy=True, order="K", subok=False, ndmin=0):
    dev = _cur()
    _check_dtype(dtype)
    if isinstance(obj, ndarray):
        if obj._dev != dev:
            obj = obj.copy()    # CuPy copies from another device
            copy = False
        a = obj._a.astype(dtype or obj.dtype, copy=copy)
        r = ndarray._new(a, dev) if a is not obj._a else obj
        if ndmin > r.ndim:
            r = r.reshape((1,) * (ndmin - r.ndim) + r.shape)
        return r
    if isinstance(obj, (list, tuple)) and _bi.any(
            isinstance(v, ndarray) for v in obj):
        obj = [v.get() if isinstance(v, ndarray) else v for v in obj]
    a = _np.array(obj, dtype=dtype, copy=True, order=order, ndmin=ndmin)
    if a.dtype.kind not in "biufc":
        raise ValueError(f"Unsupported dtype {a.dtype}")
    _h2d.append(a.size)     # host data copied to the device
    return ndarray._new(a, dev)


def asarray(a, dtype=None, order=None, *, blocking=False):
    return array(a, dtype, copy=False, order=order or "K")


asanyarray = asarray


def take(a, indices, axis=None, out=None):
    return a.take(indices, axis, out)


def take_along_axis(a, indices, axis):
    # CuPy 13 indexes with the fancy index built from `indices`: wraps
    dev = _cur()
    _check_dev(a, dev)
    _check_dev(indices, dev)
    if axis is None:
        arr, idx, axis = a._a.reshape(-1), indices._a, 0
    else:
        arr, idx = a._a, indices._a
    n = arr.shape[axis]
    return ndarray._new(_np.take_along_axis(arr, idx % n if n else idx,
                                            axis), dev)


def asnumpy(a, stream=None, order="C", out=None, blocking=True):
    if isinstance(a, ndarray):
        return a.get(stream=stream, order=order, out=out)
    return _np.asarray(a, order=order)


def get_array_module(*args):
    import numpy
    for a in args:
        if isinstance(a, ndarray):
            import cupy
            return cupy
    return numpy


def where(condition, x=None, y=None):
    # CuPy 13: _where_ufunc(condition.astype('?'), x, y): a Python bool
    # condition has no astype
    if x is None and y is None:
        return condition.nonzero()
    if x is None or y is None:
        raise ValueError("Must provide both 'x' and 'y' or neither.")
    if not isinstance(condition, ndarray):
        raise AttributeError(
            f"'{type(condition).__name__}' object has no attribute 'astype'")
    return _where_ufunc(condition.astype("?"), x, y)


class _WhereUfunc(_ufunc):
    def __init__(self):
        self.__name__ = self.name = "cupy_where"
        self.nin, self.nout, self.nargs = 3, 1, 4

        def w(c, x, y, **kw):
            out = kw.get("out")
            r = _np.where(c, x, y)
            if out is not None:
                out[...] = r
                return out
            return r
        self._u = w


_where_ufunc = _WhereUfunc()


def _unsupported(name):
    def f(*a, **k):
        raise NotImplementedError(
            f"cupy.{name} is not backed by the NumPy stand-in")
    f.__name__ = name
    return f


def get_default_memory_pool():
    return cuda._POOL


def get_default_pinned_memory_pool():
    return cuda._POOL


def is_available():
    return True


from types import SimpleNamespace as _NS  # noqa: E402

lib = _NS(stride_tricks=_NS(
    as_strided=lambda x, shape=None, strides=None: ndarray._new(
        _np.lib.stride_tricks.as_strided(x._a, shape, strides), x._dev)))
from numpy import newaxis, inf, nan, pi, e  # noqa: E402,F401

_HAND = {"fuse",
         "array", "asarray", "asanyarray", "asnumpy", "get_array_module",
         "take", "take_along_axis",
         "where", "ndarray", "cuda", "random", "linalg", "lib", "newaxis",
         "inf", "nan", "pi", "e", "is_available", "get_default_memory_pool",
         "get_default_pinned_memory_pool", "__version__"}

# the namespace: CuPy 13.0's names that NumPy can back
for _name in sorted(_CUPY_NAMES):
    if _name in _HAND or _name in globals():
        continue
    _obj = getattr(_np, _name, None)
    if _obj is None:
        if _name[0].islower():
            globals()[_name] = _unsupported(_name)
        continue
    if isinstance(_obj, _types.ModuleType):
        continue   # cupy.linalg, cupy.fft, ...: not backed
    if isinstance(_obj, _np.ufunc):
        globals()[_name] = _ufunc(_obj)
    elif isinstance(_obj, type) or not callable(_obj):
        globals()[_name] = _obj   # dtypes (float32, ...), constants
    else:
        globals()[_name] = _fn(_obj, _name)

ndarray.__divmod__ = lambda s, o: (floor_divide(s, o), remainder(s, o))  # noqa: F821

from . import random  # noqa: E402,F401
from . import linalg  # noqa: E402,F401
