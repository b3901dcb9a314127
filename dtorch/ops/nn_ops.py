"""Fused neural-network primitives: forward and backward side by side.

These exist where composing Tensor ops costs time or memory (one node instead
of many, no per-element Python): convolution by im2col over strided views and
one batched matmul, pooling, softmax / log_softmax, nll, layer / batch norm,
embedding, dropout, GELU, and whole-sequence RNN / LSTM / GRU layers whose
input projections are computed for all time steps before the loop; and where
a composition would get the gradient wrong at a boundary point: the
piecewise activations and the losses carry PyTorch's own backward formulas
(tests/test_boundary_grads.py compares them with PyTorch at 0, +-inf, NaN,
kinks and ties). Like
``primitives.py``, every class works on raw NumPy or CuPy arrays and asks
``get_array_module`` for the module; each is checked in tests against
gradcheck and against the composed Tensor version.
"""
import ctypes
import math
import os
import sys

import numpy as np

from .._backend import get_array_module, put_along_axis
from .primitives import Op, index_add0, keep_grad, unbroadcast


def _tune_malloc():
    """Keep freed NumPy buffers in glibc's heap for reuse.

    A training step allocates and frees the same few large arrays (im2col
    columns, gate buffers, gradients) every step. By default glibc serves
    such sizes with fresh mmap()s, or trims the heap top, so every step
    page-faults its working set in again: measured 1-3 thousand faults and
    up to 10 ms of system time per CNN step. PyTorch's allocator reuses its
    memory. Raising the mmap threshold to glibc's maximum (32 MB) and the
    trim threshold to 256 MB keeps that memory mapped; peak RSS is
    unchanged, only the return of freed memory to the OS is delayed. Set
    DTORCH_MALLOC_TUNING=0 to leave malloc alone."""
    if (not sys.platform.startswith("linux")
            or os.environ.get("DTORCH_MALLOC_TUNING", "1") == "0"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 32 << 20)       # M_MMAP_THRESHOLD
        libc.mallopt(-1, 256 << 20)      # M_TRIM_THRESHOLD
    except (OSError, AttributeError):    # not glibc (musl, ...): skip
        pass


_tune_malloc()


# ============================================================ helpers ==

def _as_strided(xp, x, shape, strides):
    return xp.lib.stride_tricks.as_strided(x, shape=shape, strides=strides)


def _pad2d(xp, x, pads, value=0.0):
    """Pad the last two axes by ((top, bottom), (left, right))."""
    (t, b), (l, r) = pads
    if not (t or b or l or r):
        return x
    return xp.pad(x, ((0, 0), (0, 0), (t, b), (l, r)),
                  constant_values=value)


def _windows(xp, x, k, stride, dilation, out_hw):
    """View (N, C, KH, KW, OH, OW) of the sliding windows of padded x."""
    n, c = x.shape[:2]
    sn, sc, sh, sw = x.strides
    return _as_strided(
        xp, x, (n, c, k[0], k[1], out_hw[0], out_hw[1]),
        (sn, sc, sh * dilation[0], sw * dilation[1],
         sh * stride[0], sw * stride[1]))


def _col2im(xp, cols, shape, k, stride, dilation, out_hw):
    """The adjoint of ``_windows``: sum (N, C, KH, KW, OH, OW) back into an
    array of (padded) ``shape``, one strided slice per kernel offset (never
    ``add.at``)."""
    out = xp.zeros(shape, cols.dtype)
    oh, ow = out_hw
    for i in range(k[0]):
        h0 = i * dilation[0]
        hs = slice(h0, h0 + stride[0] * (oh - 1) + 1, stride[0])
        for j in range(k[1]):
            w0 = j * dilation[1]
            ws = slice(w0, w0 + stride[1] * (ow - 1) + 1, stride[1])
            out[:, :, hs, ws] += cols[:, :, i, j]
    return out


def _unpad2d(x, pads):
    (t, b), (l, r) = pads
    h, w = x.shape[-2:]
    return x[..., t:h - b, l:w - r]


def conv_out_size(size, k, stride, pad_total, dilation):
    return (size + pad_total - dilation * (k - 1) - 1) // stride + 1


# ============================================================ convolution ==

class Conv2d(Op):
    """out = conv2d(x, w) + b for x (N, C, H, W), w (O, C/groups, KH, KW).

    groups == 1 (the common case) works channels-last: the input is padded
    into an (N, H, W, C) buffer whose strided window view gives columns
    (N*OH*OW, KH*KW*C) with C innermost, so that building them copies
    whole channel runs. The columns are never built for the whole batch:
    one chunk of images at a time (``_conv_chunks``) is copied and handed
    to a 2-D GEMM while it is still in cache, and backward builds them
    again from the padded input it kept (measured for the benchmark CNN's
    second conv, 64x32x14x14, 3x3: forward 7.7 -> 5.9 ms, weight gradient
    7.1 -> 6.4 ms, and 14 MB of columns no longer held between forward and
    backward). The input gradient of a stride-1 convolution is itself a
    convolution of the output gradient with the flipped, transposed kernel,
    computed the same way (10.5 -> 8.0 ms against a GEMM per kernel offset
    and a scatter-add); other strides scatter-add per kernel offset.
    Few input channels (an image's first layer) and groups > 1 use NCHW
    columns (N, G, C/G*KH*KW, OH*OW) and a batched matmul over groups.
    """
    @staticmethod
    def forward(ctx, x, w, b=None, stride=(1, 1), pads=((0, 0), (0, 0)),
                dilation=(1, 1), groups=1):
        xp = get_array_module(x)
        n, c, h, wd = x.shape
        o, cg, kh, kw = w.shape
        hp, wp = h + sum(pads[0]), wd + sum(pads[1])
        oh = conv_out_size(h, kh, stride[0], sum(pads[0]), dilation[0])
        ow = conv_out_size(wd, kw, stride[1], sum(pads[1]), dilation[1])
        if oh <= 0 or ow <= 0:
            raise RuntimeError(
                f"Calculated padded input size per channel: "
                f"({hp} x {wp}). Kernel size: "
                f"({dilation[0] * (kh - 1) + 1} x "
                f"{dilation[1] * (kw - 1) + 1}). Kernel size can't be "
                f"greater than actual input size")
        ctx.save_for_backward(w)
        # few input channels (an image's first layer): channels-last
        # columns would be copied a handful of elements at a time; the NCHW
        # columns copy whole rows and the batched matmul yields NCHW
        # (measured C=1: 0.8 vs 2.1 ms, C=8: 5.3 vs 7.9 ms forward)
        ctx.nchw = groups != 1 or c * kh * kw < 128
        if ctx.nchw:
            return _conv2d_grouped(ctx, xp, x, w, b, stride, pads, dilation,
                                   groups, (oh, ow))
        out, xpad = _conv_nhwc(xp, x, w, b, stride, pads, dilation, (oh, ow))
        ctx.xpad, ctx.meta = xpad, (x.shape, pads, stride, dilation, 1,
                                    (oh, ow))
        return out

    @staticmethod
    def backward(ctx, g):
        w, = ctx.to_save
        xshape, pads, stride, dilation, groups, ohw = ctx.meta
        xp = get_array_module(g)
        if ctx.nchw:
            return _conv2d_grouped_backward(ctx, xp, g, w, ctx.cols)
        o, c, kh, kw = w.shape
        n, L = g.shape[0], ohw[0] * ohw[1]
        need = ctx.needs_input_grad
        gx = gw = gb = None
        if need[0]:
            gx = _conv_nhwc_input_grad(xp, g, w, xshape, pads, stride,
                                       dilation, ohw)
        if need[1] or (len(need) > 2 and need[2]):
            # g as (N*OH*OW, O): one copy of the output's size
            gl = xp.ascontiguousarray(xp.swapaxes(g.reshape(n, o, L), 1, 2))
            gl = gl.reshape(n * L, o)
        if need[1]:
            # the sum over chunks of (O, rows) @ (rows, KH*KW*C)
            win = _nhwc_windows(xp, ctx.xpad, (kh, kw), stride, dilation,
                                ohw)
            gw = xp.zeros((o, kh * kw * c), g.dtype)
            for s, e in _conv_chunks(xp, n, L * kh * kw * c * g.itemsize):
                cols = win[s:e].reshape((e - s) * L, -1)
                gw += gl[s * L:e * L].T @ cols
            gw = xp.ascontiguousarray(
                gw.reshape(o, kh, kw, c).transpose(0, 3, 1, 2))
        if len(need) > 2 and need[2]:
            gb = gl.sum(axis=0)
        return gx, gw, gb


# bytes of columns per chunk: the chunk is copied, then read by the GEMM
# while it is in L2 / L3 (measured 4-16 images of 14x14x288 floats, about
# 1-4 MB, equally fast; the whole batch, 14 MB, 25% slower)
_CONV_CHUNK_BYTES = 2 << 20


