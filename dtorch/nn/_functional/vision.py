"""Vision functions (pad: padding.py): interpolate/upsample, pixel (un)shuffle,
channel_shuffle, affine_grid, grid_sample."""
import math
import warnings

import numpy as np

from ... import _backend as B
from ...autograd.function import autocast_op
from ._common import _wrap
from .pooling import adaptive_avg_pool1d, adaptive_avg_pool2d


# ====================================================== interpolation =====

def _out_size(input, size, scale_factor, nd):
    if size is not None and scale_factor is not None:
        raise ValueError("only one of size or scale_factor should be defined")
    if size is not None:
        return tuple(size) if isinstance(size, (tuple, list)) else \
            (int(size),) * nd
    if scale_factor is None:
        raise ValueError("either size or scale_factor should be defined")
    sf = tuple(scale_factor) if isinstance(scale_factor, (tuple, list)) \
        else (float(scale_factor),) * nd
    return tuple(int(math.floor(input.shape[2 + i] * sf[i]))
                 for i in range(nd))


def _scales(input, out, scale_factor, nd, recompute):
    if scale_factor is not None and not recompute:
        sf = tuple(scale_factor) if isinstance(scale_factor, (tuple, list)) \
            else (float(scale_factor),) * nd
        return [1.0 / s for s in sf]
    return [input.shape[2 + i] / out[i] for i in range(nd)]


def _nearest_index(xp, n_in, n_out, scale, exact):
    o = np.arange(n_out, dtype=np.float64)
    if exact:
        src = np.floor((o + 0.5) * scale)
    else:
        src = np.floor(o * scale)
    return xp.asarray(np.minimum(src, n_in - 1).astype(np.int64))


def _linear_weights(n_in, n_out, scale, align_corners, dtype):
    """(n_out, n_in) interpolation matrix of 1-D linear resampling."""
    o = np.arange(n_out, dtype=np.float64)
    if align_corners:
        src = o * ((n_in - 1) / (n_out - 1)) if n_out > 1 else o * 0
    else:
        src = np.maximum((o + 0.5) * scale - 0.5, 0)
    i0 = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
    i1 = np.minimum(i0 + 1, n_in - 1)
    w1 = src - i0
    m = np.zeros((n_out, n_in))
    np.add.at(m, (np.arange(n_out), i0), 1 - w1)   # n_out rows, not elements
    np.add.at(m, (np.arange(n_out), i1), w1)
    return m.astype(dtype)


@B.on_own_device
def interpolate(input, size=None, scale_factor=None, mode="nearest",
                align_corners=None, recompute_scale_factor=None,
                antialias=False):
    """Resize the spatial dims: 'nearest', 'nearest-exact', 'linear',
    'bilinear', 'trilinear' (separable matrix products, differentiable) and
    'area' (adaptive average pooling)."""
    nd = input.ndim - 2
    if nd < 1:
        raise ValueError(f"Input Error: Only 3D, 4D and 5D input Tensors "
                         f"supported (got {input.ndim}D)")
    if mode in ("nearest", "nearest-exact", "area") and \
            align_corners is not None:
        raise ValueError("align_corners option can only be set with the "
                         "interpolating modes: linear | bilinear | bicubic "
                         "| trilinear")
    if antialias:
        raise NotImplementedError("interpolate(antialias=True) is not "
                                  "supported by dtorch")
    out = _out_size(input, size, scale_factor, nd)
    scales = _scales(input, out, scale_factor, nd, recompute_scale_factor)
    xp = input._xp()
    x = input
    if mode in ("nearest", "nearest-exact"):
        for i in range(nd):
            idx = _nearest_index(xp, input.shape[2 + i], out[i], scales[i],
                                 mode == "nearest-exact")
            x = x.index_select(2 + i, _wrap(idx))
        return x
    if mode == "area":
        if nd == 1:
            return adaptive_avg_pool1d(x, out)
        if nd == 2:
            return adaptive_avg_pool2d(x, out)
        raise NotImplementedError("area mode for 3-D inputs")
    expect = {"linear": 1, "bilinear": 2, "trilinear": 3}
    if mode not in expect and mode != "bicubic":
        raise NotImplementedError(f"interpolate mode {mode!r}")
    if mode == "bicubic":
        raise NotImplementedError("interpolate(mode='bicubic') is not "
                                  "supported by dtorch")
    if expect[mode] != nd:
        raise NotImplementedError(
            f"Got {input.ndim}D input, but {mode} mode needs "
            f"{expect[mode] + 2}D input")
    ac = bool(align_corners)
    for i in range(nd):
        m = _linear_weights(input.shape[2 + i], out[i], scales[i], ac,
                            input._data.dtype)
        x = x.movedim(2 + i, -1) @ _wrap(xp.asarray(m.T))
        x = x.movedim(-1, 2 + i)
    return x


def upsample(input, size=None, scale_factor=None, mode="nearest",
             align_corners=None):
    warnings.warn("nn.functional.upsample is deprecated. Use "
                  "nn.functional.interpolate instead.", stacklevel=2)
    return interpolate(input, size, scale_factor, mode, align_corners)


