"""Sliding-window views shared by convolution, pooling and ``F.unfold``:
padding of the last two axes, a strided (N, C, KH, KW, OH, OW) view of the
windows (no copy), and its adjoint ``_col2im`` (one strided slice-add per
kernel offset, never ``add.at``).
"""


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


def _offsets(k, stride, dilation, out_hw):
    """(rows, cols) slices that pick kernel offset (i, j) of every window."""
    oh, ow = out_hw
    for i in range(k[0]):
        h0 = i * dilation[0]
        hs = slice(h0, h0 + stride[0] * (oh - 1) + 1, stride[0])
        for j in range(k[1]):
            w0 = j * dilation[1]
            yield hs, slice(w0, w0 + stride[1] * (ow - 1) + 1, stride[1])


def _col2im(xp, cols, shape, k, stride, dilation, out_hw):
    """The adjoint of ``_windows``: sum (N, C, KH, KW, OH, OW) back into an
    array of (padded) ``shape``, one strided slice per kernel offset (never
    ``add.at``)."""
    out = xp.zeros(shape, cols.dtype)
    for o, (hs, ws) in enumerate(_offsets(k, stride, dilation, out_hw)):
        out[:, :, hs, ws] += cols[:, :, o // k[1], o % k[1]]
    return out


def _unpad2d(x, pads):
    (t, b), (l, r) = pads
    h, w = x.shape[-2:]
    return x[..., t:h - b, l:w - r]


def conv_out_size(size, k, stride, pad_total, dilation):
    return (size + pad_total - dilation * (k - 1) - 1) // stride + 1
