"""``autocast``: run each op of a region in the dtype its policy names.

The policy is a table keyed by op class, one per device type, after
PyTorch's lists (aten/src/ATen/autocast_mode.cpp, read for the op policy):

- ``LOWER``: GEMM-like ops (matmul, linear, conv, einsum, RNN layers) run in
  the region's low dtype;
- ``FP32``: ops whose range or accuracy suffers in 16 bits run in float32
  (on CUDA: exp, log, pow, softmax, sums, norms, losses; on CPU PyTorch's
  list is shorter: prod and the losses);
- ``FP32_KEEP`` (CPU norms): PyTorch's CPU layer/batch norm take a bfloat16
  input with float32 weights, compute in float32 and return the input's
  dtype; dtorch does the same by running the op in float32 and rounding once;
- ``PROMOTE``: ops whose inputs must agree (cat, stack, ...) run in the
  widest floating dtype among them;
- ``NONE``: a composite outside every list (dot, mv, adaptive_avg_pool)
  runs on what it is given, with autocast off inside, so that the GEMM it
  is built from is not lowered where PyTorch's op is not.

An op outside the table runs on what it is given (its usual promotion).
Only floating tensors of the region's device type other than float64 are
cast. Casts are autograd ops, so backward runs in the forward's dtypes and a
float32 parameter receives a float32 gradient. Within a region a float32
leaf that requires grad (a parameter) is cast to the low dtype once and the
cast reused (``cache_enabled``); the cache empties when the outermost region
exits.

The state is per thread (as PyTorch's), so ``spawn_threads`` ranks each have
their own. Entering the first region anywhere installs the dispatcher in
``dtorch.autograd.function``; leaving the last removes it, so code outside
autocast pays one global lookup per op.
"""
import functools
import threading

import numpy as np

from .. import _backend as B
from .. import ops as P
from ..autograd import function as _function
from ..autograd.function import TensorBase
from ..autograd.grad_mode import _state as _grad_state

LOWER, FP32, FP32_KEEP, PROMOTE, BANNED, NONE = (
    "lower", "fp32", "fp32_keep", "promote", "banned", "none")

_COMMON_LOWER = (P.MatMul, P.Linear, P.Conv2d, P.ConvTranspose2d, P.Einsum,
                 P.PRelu)
_LOSSES = (P.NllLoss, P.CrossEntropy, P.SoftMargin, P.MultiMargin,
           P.BinaryCrossEntropyWithLogits, P.SmoothL1, P.Huber, P.CTCLoss)

# PyTorch's CPU lists: lower_precision_fp (mm/bmm/baddbmm/addmm/linear/conv,
# mkldnn_rnn_layer = nn.LSTM, prelu, sdpa through its matmuls), fp32
# (prod, the losses), promote (cat, stack).
# nn.RNN and RNNCell are bfloat16 there too (their linear ops), nn.GRU and
# GRUCell float32 (not listed: the float32 state wins).
_CPU = {op: LOWER for op in _COMMON_LOWER + (P.LSTMLayer, P.RNNLayer)}
_CPU.update({op: FP32 for op in _LOSSES + (P.Prod, P.BinaryCrossEntropy,
                                           P.GRULayer)})
_CPU.update({P.LayerNorm: FP32_KEEP, P.BatchNorm: FP32_KEEP})
_CPU.update({P.Cat: PROMOTE})     # stack too: it composes Cat

# PyTorch's CUDA lists: lower_precision_fp (as above, plus the cuDNN RNNs),
# fp32 (exp/log/pow family, softplus, layer/group norm, norms, losses) and
# fp32_set_opt_dtype (softmax, log_softmax, sum, prod, cumsum, cumprod),
# promote (cat, stack, atan2, ...); binary_cross_entropy is refused.
_CUDA = {op: LOWER for op in _COMMON_LOWER + (P.RNNLayer, P.LSTMLayer,
                                              P.GRULayer)}
_CUDA.update({op: FP32 for op in _LOSSES + (
    P.Exp, P.Expm1, P.Log, P.Log1p, P.Pow, P.Reciprocal, P.Rsqrt, P.Sinh,
    P.Cosh, P.Asin, P.Acos, P.Erfinv, P.Softplus, P.LayerNorm, P.Norm,
    P.Softmax, P.LogSoftmax, P.Sum, P.Prod, P.Cumsum, P.Cumprod,
    P.LogCumSumExp)})
