"""2-D max and average pooling, forward and backward side by side. Max
pooling has three paths (the 2x2 tiling of a contiguous input, windows
that tile the input, and the general strided case); ``MaxPool2d``'s
docstring says why and what each measured.
"""
import numpy as np

from .. import _kernels
from .._backend import get_array_module
from .base import Op, is_float, zero_link_t
from .window import _col2im, _offsets, _pad2d, _unpad2d, _windows


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
        lo = -xp.inf if is_float(x.dtype) else np.iinfo(x.dtype).min
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
        kern = _kernels.kernels(x) if ctx.pairs else None
        if kern is not None:
            col, low, best = _max_pairs_kernel(kern, x, oh, ow)
            ctx.save_for_backward(col, low)
            return best
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
            ctx.save_for_backward(x, x, best.copy())     # see _saved
            return best
        xpad = _pad2d(xp, x, pads, lo)
        best = None
        for hs, ws in _offsets(k, stride, dilation, (oh, ow)):
            v = xpad[:, :, hs, ws]
            if best is None:
                best = v.copy()
            else:
                xp.maximum(best, v, out=best)
        ctx.save_for_backward(x, xpad, best.copy())  # see _saved
        return best

    @staticmethod
    def backward(ctx, g):
        xp = get_array_module(g)
        shape, k, stride, pads, dilation, ohw = ctx.meta
        finite = bool(xp.isfinite(g).all()) if is_float(g.dtype) else True
        if ctx.pairs:
            col, low = ctx.to_save
            n, c, h, w = shape
            g2 = g.reshape(-1, ohw[1])
            kern = _kernels.kernels(g2)
            if kern is not None:
                gx = np.empty(shape, g.dtype)
                kern.max_pool2x2_bwd(g2, col.reshape(-1, 2, ohw[1]),
                                     low.reshape(g2.shape),
                                     gx.reshape(-1, 2, ohw[1], 2), finite)
                return gx
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
        xin, best = _saved(ctx)
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
            lo = -np.inf if is_float(best.dtype) else \
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

    @staticmethod
    def backward_graph(ctx, g):
        # kept: the array backward assigns g to the winners in place, pass
        # by pass over the window offsets, which no tensor op can.
        # piecewise linear: g goes to each window's winner, a scatter that
        # is differentiable in g (its gradient gathers at the winners)
        lin, pshape, pads = _max_winners(ctx)
        from .selection import scatter_flat_t
        gx = scatter_flat_t(g, lin, pshape)
        (t, b), (l, r) = pads
        if t or b or l or r:
            gx = gx[:, :, t:pshape[2] - b, l:pshape[3] - r]
        return zero_link_t(gx, ctx, 0, ctx.meta[0], g._data.dtype)


def _saved(ctx):
    """The (padded) input and the window maxima that backward compares.
    Forward keeps the input itself too (as PyTorch does, so an in-place
    change to it is caught) and a copy of the maxima, not the output: an
    in-place op on the output (MaxPool2d -> ReLU(inplace=True)) stays
    legal, as with PyTorch's saved indices (measured 16x32x56x56, 3x3 /
    2 / pad 1, forward + backward, thread CPU time, min of 15 at load
    2-5: 7.4-7.8 ms saving the output, 7.5-8.4 ms with the copy)."""
    return ctx.to_save[1], ctx.to_save[2]


def _max_pairs_kernel(kern, x, oh, ow):
    """The compiled 2x2 pool: (col, low, best) as the NumPy path keeps
    them (col per window row's cell pair, low per window)."""
    n, c = x.shape[:2]
    rows = n * c * oh
    col = np.empty(rows * 2 * ow, bool)
    low = np.empty((rows, ow), bool)
    best = np.empty((n, c, oh, ow), x.dtype)
    kern.max_pool2x2_fwd(x.reshape(rows, 2, ow, 2), col.reshape(rows, 2, ow),
                         low, best.reshape(rows, ow))
    return col, low, best


def _has_nan(xp, a):
    """Whether a float array holds a NaN: one max (NaN propagates), no
    boolean array."""
    return is_float(a.dtype) and a.size > 0 and bool(xp.isnan(a.max()))


