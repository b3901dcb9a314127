"""Tensor factories (``tensor``, ``zeros``, ``randn``, ...) and the
``dtorch.*`` functions that take several tensors (``cat``, ``stack``,
``where``)."""
import warnings

import numpy as np

from . import _backend as B
from . import ops as P
from .autograd import _capture
from .autograd.grad_mode import is_grad_enabled
from .random import draw as _draw
from ._tensor_methods._common import _dims
from .tensor import Tensor, _finish, _np_dtype, _fill, _where
from .tensor import tensor  # noqa: F401 (dtorch.tensor)


def as_tensor(data, dtype=None, device=None):
    """Like ``tensor`` but shares memory when possible (NumPy arrays of a
    matching dtype, tensors on the right device)."""
    if isinstance(data, Tensor):
        t = data
        if dtype is not None or device is not None:
            t = t.to(device=device, dtype=dtype)
        return t
    if isinstance(data, np.ndarray) and device in (None, "cpu") and (
            dtype is None or B.to_dtype(dtype).np == data.dtype):
        return from_numpy(data)
    return tensor(data, dtype=dtype, device=device)


def from_numpy(a):
    """A tensor that shares memory with the NumPy array ``a``."""
    if not isinstance(a, np.ndarray):
        raise TypeError(f"expected np.ndarray (got {type(a).__name__})")
    B.from_np(a.dtype)   # raises for unsupported dtypes
    return Tensor._make(a, False, None)


def zeros(*size, dtype=None, device=None, requires_grad=False, out=None):
    if out is not None and dtype is None:
        dtype = out.dtype
    # a factory resizes out without PyTorch's warning
    return _write_out(out, _fill(0, size, dtype, device, requires_grad),
                      "zeros", warn_resize=False)


def _write_out(out, res, name, warn_resize=True):
    """PyTorch's ``out=``: ``res`` written into ``out`` (resized, with
    PyTorch's warning, when a non-empty ``out`` has another shape; cast
    within the same kind), and ``out`` returned."""
    if out is None:
        return res
    if is_grad_enabled() and (res.requires_grad or out.requires_grad):
        raise RuntimeError(
            f"{name}(): functions with out=... arguments don't support "
            f"automatic differentiation, but one of the arguments requires "
            f"grad.")
    if not np.can_cast(_np_dtype(res.dtype), _np_dtype(out.dtype),
                       casting="same_kind"):
        raise RuntimeError(f"{name}(): result type {res.dtype} can't be "
                           f"cast to the desired output type {out.dtype}")
    if tuple(out.shape) != tuple(res.shape):
        if out.numel() and warn_resize:
            warnings.warn(
                f"An output with one or more elements was resized since it "
                f"had shape {list(out.shape)}, which does not match the "
                f"required output shape {list(res.shape)}.", UserWarning,
                stacklevel=3)
        out.resize_(res.shape)
    out._data[...] = res._data
    out._bump_version()
    return out


def ones(*size, dtype=None, device=None, requires_grad=False):
    return _fill(1, size, dtype, device, requires_grad)


def empty(*size, dtype=None, device=None, requires_grad=False,
          memory_format=None):
    return _fill(0, size, dtype, device, requires_grad)


def full(size, fill_value, dtype=None, device=None, requires_grad=False):
    if dtype is None:
        dtype = B.result_type(type(fill_value), type(fill_value))
    return _fill(fill_value, (tuple(size),), dtype, device, requires_grad)


def _like(fn, t, dtype, device, requires_grad, *args):
    return fn(*args, t.shape, dtype=dtype or t.dtype,
              device=device or t.device, requires_grad=requires_grad)


def zeros_like(t, dtype=None, device=None, requires_grad=False,
               memory_format=None):
    return _like(zeros, t, dtype, device, requires_grad)


def ones_like(t, dtype=None, device=None, requires_grad=False,
              memory_format=None):
    return _like(ones, t, dtype, device, requires_grad)


def empty_like(t, dtype=None, device=None, requires_grad=False,
               memory_format=None):
    return _like(zeros, t, dtype, device, requires_grad)


def full_like(t, fill_value, dtype=None, device=None, requires_grad=False):
    return full(t.shape, fill_value, dtype=dtype or t.dtype,
                device=device or t.device, requires_grad=requires_grad)


@_capture.array_source
def _random(method, size, generator, dtype, device, requires_grad, *args):
    # drawn on the target device by its generator (never on the host and
    # copied); CPU streams are NumPy's, as before
    dt = B.to_dtype(dtype) or B.get_default_dtype()
    dev = B.to_device(device)
    if dev is not None and dev.type == "cuda":
        B.check_cuda_dtype(dt)
    a = _draw(method, *args, size=_dims(size), device=dev,
              generator=generator, dtype=dt.np)
    t = Tensor._make(a, False, None)
    if requires_grad:
        t.requires_grad_(True)
    return t


def randn(*size, generator=None, dtype=None, device=None,
          requires_grad=False):
    """Standard normal samples from the default (or given) generator, or
    on a CUDA device from that device's generator."""
    return _random("standard_normal", size, generator, dtype, device,
                   requires_grad)