_CUDA.update({P.Cat: PROMOTE, P.Atan2: PROMOTE,     # stack: a Cat
              P.BinaryCrossEntropy: BANNED})

_POLICY = {"cpu": _CPU, "cuda": _CUDA}
_DEFAULT_DTYPE = {"cpu": B.bfloat16, "cuda": B.float16}

_BCE_BANNED = (
    "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are "
    "unsafe to autocast.\nMany models use a sigmoid layer right before the "
    "binary cross entropy layer.\nIn this case, combine the two layers using "
    "torch.nn.functional.binary_cross_entropy_with_logits\nor "
    "torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and "
    "BCEWithLogits are\nsafe to autocast.")


class _State(threading.local):
    def __init__(self):
        # device type -> (enabled, low dtype, cache_enabled)
        self.mode = {"cpu": (False, B.bfloat16, True),
                     "cuda": (False, B.float16, True)}
        self.depth = 0          # open regions, enabled or not
        self.cache = {}         # id(leaf) -> (leaf, its low-dtype cast)
        self.busy = None        # the op class being dispatched


_tls = _State()
_open = [0]                     # open enabled regions in all threads
_lock = threading.Lock()
_F32 = np.dtype(np.float32)


def _eligible(a, cpu):
    # a floating tensor of the region's device type, not float64
    if not isinstance(a, TensorBase):
        return False
    d = a._data
    if (type(d) is np.ndarray) is not cpu:
        return False
    dt = d.dtype
    return dt.itemsize in (2, 4) and (dt.kind == "f" or B.is_bfloat16_np(dt))


def _cast(a, dt, cache):
    if a._data.dtype == dt:
        return a
    if cache is not None and a.requires_grad and a.grad_fn is None \
            and a._data.dtype == _F32 and _grad_state.enabled:
        hit = cache.get(id(a))
        if hit is not None and hit[0] is a:
            return hit[1]
        out = P.Cast.apply(a, np_dtype=dt)
        cache[id(a)] = (a, out)
        return out
    return P.Cast.apply(a, np_dtype=dt)


def _dispatch(cls, args, kwargs):
    st = _tls
    if st.busy is cls:
        return NotImplemented
    first = None
    for a in args:
        if isinstance(a, TensorBase):
            first = a
            break
    if first is None:
        return NotImplemented
    cpu = type(first._data) is np.ndarray
    dev = "cpu" if cpu else "cuda"
    enabled, low, cache_on = st.mode[dev]
    if not enabled:
        return NotImplemented
    policy = _POLICY[dev].get(cls)
    if policy is None:
        # a composite marked with autograd.function.autocast_op
        policy = getattr(cls, "_autocast_policy", None)
        if isinstance(policy, dict):        # one policy per device type
            policy = policy.get(dev)
        if policy is None:
            return NotImplemented
    if policy is BANNED:
        raise RuntimeError(_BCE_BANNED)
    if policy == NONE:
        mode = st.mode[dev]
        st.mode[dev] = (False,) + tuple(mode[1:])
        try:
            return cls(*args, **kwargs)
        finally:
            st.mode[dev] = mode
    keep = None
    if policy is LOWER:
        cache = st.cache if cache_on else None
        new = [_cast(a, low.np, cache) if _eligible(a, cpu) else a
               for a in args]
    elif policy is PROMOTE:
        dts = {a._data.dtype for a in args if _eligible(a, cpu)}
        if len(dts) < 2:
            return NotImplemented
        new = [_cast(a, _F32, None) if _eligible(a, cpu) else a
               for a in args]
    else:
        if policy is FP32_KEEP and _eligible(first, cpu) \
                and first._data.dtype != _F32:
            keep = first._data.dtype
        new = [_cast(a, _F32, None) if _eligible(a, cpu) else a
               for a in args]
    composite32 = policy is FP32 and not isinstance(cls, type)
    if keep is None and not composite32 and all(
            n is a for n, a in zip(new, args)):
        return NotImplemented       # nothing to cast
    prev, st.busy = st.busy, cls
    if composite32:
        # a float32 composite (a loss, lstm_cell on CPU) runs whole in
        # float32: its inner matmuls are not lowered again
        mode = st.mode[dev]
        st.mode[dev] = (False,) + tuple(mode[1:])
    try:
        run = cls.apply if isinstance(cls, type) else cls
        out = run(*new, **kwargs)
    finally:
        st.busy = prev
        if composite32:
            st.mode[dev] = mode
    if keep is not None:
        out = P.Cast.apply(out, np_dtype=keep)
    return out


