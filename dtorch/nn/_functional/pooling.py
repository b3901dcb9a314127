"""Pooling functions: max/avg pooling (1-3 d), adaptive, Lp pooling."""
import numpy as np

from ... import _backend as B
from ... import ops as N
from ...autograd.function import autocast_op
from ...tensor import Tensor
from ._common import _columns, _ntuple, _pair, _triple, _wrap, \
    fresh_result
from .conv import _as_pair


# ================================================================ pooling ==

def _pool_out(size, k, s, p, d, ceil_mode):
    num = size + 2 * p - d * (k - 1) - 1
    out = (-(-num // s) if ceil_mode else num // s) + 1
    # the last window must start inside the input or the left padding
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def _pool_args(input, kernel_size, stride, padding, dilation, name):
    if input.ndim not in (3, 4):
        raise RuntimeError(
            f"{name}: Expected 3D or 4D (batch mode) tensor for input, but "
            f"got: {list(input.shape)}")
    k = _pair(kernel_size, "kernel_size")
    s = k if (stride is None or stride == [] or stride == ()) \
        else _pair(stride, "stride")
    p = _pair(padding, "padding")
    d = _pair(dilation, "dilation")
    for i in range(2):
        if p[i] > (d[i] * (k[i] - 1) + 1) // 2:
            raise RuntimeError(
                f"pad should be at most half of effective kernel size, but "
                f"got pad={p[i]}, kernel_size={k[i]} and dilation={d[i]}")
    return k, s, p, d


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1,
               ceil_mode=False, return_indices=False):
    k, s, p, d = _pool_args(input, kernel_size, stride, padding, dilation,
                            "max_pool2d")
    unbatched = input.ndim == 3
    if unbatched:
        input = input.unsqueeze(0)
    h, w = input.shape[2:]
    ohw = (_pool_out(h, k[0], s[0], p[0], d[0], ceil_mode),
           _pool_out(w, k[1], s[1], p[1], d[1], ceil_mode))
    if ohw[0] <= 0 or ohw[1] <= 0:
        raise RuntimeError(
            f"Given input size: ({input.shape[1]}x{h}x{w}). Calculated "
            f"output size: ({input.shape[1]}x{ohw[0]}x{ohw[1]}). Output size "
            f"is too small")
    out = N.MaxPool2d.apply(input, k=k, stride=s,
                            pads=((p[0], p[0]), (p[1], p[1])), dilation=d,
                            out_hw=ohw)
    if return_indices:
        idx = _max_pool_indices(input._data, k, s, p, d, ohw)
        if unbatched:
            return out.squeeze(0), idx.squeeze(0)
        return out, idx
    return out.squeeze(0) if unbatched else out


def _max_pool_indices(x, k, s, p, d, ohw):
    """Flat (H * W) input indices of the maxima, PyTorch's return_indices."""
    xp = B.get_array_module(x)
    h, w = x.shape[2:]
    oh, ow = ohw
    lo = -xp.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    ph = max(0, (oh - 1) * s[0] + d[0] * (k[0] - 1) + 1 - h - p[0])
    pw = max(0, (ow - 1) * s[1] + d[1] * (k[1] - 1) + 1 - w - p[1])
    xpad = N._pad2d(xp, x, ((p[0], ph), (p[1], pw)), lo)
    win = N._windows(xp, xpad, k, s, d, ohw).transpose(0, 1, 4, 5, 2, 3)
    win = win.reshape(x.shape[:2] + (oh, ow, -1))
    am = win.argmax(-1)
    if x.dtype.kind == "f":
        # PyTorch takes the last NaN of a window (argmax finds the first)
        isn = xp.isnan(win)
        if bool(isn.any()):
            lastnan = win.shape[-1] - 1 - isn[..., ::-1].argmax(-1)
            am = xp.where(isn.any(-1), lastnan, am)
    rows = xp.arange(oh)[:, None] * s[0] + (am // k[1]) * d[0] - p[0]
    cols = xp.arange(ow)[None, :] * s[1] + (am % k[1]) * d[1] - p[1]
    pad = (rows < 0) | (rows >= h) | (cols < 0) | (cols >= w)
    if bool(pad.any()):
        # a window whose real cells all hold -inf: its first real cell
        # (PyTorch), not the padding that argmax found first
        def first(o, ss, pp, dd):
            st = xp.arange(o) * ss - pp
            return xp.where(st < 0, st + (-(st // dd)) * dd, st)
        rows = xp.where(pad, first(oh, s[0], p[0], d[0])[:, None], rows)
        cols = xp.where(pad, first(ow, s[1], p[1], d[1])[None, :], cols)
    return Tensor._wrap((rows * w + cols).astype(np.int64))


@fresh_result
def max_pool1d(input, kernel_size, stride=None, padding=0, dilation=1,
               ceil_mode=False, return_indices=False):
    one = lambda v: _ntuple(v, 1)[0]  # noqa: E731
    s = one(kernel_size) if stride is None else one(stride)
    res = max_pool2d(input.unsqueeze(-2), (1, one(kernel_size)), (1, s),
                     (0, one(padding)), (1, one(dilation)), ceil_mode,
                     return_indices)
    if return_indices:
        return res[0].squeeze(-2), res[1].squeeze(-2)
    return res.squeeze(-2)


def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False,
               count_include_pad=True, divisor_override=None):
    k, s, p, _ = _pool_args(input, kernel_size, stride, padding, 1,
                            "avg_pool2d")
    unbatched = input.ndim == 3
    if unbatched:
        input = input.unsqueeze(0)
    h, w = input.shape[2:]
    oh = _pool_out(h, k[0], s[0], p[0], 1, ceil_mode)
    ow = _pool_out(w, k[1], s[1], p[1], 1, ceil_mode)
    if divisor_override:
        div = divisor_override
    else:
        # PyTorch's divisor: the window clipped to the padded input, or to
        # the input itself when padding does not count
        def sizes(o, size, kk, ss, pp):
            start = np.arange(o) * ss - pp
            end = np.minimum(start + kk, size + pp)
            full = end - start
            real = np.minimum(end, size) - np.maximum(start, 0)
            return full if count_include_pad else real
        dv = np.outer(sizes(oh, h, k[0], s[0], p[0]),
                      sizes(ow, w, k[1], s[1], p[1]))
        div = int(dv.flat[0]) if (dv == dv.flat[0]).all() else \
            input.device.send(dv.astype(input._data.dtype))
    out = N.AvgPool2d.apply(input, k=k, stride=s,
                            pads=((p[0], p[0]), (p[1], p[1])),
                            out_hw=(oh, ow), divisor=div)
    return out.squeeze(0) if unbatched else out


@fresh_result
def avg_pool1d(input, kernel_size, stride=None, padding=0, ceil_mode=False,
               count_include_pad=True):
    one = lambda v: _ntuple(v, 1)[0]  # noqa: E731
    s = one(kernel_size) if stride is None else one(stride)
    return avg_pool2d(input.unsqueeze(-2), (1, one(kernel_size)), (1, s),
                      (0, one(padding)), ceil_mode,
                      count_include_pad).squeeze(-2)


def _adaptive_matrix(xp, size, out, dtype):
    """(out, size) averaging matrix of PyTorch's adaptive windows:
    [floor(i * size / out), ceil((i + 1) * size / out))."""
    m = np.zeros((out, size))
    for i in range(out):
        a = (i * size) // out
        b = -(-((i + 1) * size) // out)
        m[i, a:b] = 1.0 / (b - a)
    return xp.asarray(m.astype(dtype))


@autocast_op("none")         # not lowered (PyTorch's lists)
def adaptive_avg_pool2d(input, output_size):
    if input.ndim not in (3, 4):
        raise RuntimeError(
            f"adaptive_avg_pool2d(): Expected 3D or 4D tensor, but got "
            f"{list(input.shape)}")
    h, w = input.shape[-2:]
    osz = output_size if isinstance(output_size, (tuple, list)) \
        else (output_size, output_size)
    oh = h if osz[0] is None else int(osz[0])
    ow = w if osz[1] is None else int(osz[1])
    if oh == 1 and ow == 1:
        return input.mean((-2, -1), keepdim=True)
    if h % oh == 0 and w % ow == 0:
        return avg_pool2d(input, (h // oh, w // ow))
    # windows overlap or vary in size: the average is separable in H and W
    xp = input._xp()
    mh = Tensor._wrap(_adaptive_matrix(xp, h, oh, input._data.dtype))
    mw = Tensor._wrap(_adaptive_matrix(xp, w, ow, input._data.dtype))
    return mh @ input @ mw.t()


@fresh_result
@autocast_op("none")
def adaptive_avg_pool1d(input, output_size):
    o = _ntuple(output_size, 1)[0]
    return adaptive_avg_pool2d(input.unsqueeze(-2), (1, o)).squeeze(-2)


def adaptive_max_pool2d(input, output_size, return_indices=False):
    """Max over PyTorch's adaptive windows (start floor(i*H/oh), end
    ceil((i+1)*H/oh)); windows are gathered, one reduction."""
    x = input if input.ndim == 4 else input.unsqueeze(0)
    n, c, h, w = x.shape
    oh, ow = _as_pair(output_size)
    oh = h if oh is None else oh
    ow = w if ow is None else ow
    xp = x._xp()
    rh = _adaptive_windows(h, oh)
    rw = _adaptive_windows(w, ow)
    # pad each window to the largest size by repeating its first index
    flat = x.reshape(n, c, h * w)
    pos = (rh[:, None, :, None] * w + rw[None, :, None, :]).reshape(
        oh * ow, -1)
    g = flat.index_select(2, _wrap(xp.asarray(pos.reshape(-1))))
    g = g.reshape(n, c, oh * ow, pos.shape[1])
    vals, arg = g.max(-1)
    out = vals.reshape(n, c, oh, ow)
    if input.ndim == 3:
        out = out.squeeze(0)
    if return_indices:
        ind = _wrap(xp.asarray(pos))[
            _wrap(xp.arange(oh * ow)).reshape(1, 1, -1), arg]
        ind = ind.reshape(out.shape)
        return out, ind
    return out


def _adaptive_windows(n, o):
    starts = (np.arange(o) * n) // o
    ends = -((-(np.arange(o) + 1) * n) // o)
    size = int((ends - starts).max())
    idx = starts[:, None] + np.arange(size)[None, :]
    # indices past a window's end repeat its start (max is unchanged)
    return np.where(idx < ends[:, None], idx, starts[:, None])


def adaptive_max_pool1d(input, output_size, return_indices=False):
    res = adaptive_max_pool2d(input.unsqueeze(-2), (1, output_size),
                              return_indices)
    if return_indices:
        return res[0].squeeze(-2), res[1].squeeze(-2)
    return res.squeeze(-2)


def lp_pool2d(input, norm_type, kernel_size, stride=None, ceil_mode=False):
    kw, kh = _as_pair(kernel_size)
    out = avg_pool2d(input ** norm_type, kernel_size, stride, 0, ceil_mode)
    return (out.sign() * out.abs().relu() * (kw * kh)) ** (1.0 / norm_type)


def lp_pool1d(input, norm_type, kernel_size, stride=None, ceil_mode=False):
    out = avg_pool1d(input ** norm_type, kernel_size, stride, 0, ceil_mode)
    return (out.sign() * out.abs().relu() * kernel_size) ** \
        (1.0 / norm_type)


def _pool3d_args(input, kernel_size, stride, padding, dilation, ceil_mode,
                 name):
    if ceil_mode:
        raise NotImplementedError(f"{name}(ceil_mode=True) is not supported "
                                  f"by dtorch")
    k = _triple(kernel_size, "kernel_size")
    s = _triple(stride if stride not in (None, ()) else kernel_size,
                "stride")
    p = _triple(padding, "padding")
    d = _triple(dilation, "dilation")
    if any(2 * pp > kk for pp, kk in zip(p, k)):
        raise RuntimeError("pad should be at most half of effective kernel "
                           "size")
    if input.ndim not in (4, 5):
        raise RuntimeError(f"{name}: expected 4D or 5D input, got "
                           f"{input.ndim}D")
    return k, s, p, d


@autocast_op({"cpu": "fp32"})    # PyTorch's CPU fp32 list
def max_pool3d(input, kernel_size, stride=None, padding=0, dilation=1,
               ceil_mode=False, return_indices=False):
    if return_indices:
        raise NotImplementedError("max_pool3d(return_indices=True) is not "
                                  "supported by dtorch")
    k, s, p, d = _pool3d_args(input, kernel_size, stride, padding, dilation,
                              ceil_mode, "max_pool3d")
    x = input if input.ndim == 5 else input.unsqueeze(0)
    cols, out = _columns(x, k, s, p, d, fill=float("-inf"))
    y = cols.amax(2).reshape(x.shape[0], x.shape[1], *out)
    return y if input.ndim == 5 else y.squeeze(0)


@autocast_op({"cpu": "fp32"})
def avg_pool3d(input, kernel_size, stride=None, padding=0, ceil_mode=False,
               count_include_pad=True, divisor_override=None):
    k, s, p, d = _pool3d_args(input, kernel_size, stride, padding, 1,
                              ceil_mode, "avg_pool3d")
    x = input if input.ndim == 5 else input.unsqueeze(0)
    cols, out = _columns(x, k, s, p, d)
    tot = cols.sum(2)
    if divisor_override:
        y = tot / divisor_override
    elif count_include_pad or not any(p):
        y = tot / (k[0] * k[1] * k[2])
    else:
        ones = x.new_ones((1, 1) + tuple(x.shape[2:]))
        cnt, _ = _columns(ones, k, s, p, d)
        y = tot / cnt.sum(2)
    y = y.reshape(x.shape[0], x.shape[1], *out)
    return y if input.ndim == 5 else y.squeeze(0)
