"""Normalisation and dropout, forward and backward side by side: layer norm
over the last axes, training-mode batch norm (running statistics updated
in the same pass), and dropout with a given keep-mask.
"""
import numpy as np

from .. import _kernels
from .._backend import get_array_module
from .base import Op, is_float, grad_xp
from .recompute import pin, pin_all


def _affine(xhat, w, b, shape=None):
    """xhat * w + b, either of them None, reshaped to ``shape`` where
    given; never xhat itself: backward reads it, and an in-place op on the
    output (LayerNorm -> ReLU(inplace=True)) must not change it."""
    out = xhat if w is not None or b is not None else xhat.copy()
    if w is not None:
        out = out * (w if shape is None else w.reshape(shape))
    if b is not None:
        out = out + (b if shape is None else b.reshape(shape))
    return out


class LayerNorm(Op):
    """Normalise over the last ``nd`` axes, then ``* w + b`` (optional).
    One op, not a composition of mean/sub/mul (eight nodes): its compiled
    kernels do statistics and affine in one pass each way (measured
    256x1024 float32 forward + backward, process CPU time, load 14: 0.87
    ms against NumPy's 1.13 ms for the same op, medians of 30)."""
    @staticmethod
    def forward(ctx, x, w=None, b=None, nd=1, eps=1e-5):
        xp = get_array_module(x)
        axes = tuple(range(x.ndim - nd, x.ndim))
        k = _kernels.kernels(x, *(a for a in (w, b) if a is not None))
        if k is not None:           # statistics and affine in one pass
            ctx.save_for_backward(w)
            return _layer_norm_kernel(k, ctx, x, w, b, axes, eps)
        mu = x.mean(axis=axes, keepdims=True)
        xc = x - mu
        var = (xc * xc).mean(axis=axes, keepdims=True)
        rstd = 1 / xp.sqrt(var + eps)
        xhat = xc * rstd
        ctx.save_for_backward(w)
        ctx.xhat, ctx.rstd, ctx.axes = xhat, rstd, axes
        return _affine(xhat, w, b)

    @staticmethod
    def backward(ctx, g):
        w, = ctx.to_save
        xhat, rstd, axes = ctx.xhat, ctx.rstd, ctx.axes
        need = ctx.needs_input_grad
        ga, kern = _contiguous_for_kernel(g, xhat, rstd, w, False)
        fast = kern and _layer_norm_grads(kern, ga, xhat, rstd, w, axes,
                                          need)
        if ctx._gmake is None and fast:
            return fast
        xp = grad_xp(g)
        if ctx._gmake is not None:
            xhat, rstd = _saved_stats(ctx, g, axes)
        w = ctx.input(1, w)
        lead = tuple(range(g.ndim - len(axes)))
        n = int(np.prod([g.shape[a] for a in axes]))

        def mean(a):
            return xp.sum(a, axis=axes, keepdims=True) / n
        gw = xp.sum(g * xhat, axis=lead) if len(need) > 1 and need[1] \
            else None
        gb = xp.sum(g, axis=lead) if len(need) > 2 and need[2] else None
        gx = None
        if need[0]:
            gh = g * w if w is not None else g
            gx = rstd * (gh - mean(gh) - xhat * mean(gh * xhat))
        return pin_all((gx, gw, gb), fast)


def _layer_norm_kernel(k, ctx, x, w, b, axes, eps):
    n = int(np.prod(x.shape[axes[0]:]))
    x2 = x.reshape(-1, n)
    out, xhat = np.empty_like(x), np.empty_like(x)
    rstd = np.empty(x2.shape[:1] + (1,) * len(axes), x.dtype)
    k.layer_norm_fwd(x2, x2[0] if w is None else w.reshape(-1),
                     x2[0] if b is None else b.reshape(-1),
                     _kernels.scalar(x, eps), out.reshape(-1, n),
                     xhat.reshape(-1, n), rstd.reshape(-1),
                     w is not None, b is not None)
    ctx.xhat, ctx.rstd, ctx.axes = xhat, rstd.reshape(
        x.shape[:axes[0]] + (1,) * len(axes)), axes
    return out


