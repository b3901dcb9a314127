"""Array-level int8 arithmetic of dynamic quantization (NumPy or CuPy).

- Weights: per output channel, symmetric, int8 in [-127, 127]:
  ``w ~= scale[c] * q[c, :]`` with ``scale[c] = max|w[c, :]| / 127``.
- Activations: per tensor, asymmetric uint8 in [0, 255], chosen from the
  tensor's own min/max at each call (PyTorch's dynamic quantization):
  ``x ~= s * (q - zp)`` with the range widened to include 0, so that 0 is
  exact.
- Products: ``sum_k (qx - zp) * qw`` is an integer; it is computed exactly
  as int32 accumulation would. NumPy has no fast integer GEMM (its integer
  matmul is a plain loop, 20-50x slower than BLAS on this machine), so the
  integers go through float32 BLAS instead: every product is at most
  255 * 127 in magnitude and float32 holds integers up to 2**24 exactly, so
  a dot product over at most ``_EXACT_K`` = 512 terms is exact; longer ones
  are cut into such chunks whose (exact) results add in int32.
  When numba is installed (extra 'quant'), CPU batches of up to
  ``KERNEL_MAX_ROWS`` rows use a compiled int8 kernel instead (``_kernels``):
  faster, and bit for bit the same results.
"""
import math

import numpy as np

from ... import _backend as B
from . import _kernels

# Row count (batch) up to which a CPU Linear uses the compiled int8 kernel
# (_kernels, when numba is installed) instead of float32 BLAS. Measured
# crossover in benchmarks/quant.py; 0 disables the kernel.
KERNEL_MAX_ROWS = 32

_F32_EPS = float(np.finfo(np.float32).eps)
QMAX_W = 127
QMIN_X, QMAX_X = 0, 255
# 2**24 / (255 * 127) = 518: the longest dot product float32 keeps exact
_EXACT_K = 512


def quantize_weight_per_channel(w):
    """(int8 q, float32 scale per row) of a 2-D float array."""
    xp = B.get_array_module(w)
    w = w.astype(np.float32, copy=False)
    if w.ndim != 2:
        raise ValueError(f"per-channel weight quantization expects a 2-D "
                         f"weight, got shape {list(w.shape)}")
    if w.size and not bool(xp.isfinite(w).all()):
        raise ValueError("cannot quantize a weight that contains inf or NaN")
    amax = xp.abs(w).max(axis=1) if w.shape[1] else \
        xp.zeros(w.shape[0], np.float32)
    scale = (amax / QMAX_W).astype(np.float32)
    # an all-zero row: any scale reproduces it; 1 keeps the division finite
    scale = xp.where(scale > 0, scale, np.float32(1.0)).astype(np.float32)
    q = xp.clip(xp.rint(w / scale[:, None]), -QMAX_W, QMAX_W)
    return q.astype(np.int8), scale


def choose_qparams(x, what="input"):
    """(scale, zero_point) of PyTorch's dynamic uint8 activation
    quantization for array ``x`` (per tensor; the range includes 0)."""
    return qparams_from_range(float(x.min()), float(x.max()), what)


def qparams_from_range(lo, hi, what="input"):
    """``choose_qparams`` of an array whose min and max are ``lo``,
    ``hi`` (Python floats)."""
    lo = min(lo, 0.0)
    hi = max(hi, 0.0)
    # Python scalar arithmetic: numpy's scalar calls (isfinite, finfo,
    # clip) cost ~15 us a call, more than a batch-1 int8 GEMV
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError(f"dynamic quantization: the {what} contains inf "
                         f"or NaN, which has no int8 representation")
    scale = (hi - lo) / (QMAX_X - QMIN_X)
    if scale <= _F32_EPS:
        scale = 1.0
    zp = int(min(max(QMIN_X - round(lo / scale), QMIN_X), QMAX_X))
    return np.float32(scale), zp