def rand(*size, generator=None, dtype=None, device=None,
         requires_grad=False):
    return _random("random", size, generator, dtype, device, requires_grad)


def randint(low, high=None, size=None, generator=None, dtype=None,
            device=None, requires_grad=False):
    if size is None and isinstance(high, (tuple, list)):
        # randint(high, size): PyTorch's two-argument form
        low, high, size = 0, low, high
    if high is None:
        low, high = 0, low
    if size is None:
        raise TypeError("randint() missing required argument 'size'")
    return _random("integers", (tuple(size),), generator,
                   B.to_dtype(dtype) or B.int64, device, False, low, high)


def randperm(n, generator=None, dtype=None, device=None):
    dt = B.to_dtype(dtype) or B.int64
    a = _draw("permutation", n, device=device, generator=generator,
              dtype=dt.np)
    return Tensor._make(a, False, None)


def randn_like(t, dtype=None, device=None, requires_grad=False):
    return randn(t.shape, dtype=dtype or t.dtype, device=device or t.device,
                 requires_grad=requires_grad)


def rand_like(t, dtype=None, device=None, requires_grad=False):
    return rand(t.shape, dtype=dtype or t.dtype, device=device or t.device,
                requires_grad=requires_grad)


def randint_like(t, low, high=None, dtype=None, device=None):
    return randint(low, high, t.shape, dtype=dtype or t.dtype,
                   device=device or t.device)


def normal(mean, std, size=None, generator=None, dtype=None, device=None):
    if isinstance(mean, Tensor) or isinstance(std, Tensor):
        shape = np.broadcast_shapes(tuple(getattr(mean, "shape", ())),
                                    tuple(getattr(std, "shape", ())))
        ref = mean if isinstance(mean, Tensor) else std
        # drawn on the device of the mean/std tensor, in its dtype; in the
        # graph with a zero derivative to mean and std, as PyTorch's
        value = (randn(shape, generator=generator, dtype=ref.dtype,
                       device=ref.device) * std + mean).detach()._data
        other = std if ref is mean else None
        return P.Step.apply(ref, other, lambda xp, x, y: value)
    return randn(size, generator=generator, dtype=dtype,
                 device=device) * std + mean


def arange(start, end=None, step=1, dtype=None, device=None,
           requires_grad=False):
    if end is None:
        start, end = 0, start
    vals = [start, end, step]
    vals = [v.item() if isinstance(v, Tensor) else v for v in vals]
    if dtype is None:
        dtype = B.get_default_dtype() if any(
            isinstance(v, float) for v in vals) else B.int64
    if vals[2] == 0:
        raise RuntimeError("step must be nonzero")
    a = np.arange(*vals).astype(B.to_dtype(dtype).np)
    return _finish(a, dtype, device, requires_grad)


def linspace(start, end, steps, dtype=None, device=None,
             requires_grad=False):
    a = np.linspace(start, end, steps).astype(_np_dtype(dtype))
    return _finish(a, dtype, device, requires_grad)


def logspace(start, end, steps, base=10.0, dtype=None, device=None):
    a = np.logspace(start, end, steps, base=base).astype(_np_dtype(dtype))
    return _finish(a, dtype, device, False)


def eye(n, m=None, dtype=None, device=None, requires_grad=False):
    a = np.eye(n, m, dtype=_np_dtype(dtype))
    return _finish(a, dtype, device, requires_grad)


# ------------------------------------------------- multi-tensor functions --

def _tensors(seq, op):
    seq = list(seq)
    if not seq:
        raise RuntimeError(f"{op}(): expected a non-empty list of Tensors")
    for i, t in enumerate(seq):
        if not isinstance(t, Tensor):
            raise TypeError(f"{op}(): argument 'tensors' must be a sequence "
                            f"of Tensors, but element {i} is "
                            f"{type(t).__name__}")
    return seq


def cat(tensors, dim=0, out=None):
    """Concatenate tensors along an existing dimension."""
    ts = _tensors(tensors, "cat")
    # PyTorch skips legacy empty 1-D tensors in cat
    ts = [t for t in ts if not (t.ndim == 1 and t.numel() == 0)] or ts[:1]
    if len(ts) == 1:
        res = ts[0] * 1 if ts[0].requires_grad else ts[0].clone()
    else:
        res = P.Cat.apply(*ts, dim=dim)
    return _write_out(out, res, "cat")


concat = concatenate = cat


def stack(tensors, dim=0, out=None):
    """Stack equally shaped tensors along a new dimension."""
    ts = _tensors(tensors, "stack")
    return _write_out(out, P.stack(*ts, dim=dim), "stack")


def where(condition, input=None, other=None):
    """Elementwise ``input if condition else other``; with only a condition,
    the indices of its non-zero elements (as ``nonzero(as_tuple=True)``)."""
    cond = condition._data if isinstance(condition, Tensor) else condition
    if input is None and other is None:
        xp = B.get_array_module(cond)
        return tuple(Tensor._wrap(i.astype(np.int64)) for i in
                     xp.nonzero(cond))
    return _where(cond, input, other)


def nonzero(t, as_tuple=False):
    return t.nonzero(as_tuple=as_tuple)
