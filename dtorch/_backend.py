"""The one place that maps devices to array modules (NumPy | CuPy) and dtorch
dtypes to array dtypes.

Op bodies call ``get_array_module(x)`` and nothing else about devices, in the
manner of chainer's ``backend.get_array_module``. CuPy is imported lazily: a
machine without it runs everything on the CPU and ``cuda.is_available()`` is
False.
"""
import sys
import threading

import numpy as np

from ._meta import MetaArray
from ._rank_local import RankLocal

# ---------------------------------------------------------------- CuPy ----

_cupy = None
_cupy_error = None
_cupy_tried = False


_cupy_hooks = []


def on_cupy_load(fn):
    """Call ``fn(cupy)`` once CuPy has loaded (now, if it has)."""
    _cupy_hooks.append(fn)
    if _cupy is not None:
        fn(_cupy)


def _load_cupy():
    global _cupy, _cupy_error, _cupy_tried
    if not _cupy_tried:
        _cupy_tried = True
        try:
            import cupy
            cupy.cuda.runtime.getDeviceCount()
            _cupy = cupy
        except Exception as e:  # ImportError, or CUDA driver errors
            _cupy_error = e
        else:
            for fn in _cupy_hooks:
                fn(cupy)
    return _cupy


def cupy_available():
    return _load_cupy() is not None


def current_cuda_index():
    """The CUDA device current in this thread (CuPy's ``Device().id``)."""
    return check_cuda_available().cuda.Device().id


# ----------------------------------------------- deferred device checks ----
# Input checks on device arrays (index ranges, target classes, probability
# ranges) must not stop the host at every forward (a `bool(x.any())` waits
# for the GPU). They are computed on the device and raised at the next point
# where the host waits anyway (item(), tolist(), .cpu(), cuda.synchronize())
# or every _CHECK_BATCH checks - PyTorch's CUDA kernels likewise report such
# errors asynchronously. On the CPU the checks raise at once.

_pending_checks = []
_CHECK_BATCH = 64


def check_or_defer(bad, make_error):
    """Raise ``make_error()`` if the 0-d bool array ``bad`` is true: now for
    a NumPy array, at the next synchronisation point for a device array."""
    if type(bad) is np.ndarray or not is_cupy_array(bad):
        if bad:
            raise make_error()
        return
    _pending_checks.append((bad, make_error))
    if len(_pending_checks) >= _CHECK_BATCH:
        flush_checks()


def flush_checks():
    """Raise the first failed deferred check (all are cleared)."""
    if not _pending_checks:
        return
    items = _pending_checks[:]
    del _pending_checks[:len(items)]
    for bad, make_error in items:
        if bool(bad):
            raise make_error()


# --------------------------------------------- CuPy version differences ----
# dtorch supports CuPy 13.x and 14.x (pyproject's cuda extras); these shims
# cover what 13.x lacks, so an op body is written once for both.

def put_along_axis(xp, arr, indices, values, axis):
    """``xp.put_along_axis`` (CuPy has it from 14.0 only)."""
    f = getattr(xp, "put_along_axis", None)
    if f is not None:
        return f(arr, indices, values, axis=axis)
    # NumPy's construction: an open mesh of aranges, `indices` along axis
    axis = axis % arr.ndim
    idx = []
    for d, n in enumerate(arr.shape):
        if d == axis:
            idx.append(indices)
        else:
            shape = [1] * arr.ndim
            shape[d] = n
            idx.append(xp.arange(n).reshape(shape))
    arr[tuple(idx)] = values


def reshape_view(a, shape):
    """A view of `a` with `shape`, or ValueError when that needs a copy
    (``reshape(copy=False)`` is NumPy >= 2.1 and CuPy >= 14.2 only; setting
    the shape of a view is the old spelling both libraries have)."""
    if type(a) is np.ndarray:
        return a.reshape(shape, copy=False)
    v = a.view()
    try:
        v.shape = shape
    except AttributeError as e:   # CuPy and NumPy say "incompatible shape"
        raise ValueError(str(e)) from None
    return v


def check_cuda_available():
    """Return the cupy module or raise with an install hint."""
    cp = _load_cupy()
    if cp is None:
        raise RuntimeError(
            "CUDA is not available: dtorch needs CuPy and an NVIDIA GPU for "
            "'cuda' tensors (in the dtorch clone: pip install -e '.[cuda12]' "
            f"or '.[cuda13]'). Import error: {_cupy_error!r}")
    return cp


def is_cupy_array(a):
    return _cupy is not None and isinstance(a, _cupy.ndarray)


def get_array_module(*arrays):
    """numpy or cupy, whichever owns the arrays (numpy for scalars)."""
    if _cupy is not None:
        for a in arrays:
            if isinstance(a, _cupy.ndarray):
                return _cupy
    return np