def _layer_norm_grads(k, g, xhat, rstd, w, axes, need):
    n = xhat.size // rstd.size
    g2, h2 = g.reshape(-1, n), xhat.reshape(-1, n)
    gx = gw = gb = None
    if need[0]:
        gx = np.empty_like(g)
        k.layer_norm_bwd_x(g2, h2, rstd.reshape(-1),
                           g2[0] if w is None else w.reshape(-1),
                           w is not None, gx.reshape(-1, n))
    if (len(need) > 1 and need[1]) or (len(need) > 2 and need[2]):
        gw, gb = np.empty(n, g.dtype), np.empty(n, g.dtype)
        k.column_sums(g2, h2, gw, gb)
        shape = xhat.shape[axes[0]:]
        gw = gw.reshape(shape) if len(need) > 1 and need[1] else None
        gb = gb.reshape(shape) if len(need) > 2 and need[2] else None
    return gx, gw, gb


class BatchNorm(Op):
    """Training-mode batch norm over all axes but 1, with batch statistics.
    A fused op (measured 32x64x16x16 float32 forward + backward, process
    CPU time, load 14: 1.27 ms with the compiled kernels against 1.88 ms
    on NumPy's path, medians of 30).

    ``running_mean`` / ``running_var`` (arrays, optional) are updated in
    place with ``momentum`` and the unbiased batch variance, as in PyTorch;
    doing it here saves a second pass over the batch."""
    @staticmethod
    def forward(ctx, x, w=None, b=None, eps=1e-5, running_mean=None,
                running_var=None, momentum=0.1):
        xp = get_array_module(x)
        axes = (0,) + tuple(range(2, x.ndim))
        shape = [1] * x.ndim
        shape[1] = x.shape[1]
        k = _kernels.kernels(x, *(a for a in (w, b) if a is not None),
                             reduces=True)
        if k is not None:           # statistics and affine in one pass
            out, xhat, mu, var = _batch_norm_kernel(k, x, w, b, eps)
            rstd = 1 / xp.sqrt(var + eps)
        else:
            mu = x.mean(axis=axes, keepdims=True)
            xc = x - mu
            var = (xc * xc).mean(axis=axes, keepdims=True)
            rstd = 1 / xp.sqrt(var + eps)
            xhat = xc * rstd
        mu, var, rstd = (a.reshape(shape) for a in (mu, var, rstd))
        ctx.save_for_backward(w)
        ctx.xhat, ctx.rstd, ctx.axes, ctx.shape = xhat, rstd, axes, shape
        m = x.size // x.shape[1]
        if running_mean is not None:
            running_mean *= 1 - momentum
            running_mean += momentum * mu.reshape(-1)
        if running_var is not None:
            running_var *= 1 - momentum
            running_var += (momentum * m / max(m - 1, 1)) * var.reshape(-1)
        if k is not None:     # out is its own array there
            return out
        return _affine(xhat, w, b, shape)

    @staticmethod
    def backward(ctx, g):
        w, = ctx.to_save
        xhat, rstd, axes = ctx.xhat, ctx.rstd, ctx.axes
        need = ctx.needs_input_grad
        ga, k = _contiguous_for_kernel(g, xhat, rstd, w, True)
        fast = None
        if k is not None:
            gx, gsum, gxh = _batch_norm_grads(k, ga, xhat, rstd, w, need[0])
            fast = (gx, gxh if len(need) > 1 and need[1] else None,
                    gsum if len(need) > 2 and need[2] else None)
            if ctx._gmake is None:
                return fast
        xp = grad_xp(g)
        if ctx._gmake is not None:
            xhat, rstd = _saved_stats(ctx, g, axes)
        w = ctx.input(1, w)
        gw = gb = gx = None
        gsum = xp.sum(g, axis=axes)
        gxh = xp.sum(g * xhat, axis=axes)
        if len(need) > 1 and need[1]:
            gw = gxh
        if len(need) > 2 and need[2]:
            gb = gsum
        if need[0]:
            m = ga.size // ga.shape[1]
            scale = rstd if w is None else rstd * w.reshape(ctx.shape)
            gx = scale * (g - (gsum.reshape(ctx.shape)
                               + xhat * gxh.reshape(ctx.shape)) / m)
        return pin_all((gx, gw, gb), fast)


