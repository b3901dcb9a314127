"""Compiled int8 GEMV / small-batch GEMM for dynamic quantization (numba,
optional extra ``quant``).

NumPy has no integer GEMM (its integer matmul is a plain loop), so without
numba the exact integer product goes through float32 BLAS, which needs the
int8 weight cast to float32 at every call: at batch 1 that cast costs more
than the GEMV it feeds. Here the weight is read as int8 (1 byte per weight,
a quarter of float32's memory traffic, which bounds a GEMV) and the
activation codes as int16, multiplied and summed in int32: exact, so the
results equal the BLAS path bit for bit.

numba is imported lazily (first quantized call), never by ``import dtorch``.
``cache=True`` keeps the compiled code next to this file, so compiling
happens once per machine.
"""
import numpy as np

_kernel = None          # the compiled function, False when numba is absent


def _compile():
    import numba

    # Inner loop over the reduction dim, contiguous for both operands
    # (weights are [out, in] row-major), one int32 accumulator: LLVM turns
    # it into widening multiply-adds (vpmaddwd / vpdpwssd on x86).
    # int16 activations vectorise better than uint8 ones here (measured:
    # 26 vs 42 us for 1024x1024, batch 1).
    @numba.njit(fastmath=True, cache=True, nogil=True)
    def int8_gemm(a, w, out):
        m_rows, k_len = a.shape
        n_rows = w.shape[0]
        for m in range(m_rows):
            for n in range(n_rows):
                acc = np.int32(0)
                for k in range(k_len):
                    acc += np.int32(a[m, k]) * np.int32(w[n, k])
                out[m, n] = acc

    # The whole Linear for float32 input in one call: quantize the rows
    # (the float32 ops of _core.dynamic_linear, in its order), the int32
    # GEMM, then ``float32(acc) * scale[n] (+ bias[n])``. Not fastmath:
    # the float steps must round as NumPy's do (no FMA contraction), so
    # both paths agree bit for bit; the integer loop vectorises anyway.
    @numba.njit(cache=True, nogil=True)
    def fused_linear(x, inv, lo, hi, w, scale, sx, bias, has_bias, out):
        m_rows, k_len = x.shape
        n_rows = w.shape[0]
        a = np.empty((m_rows, k_len), np.int16)
        for m in range(m_rows):
            for k in range(k_len):
                v = np.rint(x[m, k] * inv)
                a[m, k] = np.int16(min(max(v, lo), hi))
        # the GEMM as its own compiled function: inlined into this loop it
        # vectorised far worse (measured 7x slower at 1024x1024, batch 32)
        acc = np.empty((m_rows, n_rows), np.int32)
        int8_gemm(a, w, acc)
        for m in range(m_rows):
            for n in range(n_rows):
                # (scale * sx) first: NumPy's order, float32 throughout
                y = np.float32(acc[m, n]) * (scale[n] * sx)
                out[m, n] = y + bias[n] if has_bias else y

    # NumPy's min/max in one pass: NaN propagates (the caller rejects it)
    @numba.njit(cache=True, nogil=True)
    def minmax(x):
        lo = np.inf
        hi = -np.inf
        for v in x.ravel():
            if v != v:
                return np.nan, np.nan
            lo = min(lo, v)
            hi = max(hi, v)
        return float(lo), float(hi)
    return int8_gemm, fused_linear, minmax


def kernel():
    """The compiled ``(int8_gemm, fused_linear, minmax)``, or None when numba is
    not installed. ``int8_gemm(a int16 (M, K), w int8 (N, K), out int32
    (M, N))``."""
    global _kernel
    if _kernel is None:
        try:
            _kernel = _compile()
        except ImportError:
            _kernel = False
    return _kernel or None


def int_matmul(a, qw):
    """``a @ qw.T`` as int32 for int16 ``a`` (M, K) and int8 ``qw`` (N, K),
    both C-contiguous."""
    out = np.empty((a.shape[0], qw.shape[0]), np.int32)
    kernel()[0](a, qw, out)
    return out


def minmax(x):
    """(min, max) of a C-contiguous float32 array as Python floats."""
    return kernel()[2](x)


def linear(x, inv, lo, hi, qw, scale, sx, bias):
    """float32 (M, N) of float32 ``x`` (M, K), C-contiguous: activation
    codes minus zero point ``clip(rint(x * inv), lo, hi)`` (float32), exact
    int32 products with int8 ``qw`` (N, K), times float32 ``scale * sx``
    (``scale`` (N,), ``sx`` a float32 scalar), plus float32 ``bias`` (N,) or None."""
    out = np.empty((x.shape[0], qw.shape[0]), np.float32)
    has_bias = bias is not None
    kernel()[1](x, inv, lo, hi, qw, scale, sx,
                bias if has_bias else scale, has_bias, out)
    return out