# -------------------------------------------------------------- dtypes ----

class dtype:
    """A dtorch dtype, e.g. ``dtorch.float32``; maps to a NumPy dtype."""
    __slots__ = ("name", "np", "is_floating_point", "is_complex",
                 "itemsize", "_kind", "_rank")

    def __init__(self, name, np_dtype, kind, rank):
        self.name = name
        self.np = np_dtype
        self._kind = kind      # 0 bool, 1 integer, 2 floating
        self._rank = rank      # order inside the kind, for promotion
        self.is_floating_point = kind == 2
        self.is_complex = False
        self.itemsize = np_dtype.itemsize if np_dtype is not None else 2

    @property
    def is_signed(self):
        return self._kind != 0 and self.name != "uint8"

    def to_real(self):
        return self

    def __repr__(self):
        return "dtorch." + self.name

    def __reduce__(self):
        return (_dtype_by_name, (self.name,))


bool_ = dtype("bool", np.dtype(np.bool_), 0, 0)
uint8 = dtype("uint8", np.dtype(np.uint8), 1, 0)
int8 = dtype("int8", np.dtype(np.int8), 1, 1)
int16 = dtype("int16", np.dtype(np.int16), 1, 2)
int32 = dtype("int32", np.dtype(np.int32), 1, 3)
int64 = dtype("int64", np.dtype(np.int64), 1, 4)
float16 = dtype("float16", np.dtype(np.float16), 2, 0)


class _LazyBfloat16(dtype):
    """bfloat16 until its array dtype is first asked for: NumPy has none, and
    importing ml_dtypes' costs 0.5-1.2 s of CPU, which every rank, test
    subprocess and ``--help`` would pay at ``import dtorch``. The first
    ``.np`` imports it, then the object becomes a plain ``dtype`` (no cost
    after that)."""
    __slots__ = ()

    @property
    def np(self):
        return _load_bfloat16()

    @np.setter
    def np(self, value):
        _NP_SLOT.__set__(self, value)


_NP_SLOT = dtype.__dict__["np"]
_bfloat16_hooks = []


def _load_bfloat16():
    """Import ml_dtypes once; the NumPy dtype of bfloat16 (None without
    ml_dtypes, a declared dependency)."""
    try:
        import ml_dtypes
        np_dtype = np.dtype(ml_dtypes.bfloat16)
    except ImportError:  # pragma: no cover
        np_dtype = None
    _NP_SLOT.__set__(bfloat16, np_dtype)
    bfloat16.__class__ = dtype
    if np_dtype is not None:
        _BY_NP[np_dtype] = bfloat16
        for hook in _bfloat16_hooks:
            hook(np_dtype)
    return np_dtype


def on_bfloat16(hook):
    """Call ``hook(numpy bfloat16 dtype)`` once ml_dtypes is loaded (now if
    it is): for tables keyed by array dtypes."""
    _bfloat16_hooks.append(hook)
    if type(bfloat16) is dtype and bfloat16.np is not None:
        hook(bfloat16.np)


def is_bfloat16_np(np_dtype):
    """Whether an array dtype is ml_dtypes' bfloat16 (no such array exists
    while ml_dtypes is not imported, so this never imports it)."""
    return "ml_dtypes" in sys.modules and np_dtype == bfloat16.np


bfloat16 = _LazyBfloat16("bfloat16", None, 2, 1)
float32 = dtype("float32", np.dtype(np.float32), 2, 2)
float64 = dtype("float64", np.dtype(np.float64), 2, 3)

ALL_DTYPES = (bool_, uint8, int8, int16, int32, int64,
              float16, bfloat16, float32, float64)
_BY_NAME = {d.name: d for d in ALL_DTYPES}
_BY_NP = {d.np: d for d in ALL_DTYPES if d is not bfloat16}   # its own: on load


def _dtype_by_name(name):
    return _BY_NAME[name]


# one per process, and one per thread rank (dtorch._rank_local)
_default_dtype = RankLocal(lambda: [float32])


def get_default_dtype():
    return _default_dtype.get()[0]


def set_default_dtype(d):
    d = to_dtype(d)
    if not d.is_floating_point:
        raise TypeError(f"only floating-point types are supported as the "
                        f"default type, got {d}")
    _default_dtype.get()[0] = d


def from_np(np_dtype):
    """dtorch dtype of a NumPy/CuPy array dtype."""
    try:
        return _BY_NP[np_dtype]
    except KeyError:
        if is_bfloat16_np(np_dtype):    # a caller's ml_dtypes array
            return bfloat16
        raise TypeError(f"dtorch has no dtype for array dtype {np_dtype}; "
                        f"supported: {', '.join(_BY_NAME)}") from None