def _install(delta):
    with _lock:
        _open[0] += delta
        _function._autocast = _dispatch if _open[0] > 0 else None
        # Function.apply checks one hook that the profiler shares with
        # autocast; recompute it (absent before the profiler's change)
        update = getattr(_function, "_update_hook", None)
        if update is not None:
            update()


class autocast:
    """``autocast(device_type, dtype=None, enabled=True, cache_enabled=True)``
    as a context manager or decorator (PyTorch's ``torch.autocast``)."""

    def __init__(self, device_type, dtype=None, enabled=True,
                 cache_enabled=None):
        if not isinstance(device_type, str):
            raise ValueError(
                f"Expected `device_type` of type `str`, got: "
                f"`{type(device_type)}`")
        if device_type not in _POLICY:
            raise RuntimeError(
                f"User specified an unsupported autocast device_type "
                f"'{device_type}'")
        self.device = device_type
        self.fast_dtype = _DEFAULT_DTYPE[device_type] if dtype is None \
            else B.to_dtype(dtype)
        self._enabled = bool(enabled)
        self._cache_enabled = True if cache_enabled is None \
            else bool(cache_enabled)
        allowed = (B.bfloat16, B.float16)
        if self.fast_dtype not in allowed:
            import warnings
            warnings.warn(
                f"In {device_type} autocast, but the target dtype is not "
                f"supported. Disabling autocast.\n{device_type} Autocast "
                f"only supports dtypes of torch.bfloat16, torch.float16 "
                f"currently.")
            self._enabled = False
        # only an enabled region needs the low dtype's arrays (a disabled
        # one, as checkpoint's recomputation enters, must not import
        # ml_dtypes for bfloat16)
        if self._enabled and self.fast_dtype.np is None:
            raise RuntimeError(f"{self.fast_dtype} is not available "
                               f"(install ml_dtypes)")

    def __enter__(self):
        st = _tls
        self._prev = st.mode[self.device]
        st.mode[self.device] = (self._enabled, self.fast_dtype,
                                self._cache_enabled)
        st.depth += 1
        if self._enabled:
            _install(1)
        return self

    def __exit__(self, *exc):
        st = _tls
        st.mode[self.device] = self._prev
        st.depth -= 1
        if st.depth == 0:
            st.cache.clear()    # PyTorch clears the cast cache here too
        if self._enabled:
            _install(-1)
        return False

    def __call__(self, func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            with autocast(self.device, self.fast_dtype, self._enabled,
                          self._cache_enabled):
                return func(*args, **kwargs)
        return wrapper


def is_autocast_available(device_type):
    return device_type in _POLICY


# the device types PyTorch's device strings know (its error lists them)
_TORCH_DEVICE_TYPES = (
    "cpu, cuda, ipu, xpu, mkldnn, opengl, opencl, ideep, hip, ve, fpga, "
    "maia, xla, lazy, vulkan, mps, meta, hpu, mtia, privateuseone")


def _autocast_type(device_type, fn):
    """The device type of ``device_type`` ('cuda:0' -> 'cuda'), with
    PyTorch's errors for a non-string or an unknown type."""
    if not isinstance(device_type, str):
        raise TypeError(f"{fn}(): argument 'device_type' (position 1) must "
                        f"be str, not {type(device_type).__name__}")
    t = device_type.split(":", 1)[0]
    if t not in _TORCH_DEVICE_TYPES.split(", "):
        raise RuntimeError(f"Expected one of {_TORCH_DEVICE_TYPES} device "
                           f"type at start of device string: {device_type}")
    return t


def is_autocast_enabled(device_type=None):
    """Whether autocast is on for ``device_type`` in this thread (no
    argument: CUDA, PyTorch's old meaning)."""
    t = "cuda" if device_type is None else _autocast_type(
        device_type, "is_autocast_enabled")
    return t in _tls.mode and _tls.mode[t][0]


def get_autocast_dtype(device_type):
    """The dtype autocast lowers to on ``device_type`` in this thread."""
    t = _autocast_type(device_type, "get_autocast_dtype")
    if t not in _tls.mode:
        raise RuntimeError(f"get_autocast_dtype: dtorch has autocast for "
                           f"'cpu' and 'cuda' only, not '{t}'")
    return _tls.mode[t][1]


def _cache_size():
    """How many weight casts this thread's cache holds (for tests)."""
    return len(_tls.cache)


def _cache_nbytes():
    return sum(c._data.nbytes for _, c in _tls.cache.values())