def _batch_norm_kernel(k, x, w, b, eps):
    """The compiled training-mode forward: (out, xhat, mean, var), mean and
    var per channel (1-D)."""
    n, c = x.shape[:2]
    x3 = x.reshape(n, c, -1)
    out, xhat = np.empty_like(x), np.empty_like(x)
    mu, var = np.empty(c, x.dtype), np.empty(c, x.dtype)
    k.batch_norm_fwd(x3, x3[0, 0] if w is None else w, x3[0, 0]
                     if b is None else b, _kernels.scalar(x, eps),
                     out.reshape(x3.shape), xhat.reshape(x3.shape), mu, var,
                     w is not None, b is not None)
    return out, xhat, mu, var


def _batch_norm_grads(k, g, xhat, rstd, w, need_x):
    """The compiled backward: (gx or None, sum of g, sum of g xhat)."""
    n, c = g.shape[:2]
    g3 = g.reshape(n, c, -1)
    gx = np.empty_like(g) if need_x else g
    gsum, gxh = np.empty(c, g.dtype), np.empty(c, g.dtype)
    k.batch_norm_bwd(g3, xhat.reshape(g3.shape), rstd.reshape(-1),
                     g3[0, 0] if w is None else w, w is not None, need_x,
                     gx.reshape(g3.shape), gsum, gxh)
    return (gx if need_x else None), gsum, gxh


class ChannelAffine(Op):
    """``x * scale + shift`` with ``scale`` and ``shift`` (C,) along axis
    1 of x (N, C, *), either None: eval-mode batch norm (scale = w / sqrt(
    running_var + eps), shift = b - running_mean scale) and group norm's
    weight and bias. One pass and one node each way; the compiled kernel's
    forward and input gradient are the NumPy path's bits (threads split
    the planes); the per-channel sums of backward run in float64, one
    thread per channel (not under use_deterministic_algorithms(True),
    whose bits are the NumPy path's). Measured 16x32x16x16 float32,
    benchmarks/cpu_kernels.py --torch (eval batch norm) and --only
    channel_affine (against NumPy): eval batch norm fwd+bwd 1.91x -> 1.18x
    torch at one thread (load 3.9), forward alone 6.9x -> 1.55x."""
    @staticmethod
    def forward(ctx, x, scale=None, shift=None):
        shape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
        ctx.save_for_backward(x, scale)
        ctx.shape = shape
        ctx.has_shift = shift is not None
        k = _kernels.kernels(x, *(a for a in (scale, shift)
                                  if a is not None)) if x.ndim >= 2 else None
        if k is not None:
            out = np.empty_like(x)
            x3 = x.reshape(x.shape[0], x.shape[1], -1)
            k.channel_affine(x3, x3[0, :, 0] if scale is None else scale,
                             x3[0, :, 0] if shift is None else shift,
                             scale is not None, shift is not None,
                             out.reshape(x3.shape))
            return out
        return _affine(x, scale, shift, shape)

    @staticmethod
    def backward(ctx, g):
        x, s = ctx.to_save
        need = tuple(ctx.needs_input_grad) + (False,) * 3
        need_s, need_t = need[1] and s is not None, need[2] and ctx.has_shift
        fast = None
        if ctx._gmake is None:
            fast = _channel_affine_grads(g, x, s, need[0], need_s, need_t)
            if fast is not None:
                return fast
        xp = grad_xp(g)
        axes = (0,) + tuple(range(2, x.ndim))
        gx = gs = gt = None
        if need[0]:
            si = ctx.input(1, s)
            gx = g if si is None else g * si.reshape(ctx.shape)
        if need_s:
            gs = xp.sum(g * ctx.input(0, x), axis=axes)
        if need_t:
            gt = xp.sum(g, axis=axes)
        return gx, gs, gt