def quantize_activation(x, scale, zp):
    """uint8 codes of ``x`` under (scale, zp)."""
    xp = B.get_array_module(x)
    # times the reciprocal, as dynamic_linear does: the same codes
    inv = np.float32(1.0 / scale)
    q = xp.rint(x.astype(np.float32, copy=False) * inv) + zp
    return xp.clip(q, QMIN_X, QMAX_X).astype(np.uint8)


def int_matmul(qx, zp, qw):
    """``(qx - zp) @ qw.T`` as int32: qx uint8 (..., K), qw int8 (N, K).
    Exact (see the module docstring)."""
    a = qx.astype(np.float32)
    a -= np.float32(zp)
    return _exact_dot(a, qw, as_int=True)


def _exact_dot(a, qw, as_int=False):
    """``a @ qw.T`` for float32 ``a`` holding integers in [-255, 255]:
    exact, in float32 (or int32 with ``as_int``) when K <= _EXACT_K, else
    chunk sums added in int32."""
    xp = B.get_array_module(a)
    k = qw.shape[1]
    if k <= _EXACT_K:
        out = a @ qw.astype(np.float32).T
        return out.astype(np.int32) if as_int else out
    acc = None
    for s in range(0, k, _EXACT_K):
        part = (a[..., s:s + _EXACT_K]
                @ qw[:, s:s + _EXACT_K].astype(np.float32).T).astype(np.int32)
        acc = part if acc is None else xp.add(acc, part, out=acc)
    return acc


def dynamic_linear(x, qw, w_scale, bias):
    """float32 ``x @ w.T + bias`` with ``w = w_scale[:, None] * qw`` and
    ``x`` quantized to uint8 on the fly; int32 accumulation.

    The activation codes minus their zero point, ``clip(rint(x / s), -zp,
    255 - zp)``, are formed directly in float32 (the array BLAS reads): the
    same integers as ``quantize_activation(x) - zp``, two casts fewer.
    """
    xp = B.get_array_module(x)
    if x.size == 0:
        out = xp.zeros(x.shape[:-1] + (qw.shape[0],), np.float32)
        return out if bias is None else out + bias
    k = x.shape[-1]
    rows = x.size // k
    use_kernel = (xp is np and rows <= KERNEL_MAX_ROWS
                  and _kernels.kernel() is not None)
    # the fused kernel rounds as NumPy does for float32 operands only
    fused = use_kernel and x.dtype == w_scale.dtype == np.float32 and (
        bias is None or bias.dtype == np.float32)
    if fused:
        x2 = np.ascontiguousarray(x.reshape(rows, k))
        # one compiled pass instead of two NumPy reductions (batch 1: the
        # per-call overhead is what small layers pay)
        sx, zp = qparams_from_range(*_kernels.minmax(x2))
    else:
        sx, zp = choose_qparams(x)
    lo, hi = np.float32(QMIN_X - zp), np.float32(QMAX_X - zp)
    if fused:
        # one compiled pass: quantize, int32 GEMM, dequantize
        out = _kernels.linear(x2, np.float32(1.0 / sx), lo, hi,
                              np.ascontiguousarray(qw), w_scale, sx,
                              bias)
        return out.reshape(x.shape[:-1] + (qw.shape[0],))
    a = x * np.float32(1.0 / sx) if x.dtype == np.float32 else \
        (x / sx).astype(np.float32)
    xp.rint(a, out=a)
    xp.clip(a, lo, hi, out=a)
    if use_kernel:
        # the same integers, summed in int32 by the compiled kernel
        out = _kernels.int_matmul(a.reshape(rows, k).astype(np.int16),
                                  np.ascontiguousarray(qw))
        out = out.reshape(x.shape[:-1] + (qw.shape[0],))
    else:
        out = _exact_dot(a, qw)
    if out.dtype != np.float32:
        out = out.astype(np.float32)
    out *= (w_scale * sx).astype(np.float32)
    if bias is not None:
        out += bias
    return out
