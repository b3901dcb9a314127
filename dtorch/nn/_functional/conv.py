"""Convolution functions: conv1d/2d/3d, conv_transpose1d/2d, unfold, fold."""
import numpy as np

from ... import ops as N
from ...autograd.function import autocast_op
from ...ops.base import check_conv_dtypes
from ...functional import einsum
from .padding import pad as _pad
from ._common import _columns, _ntuple, _pair, _triple, _wrap, \
    fresh_result


# ============================================================ convolution ==

def _conv_pads(padding, k, dilation, stride, n, name):
    if isinstance(padding, str):
        if padding == "valid":
            return ((0, 0),) * n
        if padding != "same":
            raise ValueError(f"Invalid padding string '{padding}', should "
                             f"be one of {{'valid', 'same'}}")
        if any(s != 1 for s in stride):
            raise ValueError("padding='same' is not supported for strided "
                             "convolutions")
        pads = []
        for kk, d in zip(k, dilation):
            total = d * (kk - 1)
            pads.append((total // 2, total - total // 2))
        return tuple(pads)
    p = _ntuple(padding, n, "padding")
    return tuple((a, a) for a in p)


def _conv_input(input, weight, groups, nd, name, transposed=False):
    """Check a convolution's input and weight ranks and the input's channel
    count (PyTorch's words); returns the input batched and whether it was
    not."""
    if input.ndim not in (nd + 1, nd + 2):
        raise RuntimeError(
            f"Expected {nd + 1}D (unbatched) or {nd + 2}D (batched) input to "
            f"{name}, but got input of size: {list(input.shape)}")
    c = input.shape[-nd - 1]
    if weight.ndim != nd + 2:
        raise RuntimeError(
            f"weight should have at least three dimensions: expected "
            f"{nd + 2}D weight for {name}, got weight of size "
            f"{list(weight.shape)}")
    unbatched = input.ndim == nd + 1
    if unbatched:
        input = input.unsqueeze(0)
    want = weight.shape[0] if transposed else weight.shape[1] * groups
    if c != want:
        given = "transposed=1" if transposed else f"groups={groups}"
        raise RuntimeError(
            f"Given {given}, weight of size {list(weight.shape)}, expected "
            f"input{list(input.shape)} to have {want} channels, but got {c} "
            f"channels instead")
    return input, unbatched


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1,
           groups=1):
    """2-D convolution over (N, C, H, W) or unbatched (C, H, W) input."""
    input, unbatched = _conv_input(input, weight, groups, 2, "conv2d")
    if weight.shape[0] % groups:
        raise RuntimeError(
            f"Given groups={groups}, expected weight to be divisible by "
            f"{groups} at dimension 0, but got weight of size "
            f"{list(weight.shape)} instead")
    stride = _pair(stride, "stride")
    dilation = _pair(dilation, "dilation")
    pads = _conv_pads(padding, weight.shape[2:], dilation, stride, 2,
                      "conv2d")
    out = N.Conv2d.apply(input, weight, bias, stride=stride, pads=pads,
                         dilation=dilation, groups=groups)
    return out.squeeze(0) if unbatched else out


@fresh_result
def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1,
           groups=1):
    """1-D convolution over (N, C, L), run as a 2-D one with height 1."""
    input, unbatched = _conv_input(input, weight, groups, 1, "conv1d")
    if isinstance(padding, str):
        pad2 = padding
    else:
        pad2 = (0, _ntuple(padding, 1, "padding")[0])
    out = conv2d(input.unsqueeze(2), weight.unsqueeze(2), bias,
                 (1, _ntuple(stride, 1)[0]), pad2,
                 (1, _ntuple(dilation, 1)[0]), groups).squeeze(2)
    return out.squeeze(0) if unbatched else out


def conv_transpose2d(input, weight, bias=None, stride=1, padding=0,
                     output_padding=0, groups=1, dilation=1):
    """Transposed 2-D convolution (the gradient of conv2d in its input)."""
    input, unbatched = _conv_input(input, weight, groups, 2,
                                   "conv_transpose2d", transposed=True)
    stride = _pair(stride, "stride")
    dilation = _pair(dilation, "dilation")
    p = _pair(padding, "padding")
    op = _pair(output_padding, "output_padding")
    for a, s, d in zip(op, stride, dilation):
        if a >= s and a >= d:
            raise RuntimeError(
                "output padding must be smaller than either stride or "
                "dilation")
    out = N.ConvTranspose2d.apply(
        input, weight, bias, stride=stride, pads=((p[0], p[0]), (p[1], p[1])),
        dilation=dilation, groups=groups, output_padding=op)
    return out.squeeze(0) if unbatched else out


@fresh_result
def conv_transpose1d(input, weight, bias=None, stride=1, padding=0,
                     output_padding=0, groups=1, dilation=1):
    unbatched = input.ndim == 2
    if unbatched:
        input = input.unsqueeze(0)
    one = lambda v: _ntuple(v, 1)[0]  # noqa: E731
    out = conv_transpose2d(input.unsqueeze(2), weight.unsqueeze(2), bias,
                           (1, one(stride)), (0, one(padding)),
                           (0, one(output_padding)), groups,
                           (1, one(dilation))).squeeze(2)
    return out.squeeze(0) if unbatched else out