def upsample_nearest(input, size=None, scale_factor=None):
    return interpolate(input, size, scale_factor, mode="nearest")


def upsample_bilinear(input, size=None, scale_factor=None):
    return interpolate(input, size, scale_factor, mode="bilinear",
                       align_corners=True)


def pixel_shuffle(input, upscale_factor):
    r = upscale_factor
    *lead, c, h, w = input.shape
    if c % (r * r):
        raise RuntimeError(f"pixel_shuffle expects its input's 'channel' "
                           f"dimension to be divisible by the square of "
                           f"upscale_factor, but input.size(-3)={c} is not "
                           f"divisible by {r * r}")
    x = input.reshape(*lead, c // (r * r), r, r, h, w)
    k = len(lead)
    x = x.permute(*range(k), k, k + 3, k + 1, k + 4, k + 2)
    return x.reshape(*lead, c // (r * r), h * r, w * r)


def pixel_unshuffle(input, downscale_factor):
    r = downscale_factor
    *lead, c, h, w = input.shape
    k = len(lead)
    x = input.reshape(*lead, c, h // r, r, w // r, r)
    x = x.permute(*range(k), k, k + 2, k + 4, k + 1, k + 3)
    return x.reshape(*lead, c * r * r, h // r, w // r)


def channel_shuffle(input, groups):
    n, c = input.shape[:2]
    rest = tuple(input.shape[2:])
    return input.reshape(n, groups, c // groups, *rest).transpose(1, 2) \
        .reshape(n, c, *rest)


def affine_grid(theta, size, align_corners=None):
    """Sampling grid (N, H, W, 2) of a batch of 2-D affine transforms."""
    if len(size) != 4:
        raise NotImplementedError("affine_grid: only 2-D (4-D size) grids")
    n, _, h, w = size
    ac = bool(align_corners)

    def lin(k):
        if k <= 1:
            return np.zeros(max(k, 1))
        v = np.linspace(-1, 1, k)
        return v if ac else v * (k - 1) / k
    xs, ys = lin(w), lin(h)
    base = np.stack([np.broadcast_to(xs[None, :], (h, w)),
                     np.broadcast_to(ys[:, None], (h, w)),
                     np.ones((h, w))], -1).reshape(1, h * w, 3)
    b = _wrap(theta._xp().asarray(base.astype(theta._data.dtype)))
    return (b @ theta.transpose(1, 2)).reshape(n, h, w, 2)


@autocast_op({"cpu": "fp32"})    # PyTorch's CPU fp32 list (grid_sampler)
def grid_sample(input, grid, mode="bilinear", padding_mode="zeros",
                align_corners=None):
    """Bilinear or nearest sampling of (N, C, H, W) at grid (N, Ho, Wo, 2)
    in [-1, 1] coordinates; zeros or border padding."""
    if mode not in ("bilinear", "nearest"):
        raise NotImplementedError(f"grid_sample mode {mode!r}")
    if padding_mode not in ("zeros", "border"):
        raise NotImplementedError(f"grid_sample padding_mode "
                                  f"{padding_mode!r}")
    n, c, h, w = input.shape
    ho, wo = grid.shape[1:3]
    ac = bool(align_corners)
    gx, gy = grid[..., 0], grid[..., 1]
    if ac:
        ix = (gx + 1) / 2 * (w - 1)
        iy = (gy + 1) / 2 * (h - 1)
    else:
        ix = ((gx + 1) * w - 1) / 2
        iy = ((gy + 1) * h - 1) / 2
    if padding_mode == "border":
        ix = ix.clamp(0, w - 1)
        iy = iy.clamp(0, h - 1)
    flat = input.reshape(n, c, h * w)

    def tap(yy, xx):
        # yy, xx: integer tensors (N, Ho, Wo); out-of-range reads give 0
        ok = ((xx >= 0) & (xx < w) & (yy >= 0) & (yy < h))
        pos = (yy.clamp(0, h - 1) * w + xx.clamp(0, w - 1)).reshape(n, 1, -1)
        v = flat.gather(2, pos.expand(n, c, ho * wo)).reshape(n, c, ho, wo)
        return v * ok.unsqueeze(1).to(v.dtype)

    if mode == "nearest":
        return tap(iy.detach().round().long(), ix.detach().round().long())
    x0 = ix.detach().floor()
    y0 = iy.detach().floor()
    wx1 = (ix - x0).unsqueeze(1)
    wy1 = (iy - y0).unsqueeze(1)
    x0l, y0l = x0.long(), y0.long()
    out = (tap(y0l, x0l) * (1 - wx1) * (1 - wy1)
           + tap(y0l, x0l + 1) * wx1 * (1 - wy1)
           + tap(y0l + 1, x0l) * (1 - wx1) * wy1
           + tap(y0l + 1, x0l + 1) * wx1 * wy1)
    return out