def _tiles(x, k, ohw):
    """(N, C, OH, KH, OW, KW) view of the windows of a pool whose kernel
    equals its stride (the cells of x past the last window are dropped)."""
    n, c = x.shape[:2]
    oh, ow = ohw
    return x[:, :, :oh * k[0], :ow * k[1]].reshape(n, c, oh, k[0], ow, k[1])


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
        ctx.meta = (x.shape, k, stride, pads, (oh, ow), divisor)
        kern = _avg_kernel(xp, x, divisor, (oh, ow))
        if kern is not None:
            xpad = xp.ascontiguousarray(_pad2d(xp, x, pads))
            out = xp.empty((n * c, oh, ow), x.dtype)
            kern[0].avg_pool_fwd(xpad.reshape(n * c, *xpad.shape[2:]), out,
                                 kern[1], *k, *stride)
            return out.reshape(n, c, oh, ow)
        if (tuple(k) == tuple(stride) and not any(pads[0] + pads[1])
                and isinstance(divisor, (int, float))):
            out = x[:, :, :oh * k[0], :ow * k[1]].reshape(
                n, c, oh, k[0], ow, k[1]).sum(axis=(3, 5))
        else:
            win = _windows(xp, _pad2d(xp, x, pads), k, stride, (1, 1),
                           (oh, ow))
            out = win.sum(axis=(2, 3))
        out = out / xp.asarray(divisor, dtype=x.dtype)
        return out.astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        if ctx._gmake is not None:
            # the same body as an op of g (linear: its gradient is the
            # pool), joined to x by a zero derivative as PyTorch's
            return zero_link_t(AvgPool2dGrad.apply(g, meta=ctx.meta), ctx,
                               0, ctx.meta[0], g._data.dtype)
        xp = get_array_module(g)
        shape, k, stride, pads, ohw, divisor = ctx.meta
        n, c = shape[:2]
        pshape = (n, c, shape[2] + sum(pads[0]), shape[3] + sum(pads[1]))
        kern = _avg_kernel(xp, g, divisor, ohw)
        if kern is not None:
            gx = xp.zeros(pshape, g.dtype)
            kern[0].avg_pool_bwd(g.reshape(n * c, *ohw), kern[1],
                                 gx.reshape(n * c, *pshape[2:]), *k, *stride)
            return xp.ascontiguousarray(_unpad2d(gx, pads))
        g = g / xp.asarray(divisor, dtype=g.dtype)
        cols = xp.broadcast_to(g[:, :, None, None], (n, c, k[0], k[1]) + ohw)
        return _unpad2d(_col2im(xp, cols, pshape, k, stride, (1, 1), ohw),
                        pads)


def _avg_kernel(xp, a, divisor, ohw):
    """(compiled kernels, divisor as a C-contiguous (OH, OW) array of a's
    dtype) when they apply to a (contiguous float NumPy), else None."""
    kern = _kernels.kernels(a) if xp is np else None
    if kern is None:
        return None
    div = np.ascontiguousarray(np.broadcast_to(
        np.asarray(divisor, dtype=a.dtype), ohw))
    return kern, div


class AvgPool2dGrad(Op):
    """AvgPool2d's input gradient as an op of g: linear, its gradient is
    the average pool itself (AvgPool2d's create_graph=True backward)."""
    @staticmethod
    def forward(ctx, g, meta=None):
        ctx.meta = meta
        return AvgPool2d.backward(ctx, g)

    @staticmethod
    def backward(ctx, h):
        # the pool: its forward on arrays, the op (recorded) on a tensor
        shape, k, stride, pads, ohw, divisor = ctx.meta
        pool = AvgPool2d.forward if ctx._gmake is None else \
            (lambda c, *a, **kw: AvgPool2d.apply(*a, **kw))
        return pool(AvgPool2d.__new__(AvgPool2d), h, k=k, stride=stride,
                    pads=pads, out_hw=ohw, divisor=divisor)


def _max_winners(ctx):
    """Flat positions (N, C, OH, OW) of each window's winning cell in the
    (padded) input plane, that plane's shape and the padding: the cells
    that backward sends g to."""
    shape, k, stride, pads, dilation, ohw = ctx.meta
    n, c, h, w = shape
    oh, ow = ohw
    if ctx.pairs:
        col, low = ctx.to_save
        xp = get_array_module(col)
        low = low.reshape(n * c, oh, ow)
        rows = 2 * xp.arange(oh).reshape(1, oh, 1) + low
        cols = 2 * xp.arange(ow).reshape(1, 1, ow)
        plane = xp.arange(n * c).reshape(-1, 1, 1)
        # the window-row pair (plane, row, column pair) of the winning row
        cols = cols + col[(plane * h + rows) * ow + cols // 2]
        return (plane * h + rows) * w + cols, shape, ((0, 0), (0, 0))
    xin, best = _saved(ctx)
    xp = get_array_module(xin)
    kk = k[0] * k[1]
    if ctx.tiled:
        win = _tiles(xin, k, ohw).transpose(0, 1, 2, 4, 3, 5)
    else:
        win = _windows(xp, xin, k, stride, dilation, ohw).transpose(
            0, 1, 4, 5, 2, 3)
    # PyTorch's winner: the first maximum among the real cells (a window
    # of padding and -inf gives its first real cell), the last NaN where
    # the maximum is NaN
    hit = win.reshape(n, c, oh, ow, kk) == best[..., None]
    if not ctx.tiled and any(pads[0] + pads[1]):
        real = _windows(xp, _pad2d(xp, xp.ones((1, 1, h, w), bool), pads,
                                   False), k, stride, dilation, ohw)
        hit &= real.transpose(0, 1, 4, 5, 2, 3).reshape(1, 1, oh, ow, kk)
    a = hit.argmax(-1)
    if _has_nan(xp, best):
        isn = xp.isnan(win.reshape(n, c, oh, ow, kk))
        a = xp.where(xp.isnan(best), kk - 1 - isn[..., ::-1].argmax(-1), a)
    hp, wp = xin.shape[2:]
    rows = xp.arange(oh).reshape(-1, 1) * stride[0] + \
        (a // k[1]) * dilation[0]
    cols = xp.arange(ow) * stride[1] + (a % k[1]) * dilation[1]
    plane = xp.arange(n * c).reshape(n, c, 1, 1)
    return ((plane * hp + rows) * wp + cols, (n, c, hp, wp),
            ((0, 0), (0, 0)) if ctx.tiled else pads)