def to_dtype(d):
    """Accept a dtorch dtype, a NumPy dtype/type or a name; return dtorch's."""
    if d is None or isinstance(d, dtype):
        return d
    if isinstance(d, str):
        name = d[6:] if d.startswith("torch.") else d
        name = {"float": "float32", "double": "float64", "half": "float16",
                "long": "int64", "int": "int32", "bool": "bool"}.get(name, name)
        if name in _BY_NAME:
            return _BY_NAME[name]
    if d is float:
        return _default_dtype.get()[0]
    if d is int:
        return int64
    if d is bool:
        return bool_
    try:
        return from_np(np.dtype(d))
    except TypeError:
        raise TypeError(f"unknown dtype {d!r}") from None


_FLOAT_BY_RANK = {0: float16, 1: bfloat16, 2: float32, 3: float64}


def promote_types(a, b):
    """PyTorch's promotion of two dtypes (float16 with bfloat16 gives float32)."""
    if a is b:
        return a
    if a._kind != b._kind:
        return a if a._kind > b._kind else b
    if a._kind == 2 and {a.name, b.name} == {"float16", "bfloat16"}:
        return float32
    if a._kind == 1 and "uint8" in (a.name, b.name):
        other = b if a.name == "uint8" else a
        return int16 if other.name == "int8" else other
    return a if a._rank > b._rank else b


_py_kind = {bool: 0, int: 1, float: 2}


def result_type(a, b, a_dim=True, b_dim=True):
    """Result dtype of a binary op between operands of dtypes a and b.

    Following PyTorch, dimensioned tensors take priority over zero-dim tensors
    and Python scalars of the same kind: ``int32 tensor + 0-dim int64 tensor``
    is int32, and a higher kind always wins: ``int tensor + 2.5`` is the
    default float dtype. A Python scalar is passed as its type (int, float or
    bool) with ``*_dim=False``.
    """
    if isinstance(a, type):
        a_kind, a_dim, a = _py_kind[a], False, None
    else:
        a_kind = a._kind
    if isinstance(b, type):
        b_kind, b_dim, b = _py_kind[b], False, None
    else:
        b_kind = b._kind
    if a_dim == b_dim or a_kind != b_kind:
        if a is not None and b is not None:
            if a_dim == b_dim:
                return promote_types(a, b)
            # different priority and kind: the higher kind wins
            if a_kind > b_kind:
                return a
            return b
        # a Python scalar involved
        known, known_kind = (a, a_kind) if a is not None else (b, b_kind)
        other_kind = b_kind if a is not None else a_kind
        if known is None:  # two Python scalars
            k = max(a_kind, b_kind)
            return (bool_, int64, _default_dtype.get()[0])[k]
        if known_kind >= other_kind:
            return known
        return int64 if other_kind == 1 else _default_dtype.get()[0]
    # same kind, different priority: the dimensioned one wins
    return a if a_dim else b


def numpy_dtype(d):
    """The array dtype for a dtorch dtype (None stays None)."""
    if d is None:
        return None
    return to_dtype(d).np


def check_cuda_dtype(d):
    """Raise for a dtype that CuPy cannot hold (bfloat16: no CuPy release
    up to 14.x has it)."""
    if d is bfloat16:
        raise TypeError(
            "bfloat16 tensors are not supported on CUDA devices: CuPy has "
            "no bfloat16 dtype; use float16 (with amp.GradScaler) or float32 "
            "on the GPU")


# ------------------------------------------------------------- devices ----

class _NullContext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_NULL_CONTEXT = _NullContext()