def _channel_affine_grads(g, x, s, need_x, need_s, need_t):
    """The compiled backward of ChannelAffine, or None (no kernel)."""
    ga = getattr(g, "_data", g)
    sums = need_s or need_t
    arrays = (x,) if s is None else (x, s)
    k = _kernels.kernels(*arrays, reduces=sums)
    if k is None or type(ga) is not np.ndarray or ga.dtype != x.dtype \
            or x.ndim < 2:
        return None
    ga = np.ascontiguousarray(ga)
    n, c = x.shape[:2]
    g3, x3 = ga.reshape(n, c, -1), x.reshape(n, c, -1)
    s1 = x3[0, :, 0] if s is None else s
    gx = np.empty_like(ga) if need_x else None
    if not sums:
        # the input gradient alone: the forward kernel's g * s
        k.channel_affine(g3, s1, s1, s is not None, False,
                         gx.reshape(g3.shape))
        return gx, None, None
    gs, gt = np.empty(c, x.dtype), np.empty(c, x.dtype)
    k.channel_affine_bwd(g3, x3, s1, s is not None, need_x, need_s,
                         g3 if gx is None else gx.reshape(g3.shape), gs, gt)
    return gx, (gs if need_s else None), (gt if need_t else None)


class Dropout(Op):
    """x * mask / (1 - p) with a given boolean keep-mask. Backward is a
    product with the mask too, as PyTorch's (an infinite gradient at a
    dropped element gives NaN in both)."""
    @staticmethod
    def forward(ctx, x, keep=None, p=0.5):
        scale = x.dtype.type(1.0 / (1.0 - p)) if is_float(x.dtype) else \
            1.0 / (1.0 - p)
        ctx.keep, ctx.scale = keep, scale
        return _mask_scale(x, keep, scale)

    @staticmethod
    def backward(ctx, g):
        return _mask_scale(g, ctx.const(ctx.keep), ctx.scale), None


def _mask_scale(x, keep, scale):
    """x * keep * scale: one threaded pass (the compiled kernel) when keep
    is a boolean array of x's shape, else NumPy's two (the same values;
    also on a gradient tensor under create_graph)."""
    if type(x) is not np.ndarray and hasattr(x, "_make"):
        return x * keep * float(scale)
    k = _kernels.kernels(x) if (
        type(keep) is np.ndarray and keep.dtype == bool
        and keep.shape == x.shape and keep.flags.c_contiguous
        and isinstance(scale, x.dtype.type)) else None
    if k is None:
        return x * keep * scale
    out = np.empty_like(x)
    k.mask_scale(_kernels.flat(x), _kernels.flat(keep), scale,
                 _kernels.flat(out))
    return out


def _contiguous_for_kernel(g, xhat, rstd, w, reduces):
    """(g's array, the compiled kernels or None): whether the kernel
    applies is decided on what forward saved, not on g's layout (a
    broadcast gradient is made contiguous), so that both orders take the
    same path and give the same values."""
    ga = getattr(g, "_data", g)
    k = _kernels.kernels(xhat, rstd, *(() if w is None else (w,)),
                         reduces=reduces)
    if k is None or type(ga) is not np.ndarray or ga.dtype != xhat.dtype:
        return ga, None
    return np.ascontiguousarray(ga), k


def _saved_stats(ctx, g, axes):
    """LayerNorm's / BatchNorm's saved xhat and rstd under create_graph:
    their saved values (``pin``) with the derivatives of their
    recomputation from x. Forward keeps xhat and rstd, not x: x - mean(x)
    = xhat / rstd stands for x, as both ops are invariant to a shift of x
    along the normalised axes (their gradients are the same at both
    points), and rstd is rebuilt as (var + c)^-1/2 with c = 1 / rstd^2 -
    var, eps up to rounding."""
    xhat_a, rstd_a = ctx.xhat, ctx.rstd
    xp = grad_xp(g)
    n = int(np.prod([xhat_a.shape[a] for a in axes]))
    with np.errstate(divide="ignore", invalid="ignore"):
        xc_a = xhat_a / rstd_a          # rstd is finite and > 0
        c = 1 / (rstd_a * rstd_a) - (xc_a * xc_a).mean(axis=axes,
                                                       keepdims=True)
    x = ctx.input(0, xc_a)
    xc = x - xp.sum(x, axis=axes, keepdims=True) / n
    var = xp.sum(xc * xc, axis=axes, keepdims=True) / n + ctx.const(c)
    rstd = pin(1 / xp.sqrt(var), rstd_a)
    return pin(xc * rstd, xhat_a), rstd
