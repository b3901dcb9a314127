"""2-D convolution and its transpose, forward and backward side by side.

groups == 1 runs channels-last: strided window views of a padded
(N, H, W, C) copy, copied one cache-sized chunk of images at a time into a
column matrix for one GEMM each (``Conv2d``'s docstring has the figures).
Stride-1 3x3 convolutions with enough channels run Winograd F(2x2, 3x3)
on the same padded input instead (``_winograd``; compiled kernels only).
Few input channels and grouped convolutions use NCHW columns and a batched
matmul over groups; ``ConvTranspose2d`` is the adjoint in x.
"""
import numpy as np

from .. import _kernels
from .._backend import get_array_module
from .base import Op, float32_compute, check_conv_dtypes
from .window import _as_strided, _col2im, _offsets, _pad2d, _unpad2d, \
    _windows, conv_out_size


@float32_compute
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
    Stride-1, undilated 3x3 kernels from 16 channels in and out take
    Winograd F(2x2, 3x3) for all three (``_winograd``: 4/9 of the
    multiplications, measured 1.3-1.7x faster).
    Few input channels (an image's first layer) and groups > 1 use NCHW
    columns (N, G, C/G*KH*KW, OH*OW) and a batched matmul over groups.
    """
    @staticmethod
    def forward(ctx, x, w, b=None, stride=(1, 1), pads=((0, 0), (0, 0)),
                dilation=(1, 1), groups=1):
        check_conv_dtypes(x, w, b)
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
        wino = _winograd(xp, ctx.xpad, w, stride, dilation) \
            if need[1] else None
        if wino is not None:
            gw = _wino_weight_grad(wino, ctx.xpad, gl.reshape(n, *ohw, o),
                                   w.shape)
        elif need[1]:
            # the sum over chunks of (O, rows) @ (rows, KH*KW*C)
            win = _nhwc_windows(xp, ctx.xpad, (kh, kw), stride, dilation,
                                ohw)
            gw = xp.zeros((o, kh * kw * c), g.dtype)
            for s, e in _conv_chunks(xp, n, L * kh * kw * c * g.itemsize):
                cols = _cols(xp, win, ctx.xpad, s, e, stride, dilation)
                gw += gl[s * L:e * L].T @ cols
            gw = xp.ascontiguousarray(
                gw.reshape(o, kh, kw, c).transpose(0, 3, 1, 2))
        if len(need) > 2 and need[2]:
            gb = gl.sum(axis=0)
        return gx, gw, gb

    @staticmethod
    def backward_graph(ctx, g):
        # kept: the array backward's chunked column GEMMs accumulate in
        # place (gw +=), which no tensor op can; this is its graph form.
        # gx is a transposed convolution of g, gw the bilinear
        # Conv2dWeightGrad of (x, g): both differentiable ops, whose own
        # gradients are convolutions again (any order)
        w, = ctx.to_save
        _, pads, stride, dilation, groups, ohw = ctx.meta
        x = ctx.x if ctx.nchw else _nhwc_unpadded(ctx.xpad, pads)
        need = ctx.needs_input_grad
        gx = gw = gb = None
        conf = dict(stride=stride, pads=pads, dilation=dilation,
                    groups=groups)
        if need[0]:
            gx = ConvTranspose2d.apply(
                g, ctx.graph_input(1, w), None, output_padding=_out_pad(
                    x.shape, ohw, w.shape, **conf), **conf)
        if need[1]:
            gw = Conv2dWeightGrad.apply(ctx.graph_input(0, x), g,
                                        wshape=w.shape, **conf)
        if len(need) > 2 and need[2]:
            gb = g.sum((0, 2, 3))
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
    kern = _winograd(xp, xpad, w, stride, dilation)
    if kern is not None:
        return _wino_conv(kern, xpad, w, b, ohw), xpad
    win = _nhwc_windows(xp, xpad, (kh, kw), stride, dilation, ohw)
    w2t = w.transpose(0, 2, 3, 1).reshape(o, K).T
    out = xp.empty((n, o, oh, ow), x.dtype)
    for s, e in _conv_chunks(xp, n, L * K * x.itemsize):
        r = _cols(xp, win, xpad, s, e, stride, dilation) @ w2t
        if b is not None:
            r += b
        out[s:e] = r.reshape(e - s, oh, ow, o).transpose(0, 3, 1, 2)
    return out, xpad


# Winograd F(2x2, 3x3) (Lavin & Gray 2015) for stride-1, undilated 3x3
# convolutions: per 4x4 input tile V = B^T d B, per kernel U = G w G^T,
# 16 GEMMs (tiles, C) @ (C, O) in the transformed domain, and the 2x2
# outputs A^T M A (dtorch._kernels._numba wino_*). 16 multiplications per
# 2x2 outputs and channel pair against 36: measured (one thread, thread
# CPU time, benchmarks/cpu_kernels.py --conv, load 14) forward against
# the column path: ResNet 16x32x16x16 1.34 -> 0.78 ms, 16x64x8x8 1.02 ->
# 0.71, 16x128x4x4 1.04 -> 0.59, the CNN's 64x32x14x14 (O 64) 6.72 ->
# 4.56, 1x64x64x64 5.42 -> 3.50; forward + input gradient and forward +
# weight gradient alike (13.96 -> 9.42, 13.01 -> 8.99 ms for the CNN's).
# The GEMMs stay most of the time (OpenBLAS's AVX2 kernels here, where
# PyTorch's oneDNN runs AVX-512: still 1.2-1.8x torch's time).
# The transforms are exact in binary but for G's halves, the sums are in
# another order than the column GEMM's: float rounding apart (float32
# ~1e-6 relative to the output's scale), and the same bits on every run
# and thread count (no thread-dependent reduction).
# from these many input and output channels: measured forward, 16x16x16
# images, Winograd / columns: C 15 (O 16) 0.44 / 0.39 ms, C 16 0.30 /
# 0.39; O 8 (C 16) 0.28 / 0.30, O 12 0.36 / 0.42 (fewer output channels
# gain little, and their input gradient has as few input channels)
_WINO_MIN_C = 16
_WINO_MIN_O = 16
# and from these many tiles in the batch: with fewer, each of the 16 GEMMs
# is a few rows against the whole transformed kernel (measured 2 images of
# 128x2x2, 2 tiles: 0.19 vs 0.14 ms forward; 16 tiles even, 64 tiles
# 0.58 vs 0.91 ms)
_WINO_MIN_TILES = 16


def _winograd(xp, xpad, w, stride, dilation):
    """The compiled kernels when the Winograd path applies, else None."""
    o, c, kh, kw = w.shape
    n, hp, wp, _ = xpad.shape
    tiles = n * ((hp - 1) // 2) * ((wp - 1) // 2)
    if xp is not np or (kh, kw) != (3, 3) or tuple(stride) != (1, 1) \
            or tuple(dilation) != (1, 1) or c < _WINO_MIN_C \
            or o < _WINO_MIN_O or tiles < _WINO_MIN_TILES:
        return None
    return _kernels.kernels(xpad)


def _wino_chunks(n, tiles, c, o, itemsize):
    """Image ranges whose transformed tiles (16 per tile, C + O channels)
    take about ``_CONV_CHUNK_BYTES``."""
    return _conv_chunks(np, n, 16 * tiles * (c + o) * itemsize)


def _wino_conv(kern, xpad, w, b, ohw):
    """groups == 1, stride-1 3x3 convolution of the padded channels-last
    input by Winograd F(2x2, 3x3): out (N, O, OH, OW)."""
    n, _, _, c = xpad.shape
    o = w.shape[0]
    oh, ow = ohw
    th, tw = (oh + 1) // 2, (ow + 1) // 2
    u = np.empty((16, c, o), w.dtype)
    kern.wino_weight(np.ascontiguousarray(w), u)
    bias = b if b is not None else np.zeros(1, w.dtype)
    out = np.empty((n, o, oh, ow), xpad.dtype)
    for s, e in _wino_chunks(n, th * tw, c, o, xpad.itemsize):
        v = np.empty((16, (e - s) * th * tw, c), xpad.dtype)
        kern.wino_in(xpad, v, s, th, tw)
        r = np.empty((e - s, oh, ow, o), xpad.dtype)
        kern.wino_out(np.matmul(v, u), r, bias, b is not None, 0, th, tw)
        out[s:e] = r.transpose(0, 3, 1, 2)
    return out


def _wino_weight_grad(kern, xpad, gl, wshape):
    """The weight gradient of ``_wino_conv`` for the output gradient gl
    (N, OH, OW, O): the adjoint of each step, dU = sum over tiles of
    V^T (A g A^T), then gw = G^T dU G."""
    n, _, _, c = xpad.shape
    _, oh, ow, o = gl.shape
    th, tw = (oh + 1) // 2, (ow + 1) // 2
    du = np.zeros((16, c, o), gl.dtype)
    for s, e in _wino_chunks(n, th * tw, c, o, xpad.itemsize):
        v = np.empty((16, (e - s) * th * tw, c), xpad.dtype)
        kern.wino_in(xpad, v, s, th, tw)
        gm = np.empty((16, (e - s) * th * tw, o), gl.dtype)
        kern.wino_grad_out(gl, gm, s, th, tw)
        du += np.matmul(v.transpose(0, 2, 1), gm)
    gw = np.empty(wshape, gl.dtype)
    kern.wino_weight_grad(du, gw)
    return gw


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
    kern = _kernels.kernels(gxp, gk)
    if kern is not None:
        kern.col2im_nhwc(gk, gxp, *k, *stride, *dilation)
    else:
        for o, (hs, ws) in enumerate(_offsets(k, stride, dilation, ohw)):
            gxp[:, hs, ws] += gk[o]
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
    ctx.x = x           # for the create_graph=True backward
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


@float32_compute
class ConvTranspose2d(Op):
    """The adjoint of Conv2d in x: w is (C_in, C_out/groups, KH, KW)."""
    @staticmethod
    def forward(ctx, x, w, b=None, stride=(1, 1), pads=((0, 0), (0, 0)),
                dilation=(1, 1), groups=1, output_padding=(0, 0)):
        check_conv_dtypes(x, w, b)
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

    @staticmethod
    def backward_graph(ctx, g):
        # kept: the array backward shares its window view of g between gx
        # and gw (one pad, no ops); this is its graph form.
        # ConvTranspose2d(x, w) is Conv2d's input gradient: its gradients
        # are Conv2d(g, w) for x and Conv2dWeightGrad(g, x) for w
        x, w = ctx.to_save
        pshape, pads, stride, dilation, groups = ctx.meta
        conf = dict(stride=stride, pads=pads, dilation=dilation,
                    groups=groups)
        need = ctx.needs_input_grad
        gx = gw = gb = None
        if need[0]:
            gx = Conv2d.apply(g, ctx.graph_input(1, w), None, **conf)
            if tuple(gx.shape) != x.shape:
                # output_padding >= stride: the convolution reaches
                # windows past x's last row / column
                gx = gx[:, :, :x.shape[2], :x.shape[3]]
        if need[1]:
            gw = Conv2dWeightGrad.apply(g, ctx.graph_input(0, x),
                                        wshape=w.shape, **conf)
        if len(need) > 2 and need[2]:
            gb = g.sum((0, 2, 3))
        return gx, gw, gb


@float32_compute
class Conv2dWeightGrad(Op):
    """The weight gradient of a convolution, gw = dConv2d(x, w)/dw . g, as
    an op of (x, g): bilinear, so its gradients are the other two
    convolution maps, ConvTranspose2d(g, h) for x and Conv2d(x, h) for g.
    Conv2d's create_graph=True backward builds on it."""
    @staticmethod
    def forward(ctx, x, g, wshape=None, stride=(1, 1),
                pads=((0, 0), (0, 0)), dilation=(1, 1), groups=1):
        xp = get_array_module(x)
        n = x.shape[0]
        o, cg, kh, kw = wshape
        ohw = g.shape[2:]
        win = _windows(xp, _pad2d(xp, x, pads), (kh, kw), stride, dilation,
                       ohw)
        cols = win.reshape(n, groups, cg * kh * kw, ohw[0] * ohw[1])
        g3 = g.reshape(n, groups, o // groups, ohw[0] * ohw[1])
        ctx.save_for_backward(x, g)
        ctx.conf = dict(stride=stride, pads=pads, dilation=dilation,
                        groups=groups)
        return (g3 @ xp.swapaxes(cols, -1, -2)).sum(0).reshape(wshape)

    @staticmethod
    def backward(ctx, h):
        # the other two convolution maps: their forwards on arrays, the
        # ops themselves (recorded, the same values) on a gradient tensor
        xa, ga = ctx.to_save
        x, g = ctx.input(0, xa), ctx.input(1, ga)
        run = _call if ctx._gmake is None else \
            (lambda op, *a, **kw: op.apply(*a, **kw))
        need = ctx.needs_input_grad
        conf = ctx.conf
        gx = run(ConvTranspose2d, g, h, None, output_padding=_out_pad(
            xa.shape, ga.shape[2:], tuple(h.shape), **conf), **conf) \
            if need[0] else None
        gg = None
        if need[1]:
            # windows past g's extent (a transposed convolution with
            # output_padding >= stride) are not g's: cut them off
            gg = run(Conv2d, x, h, None, **conf)[
                :, :, :ga.shape[2], :ga.shape[3]]
        return gx, gg


def _call(op, *args, **kwargs):
    """op's forward on arrays, outside the graph (a throwaway ctx)."""
    return op.forward(op.__new__(op), *args, **kwargs)


def _out_pad(xshape, ohw, wshape, stride, pads, dilation, groups=1):
    """The output_padding that makes ConvTranspose2d of a (.., OH, OW)
    gradient come back to the convolution input's height and width: the
    rows and columns that the last window did not reach."""
    return tuple(
        size + sum(p) - ((o - 1) * s + d * (k - 1) + 1)
        for size, o, s, d, k, p in zip(xshape[2:], ohw, stride, dilation,
                                       wshape[2:], pads))


def _nhwc_unpadded(xpad, pads):
    """Conv2d's input (N, C, H, W) as a view of its padded channels-last
    copy."""
    (t, b), (l, r) = pads
    hp, wp = xpad.shape[1:3]
    return xpad[:, t:hp - b, l:wp - r].transpose(0, 3, 1, 2)


_IM2COL_MIN_C = 32


def _cols(xp, win, xpad, s, e, stride, dilation):
    """Images s..e of the window view ``win`` of ``xpad`` as a column
    matrix (rows, KH*KW*C): the compiled kernel's threaded copy, else
    NumPy's (the same values)."""
    _, oh, ow, kh, kw, c = win.shape
    out = xp.empty(((e - s) * oh * ow, kh * kw * c), xpad.dtype)
    # the kernel copies C-element runs: NumPy's copy is faster for short
    # ones (measured one thread, 3x3: C=16 0.25 vs 0.42 ms, C=32 0.86 vs
    # 0.73 ms; two threads halve the kernel's time)
    k = _kernels.kernels(out, xpad) if c >= _IM2COL_MIN_C else None
    if k is None:
        return win[s:e].reshape(out.shape)
    k.im2col_nhwc(xpad, out, s, kh, kw, *stride, *dilation, oh, ow)
    return out
