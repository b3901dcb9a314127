"""Matrix products, forward and backward side by side: matmul with NumPy's
broadcasting rules, and linear (x @ w.T + b as one node, so that an MLP
layer costs one graph node). einsum lives in ``einsum.py``.
"""
import numpy as np

from .base import Op, _device_error, unbroadcast, float32_compute, \
    dtype_name


_BLAS_DTYPES = frozenset((np.dtype(np.float32), np.dtype(np.float64)))
_ndarray = np.ndarray


def _mm(a, b):
    """a @ b. Two 2-D NumPy float32/float64 matrices, each in C or Fortran
    order, go through ndarray.dot: the same BLAS call as matmul for such
    operands (bitwise equal results, tested), without matmul's ufunc
    dispatch, which costs ~1 us on a small matrix (4x4: 0.46 us against
    1.4 us). Anything else (strided, batched, 1-D, integer, CuPy) is
    matmul itself."""
    if type(a) is _ndarray and type(b) is _ndarray and a.ndim == 2 == b.ndim:
        dt = a.dtype
        if dt is b.dtype and dt in _BLAS_DTYPES:
            fa, fb = a.flags, b.flags
            if (fa.c_contiguous or fa.f_contiguous) \
                    and (fb.c_contiguous or fb.f_contiguous):
                return a.dot(b)
    return a @ b


@float32_compute
class MatMul(Op):
    @staticmethod
    def forward(ctx, x, y):
        if x.ndim == 0 or y.ndim == 0:
            raise RuntimeError(
                f"both arguments to matmul need to be at least 1D, but they "
                f"are {x.ndim}D and {y.ndim}D")
        if x.dtype != y.dtype:       # PyTorch's GEMMs do not promote
            raise RuntimeError(
                f"expected m1 and m2 to have the same dtype, but got: "
                f"{dtype_name(x.dtype, True)} != {dtype_name(y.dtype, True)}")
        kx = x.shape[-1]
        ky = y.shape[-2] if y.ndim > 1 else y.shape[0]
        if kx != ky:
            raise RuntimeError(
                f"mat1 and mat2 shapes cannot be multiplied "
                f"({'x'.join(map(str, x.shape))} and "
                f"{'x'.join(map(str, y.shape))})")
        ctx.save_for_backward(x, y)
        return _mm(x, y)

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.to_save
        if ctx._gmake is not None:      # create_graph (arith, below Div)
            x, y = ctx.input(0, x), ctx.input(1, y)
        n = ctx.needs_input_grad
        x1, y1 = x.ndim == 1, y.ndim == 1
        if x1 and y1:
            g2 = g.reshape(1, 1)
        elif x1:
            g2 = g[..., None, :]
        elif y1:
            g2 = g[..., None]
        else:
            g2 = g
        # the array methods, not xp.swapaxes (a Python-level function, ~1
        # us on a small matrix); reshape only where a 1-D operand was
        # lifted to 2-D
        gx = gy = None
        if n[0]:
            y2 = y[:, None] if y1 else y
            gx = unbroadcast(_mm(g2, y2.swapaxes(-1, -2)),
                             (1,) + x.shape if x1 else x.shape)
            if x1:
                gx = gx.reshape(x.shape)
        if n[1]:
            x2 = x[None, :] if x1 else x
            gy = unbroadcast(_mm(x2.swapaxes(-1, -2), g2),
                             y.shape + (1,) if y1 else y.shape)
            if y1:
                gy = gy.reshape(y.shape)
        return gx, gy


@float32_compute
class Linear(Op):
    """y = x @ w.T + b, one primitive so an MLP layer costs one node:
    the composition x @ w.t() + b takes 1.26-1.46x its time, forward and
    backward (measured float32, one thread, 2x8 -> 8: 54 against 37 us;
    64x256 -> 256: 403 against 320 us; 256x1024 -> 1024: 20.2 against
    15.2 ms; load 12)."""
    @staticmethod
    def forward(ctx, x, w, b=None):
        if x.shape[-1] != w.shape[1]:
            rows = int(np.prod(x.shape[:-1]))
            raise RuntimeError(
                f"mat1 and mat2 shapes cannot be multiplied ({rows}x"
                f"{x.shape[-1]} and {w.shape[1]}x{w.shape[0]})")
        if type(x) is not type(w):
            raise _device_error("linear", x, w)
        if x.dtype != w.dtype:
            raise RuntimeError(
                f"mat1 and mat2 must have the same dtype, but got "
                f"{dtype_name(x.dtype)} and {dtype_name(w.dtype)}")
        if b is not None and b.dtype != x.dtype:
            raise RuntimeError(
                f"self and mat2 must have the same dtype, but got "
                f"{dtype_name(b.dtype)} and {dtype_name(w.dtype)}")
        ctx.save_for_backward(x, w)
        if x.ndim > 2 and not x.flags.c_contiguous:
            # a strided N-D input (a batch_first transpose) would run as
            # one small GEMM per leading index: copy it once into rows
            # instead, measured 1.7x faster, and keep the copy for backward
            x2 = x.reshape(-1, x.shape[-1])
            ctx.x2 = x2
            out = _mm(x2, w.T).reshape(x.shape[:-1] + (w.shape[0],))
        else:
            out = _mm(x, w.T)
        if b is not None:
            out += b
        return out

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.to_save
        if ctx._gmake is not None:      # create_graph (arith, below Div)
            x, w = ctx.input(0, x), ctx.input(1, w)
        n = ctx.needs_input_grad
        gx = gw = gb = None
        g2 = g.reshape(-1, g.shape[-1])
        if n[0]:
            gx = _mm(g2, w).reshape(g.shape[:-1] + (w.shape[1],))
        if n[1]:
            # forward's contiguous copy of a strided input, on arrays
            x2 = ctx.__dict__.get("x2") if ctx._gmake is None else None
            if x2 is None:
                x2 = x.reshape(-1, x.shape[-1])
            gw = _mm(g2.T, x2)
        if len(n) > 2 and n[2]:
            gb = g2.sum(0)
        return gx, gw, gb