def _as_pair(v):
    return tuple(v) if isinstance(v, (tuple, list)) else (v, v)


def _unfold_index(xp, hw, k, d, p, s):
    """Flat positions (in the padded image) read by each column of im2col:
    (C*kh*kw positions relative to a channel, L windows)."""
    hp, wp = hw[0] + 2 * p[0], hw[1] + 2 * p[1]
    oh = (hp - (d[0] * (k[0] - 1) + 1)) // s[0] + 1
    ow = (wp - (d[1] * (k[1] - 1) + 1)) // s[1] + 1
    ki = (np.arange(k[0]) * d[0])[:, None] * wp + \
        (np.arange(k[1]) * d[1])[None, :]
    wi = (np.arange(oh) * s[0])[:, None] * wp + \
        (np.arange(ow) * s[1])[None, :]
    return ki.reshape(-1, 1) + wi.reshape(1, -1), (hp, wp), (oh, ow)


def unfold(input, kernel_size, dilation=1, padding=0, stride=1):
    """im2col: (N, C, H, W) -> (N, C*kh*kw, L) sliding blocks."""
    if input.ndim not in (3, 4):
        raise NotImplementedError("Input Error: Only 3D or 4D input Tensors "
                                  "are supported (got {}D)".format(input.ndim))
    batched = input.ndim == 4
    x = input if batched else input.unsqueeze(0)
    k, d, p, s = (_as_pair(v) for v in (kernel_size, dilation, padding, stride))
    n, c = x.shape[:2]
    idx, (hp, wp), (oh, ow) = _unfold_index(np, x.shape[2:], k, d, p, s)
    if p != (0, 0):
        x = _pad(x, (p[1], p[1], p[0], p[0]))
    flat = x.reshape(n, c, hp * wp)
    cols = flat.index_select(2, _wrap(x._xp().asarray(idx.reshape(-1))))
    out = cols.reshape(n, c * k[0] * k[1], oh * ow)
    return out if batched else out.squeeze(0)


def fold(input, output_size, kernel_size, dilation=1, padding=0, stride=1):
    """col2im, the adjoint of unfold: overlapping blocks are summed."""
    batched = input.ndim == 3
    x = input if batched else input.unsqueeze(0)
    k, d, p, s = (_as_pair(v) for v in (kernel_size, dilation, padding, stride))
    osz = _as_pair(output_size)
    n, ckk, L = x.shape
    c = ckk // (k[0] * k[1])
    idx, (hp, wp), (oh, ow) = _unfold_index(np, osz, k, d, p, s)
    if oh * ow != L:
        raise RuntimeError(f"Given output_size={list(osz)}, kernel_size="
                           f"{list(k)}, dilation={list(d)}, padding="
                           f"{list(p)}, stride={list(s)}, expected size of "
                           f"input's dimension 2 to match the calculated "
                           f"number of sliding blocks {oh} * {ow} = "
                           f"{oh * ow}, but got input.size(2)={L}.")
    xp = x._xp()
    vals = x.reshape(n, c, -1)
    out = vals.new_zeros((n, c, hp * wp)).index_add(
        2, _wrap(xp.asarray(idx.reshape(-1))), vals)
    out = out.reshape(n, c, hp, wp)
    out = out[:, :, p[0]:p[0] + osz[0], p[1]:p[1] + osz[1]]
    return out if batched else out.squeeze(0)


@autocast_op("lower")     # one GEMM-like op for autocast, as PyTorch's
def conv3d(input, weight, bias=None, stride=1, padding=0, dilation=1,
           groups=1):
    """3-D convolution of (N, C, D, H, W) input (or unbatched (C, D, H,
    W)) with (O, C / groups, kD, kH, kW) weight."""
    check_conv_dtypes(input._data, weight._data,
                      None if bias is None else bias._data)
    x, unbatched = _conv_input(input, weight, groups, 3, "conv3d")
    o, cg = weight.shape[:2]
    k = tuple(weight.shape[2:])
    if isinstance(padding, str):
        if padding == "valid":
            p = (0, 0, 0)
        else:
            raise NotImplementedError("conv3d(padding='same') is not "
                                      "supported by dtorch")
    else:
        p = _triple(padding, "padding")
    s, d = _triple(stride, "stride"), _triple(dilation, "dilation")
    cols, out = _columns(x, k, s, p, d)
    n, _, kk, L = cols.shape
    cols = cols.reshape(n, groups, cg * kk, L)
    w = weight.reshape(groups, o // groups, cg * kk)
    y = einsum("gok,ngkl->ngol", w, cols).reshape(n, o, *out)
    if bias is not None:
        y = y + bias.reshape(1, o, 1, 1, 1)
    return y.squeeze(0) if unbatched else y