class device:
    """``dtorch.device('cpu')``, ``device('cuda')``, ``device('cuda', 1)``.

    Carries ``xp``, the array module of the device, and ``send(array)``, as
    chainer's ``Device`` does.
    """
    __slots__ = ("type", "index")

    def __init__(self, type_or_str, index=None):
        if isinstance(type_or_str, device):
            self.type, self.index = type_or_str.type, type_or_str.index
            return
        if isinstance(type_or_str, int):
            type_or_str, index = "cuda", type_or_str
        s = str(type_or_str)
        if ":" in s:
            if index is not None:
                raise ValueError(f"device string {s!r} already has an index")
            s, idx = s.split(":", 1)
            if not idx.isdigit():
                raise RuntimeError(f"Invalid device string: '{type_or_str}'")
            index = int(idx)
        if s not in ("cpu", "cuda", "meta"):
            raise RuntimeError(
                f"Expected one of cpu, cuda, meta device type at start of "
                f"device string: {type_or_str}")
        if s != "cuda":
            index = None
        self.type, self.index = s, index

    # ``with dtorch.device("meta"):`` - the device of the tensors that
    # factories (and so modules' constructors) make inside the block
    def __enter__(self):
        _default_device.stack.append(self)
        return self

    def __exit__(self, *exc):
        _default_device.stack.pop()
        return False

    @property
    def xp(self):
        # a meta array answers NumPy's functions itself (dtorch/_meta.py)
        return np if self.type != "cuda" else check_cuda_available()

    def resolve(self):
        """This device with its index: 'cuda' means the current device."""
        if self.type != "cuda" or self.index is not None:
            return self
        return cuda_device(current_cuda_index())

    def context(self):
        """A context in which CuPy allocates and runs on this device (the
        current device for 'cuda'; nothing to do for 'cpu')."""
        if self.type != "cuda" or self.index is None:
            return _NULL_CONTEXT
        return check_cuda_available().cuda.Device(self.index)

    def send(self, array):
        """Move an array to this device (no copy when already there);
        'cuda' is the current device, 'cuda:i' device i; to 'meta' only
        the shape and dtype go."""
        if self.type == "meta":
            return MetaArray(array.shape, array.dtype)
        if type(array) is MetaArray:
            raise NotImplementedError("Cannot copy out of meta tensor; no "
                                      "data!")
        if self.type == "cpu":
            if is_cupy_array(array):
                flush_checks()      # the host waits for the device here
                return array.get()
            return np.asarray(array)
        cp = check_cuda_available()
        if is_bfloat16_np(getattr(array, "dtype", None)):
            check_cuda_dtype(bfloat16)
        if self.index is None:
            return cp.asarray(array)
        if is_cupy_array(array) and array.device.id == self.index:
            return array
        with cp.cuda.Device(self.index):
            return cp.asarray(array)

    def __eq__(self, other):
        if isinstance(other, str):
            other = device(other)
        if not isinstance(other, device):
            return NotImplemented
        if self.type != other.type:
            return False
        # 'cuda' with no index means the current device: equal to cuda:0
        return (self.index or 0) == (other.index or 0)

    def __hash__(self):
        return hash((self.type, self.index or 0))

    def __str__(self):
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def __repr__(self):
        if self.index is None:
            return f"device(type='{self.type}')"
        return f"device(type='{self.type}', index={self.index})"


CPU = device("cpu")
META = device("meta")
_cuda_devices = {}


class _DefaultDevice(threading.local):
    def __init__(self):
        self.stack = []


_default_device = _DefaultDevice()


def cuda_device(i):
    """The (shared) dtorch device object for cuda:i."""
    d = _cuda_devices.get(i)
    if d is None:
        d = _cuda_devices[i] = device("cuda", i)
    return d


class _DeviceGuard:
    """Makes CUDA device ``idx`` current inside the block, then restores
    the previous one (only when they differ: the common case costs one
    getDevice)."""
    __slots__ = ("idx", "prev")

    def __init__(self, idx):
        self.idx, self.prev = idx, None

    def __enter__(self):
        rt = _cupy.cuda.runtime
        prev = rt.getDevice()
        if prev != self.idx:
            rt.setDevice(self.idx)
            self.prev = prev
        return self

    def __exit__(self, *exc):
        if self.prev is not None:
            _cupy.cuda.runtime.setDevice(self.prev)
        return False


def device_guard(array):
    """A context that runs CuPy work on ``array``'s device. CuPy launches
    kernels on the current device, not the operands': without this, work
    on a cuda:1 array while device 0 is current lands on device 0 (or
    fails without peer access). Nothing to do for host arrays."""
    if _cupy is None or not isinstance(array, _cupy.ndarray):
        return _NULL_CONTEXT
    return _DeviceGuard(array.data.device_id)


def on_own_device(method):
    """Decorator for Tensor methods that call the array module directly
    (not through Function.apply): they run on their tensor's device. On a
    host array it costs one check."""
    def guarded(self, *args, **kwargs):
        if _cupy is None:
            return method(self, *args, **kwargs)
        a = getattr(self, "_data", None)    # dtorch.f(non-tensor, ...)
        if not isinstance(a, _cupy.ndarray):
            return method(self, *args, **kwargs)
        with _DeviceGuard(a.data.device_id):
            return method(self, *args, **kwargs)
    guarded.__name__ = method.__name__
    guarded.__qualname__ = method.__qualname__
    guarded.__doc__ = method.__doc__
    return guarded


def device_of(array):
    """The dtorch device that holds an array."""
    if type(array) is np.ndarray:
        return CPU
    if type(array) is MetaArray:
        return META
    if not is_cupy_array(array):
        return CPU
    return cuda_device(array.device.id)


def to_device(d):
    if d is None or isinstance(d, device):
        return d
    return device(d)


def factory_device(d):
    """The device a factory makes its tensor on: ``d``, or when None the
    device of the innermost ``with dtorch.device(...)`` block (None
    outside one: the CPU)."""
    if d is None:
        st = _default_device.stack
        return st[-1] if st else None
    return to_device(d)