def _conv_chunks(xp, n, image_bytes):
    """[start, stop) ranges of images whose columns take about
    ``_CONV_CHUNK_BYTES`` each; one range on a GPU, where columns are not
    the bottleneck and one large GEMM is best."""
    if xp is not np:
        return [(0, n)]
    step = max(1, _CONV_CHUNK_BYTES // max(1, image_bytes))
    return [(s, min(n, s + step)) for s in range(0, n, step)]


def _nhwc_windows(xp, xpad, k, stride, dilation, ohw):
    """(N, OH, OW, KH, KW, C) view of the windows of a padded channels-last
    (N, Hp, Wp, C) array; reshaped per image it is the column matrix."""
    n, c = xpad.shape[0], xpad.shape[3]
    sn, sh, sw, sc = xpad.strides
    return _as_strided(xp, xpad, (n, ohw[0], ohw[1], k[0], k[1], c),
                       (sn, sh * stride[0], sw * stride[1],
                        sh * dilation[0], sw * dilation[1], sc))


def _conv_nhwc(xp, x, w, b, stride, pads, dilation, ohw):
    """groups == 1 convolution (out (N, O, OH, OW), the padded channels-last
    input that backward rebuilds the columns from). Per chunk of images:
    columns (rows, KH*KW*C) @ (KH*KW*C, O), plus the bias, then one
    transposing copy into NCHW while the result is in cache."""
    n, c = x.shape[:2]
    o, _, kh, kw = w.shape
    oh, ow = ohw
    L, K = oh * ow, kh * kw * c
    xpad = _nhwc_padded(xp, x, pads)
    win = _nhwc_windows(xp, xpad, (kh, kw), stride, dilation, ohw)
    w2t = w.transpose(0, 2, 3, 1).reshape(o, K).T
    out = xp.empty((n, o, oh, ow), x.dtype)
    for s, e in _conv_chunks(xp, n, L * K * x.itemsize):
        r = win[s:e].reshape((e - s) * L, K) @ w2t
        if b is not None:
            r += b
        out[s:e] = r.reshape(e - s, oh, ow, o).transpose(0, 3, 1, 2)
    return out, xpad


def _conv_nhwc_input_grad(xp, g, w, xshape, pads, stride, dilation, ohw):
    """Gradient of a groups == 1 convolution with respect to its input.

    For stride 1, gx[y] = sum_i g[y + pt - d*i] w[i] is a convolution of g,
    padded by d*(k-1) - pt before and d*(k-1) - pb after, with the kernel
    flipped and its in/out channels swapped; it runs through
    ``_conv_nhwc`` (chunked columns, one GEMM each). Other strides, or
    padding wider than the dilated kernel, scatter-add one (N*OH*OW, C)
    block per kernel offset (``_col2im_nhwc``)."""
    o, c, kh, kw = w.shape
    n, L = g.shape[0], ohw[0] * ohw[1]
    full = [(d * (k - 1) - p0, d * (k - 1) - p1)
            for d, k, (p0, p1) in zip(dilation, (kh, kw), pads)]
    if tuple(stride) == (1, 1) and min(min(p) for p in full) >= 0:
        wf = w[:, :, ::-1, ::-1].swapaxes(0, 1)
        return _conv_nhwc(xp, g, wf, None, (1, 1), tuple(full), dilation,
                          xshape[2:])[0]
    gl = xp.ascontiguousarray(xp.swapaxes(g.reshape(n, o, L), 1, 2))
    # one (N*OH*OW, C) block per kernel offset, offset-major, so that each
    # slice-add in col2im runs over whole (OW, C) rows
    wk = w.transpose(2, 3, 0, 1).reshape(kh * kw, o, c)
    return _col2im_nhwc(xp, gl.reshape(n * L, o) @ wk, xshape, pads,
                        (kh, kw), stride, dilation, ohw)


def _nhwc_padded(xp, x, pads):
    """x (N, C, H, W) as a zero-padded channels-last (N, Hp, Wp, C) array.
    Without padding, an input that is channels-last in memory already is
    used as it is."""
    n, c, h, w = x.shape
    (t, b), (l, r) = pads
    xt = x.transpose(0, 2, 3, 1)
    if not (t or b or l or r):
        return xp.ascontiguousarray(xt)
    out = xp.zeros((n, h + t + b, w + l + r, c), x.dtype)
    out[:, t:t + h, l:l + w] = xt
    return out


def _col2im_nhwc(xp, gk, xshape, pads, k, stride, dilation, ohw):
    """Adjoint of the channels-last window view: sum per-offset blocks
    ``gk`` (KH*KW, N*OH*OW, C) into the padded (N, Hp, Wp, C) input, one
    strided slice-add per kernel offset; return the unpadded NCHW part."""
    n, c, h, w = xshape
    (t, b), (l, r) = pads
    oh, ow = ohw
    gk = gk.reshape(k[0] * k[1], n, oh, ow, c)
    gxp = xp.zeros((n, h + t + b, w + l + r, c), gk.dtype)
    for i in range(k[0]):
        h0 = i * dilation[0]
        hs = slice(h0, h0 + stride[0] * (oh - 1) + 1, stride[0])
        for j in range(k[1]):
            w0 = j * dilation[1]
            ws = slice(w0, w0 + stride[1] * (ow - 1) + 1, stride[1])
            gxp[:, hs, ws] += gk[i * k[1] + j]
    gx = gxp[:, t:t + h, l:l + w].transpose(0, 3, 1, 2)
    return xp.ascontiguousarray(gx)


def _conv2d_grouped(ctx, xp, x, w, b, stride, pads, dilation, groups, ohw):
    n = x.shape[0]
    o, cg, kh, kw = w.shape
    oh, ow = ohw
    xpad = _pad2d(xp, x, pads)
    win = _windows(xp, xpad, (kh, kw), stride, dilation, (oh, ow))
    cols = win.reshape(n, groups, cg * kh * kw, oh * ow)
    w2 = w.reshape(groups, o // groups, cg * kh * kw)
    out = (w2 @ cols).reshape(n, o, oh, ow)
    if b is not None:
        out += b.reshape(1, o, 1, 1)
    ctx.cols, ctx.meta = cols, (xpad.shape, pads, stride, dilation,
                                groups, (oh, ow))
    return out


def _conv2d_grouped_backward(ctx, xp, g, w, cols):
    pshape, pads, stride, dilation, groups, ohw = ctx.meta
    o, cg, kh, kw = w.shape
    n = g.shape[0]
    g3 = g.reshape(n, groups, o // groups, ohw[0] * ohw[1])
    need = ctx.needs_input_grad
    gx = gw = gb = None
    if need[0]:
        w2 = w.reshape(groups, o // groups, cg * kh * kw)
        gcols = xp.swapaxes(w2, -1, -2) @ g3
        gcols = gcols.reshape(n, groups * cg, kh, kw, *ohw)
        gx = _unpad2d(_col2im(xp, gcols, pshape, (kh, kw), stride,
                              dilation, ohw), pads)
    if need[1]:
        gw = (g3 @ xp.swapaxes(cols, -1, -2)).sum(0).reshape(w.shape)
    if len(need) > 2 and need[2]:
        gb = g.sum(axis=(0, 2, 3))
    return gx, gw, gb


class ConvTranspose2d(Op):
    """The adjoint of Conv2d in x: w is (C_in, C_out/groups, KH, KW)."""
    @staticmethod
    def forward(ctx, x, w, b=None, stride=(1, 1), pads=((0, 0), (0, 0)),
                dilation=(1, 1), groups=1, output_padding=(0, 0)):
        xp = get_array_module(x)
        n, c, h, wd = x.shape
        _, og, kh, kw = w.shape
        ph = (h - 1) * stride[0] + dilation[0] * (kh - 1) + 1 \
            + output_padding[0]
        pw = (wd - 1) * stride[1] + dilation[1] * (kw - 1) + 1 \
            + output_padding[1]
        w2 = w.reshape(groups, c // groups, og * kh * kw)
        x3 = x.reshape(n, groups, c // groups, h * wd)
        cols = (xp.swapaxes(w2, -1, -2) @ x3).reshape(
            n, groups * og, kh, kw, h, wd)
        out = _unpad2d(_col2im(xp, cols, (n, groups * og, ph, pw), (kh, kw),
                               stride, dilation, (h, wd)), pads)
        out = xp.ascontiguousarray(out)
        if b is not None:
            out += b.reshape(1, -1, 1, 1)
        ctx.save_for_backward(x, w)
        ctx.meta = ((n, groups * og, ph, pw), pads, stride, dilation, groups)
        return out

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.to_save
        pshape, pads, stride, dilation, groups = ctx.meta
        xp = get_array_module(g)
        n, c, h, wd = x.shape
        _, og, kh, kw = w.shape
        gpad = _pad2d(xp, g, pads)
        if gpad.shape[2:] != pshape[2:]:   # output_padding rows/cols
            gpad = xp.pad(gpad, ((0, 0), (0, 0),
                                 (0, pshape[2] - gpad.shape[2]),
                                 (0, pshape[3] - gpad.shape[3])))
        win = _windows(xp, gpad, (kh, kw), stride, dilation, (h, wd))
        cols = win.reshape(n, groups, og * kh * kw, h * wd)
        need = ctx.needs_input_grad
        gx = gw = gb = None
        if need[0]:
            w2 = w.reshape(groups, c // groups, og * kh * kw)
            gx = (w2 @ cols).reshape(x.shape)
        if need[1]:
            x3 = x.reshape(n, groups, c // groups, h * wd)
            gw = (x3 @ xp.swapaxes(cols, -1, -2)).sum(0).reshape(w.shape)
        if len(need) > 2 and need[2]:
            gb = g.sum(axis=(0, 2, 3))
        return gx, gw, gb


# ================================================================ pooling ==

class MaxPool2d(Op):
    """Max over windows; the gradient goes to the first maximum of each
    window (row-major), as in PyTorch.

    Forward is a running ``maximum`` over one strided slice of the (padded)
    input per kernel offset: no window copies, no argmax over a gathered
    axis, no index array kept. Backward finds the winners again by
    comparing each offset's slice with the output, in offset order, with a
    mask of windows already served so that ties credit the first one. When
    windows tile the input (kernel == stride, no padding, dilation 1: the
    usual 2x2 pool) the offsets' slices are disjoint views of one reshaped
    array, written once each.

    The 2x2 tiling of a contiguous input has its own path: NumPy's loops
    over (N, C, OH, OW) slices of the windows run only OW elements at a
    time, so forward keeps, next to the maxima, which column won in every
    window row (a 1-D pass over all rows) and which row won (the first
    maximum in row-major order, as in PyTorch); backward then spreads g
    over the two rows and over the two columns, four products in all
    instead of a dozen comparisons and masks (benchmark CNN, forward +
    backward: 64x32x28x28 6.7 -> 5.2 ms; 64x64x14x14, rows of 7, 2.7 ->
    2.9 ms).

    PyTorch's rule in a window: a cell wins if it is greater than the best
    so far or if it is NaN, so ties go to the first maximum and a window
    holding NaN sends its gradient to its last NaN cell. Backward masks
    with where() when g holds inf or NaN (g * 0 would be NaN); with a
    finite g the products are exact and faster."""
    @staticmethod
    def forward(ctx, x, k=(2, 2), stride=(2, 2), pads=((0, 0), (0, 0)),
                dilation=(1, 1), out_hw=None):
        xp = get_array_module(x)
        n, c, h, w = x.shape
        oh, ow = out_hw
        lo = -xp.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
        # pad the bottom/right so that ceil_mode windows are in bounds
        ph = max(0, (oh - 1) * stride[0] + dilation[0] * (k[0] - 1) + 1
                 - h - pads[0][0])
        pw = max(0, (ow - 1) * stride[1] + dilation[1] * (k[1] - 1) + 1
                 - w - pads[1][0])
        pads = ((pads[0][0], ph), (pads[1][0], pw))
        ctx.meta = (x.shape, k, stride, pads, dilation, (oh, ow))
        tiled = (tuple(k) == tuple(stride) and tuple(dilation) == (1, 1)
                 and not any(pads[0] + pads[1]))
        ctx.tiled = tiled
        ctx.pairs = (tiled and tuple(k) == (2, 2) and x.flags.c_contiguous
                     and oh * 2 == h and ow * 2 == w)
        if ctx.pairs:
            # the two cells of every window row as 1-D strided views: one
            # long loop each; then the two rows of every window
            cells = x.reshape(-1, 2)
            col = cells[:, 1] > cells[:, 0]         # the right cell won
            rows = xp.maximum(cells[:, 0], cells[:, 1])
            rows = rows.reshape(n * c * oh, 2, ow)
            low = rows[:, 1] > rows[:, 0]           # the lower row won
            best = xp.maximum(rows[:, 0], rows[:, 1])
            if _has_nan(xp, best):                  # a later NaN wins
                col |= xp.isnan(cells[:, 1])
                low |= xp.isnan(rows[:, 1])
            ctx.save_for_backward(col, low)
            return best.reshape(n, c, oh, ow)
        if tiled:
            x6 = _tiles(x, k, (oh, ow))
            # columns first, then rows: contiguous reads in the first pass
            best = x6[..., 0]
            if k[1] > 1:
                best = xp.maximum(best, x6[..., 1])
                for j in range(2, k[1]):
                    xp.maximum(best, x6[..., j], out=best)
            rows = best
            best = rows[:, :, :, 0]
            if k[0] > 1:
                best = xp.maximum(best, rows[:, :, :, 1])
                for i in range(2, k[0]):
                    xp.maximum(best, rows[:, :, :, i], out=best)
            elif k[1] == 1:
                best = best.copy()
            ctx.save_for_backward(x, best)
            return best
        xpad = _pad2d(xp, x, pads, lo)
        best = None
        for hs, ws in _offsets(k, stride, dilation, (oh, ow)):
            v = xpad[:, :, hs, ws]
            if best is None:
                best = v.copy()
            else:
                xp.maximum(best, v, out=best)
        ctx.save_for_backward(xpad, best)
        return best

    @staticmethod
    def backward(ctx, g):
        xp = get_array_module(g)
        shape, k, stride, pads, dilation, ohw = ctx.meta
        finite = bool(xp.isfinite(g).all()) if g.dtype.kind == "f" else True
        if ctx.pairs:
            col, low = ctx.to_save
            n, c, h, w = shape
            g2 = g.reshape(-1, ohw[1])
            # g to the winning row of each window, then to its winning cell
            # (g - g * mask: exact for a finite g, one product per pair
            # instead of two)
            gr = xp.empty((g2.shape[0], 2, ohw[1]), g.dtype)
            gx = xp.empty(shape, g.dtype)
            cells = gx.reshape(-1, 2)
            if finite:
                xp.multiply(g2, low, out=gr[:, 1])
                xp.subtract(g2, gr[:, 1], out=gr[:, 0])
                gr = gr.reshape(-1)
                xp.multiply(gr, col, out=cells[:, 1])
                xp.subtract(gr, cells[:, 1], out=cells[:, 0])
                return gx
            zero = xp.zeros((), g.dtype)
            gr[:, 1] = xp.where(low, g2, zero)
            gr[:, 0] = xp.where(low, zero, g2)
            gr = gr.reshape(-1)
            cells[:, 1] = xp.where(col, gr, zero)
            cells[:, 0] = xp.where(col, zero, gr)
            return gx
        xin, best = ctx.to_save
        n, c = shape[:2]
        offs = list(_offsets(k, stride, dilation, ohw))
        if ctx.tiled:
            oh, ow = ohw
            exact = oh * k[0] == shape[2] and ow * k[1] == shape[3]
            gx = (xp.empty if exact else xp.zeros)(shape, g.dtype)
            x6, g6 = _tiles(xin, k, ohw), _tiles(gx, k, ohw)
            srcs = [(x6[:, :, :, i, :, j], g6[:, :, :, i, :, j])
                    for i in range(k[0]) for j in range(k[1])]
        else:
            gx = xp.zeros(xin.shape, g.dtype)
            srcs = [(xin[:, :, hs, ws], gx[:, :, hs, ws])
                    for hs, ws in offs]
        # a window whose real cells all hold the padding value (-inf) gives
        # its gradient to its first real cell, as PyTorch, not to padding
        real = None
        if any(pads[0] + pads[1]):
            lo = -np.inf if best.dtype.kind == "f" else \
                np.iinfo(best.dtype).min
            if bool((best == lo).any()):
                real = _pad2d(xp, xp.ones((1, 1) + tuple(shape[2:]), bool),
                              pads, False)
                real = [real[:, :, hs, ws] for hs, ws in offs]
        zero = xp.zeros((), g.dtype)

        def put(dst, e):
            if e is None:
                dst[...] = g
            elif ctx.tiled:
                if finite:
                    xp.multiply(g, e, out=dst)
                else:
                    dst[...] = xp.where(e, g, zero)
            else:
                dst += g * e if finite else xp.where(e, g, zero)

        # windows whose maximum is NaN are served last, by their last NaN
        nanw = xp.isnan(best) if _has_nan(xp, best) else None
        taken = None if nanw is None else nanw.copy()
        last = len(srcs) - 1
        for o, (v, dst) in enumerate(srcs):
            if o == last and ctx.tiled:
                # the only window cells left are the maxima
                e = ~taken if taken is not None else None
            else:
                e = v == best
                if real is not None:
                    e &= real[o]
                if taken is None:
                    taken = e
                else:
                    xp.greater(e, taken, out=e)   # e and not taken
                    taken |= e
            put(dst, e)
        if nanw is not None:
            taken = ~nanw
            for v, dst in reversed(srcs):
                e = xp.isnan(v) & ~taken
                taken |= e
                if ctx.tiled:
                    dst[...] = xp.where(e, g, dst)
                else:
                    dst += xp.where(e, g, zero)
        return gx if ctx.tiled else _unpad2d(gx, pads)


def _has_nan(xp, a):
    """Whether a float array holds a NaN: one max (NaN propagates), no
    boolean array."""
    return a.dtype.kind == "f" and a.size > 0 and bool(xp.isnan(a.max()))


def _tiles(x, k, ohw):
    """(N, C, OH, KH, OW, KW) view of the windows of a pool whose kernel
    equals its stride (the cells of x past the last window are dropped)."""
    n, c = x.shape[:2]
    oh, ow = ohw
    return x[:, :, :oh * k[0], :ow * k[1]].reshape(n, c, oh, k[0], ow, k[1])


def _offsets(k, stride, dilation, out_hw):
    """(rows, cols) slices that pick kernel offset (i, j) of every window."""
    oh, ow = out_hw
    for i in range(k[0]):
        h0 = i * dilation[0]
        hs = slice(h0, h0 + stride[0] * (oh - 1) + 1, stride[0])
        for j in range(k[1]):
            w0 = j * dilation[1]
            yield hs, slice(w0, w0 + stride[1] * (ow - 1) + 1, stride[1])


class AvgPool2d(Op):
    """Mean over windows (count_include_pad: padding counts as zeros, or a
    divisor per window that counts only real input cells)."""
    @staticmethod
    def forward(ctx, x, k=(2, 2), stride=(2, 2), pads=((0, 0), (0, 0)),
                out_hw=None, divisor=None):
        xp = get_array_module(x)
        n, c, h, w = x.shape
        oh, ow = out_hw
        ph = max(0, (oh - 1) * stride[0] + k[0] - h - pads[0][0])
        pw = max(0, (ow - 1) * stride[1] + k[1] - w - pads[1][0])
        pads = ((pads[0][0], ph), (pads[1][0], pw))
        if (tuple(k) == tuple(stride) and not any(pads[0] + pads[1])
                and isinstance(divisor, (int, float))):
            out = x[:, :, :oh * k[0], :ow * k[1]].reshape(
                n, c, oh, k[0], ow, k[1]).sum(axis=(3, 5))
        else:
            win = _windows(xp, _pad2d(xp, x, pads), k, stride, (1, 1),
                           (oh, ow))
            out = win.sum(axis=(2, 3))
        out = out / xp.asarray(divisor, dtype=x.dtype)
        ctx.meta = (x.shape, k, stride, pads, (oh, ow), divisor)
        return out.astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        xp = get_array_module(g)
        shape, k, stride, pads, ohw, divisor = ctx.meta
        n, c = shape[:2]
        g = g / xp.asarray(divisor, dtype=g.dtype)
        cols = xp.broadcast_to(g[:, :, None, None], (n, c, k[0], k[1]) + ohw)
        pshape = (n, c, shape[2] + sum(pads[0]), shape[3] + sum(pads[1]))
        return _unpad2d(_col2im(xp, cols, pshape, k, stride, (1, 1), ohw),
                        pads)


# ======================================================= softmax family ==

class Softmax(Op):
    """softmax along ``dim``. ``safe``: PyTorch's _safe_softmax (its
    scaled_dot_product_attention): a slice that is -inf throughout (a
    fully masked attention row) gives 0, and so a zero gradient, not
    NaN."""
    @staticmethod
    def forward(ctx, x, dim=-1, safe=False):
        xp = get_array_module(x)
        with np.errstate(invalid="ignore"):
            e = xp.exp(x - x.max(axis=dim, keepdims=True))
            e /= e.sum(axis=dim, keepdims=True)
        if safe and x.dtype.kind == "f":
            dead = (x == -np.inf).all(axis=dim, keepdims=True)
            if bool(dead.any()):
                e = xp.where(dead, _zero(xp, e), e)
        ctx.save_for_backward(e)
        ctx.dim = dim
        return e

    @staticmethod
    def backward(ctx, g):
        y, = ctx.to_save
        gy = g * y
        return gy - y * gy.sum(axis=ctx.dim, keepdims=True)


def _log_softmax(x, dim):
    xp = get_array_module(x)
    s = x - x.max(axis=dim, keepdims=True)
    s -= xp.log(xp.exp(s).sum(axis=dim, keepdims=True))
    return s


class LogSoftmax(Op):
    @staticmethod
    def forward(ctx, x, dim=-1):
        s = _log_softmax(x, dim)
        ctx.save_for_backward(s)
        ctx.dim = dim
        return s

    @staticmethod
    def backward(ctx, g):
        y, = ctx.to_save
        xp = get_array_module(g)
        return g - xp.exp(y) * g.sum(axis=ctx.dim, keepdims=True)


class NllLoss(Op):
    """Per-element ``-w[t] * logp[n, t, ...]`` picked along the class axis 1;
    ignored targets give 0. ``reduction`` is 'none', 'sum' or 'mean'
    (weighted mean, as in PyTorch)."""
    @staticmethod
    def forward(ctx, logp, target, weight=None, ignore_index=-100,
                reduction="mean"):
        xp = get_array_module(logp)
        keep = target != ignore_index
        t = xp.where(keep, target, 0)
        picked = xp.take_along_axis(logp, xp.expand_dims(t, 1), axis=1)
        picked = xp.squeeze(picked, 1)
        w = keep.astype(logp.dtype)
        if weight is not None:
            w = w * weight[t]
        # ignored targets give 0, even where their log-probability is -inf
        loss = xp.where(keep, -(picked * w), xp.zeros((), logp.dtype))
        ctx.t, ctx.w, ctx.shape, ctx.keep = t, w, logp.shape, keep
        ctx.reduction = reduction
        if reduction == "none":
            return loss
        total = loss.sum()
        if reduction == "sum":
            return total
        ctx.denom = w.sum()
        return total / ctx.denom

    @staticmethod
    def backward(ctx, g):
        xp = get_array_module(g)
        w = ctx.w
        with np.errstate(divide="ignore", invalid="ignore"):
            if ctx.reduction == "mean":
                coef = -(w * (g / ctx.denom))
            else:
                coef = -(w * g)
        # ignored targets get 0 whatever g is (PyTorch skips them)
        coef = xp.where(ctx.keep, coef, xp.zeros((), coef.dtype))
        gx = xp.zeros(ctx.shape, coef.dtype)
        put_along_axis(xp, gx, xp.expand_dims(ctx.t, 1),
                       xp.expand_dims(coef, 1), axis=1)
        return gx, None, None


class CrossEntropy(NllLoss):
    """log_softmax over axis 1, then NllLoss, as one node: backward is
    ``softmax * coef`` with ``coef`` taken off at the targets, instead of
    NllLoss's scatter into zeros followed by LogSoftmax's backward (three
    passes over the (N, C, ...) logits saved)."""
    @staticmethod
    def forward(ctx, x, target, weight=None, ignore_index=-100,
                reduction="mean"):
        logp = ctx.logp = _log_softmax(x, 1)
        return NllLoss.forward(ctx, logp, target, weight, ignore_index,
                               reduction)

    @staticmethod
    def backward(ctx, g):
        xp = get_array_module(g)
        w = ctx.w
        with np.errstate(divide="ignore", invalid="ignore"):
            coef = w * (g / ctx.denom) if ctx.reduction == "mean" else w * g
        coef = xp.where(ctx.keep, coef, xp.zeros((), coef.dtype))
        coef = xp.expand_dims(coef, 1)
        gx = xp.exp(ctx.logp)
        gx *= coef
        t = xp.expand_dims(ctx.t, 1)
        put_along_axis(xp, gx, t, xp.take_along_axis(gx, t, axis=1) - coef,
                       axis=1)
        return gx, None, None


# ========================================================= normalisation ==

class LayerNorm(Op):
    """Normalise over the last ``nd`` axes, then ``* w + b`` (optional)."""
    @staticmethod
    def forward(ctx, x, w=None, b=None, nd=1, eps=1e-5):
        xp = get_array_module(x)
        axes = tuple(range(x.ndim - nd, x.ndim))
        mu = x.mean(axis=axes, keepdims=True)
        xc = x - mu
        var = (xc * xc).mean(axis=axes, keepdims=True)
        rstd = 1 / xp.sqrt(var + eps)
        xhat = xc * rstd
        ctx.save_for_backward(w)
        ctx.xhat, ctx.rstd, ctx.axes = xhat, rstd, axes
        out = xhat
        if w is not None:
            out = out * w
        if b is not None:
            out = out + b
        return out

    @staticmethod
    def backward(ctx, g):
        w, = ctx.to_save
        xhat, rstd, axes = ctx.xhat, ctx.rstd, ctx.axes
        need = ctx.needs_input_grad
        lead = tuple(range(g.ndim - len(axes)))
        gw = (g * xhat).sum(axis=lead) if len(need) > 1 and need[1] else None
        gb = g.sum(axis=lead) if len(need) > 2 and need[2] else None
        gx = None
        if need[0]:
            gh = g * w if w is not None else g
            gx = rstd * (gh - gh.mean(axis=axes, keepdims=True)
                         - xhat * (gh * xhat).mean(axis=axes, keepdims=True))
        return gx, gw, gb


class BatchNorm(Op):
    """Training-mode batch norm over all axes but 1, with batch statistics.

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
        mu = x.mean(axis=axes, keepdims=True)
        xc = x - mu
        var = (xc * xc).mean(axis=axes, keepdims=True)
        rstd = 1 / xp.sqrt(var + eps)
        xhat = xc * rstd
        ctx.save_for_backward(w)
        ctx.xhat, ctx.rstd, ctx.axes, ctx.shape = xhat, rstd, axes, shape
        m = x.size // x.shape[1]
        if running_mean is not None:
            running_mean *= 1 - momentum
            running_mean += momentum * mu.reshape(-1)
        if running_var is not None:
            running_var *= 1 - momentum
            running_var += (momentum * m / max(m - 1, 1)) * var.reshape(-1)
        out = xhat
        if w is not None:
            out = out * w.reshape(shape)
        if b is not None:
            out = out + b.reshape(shape)
        return out

    @staticmethod
    def backward(ctx, g):
        w, = ctx.to_save
        xhat, rstd, axes = ctx.xhat, ctx.rstd, ctx.axes
        need = ctx.needs_input_grad
        gw = gb = gx = None
        gsum = g.sum(axis=axes)
        gxh = (g * xhat).sum(axis=axes)
        if len(need) > 1 and need[1]:
            gw = gxh
        if len(need) > 2 and need[2]:
            gb = gsum
        if need[0]:
            m = g.size // g.shape[1]
            scale = rstd if w is None else rstd * w.reshape(ctx.shape)
            gx = scale * (g - (gsum.reshape(ctx.shape)
                               + xhat * gxh.reshape(ctx.shape)) / m)
        return gx, gw, gb


# ================================================ embedding, dropout, gelu ==

class Embedding(Op):
    """w[idx]; backward sums rows by sort + reduceat (``index_add0``); the
    ``padding_idx`` row gets no gradient; ``scale_grad_by_freq`` divides
    each row's gradient by the number of times it occurs in idx."""
    @staticmethod
    def forward(ctx, w, idx, padding_idx=None, scale_grad_by_freq=False):
        ctx.idx, ctx.shape, ctx.pad = idx, w.shape, padding_idx
        ctx.freq = scale_grad_by_freq
        try:
            return w[idx]
        except IndexError:
            raise IndexError("index out of range in self") from None

    @staticmethod
    def backward(ctx, g):
        xp = get_array_module(g)
        gw = index_add0(xp, ctx.shape, g.dtype, ctx.idx, g)
        if ctx.freq:
            n = xp.bincount(ctx.idx.reshape(-1), minlength=ctx.shape[0])
            gw /= xp.maximum(n, 1).astype(gw.dtype).reshape(
                (-1,) + (1,) * (gw.ndim - 1))
        if ctx.pad is not None:
            gw[ctx.pad] = 0
        return gw, None


class Dropout(Op):
    """x * mask / (1 - p) with a given boolean keep-mask. Backward is a
    product with the mask too, as PyTorch's (an infinite gradient at a
    dropped element gives NaN in both)."""
    @staticmethod
    def forward(ctx, x, keep=None, p=0.5):
        scale = x.dtype.type(1.0 / (1.0 - p)) if x.dtype.kind == "f" else \
            1.0 / (1.0 - p)
        ctx.keep, ctx.scale = keep, scale
        return x * keep * scale

    @staticmethod
    def backward(ctx, g):
        return g * ctx.keep * ctx.scale, None


def _erf(xp, x):
    if xp is np:
        try:
            from scipy.special import erf
            return erf(x)
        except ImportError:  # Abramowitz-Stegun 7.1.26, |error| < 1.5e-7
            s = np.sign(x)
            a = np.abs(x)
            t = 1.0 / (1.0 + 0.3275911 * a)
            y = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741)
                        * t - 0.284496736) * t + 0.254829592) * t \
                * np.exp(-a * a)
            return (s * y).astype(x.dtype, copy=False)
    from cupyx.scipy.special import erf
    return erf(x)


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


class Gelu(Op):
    @staticmethod
    def forward(ctx, x, approximate="none"):
        xp = get_array_module(x)
        ctx.save_for_backward(x)
        ctx.approx = approximate
        if approximate == "tanh":
            t = xp.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x ** 3))
            ctx.t = t
            return (0.5 * x * (1 + t)).astype(x.dtype, copy=False)
        cdf = 0.5 * (1 + _erf(xp, x * (1 / math.sqrt(2))))
        ctx.cdf = cdf
        return (x * cdf).astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        x, = ctx.to_save
        xp = get_array_module(g)
        if ctx.approx == "tanh":
            t = ctx.t
            dt = (1 - t * t) * _SQRT_2_OVER_PI * (1 + 3 * 0.044715 * x * x)
            d = 0.5 * (1 + t) + 0.5 * x * dt
        else:
            pdf = xp.exp(-0.5 * x * x) * (1 / math.sqrt(2 * math.pi))
            d = ctx.cdf + x * pdf
        return (g * d).astype(g.dtype, copy=False)


# ============================================================ activations ==
# Each activation is one node with PyTorch's own backward formula. Composed
# from relu / abs / where pieces, a function takes those pieces'
# subgradients at its kinks (softplus'(0) came out 0, not 1/2), and a branch
# that where() discards but that overflows (elu's exp at +inf) turns its
# zero gradient into 0 * inf = NaN.

def _zero(xp, g):
    return xp.zeros((), g.dtype)


class LeakyRelu(Op):
    @staticmethod
    def forward(ctx, x, slope=0.01):
        ctx.save_for_backward(x)
        ctx.slope = slope
        return get_array_module(x).where(x > 0, x, x * slope)

    @staticmethod
    def backward(ctx, g):
        x, = ctx.to_save
        return get_array_module(g).where(x > 0, g, g * ctx.slope)


class Elu(Op):
    """scale x for x > 0, scale alpha (e^(input_scale x) - 1) otherwise:
    elu, and selu / celu with PyTorch's scales. NaN takes the exp branch,
    so its gradient is NaN, as in PyTorch's vectorised loop."""
    @staticmethod
    def forward(ctx, x, alpha=1.0, scale=1.0, input_scale=1.0):
        xp = get_array_module(x)
        ctx.save_for_backward(x)
        ctx.coef = (alpha * scale, scale, input_scale)
        with np.errstate(over="ignore", invalid="ignore"):
            neg = xp.expm1(x * input_scale) * (alpha * scale)
            return xp.where(x > 0, x * scale if scale != 1 else x,
                            neg).astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        x, = ctx.to_save
        xp = get_array_module(g)
        neg, pos, ins = ctx.coef
        with np.errstate(over="ignore", invalid="ignore"):
            return xp.where(x > 0, g * pos if pos != 1 else g,
                            g * (ins * neg * xp.exp(x * ins))).astype(
                                g.dtype, copy=False)


class Hardswish(Op):
    """x relu6(x + 3) / 6; gradient 0 up to -3 included, g from 3 on,
    g (x / 3 + 1/2) between (NaN: NaN), PyTorch's vectorised loop."""
    @staticmethod
    def forward(ctx, x):
        xp = get_array_module(x)
        ctx.save_for_backward(x)
        return x * xp.minimum(xp.maximum(x + 3, 0), 6) / 6

    @staticmethod
    def backward(ctx, g):
        x, = ctx.to_save
        xp = get_array_module(g)
        mid = g * (x / 3 + 0.5)
        return xp.where(x <= -3, _zero(xp, g), xp.where(x >= 3, g, mid))


class Hardsigmoid(Op):
    """relu6(x + 3) / 6; gradient g / 6 strictly inside (-3, 3), else 0."""
    @staticmethod
    def forward(ctx, x):
        xp = get_array_module(x)
        ctx.save_for_backward(x)
        return xp.minimum(xp.maximum(x + 3, 0), 6) / 6

    @staticmethod
    def backward(ctx, g):
        x, = ctx.to_save
        # PyTorch multiplies by the float32 constant 1/6, in float64 too
        sixth = g.dtype.type(np.float32(1.0) / np.float32(6.0))
        return keep_grad(get_array_module(g), (x > -3) & (x < 3), g * sixth)


class Shrink(Op):
    """hardshrink (soft=False): x outside [-lambd, lambd], else 0;
    softshrink: x -+ lambd outside, else 0 (0 * x, so NaN stays NaN).
    The gradient is g strictly outside the interval, else 0 (NaN: 0), as
    PyTorch's vectorised loop."""
    @staticmethod
    def forward(ctx, x, lambd=0.5, soft=False):
        xp = get_array_module(x)
        ctx.save_for_backward(x)
        ctx.lambd = lambd
        inside = (x >= -lambd) & (x <= lambd)
        if not soft:
            return xp.where(inside, _zero(xp, x), x)
        with np.errstate(invalid="ignore"):
            return xp.where(x > lambd, x - lambd,
                            xp.where(x < -lambd, x + lambd, x * 0))

    @staticmethod
    def backward(ctx, g):
        x, = ctx.to_save
        lam = ctx.lambd
        return keep_grad(get_array_module(g), (x < -lam) | (x > lam), g)


class Threshold(Op):
    """x where x > threshold, else value; gradient g where x > threshold
    (NaN included: 'x <= threshold' is False there), as PyTorch."""
    @staticmethod
    def forward(ctx, x, threshold=0.0, value=0.0):
        xp = get_array_module(x)
        low = x <= threshold
        ctx.keep = ~low
        return xp.where(low, xp.asarray(value, dtype=x.dtype), x)

    @staticmethod
    def backward(ctx, g):
        return keep_grad(get_array_module(g), ctx.keep, g)


class PRelu(Op):
    """x for x > 0, w x otherwise, w broadcast over x (one weight, or one
    per channel on axis 1). Gradients: g or w g for x; x g where x <= 0
    (or NaN), summed to w's shape."""
    @staticmethod
    def forward(ctx, x, w):
        xp = get_array_module(x)
        ctx.save_for_backward(x, w)
        return xp.where(x > 0, x, w * x).astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.to_save
        xp = get_array_module(g)
        pos = x > 0
        n = ctx.needs_input_grad
        gx = xp.where(pos, g, w * g).astype(g.dtype, copy=False) \
            if n[0] else None
        gw = None
        if n[1]:
            gw = _unb(xp.where(pos, _zero(xp, g), x * g), w.shape)
        return gx, gw


class SoftMargin(Op):
    """log(1 + e^(-t x)), PyTorch's formula; backward -t z / (1 + z) g with
    z = e^(-t x) (so inf / inf = NaN where -t x is +inf, as there)."""
    @staticmethod
    def forward(ctx, x, t):
        xp = get_array_module(x)
        ctx.save_for_backward(x, t)
        with np.errstate(over="ignore", invalid="ignore"):
            return xp.log1p(xp.exp(-x * t))

    @staticmethod
    def backward(ctx, g):
        x, t = ctx.to_save
        xp = get_array_module(g)
        with np.errstate(over="ignore", invalid="ignore"):
            z = xp.exp(-x * t)
            return _unb(-t * z / (1 + z) * g, x.shape), None


class MultiMargin(Op):
    """Per sample sum over d != y of max(0, margin - x[y] + x[d]) ** p
    (times weight[y]) / C, PyTorch's multi_margin_loss. Backward selects
    the active terms (no product with a 0/1 mask): h = 1 or 2 z per
    active d, and minus their sum at y."""
    @staticmethod
    def forward(ctx, x, t, w=None, p=1, margin=1.0):
        xp = get_array_module(x)
        c = x.shape[1]
        ti = t.reshape(-1, 1)
        with np.errstate(invalid="ignore"):
            z = margin - xp.take_along_axis(x, ti, 1) + x
            active = z > 0
            active[xp.arange(x.shape[0]), t] = False
            h = z if p == 1 else z * z
            h = xp.where(active, h, _zero(xp, x))
            if w is not None:
                h = h * w[t].reshape(-1, 1)
        ctx.z, ctx.active, ctx.t, ctx.p, ctx.w = z, active, t, p, w
        return h.sum(1) / c

    @staticmethod
    def backward(ctx, g):
        xp = get_array_module(g)
        z, active, t = ctx.z, ctx.active, ctx.t
        c = z.shape[1]
        with np.errstate(invalid="ignore", over="ignore"):
            h = xp.ones_like(z) if ctx.p == 1 else 2 * z
            h = h / c
            if ctx.w is not None:
                h = h * ctx.w[t].reshape(-1, 1)
            h = xp.where(active, h, _zero(xp, z))
            h[xp.arange(z.shape[0]), t] = -h.sum(1)
            return h * g.reshape(-1, 1), None, None



class Softplus(Op):
    """log(1 + e^(beta x)) / beta, and x itself where beta x > threshold."""
    @staticmethod
    def forward(ctx, x, beta=1.0, threshold=20.0):
        xp = get_array_module(x)
        ctx.save_for_backward(x)
        ctx.beta, ctx.threshold = beta, threshold
        z = x * beta
        with np.errstate(over="ignore", invalid="ignore"):
            sp = xp.log1p(xp.exp(z))
            if beta != 1:
                sp /= beta
            return xp.where(z > threshold, x, sp).astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        x, = ctx.to_save
        xp = get_array_module(g)
        z = x * ctx.beta
        with np.errstate(over="ignore", invalid="ignore"):
            e = xp.exp(z)
            return xp.where(z > ctx.threshold, g, g * e / (e + 1))


class Silu(Op):
    @staticmethod
    def forward(ctx, x):
        xp = get_array_module(x)
        ctx.save_for_backward(x)
        with np.errstate(over="ignore", invalid="ignore"):
            return x / (1 + xp.exp(-x))

    @staticmethod
    def backward(ctx, g):
        x, = ctx.to_save
        xp = get_array_module(g)
        with np.errstate(over="ignore", invalid="ignore"):
            s = 1 / (1 + xp.exp(-x))
            return g * s * (1 + x * (1 - s))


class Mish(Op):
    """x tanh(softplus(x))."""
    @staticmethod
    def forward(ctx, x):
        xp = get_array_module(x)
        ctx.save_for_backward(x)
        with np.errstate(over="ignore", invalid="ignore"):
            return x * xp.tanh(xp.log1p(xp.exp(x)))

    @staticmethod
    def backward(ctx, g):
        x, = ctx.to_save
        xp = get_array_module(g)
        with np.errstate(over="ignore", invalid="ignore"):
            s = 1 / (1 + xp.exp(-x))
            t = xp.tanh(xp.log1p(xp.exp(x)))
            return g * (t + x * s * (1 - t * t))


def _log_sigmoid(xp, x):
    """log(sigmoid(x)) = min(x, 0) - log1p(e^-|x|): never overflows."""
    return xp.minimum(x, 0) - xp.log1p(xp.exp(-abs(x)))


def _log_sigmoid_grad(xp, x):
    """d/dx log(sigmoid(x)) = 1 - sigmoid(x), PyTorch's way (exactly 1/2
    at 0, finite at +-inf)."""
    neg = x < 0
    e = xp.exp(-abs(x))
    r = e / (1 + e)
    return xp.where(neg, 1 - r, r)


class LogSigmoid(Op):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return _log_sigmoid(get_array_module(x), x)

    @staticmethod
    def backward(ctx, g):
        x, = ctx.to_save
        return g * _log_sigmoid_grad(get_array_module(g), x)


# ============================================================== losses ==
# Unreduced per-element losses, each with PyTorch's backward formula (the
# functional API reduces them). Gradients are returned for every input that
# asks, target included, as in PyTorch.

def _unb(g, shape):
    """Sum a gradient down to a broadcast operand's shape."""
    return unbroadcast(g, shape)


_BCE_EPS = np.float32(1e-12)


class BinaryCrossEntropy(Op):
    """-w (t log x + (1 - t) log(1 - x)), the logs clamped at -100 as in
    PyTorch. Backward: g w (x - t) / max(x (1 - x), 1e-12) for x, which is
    finite at x = 0 and 1 exactly (a float32 sigmoid rounds to 1.0 from
    about 17), and -g w logit(x) for t. Like PyTorch, no gradient for
    the weight."""
    @staticmethod
    def forward(ctx, x, t, w=None):
        xp = get_array_module(x)
        with np.errstate(divide="ignore", invalid="ignore"):
            lx = xp.maximum(xp.log(x), -100)
            l1x = xp.maximum(xp.log1p(-x), -100)
        loss = (t - 1) * l1x - t * lx
        ctx.save_for_backward(x, t, w)
        if w is not None:
            loss = loss * w
        return loss.astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        x, t, w = ctx.to_save
        xp = get_array_module(g)
        n = ctx.needs_input_grad
        gw = g if w is None else g * w
        gx = gt = None
        with np.errstate(divide="ignore", invalid="ignore"):
            if n[0]:
                # PyTorch's EPSILON is the float 1e-12 (9.9999999600e-13)
                gx = gw * (x - t) / xp.maximum((1 - x) * x,
                                               x.dtype.type(_BCE_EPS))
                gx = _unb(gx.astype(g.dtype, copy=False), x.shape)
            if n[1]:
                gt = _unb(-xp.log(x / (1 - x)) * gw, t.shape)
        return gx, gt, None


class BinaryCrossEntropyWithLogits(Op):
    """(1 - t) x - lw log(sigmoid(x)), lw = (pos_weight - 1) t + 1, times
    w, with PyTorch's backward: g w ((pw t + 1 - t) sigmoid(x) - pw t)
    (sigmoid(x) - t without pos_weight) for x, exactly 0 at x = 0 for
    t = 1/2 (a composition took relu'(0) = abs'(0) = 0 there and gave
    g / 2); g w (log_sigmoid(-x) - pw log_sigmoid(x)) (-x g w without
    pos_weight) for t. Like PyTorch, no gradient for weight and
    pos_weight."""
    @staticmethod
    def forward(ctx, x, t, w=None, pw=None):
        xp = get_array_module(x)
        with np.errstate(over="ignore", invalid="ignore"):
            ls = _log_sigmoid(xp, x)
            lw = None if pw is None else (pw - 1) * t + 1
            loss = (1 - t) * x - (ls if lw is None else ls * lw)
            ctx.save_for_backward(x, t, w, pw)
            ctx.ls = ls
            if w is not None:
                loss = loss * w
        return loss.astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        x, t, w, pw = ctx.to_save
        xp = get_array_module(g)
        n = ctx.needs_input_grad
        out = [None] * 4
        with np.errstate(over="ignore", invalid="ignore"):
            if n[0]:
                s = 1 / (1 + xp.exp(-x))
                if pw is None:
                    gx = s - t
                else:
                    pt = pw * t
                    gx = (pt + 1 - t) * s - pt
                gx = gx * g
                if w is not None:
                    gx = gx * w
                out[0] = _unb(gx, x.shape)
            if n[1]:
                if pw is None:
                    gt = -x * g
                else:
                    gt = (_log_sigmoid(xp, -x) - ctx.ls * pw) * g
                if w is not None:
                    gt = gt * w
                out[1] = _unb(gt, t.shape)
        return tuple(out)


class SmoothL1(Op):
    """|d| < beta: d^2 / (2 beta), else |d| - beta / 2 (d = x - t); the
    gradient is d / beta inside, sign(d) from the kinks on (PyTorch)."""
    @staticmethod
    def forward(ctx, x, t, beta=1.0):
        xp = get_array_module(x, t)
        d = x - t
        z = abs(d)
        ctx.d, ctx.beta = d, beta
        ctx.shapes = (getattr(x, "shape", ()), getattr(t, "shape", ()))
        return xp.where(z < beta, (0.5 / beta) * z * z, z - 0.5 * beta)

    @staticmethod
    def backward(ctx, g):
        d, b = ctx.d, ctx.beta
        xp = get_array_module(g)
        gd = xp.where(d <= -b, -g, xp.where(d >= b, g, d * g / b))
        n = ctx.needs_input_grad
        return (_unb(gd, ctx.shapes[0]) if n[0] else None,
                _unb(-gd, ctx.shapes[1]) if n[1] else None)


class Huber(Op):
    """|d| < delta: d^2 / 2, else delta (|d| - delta / 2); the gradient is
    d inside, delta sign(d) from the kinks on (PyTorch)."""
    @staticmethod
    def forward(ctx, x, t, delta=1.0):
        xp = get_array_module(x, t)
        d = x - t
        z = abs(d)
        ctx.d, ctx.delta = d, delta
        ctx.shapes = (getattr(x, "shape", ()), getattr(t, "shape", ()))
        return xp.where(z < delta, 0.5 * z * z, delta * (z - 0.5 * delta))

    @staticmethod
    def backward(ctx, g):
        d, c = ctx.d, ctx.delta
        xp = get_array_module(g)
        gd = xp.where(d <= -c, -c * g, xp.where(d >= c, c * g, d * g))
        n = ctx.needs_input_grad
        return (_unb(gd, ctx.shapes[0]) if n[0] else None,
                _unb(-gd, ctx.shapes[1]) if n[1] else None)


# ========================================================== recurrences ==

def _sigmoid(xp, x):
    # exp(-x) may overflow to inf for very negative x: 1 / inf is 0, fine
    with np.errstate(over="ignore"):
        return 1 / (1 + xp.exp(-x))


class RNNLayer(Op):
    """A whole Elman RNN layer, one direction: h_t = act(xw[t] + h_{t-1}
    @ w_hh.T + b_hh). ``xw`` (T, N, H) holds the input projections for all
    steps. Returns (T + 1, N, H): the outputs, then h_T again as h_n's slot."""
    @staticmethod
    def forward(ctx, xw, h0, w_hh, b_hh=None, reverse=False,
                nonlinearity="tanh"):
        xp = get_array_module(xw)
        T = xw.shape[0]
        out = xp.empty((T + 1,) + h0.shape, xw.dtype)
        h = h0
        steps = range(T - 1, -1, -1) if reverse else range(T)
        wt = w_hh.T
        for t in steps:
            a = xw[t] + h @ wt
            if b_hh is not None:
                a += b_hh
            h = xp.tanh(a) if nonlinearity == "tanh" else xp.maximum(a, 0)
            out[t] = h
        out[T] = h
        ctx.save_for_backward(h0, w_hh)
        ctx.out, ctx.reverse, ctx.act = out, reverse, nonlinearity
        return out

    @staticmethod
    def backward(ctx, g):
        h0, w_hh = ctx.to_save
        xp = get_array_module(g)
        out, reverse = ctx.out, ctx.reverse
        T = out.shape[0] - 1
        da = xp.empty(out[:T].shape, g.dtype)
        dh = g[T].copy()
        steps = range(T) if reverse else range(T - 1, -1, -1)
        zero = xp.zeros((), g.dtype)
        for t in steps:
            dh += g[t]
            h = out[t]
            # relu: PyTorch's threshold_backward, g where h > 0 (a 0/1
            # product would turn an infinite dh into NaN)
            da[t] = dh * (1 - h * h) if ctx.act == "tanh" else \
                xp.where(h <= 0, zero, dh)
            dh = da[t] @ w_hh
        return _rnn_grads(ctx, xp, da, dh, (out[:T], h0, reverse))


def _prev_states(xp, hs, h0, reverse):
    """h_{t-1} for every t, in time order, as one (T, N, H) array."""
    if reverse:
        return xp.concatenate([hs[1:], h0[None]], axis=0)
    return xp.concatenate([h0[None], hs[:-1]], axis=0)


def _hh_weight_grad(dgates, hs, h0, reverse):
    """sum_t dgates[t].T @ h_{t-1}, the h_{t-1} being h0 then hs[:-1]
    (reversed: hs[1:] then h0), without copying them into one array: one
    GEMM over the T - 1 steps whose h_{t-1} is an output, one for h0."""
    T, G, H = dgates.shape[0], dgates.shape[-1], hs.shape[-1]
    if reverse:
        body, hb, first = dgates[:T - 1], hs[1:], dgates[T - 1]
    else:
        body, hb, first = dgates[1:], hs[:T - 1], dgates[0]
    gw = first.T @ h0
    if T > 1:
        gw += body.reshape(-1, G).T @ hb.reshape(-1, H)
    return gw


def _rnn_grads(ctx, xp, dgates, dh0, prev, dc0=None):
    """``prev``: the (T, N, H) states h_{t-1}, or (hs, h0, reverse) to
    take them from the outputs without a copy (``_hh_weight_grad``)."""
    need = ctx.needs_input_grad
    G = dgates.shape[-1]
    d2 = dgates.reshape(-1, G)
    gw = None
    if need[-2]:
        gw = _hh_weight_grad(dgates, *prev) if isinstance(prev, tuple) \
            else d2.T @ prev.reshape(-1, prev.shape[-1])
    gb = d2.sum(axis=0) if need[-1] else None
    if dc0 is None:
        return dgates, dh0, gw, gb
    return dgates, dh0, dc0, gw, gb


class LSTMLayer(Op):
    """A whole LSTM layer, one direction, PyTorch's gate order (i, f, g, o).

    ``xw`` (T, N, 4H) are the input projections (x @ w_ih.T + b_ih) for all
    steps. Returns (T + 1, N, H): the outputs h_1..h_T, then c_T.

    The loops run in preallocated buffers with ``out=``, no per-step
    temporaries. Two layout choices, both measured at N=32, H=256, float32,
    one thread (OpenBLAS):
    - the recurrent matmul is computed transposed, (4H, H) @ (H, N) into a
      (4H, N) buffer: 188-203 us per step against 258-271 us for
      (N, H) @ (H, 4H); adding that buffer's transposed view to xw[t] costs
      ~30 us, still a net 3 ms per layer forward;
    - the activations are kept gate-major, (T, 4, N, H), so that i, f, g, o
      and every per-gate product run over one contiguous (N, H) block (a
      column slice of an (N, 4H) row costs 3-4x as much per ufunc call).
    Backward carries dh and dc through the loop: per step one matmul and a
    dozen small products; the gate gradients are written, per step, into
    the (T, N, 4H) layout that xw and the weight-gradient GEMM need."""
    @staticmethod
    def forward(ctx, xw, h0, c0, w_hh, b_hh=None, reverse=False):
        xp = get_array_module(xw)
        T, n = xw.shape[:2]
        H = h0.shape[-1]
        dt = xw.dtype
        out = xp.empty((T + 1, n, H), dt)
        acts = xp.empty((T, 4, n, H), dt)      # i, f, g, o after activation
        cs = xp.empty((T, n, H), dt)
        tcs = xp.empty((T, n, H), dt)          # tanh(c_t), for backward
        ig = xp.empty((n, H), dt)
        hw = xp.empty((4 * H, n), dt)          # w_hh @ h.T, one step
        # all four activations in one tanh over the whole gate block:
        # sigmoid(x) = (1 + tanh(x / 2)) / 2, with NumPy's vectorised tanh
        # (scipy's expit measured 4x slower, 1 / (1 + exp(-x)) 2x). The
        # halving is folded into w_hh and b_hh once (exact: a power of 2).
        half = xp.full((4, 1, H), 0.5, dt)
        half[2] = 1
        shift = xp.full((4, 1, H), 0.5, dt)
        shift[2] = 0
        w = w_hh * half.reshape(4 * H, 1)
        bh = None if b_hh is None else b_hh.reshape(4, 1, H) * half
        hw4 = hw.reshape(4, H, n).transpose(0, 2, 1)      # (4, N, H) views
        xw4 = xw.reshape(T, n, 4, H).transpose(0, 2, 1, 3)
        h, c = h0, c0
        steps = range(T - 1, -1, -1) if reverse else range(T)
        for t in steps:
            a = acts[t]
            xp.matmul(w, h.T, out=hw)
            xp.multiply(xw4[t], half, out=a)
            a += hw4
            if bh is not None:
                a += bh
            xp.tanh(a, out=a)
            a *= half
            a += shift
            i, f, g, o = a
            cn = cs[t]
            xp.multiply(f, c, out=cn)
            xp.multiply(i, g, out=ig)
            cn += ig
            xp.tanh(cn, out=tcs[t])
            xp.multiply(o, tcs[t], out=out[t])
            h, c = out[t], cn
        out[T] = c
        ctx.save_for_backward(h0, c0, w_hh)
        ctx.out, ctx.acts, ctx.cs, ctx.tcs = out, acts, cs, tcs
        ctx.reverse = reverse
        return out

    @staticmethod
    def backward(ctx, g):
        h0, c0, w_hh = ctx.to_save
        xp = get_array_module(g)
        out, acts, cs, tcs, reverse = (ctx.out, ctx.acts, ctx.cs, ctx.tcs,
                                       ctx.reverse)
        T, _, n, H = acts.shape
        dt = g.dtype
        dgates = xp.empty((T, n, 4 * H), dt)
        dg4 = dgates.reshape(T, n, 4, H)
        d = xp.empty((4, n, H), dt)            # local factors, gate-major
        dh = xp.empty((n, H), dt)
        s1 = xp.empty((n, H), dt)
        dc = g[T].astype(dt, copy=True)
        # the h_n view of the output has its gradient folded into g[last];
        # per step everything stays in small cache-resident blocks (one pass
        # over whole (T, N, 4H) arrays for these factors measured slower)
        steps = range(T) if reverse else range(T - 1, -1, -1)
        prev = None
        for t in steps:
            a = acts[t]
            i, f, gt, o = a
            if prev is None:
                dh[...] = g[t]
            else:
                xp.matmul(dgates[prev], w_hh, out=dh)
                dh += g[t]
                dc *= acts[prev, 1]                   # f of step t + 1
            tc = tcs[t]
            xp.multiply(tc, tc, out=s1)               # dc += dh o (1 - tc^2)
            xp.subtract(1, s1, out=s1)
            s1 *= o
            s1 *= dh
            dc += s1
            xp.multiply(a, a, out=d)                  # s (1 - s); 1 - g^2
            xp.subtract(a, d, out=d)
            xp.multiply(gt, gt, out=d[2])
            xp.subtract(1, d[2], out=d[2])
            tp = t + 1 if reverse else t - 1
            d[0] *= gt
            d[1] *= c0 if (tp < 0 or tp >= T) else cs[tp]
            d[2] *= i
            d[3] *= tc
            xp.multiply(d[3], dh, out=dg4[t, :, 3])   # o: times dh
            xp.multiply(d[:3], dc,                    # i, f, g: times dc
                        out=dg4[t, :, :3].transpose(1, 0, 2))
            prev = t
        if prev is None:                    # T == 0
            dh0 = xp.zeros(h0.shape, dt)
        else:
            dh0 = dgates[prev] @ w_hh
            dc *= acts[prev, 1]
        return _rnn_grads(ctx, xp, dgates, dh0, (out[:T], h0, reverse), dc)


class GRULayer(Op):
    """A whole GRU layer, one direction, PyTorch's gates (r, z, n):
    n = tanh(xn + r * (h @ w_hn.T + b_hn)), h' = (1 - z) * n + z * h.
    Returns (T + 1, N, H): the outputs, then h_T again."""
    @staticmethod
    def forward(ctx, xw, h0, w_hh, b_hh=None, reverse=False):
        xp = get_array_module(xw)
        T, n = xw.shape[:2]
        H = h0.shape[-1]
        out = xp.empty((T + 1, n, H), xw.dtype)
        acts = xp.empty((T, n, 3 * H), xw.dtype)     # r, z, n
        hns = xp.empty((T, n, H), xw.dtype)          # h @ w_hn.T + b_hn
        h = h0
        wt = w_hh.T
        steps = range(T - 1, -1, -1) if reverse else range(T)
        for t in steps:
            hh = h @ wt
            if b_hh is not None:
                hh += b_hh
            x = xw[t]
            rz = _sigmoid(xp, x[:, :2 * H] + hh[:, :2 * H])
            hns[t] = hh[:, 2 * H:]
            nt = xp.tanh(x[:, 2 * H:] + rz[:, :H] * hh[:, 2 * H:])
            acts[t, :, :2 * H] = rz
            acts[t, :, 2 * H:] = nt
            z = rz[:, H:]
            h = nt + z * (h - nt)
            out[t] = h
        out[T] = h
        ctx.save_for_backward(h0, w_hh)
        ctx.out, ctx.acts, ctx.hns, ctx.reverse = out, acts, hns, reverse
        return out

    @staticmethod
    def backward(ctx, g):
        h0, w_hh = ctx.to_save
        xp = get_array_module(g)
        out, acts, hns, reverse = ctx.out, ctx.acts, ctx.hns, ctx.reverse
        T = out.shape[0] - 1
        H = h0.shape[-1]
        dx = xp.empty(acts.shape, g.dtype)     # grads of x-side gates
        dhh = xp.empty(acts.shape, g.dtype)    # grads of h-side gates
        dh = g[T].copy()
        steps = range(T) if reverse else range(T - 1, -1, -1)
        for t in steps:
            dh += g[t]
            a = acts[t]
            r, z, nt = a[:, :H], a[:, H:2 * H], a[:, 2 * H:]
            tp = t + 1 if reverse else t - 1
            hprev = h0 if (tp < 0 or tp >= T) else out[tp]
            dn = dh * (1 - z) * (1 - nt * nt)
            dz = dh * (hprev - nt) * z * (1 - z)
            dr = dn * hns[t] * r * (1 - r)
            dx[t, :, :H] = dr
            dx[t, :, H:2 * H] = dz
            dx[t, :, 2 * H:] = dn
            dhh[t, :, :2 * H] = dx[t, :, :2 * H]
            dhh[t, :, 2 * H:] = dn * r
            dh = dh * z + dhh[t] @ w_hh
        prev = _prev_states(xp, out[:T], h0, reverse)
        need = ctx.needs_input_grad
        d2 = dhh.reshape(-1, 3 * H)
        gw = d2.T @ prev.reshape(-1, H) if need[2] else None
        gb = d2.sum(axis=0) if len(need) > 3 and need[3] else None
        return dx, dh, gw, gb


# ================================================================ padding ==

_NP_PAD_MODES = {"reflect": "reflect", "replicate": "edge",
                 "circular": "wrap"}


class Pad(Op):
    """Pad with ``pads`` = ((before, after), ...) for every axis. Constant
    padding slices in backward; the other modes gather along each axis with
    an index array and scatter back with ``index_add0``."""
    @staticmethod
    def forward(ctx, x, pads=(), mode="constant", value=0.0):
        xp = get_array_module(x)
        ctx.pads, ctx.mode, ctx.shape = pads, mode, x.shape
        if mode == "constant":
            return xp.pad(x, pads, constant_values=value)
        idxs = []
        out = x
        for ax, (lo, hi) in enumerate(pads):
            if lo or hi:
                idx = np.pad(np.arange(x.shape[ax]), (lo, hi),
                             mode=_NP_PAD_MODES[mode])
                idx = xp.asarray(idx)
                out = xp.take(out, idx, axis=ax)
                idxs.append((ax, idx))
        ctx.idxs = idxs
        return out

    @staticmethod
    def backward(ctx, g):
        xp = get_array_module(g)
        if ctx.mode == "constant":
            key = tuple(slice(lo, g.shape[i] - hi)
                        for i, (lo, hi) in enumerate(ctx.pads))
            return g[key]
        for ax, idx in reversed(ctx.idxs):
            gm = xp.moveaxis(g, ax, 0)
            gm = index_add0(xp, (ctx.shape[ax],) + gm.shape[1:], g.dtype,
                            idx, gm)
            g = xp.moveaxis(gm, 0, ax)
        return g
