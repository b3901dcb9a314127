"""More of ``torch.nn.functional`` (issue 14): normalisation by groups and
instances, distances and similarity, the remaining activations and losses,
interpolation, pixel shuffle, fold/unfold, grid sampling helpers.

Everything is composed from differentiable Tensor ops (or the fused ops of
``dtorch/ops``), so gradients come for free and match PyTorch's formulas;
``dtorch.nn.functional`` re-exports these names.
"""
import math
import warnings

import numpy as np

from .. import _backend as B
from .. import ops as N
from ..tensor import Tensor

__all__ = [
    "group_norm", "instance_norm", "local_response_norm",
    "cosine_similarity", "pairwise_distance", "pdist",
    "hardswish", "hardsigmoid", "glu", "prelu", "rrelu", "selu", "celu",
    "threshold", "softsign", "tanhshrink", "hardshrink", "softshrink",
    "gumbel_softmax", "alpha_dropout",
    "feature_alpha_dropout", "silu_", "relu_", "elu_", "leaky_relu_",
    "hardtanh_", "threshold_",
    "margin_ranking_loss", "hinge_embedding_loss", "soft_margin_loss",
    "cosine_embedding_loss", "triplet_margin_loss",
    "triplet_margin_with_distance_loss", "poisson_nll_loss",
    "gaussian_nll_loss", "multilabel_soft_margin_loss",
    "multi_margin_loss", "multilabel_margin_loss",
    "interpolate", "upsample", "upsample_nearest", "upsample_bilinear",
    "pixel_shuffle", "pixel_unshuffle", "unfold", "fold",
    "adaptive_max_pool1d", "adaptive_max_pool2d", "lp_pool1d", "lp_pool2d",
    "affine_grid", "grid_sample", "channel_shuffle",
]


def _reduce(loss, reduction):
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    if reduction == "none":
        return loss
    raise ValueError(f"{reduction} is not a valid value for reduction")


def _wrap(a):
    return Tensor._wrap(a)


# ============================================================== norms =====

def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):
    """Normalise each of ``num_groups`` channel groups of each sample over
    its channels and positions, then scale and shift per channel."""
    if input.ndim < 2:
        raise RuntimeError(f"Expected at least 2 dimensions for input tensor "
                           f"but received {input.ndim}")
    n, c = input.shape[0], input.shape[1]
    if c % num_groups:
        raise RuntimeError(f"Expected number of channels in input to be "
                           f"divisible by num_groups, but got input of shape "
                           f"{list(input.shape)} and num_groups={num_groups}")
    x = input.reshape(n, num_groups, -1)
    out = N.LayerNorm.apply(x, None, None, nd=1, eps=eps).reshape(input.shape)
    shape = (1, c) + (1,) * (input.ndim - 2)
    if weight is not None:
        out = out * weight.reshape(shape)
    if bias is not None:
        out = out + bias.reshape(shape)
    return out


def instance_norm(input, running_mean=None, running_var=None, weight=None,
                  bias=None, use_input_stats=True, momentum=0.1, eps=1e-5):
    """Normalise each channel of each sample over its positions."""
    n, c = input.shape[0], input.shape[1]
    shape = (1, c) + (1,) * (input.ndim - 2)
    if use_input_stats:
        x = input.reshape(n * c, -1)
        out = N.LayerNorm.apply(x, None, None, nd=1, eps=eps).reshape(
            input.shape)
        if running_mean is not None or running_var is not None:
            d = input.detach().reshape(n, c, -1)
            m = d.mean(-1).mean(0)
            cnt = d.shape[-1]
            v = d.var(-1, unbiased=cnt > 1).mean(0) if cnt > 1 else \
                d.var(-1, unbiased=False).mean(0)
            if running_mean is not None:
                running_mean.mul_(1 - momentum).add_(m * momentum)
            if running_var is not None:
                running_var.mul_(1 - momentum).add_(v * momentum)
    else:
        out = (input - running_mean.reshape(shape)) / (
            running_var.reshape(shape) + eps).sqrt()
    if weight is not None:
        out = out * weight.reshape(shape)
    if bias is not None:
        out = out + bias.reshape(shape)
    return out


def local_response_norm(input, size, alpha=1e-4, beta=0.75, k=1.0):
    from .functional import pad, avg_pool2d
    sq = (input * input).unsqueeze(1)
    if input.ndim == 3:
        sq = pad(sq, (0, 0, size // 2, (size - 1) // 2))
        div = avg_pool2d(sq, (size, 1), stride=1).squeeze(1)
    else:
        s = input.shape
        sq = sq.reshape(s[0], 1, s[1], s[2], -1)
        sq = pad(sq, (0, 0, 0, 0, size // 2, (size - 1) // 2))
        # average over the channel window: cumulative sums along dim 2
        cs = sq.cumsum(2)
        cs = _cat_zero(cs, 2)
        div = (cs.narrow(2, size, s[1]) - cs.narrow(2, 0, s[1])) / size
        div = div.squeeze(1).reshape(s)
    return input / (div * alpha + k) ** beta


def _cat_zero(t, dim):
    from .._creation import cat
    shape = list(t.shape)
    shape[dim] = 1
    return cat([t.new_zeros(shape), t], dim)


# ======================================================= distances ========

def cosine_similarity(x1, x2, dim=1, eps=1e-8):
    """x1 . x2 / max(||x1|| ||x2||, eps), along dim (broadcasting)."""
    w12 = (x1 * x2).sum(dim)
    n1 = (x1 * x1).sum(dim)
    n2 = (x2 * x2).sum(dim)
    # PyTorch clamps each squared norm product: sqrt(clamp(n1 * n2, eps^2))
    return w12 / (n1 * n2).clamp(min=eps * eps).sqrt()


def pairwise_distance(x1, x2, p=2.0, eps=1e-6, keepdim=False):
    d = x1 - x2 + eps
    if p == float("inf"):
        return d.abs().amax(-1, keepdim)
    if p == 0:
        return (d != 0).sum(-1, keepdim).to(x1.dtype)
    return d.norm(p, -1, keepdim)


def pdist(input, p=2.0):
    n = input.shape[0]
    i, j = np.triu_indices(n, 1)
    xp = input._xp()
    a = input[_wrap(xp.asarray(i))]
    b = input[_wrap(xp.asarray(j))]
    return (a - b).norm(p, -1)


# ====================================================== activations =======

# the piecewise activations are one node each with PyTorch's backward
# (dtorch/ops/activation.py): composed from clamp, their gradients at the kinks
# and under an infinite upstream gradient differed (tests/test_boundary_grads)

def hardswish(input, inplace=False):
    return N.Hardswish.apply(input)


def hardsigmoid(input, inplace=False):
    return N.Hardsigmoid.apply(input)


def glu(input, dim=-1):
    if input.shape[dim] % 2:
        raise RuntimeError(f"Halving dimension must be even, but dimension "
                           f"{dim % input.ndim} is size {input.shape[dim]}")
    a, b = input.chunk(2, dim)
    return a * b.sigmoid()


def prelu(input, weight):
    if weight.numel() != 1 and input.ndim >= 2:
        w = weight.reshape((1, -1) + (1,) * (input.ndim - 2))
    else:
        w = weight.reshape(()) if weight.numel() == 1 else weight
    return N.PRelu.apply(input, w)


def rrelu(input, lower=1.0 / 8, upper=1.0 / 3, training=False,
          inplace=False):
    if training:
        a = input.new_empty(input.shape).uniform_(lower, upper).detach()
        return N.PRelu.apply(input, a)
    return N.LeakyRelu.apply(input, slope=(lower + upper) / 2)


_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


def selu(input, inplace=False):
    from .functional import elu
    return _SELU_SCALE * elu(input, _SELU_ALPHA)


def celu(input, alpha=1.0, inplace=False):
    return N.Elu.apply(input, alpha=alpha, input_scale=1.0 / alpha)


def threshold(input, threshold, value, inplace=False):
    return N.Threshold.apply(input, threshold=threshold, value=value) \
        if isinstance(value, (int, float)) else \
        input.where(input > threshold, value)


def softsign(input):
    return input / (1 + input.abs())


def tanhshrink(input):
    return input - input.tanh()


def hardshrink(input, lambd=0.5):
    return N.Shrink.apply(input, lambd=lambd)


def softshrink(input, lambd=0.5):
    return N.Shrink.apply(input, lambd=lambd, soft=True)


def gumbel_softmax(logits, tau=1.0, hard=False, eps=1e-10, dim=-1):
    from .functional import softmax
    g = -logits.new_empty(logits.shape).exponential_().log()
    y = softmax((logits + g) / tau, dim)
    if not hard:
        return y
    idx = y.argmax(dim, keepdim=True)
    onehot = y.new_zeros(y.shape).scatter_(dim, idx, 1.0)
    return onehot - y.detach() + y     # straight-through


def alpha_dropout(input, p=0.5, training=False, inplace=False):
    if p < 0 or p > 1:
        raise ValueError(f"dropout probability has to be between 0 and 1, "
                         f"but got {p}")
    if not training or p == 0:
        return input
    if p == 1:
        return input * 0
    alpha_p = -_SELU_ALPHA * _SELU_SCALE
    a = ((1 - p) * (1 + p * alpha_p ** 2)) ** -0.5
    b = -a * alpha_p * p
    keep = (input.new_empty(input.shape).uniform_() >= p).to(input.dtype)
    return (input * keep + alpha_p * (1 - keep)) * a + b


def feature_alpha_dropout(input, p=0.5, training=False, inplace=False):
    if not training or p == 0:
        return input
    alpha_p = -_SELU_ALPHA * _SELU_SCALE
    a = ((1 - p) * (1 + p * alpha_p ** 2)) ** -0.5
    b = -a * alpha_p * p
    shape = tuple(input.shape[:2]) + (1,) * (input.ndim - 2)
    keep = (input.new_empty(shape).uniform_() >= p).to(input.dtype)
    return (input * keep + alpha_p * (1 - keep)) * a + b


def _inplace_of(name):
    def fn(input, *args, **kwargs):
        from . import functional as F
        out = getattr(F, name)(input, *args, **kwargs)
        return input.copy_(out) if not input.requires_grad else \
            input._rebase(lambda t: getattr(F, name)(t, *args, **kwargs))
    fn.__name__ = name + "_"
    return fn


silu_ = _inplace_of("silu")
relu_ = _inplace_of("relu")
elu_ = _inplace_of("elu")
leaky_relu_ = _inplace_of("leaky_relu")
hardtanh_ = _inplace_of("hardtanh")
threshold_ = _inplace_of("threshold")


# ============================================================ losses ======

def margin_ranking_loss(input1, input2, target, margin=0.0, size_average=None,
                        reduce=None, reduction="mean"):
    return _reduce((-target * (input1 - input2) + margin).clamp(min=0),
                   reduction)


def hinge_embedding_loss(input, target, margin=1.0, size_average=None,
                         reduce=None, reduction="mean"):
    pos = input.where(target == 1, input.new_zeros(()))
    neg = (margin - input).clamp(min=0).where(target == -1,
                                              input.new_zeros(()))
    return _reduce(pos + neg, reduction)


def soft_margin_loss(input, target, size_average=None, reduce=None,
                     reduction="mean"):
    return _reduce(N.SoftMargin.apply(input, target), reduction)


def cosine_embedding_loss(input1, input2, target, margin=0.0,
                          size_average=None, reduce=None, reduction="mean"):
    eps = float(np.float32(1e-12))      # PyTorch's EPSILON is a float
    prod = (input1 * input2).sum(-1)
    m1 = (input1 * input1).sum(-1) + eps
    m2 = (input2 * input2).sum(-1) + eps
    cos = prod / (m1 * m2).sqrt()
    zero = cos.new_zeros(())
    loss = (1 - cos).where(target == 1, zero) + \
        (cos - margin).clamp(min=0).where(target == -1, zero)
    return _reduce(loss, reduction)


def triplet_margin_loss(anchor, positive, negative, margin=1.0, p=2.0,
                        eps=1e-6, swap=False, size_average=None, reduce=None,
                        reduction="mean"):
    d_pos = pairwise_distance(anchor, positive, p, eps)
    d_neg = pairwise_distance(anchor, negative, p, eps)
    if swap:
        d_neg = d_neg.minimum(pairwise_distance(positive, negative, p, eps))
    return _reduce((d_pos - d_neg + margin).clamp(min=0), reduction)


def triplet_margin_with_distance_loss(anchor, positive, negative, *,
                                      distance_function=None, margin=1.0,
                                      swap=False, reduction="mean"):
    dist = distance_function or pairwise_distance
    d_pos = dist(anchor, positive)
    d_neg = dist(anchor, negative)
    if swap:
        d_neg = d_neg.minimum(dist(positive, negative))
    return _reduce((d_pos - d_neg + margin).clamp(min=0), reduction)


def poisson_nll_loss(input, target, log_input=True, full=False,
                     size_average=None, eps=1e-8, reduce=None,
                     reduction="mean"):
    if log_input:
        loss = input.exp() - target * input
    else:
        loss = input - target * (input + eps).log()
    if full:
        # Stirling's term for log(target!), only where target > 1; as in
        # PyTorch it is differentiable in target
        t = target
        stirling = t * t.log() - t + 0.5 * (2 * math.pi * t).log()
        loss = loss + stirling.masked_fill(t <= 1, 0)
    return _reduce(loss, reduction)


def gaussian_nll_loss(input, target, var, full=False, eps=1e-6,
                      reduction="mean"):
    if var.ndim == input.ndim - 1 or (var.shape[-1] == 1
                                      and input.shape[-1] != 1
                                      and var.ndim == input.ndim):
        if var.ndim == input.ndim - 1:
            var = var.unsqueeze(-1)
    if bool((var < 0).any()):
        raise ValueError("var has negative entry/entries")
    v = var.clamp(min=eps) if not var.requires_grad else \
        var + (var.clamp(min=eps) - var).detach()
    loss = 0.5 * (v.log() + (input - target) ** 2 / v)
    if full:
        loss = loss + 0.5 * math.log(2 * math.pi)
    return _reduce(loss, reduction)


def multilabel_soft_margin_loss(input, target, weight=None,
                                size_average=None, reduce=None,
                                reduction="mean"):
    from .functional import logsigmoid
    loss = -(target * logsigmoid(input) + (1 - target) * logsigmoid(-input))
    if weight is not None:
        loss = loss * weight
    loss = loss.mean(-1)
    return _reduce(loss, reduction)


def multi_margin_loss(input, target, p=1, margin=1.0, weight=None,
                      size_average=None, reduce=None, reduction="mean"):
    if p not in (1, 2):
        raise ValueError("only p == 1 and p == 2 supported")
    x = input if input.ndim == 2 else input.unsqueeze(0)
    loss = N.MultiMargin.apply(x, target.reshape(-1)._data,
                               None if weight is None else weight._data,
                               p=p, margin=margin)
    if input.ndim == 1:
        loss = loss.reshape(())
    return _reduce(loss, reduction)


def multilabel_margin_loss(input, target, size_average=None, reduce=None,
                           reduction="mean"):
    raise NotImplementedError("multilabel_margin_loss is not supported by "
                              "dtorch")


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
        from .functional import adaptive_avg_pool1d, adaptive_avg_pool2d
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


def _pair(v):
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
    from .functional import pad as _pad
    if input.ndim not in (3, 4):
        raise NotImplementedError("Input Error: Only 3D or 4D input Tensors "
                                  "are supported (got {}D)".format(input.ndim))
    batched = input.ndim == 4
    x = input if batched else input.unsqueeze(0)
    k, d, p, s = (_pair(v) for v in (kernel_size, dilation, padding, stride))
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
    k, d, p, s = (_pair(v) for v in (kernel_size, dilation, padding, stride))
    osz = _pair(output_size)
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


def adaptive_max_pool2d(input, output_size, return_indices=False):
    """Max over PyTorch's adaptive windows (start floor(i*H/oh), end
    ceil((i+1)*H/oh)); windows are gathered, one reduction."""
    x = input if input.ndim == 4 else input.unsqueeze(0)
    n, c, h, w = x.shape
    oh, ow = _pair(output_size)
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
    from .functional import avg_pool2d
    kw, kh = _pair(kernel_size)
    out = avg_pool2d(input ** norm_type, kernel_size, stride, 0, ceil_mode)
    return (out.sign() * out.abs().relu() * (kw * kh)) ** (1.0 / norm_type)


def lp_pool1d(input, norm_type, kernel_size, stride=None, ceil_mode=False):
    from .functional import avg_pool1d
    out = avg_pool1d(input ** norm_type, kernel_size, stride, 0, ceil_mode)
    return (out.sign() * out.abs().relu() * kernel_size) ** \
        (1.0 / norm_type)


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


# ========================================================= embedding bags ==

def embedding_bag(input, weight, offsets=None, max_norm=None, norm_type=2,
                  scale_grad_by_freq=False, mode="mean", sparse=False,
                  per_sample_weights=None, include_last_offset=False,
                  padding_idx=None):
    """Sum, mean or max of the embeddings of each bag: the rows of a 2-D
    ``input``, or the slices of a 1-D ``input`` that ``offsets`` start."""
    from .functional import embedding
    if mode not in ("sum", "mean", "max"):
        raise ValueError(f"mode has to be one of sum, mean or max, got "
                         f"{mode}")
    if per_sample_weights is not None and mode != "sum":
        raise NotImplementedError(
            f"embedding_bag: per_sample_weights was not None. "
            f"per_sample_weights is only supported for mode='sum' (got "
            f"mode='{mode}'). Please open a feature request on GitHub.")
    xp = input._xp()
    if input.ndim == 2:
        if offsets is not None:
            raise ValueError("if input is 2D, then offsets has to be None, "
                             "as input is treated is a mini-batch of fixed "
                             "length sequences.")
        nb, L = input.shape
        off = np.arange(nb) * L
        idx = input.reshape(-1)
        if per_sample_weights is not None:
            per_sample_weights = per_sample_weights.reshape(-1)
    elif input.ndim == 1:
        if offsets is None:
            raise ValueError("offsets has to be a 1D Tensor but got None")
        off = np.asarray(offsets.detach().cpu()._data, np.int64)
        if include_last_offset:
            off = off[:-1]
        idx = input
    else:
        raise ValueError(f"input has to be 1D or 2D Tensor, but got Tensor "
                         f"of dimension {input.ndim}")
    nb = len(off)
    n = idx.shape[0]
    seg = np.searchsorted(off, np.arange(n), side="right") - 1
    keep = np.ones(n, bool)
    if padding_idx is not None:
        pi = padding_idx % weight.shape[0]
        keep = np.asarray(idx.cpu()._data) != pi
    rows = embedding(idx, weight, None, max_norm, norm_type,
                     scale_grad_by_freq)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.unsqueeze(1)
    sel = np.flatnonzero(keep)
    seg_k = seg[sel]
    rows = rows.index_select(0, Tensor._wrap(xp.asarray(sel)))
    d = weight.shape[1]
    segt = Tensor._wrap(xp.asarray(seg_k.astype(np.int64)))
    if mode in ("sum", "mean"):
        out = rows.new_zeros((nb, d)).index_add(0, segt, rows)
        if mode == "mean":
            cnt = np.bincount(seg_k, minlength=nb).astype(np.float64)
            out = out / Tensor._wrap(xp.asarray(np.maximum(cnt, 1)[:, None]
                                                 .astype(out._data.dtype)))
        return out
    # max: place each bag's rows in a dense (bags, longest, D) block
    counts = np.bincount(seg_k, minlength=nb)
    L = max(int(counts.max()) if counts.size else 0, 1)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    pos = np.arange(seg_k.size) - starts[seg_k]
    dense = rows.new_full((nb * L, d), float("-inf")).index_copy(
        0, Tensor._wrap(xp.asarray((seg_k * L + pos).astype(np.int64))),
        rows)
    out = dense.reshape(nb, L, d).amax(1)
    empty = Tensor._wrap(xp.asarray((counts == 0)[:, None]))
    return out.masked_fill(empty, 0.0)


__all__ += ["embedding_bag"]


# ===================================================== 3-d conv and pooling ==
# Windows are gathered with one index_select over the flattened, padded
# volume (columns (N, C, K, L)); the convolution is one einsum over them.
# Gradients come from index_select's backward (a sorted segment sum).

def _triple(v, name):
    from .functional import _ntuple
    return _ntuple(v, 3, name)


def _window_index(sizes, k, s, d):
    """Flat positions (K, L) read by each kernel offset at each output
    position, in a volume of ``sizes`` (already padded)."""
    out = [(n - (dd * (kk - 1) + 1)) // ss + 1
           for n, kk, ss, dd in zip(sizes, k, s, d)]
    if any(o <= 0 for o in out):
        raise RuntimeError(f"Output size is too small (calculated output "
                           f"size {out} from input of padded size "
                           f"{list(sizes)})")
    strides = [sizes[1] * sizes[2], sizes[2], 1]
    koff = np.zeros(1, np.int64)
    opos = np.zeros(1, np.int64)
    for ax in range(3):
        koff = (koff[:, None] + (np.arange(k[ax]) * d[ax]
                                 * strides[ax])[None, :]).reshape(-1)
        opos = (opos[:, None] + (np.arange(out[ax]) * s[ax]
                                 * strides[ax])[None, :]).reshape(-1)
    return koff[:, None] + opos[None, :], out


def _columns(x, k, s, p, d, fill=0.0):
    from .functional import pad
    if any(p):
        x = pad(x, (p[2], p[2], p[1], p[1], p[0], p[0]), value=fill)
    n, c = x.shape[:2]
    idx, out = _window_index(tuple(x.shape[2:]), k, s, d)
    flat = x.reshape(n, c, -1)
    cols = flat.index_select(2, Tensor._wrap(x._xp().asarray(
        idx.reshape(-1))))
    return cols.reshape(n, c, idx.shape[0], idx.shape[1]), out


def conv3d(input, weight, bias=None, stride=1, padding=0, dilation=1,
           groups=1):
    """3-D convolution of (N, C, D, H, W) input (or unbatched (C, D, H,
    W)) with (O, C / groups, kD, kH, kW) weight."""
    batched = input.ndim == 5
    if input.ndim not in (4, 5):
        raise RuntimeError(f"Expected 4D (unbatched) or 5D (batched) input "
                           f"to conv3d, but got input of size: "
                           f"{list(input.shape)}")
    x = input if batched else input.unsqueeze(0)
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
    if x.shape[1] != cg * groups:
        raise RuntimeError(
            f"Given groups={groups}, weight of size {list(weight.shape)}, "
            f"expected input{list(x.shape)} to have {cg * groups} channels, "
            f"but got {x.shape[1]} channels instead")
    cols, out = _columns(x, k, s, p, d)
    n, _, kk, L = cols.shape
    cols = cols.reshape(n, groups, cg * kk, L)
    w = weight.reshape(groups, o // groups, cg * kk)
    from .._functions import einsum
    y = einsum("gok,ngkl->ngol", w, cols).reshape(n, o, *out)
    if bias is not None:
        y = y + bias.reshape(1, o, 1, 1, 1)
    return y if batched else y.squeeze(0)


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


__all__ += ["conv3d", "max_pool3d", "avg_pool3d"]


# =================================================================== CTC ==

def ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0,
             reduction="mean", zero_infinity=False):
    """Connectionist temporal classification loss of (T, N, C)
    log-probabilities (or unbatched (T, C)) against padded (N, S) or
    concatenated targets. 'mean' divides each sample's loss by its target
    length, then averages, as PyTorch."""
    from ..ops.ctc import CTCLoss

    def arr(v):
        if isinstance(v, Tensor):
            return np.asarray(v.detach().cpu()._data, np.int64).reshape(-1)
        return np.asarray(v, np.int64).reshape(-1)
    batched = log_probs.ndim == 3
    lp = log_probs if batched else log_probs.unsqueeze(1)
    T, n, _ = lp.shape
    il, tl = arr(input_lengths), arr(target_lengths)
    if il.size != n or tl.size != n:
        raise RuntimeError(f"input_lengths and target_lengths must have "
                           f"size {n} (the batch), got {il.size} and "
                           f"{tl.size}")
    if (il > T).any():
        raise RuntimeError(f"Expected input_lengths to have value at most "
                           f"{T}, but got value {int(il.max())}")
    t = arr(targets) if not isinstance(targets, Tensor) or \
        targets.ndim < 2 else None
    if t is not None and (targets.ndim if isinstance(targets, Tensor)
                          else np.ndim(targets)) <= 1 and batched:
        # concatenated targets -> padded rows
        L = int(tl.max()) if tl.size else 0
        pad = np.zeros((n, L), np.int64)
        starts = np.concatenate([[0], np.cumsum(tl)[:-1]])
        pos = np.arange(L)[None, :]
        take = pos < tl[:, None]
        src = (starts[:, None] + pos)[take]
        pad[take] = t[src]
        tgt = pad
    elif t is not None:
        tgt = t.reshape(1, -1)
    else:
        tgt = np.asarray(targets.detach().cpu()._data, np.int64)
    if tgt.shape[1] < (tl.max() if tl.size else 0):
        raise RuntimeError("target_lengths exceed the targets' length")
    loss = CTCLoss.apply(lp, targets=tgt, input_lengths=il,
                         target_lengths=tl, blank=blank,
                         zero_infinity=zero_infinity)
    if reduction == "none":
        return loss if batched else loss.squeeze(0)
    if reduction == "sum":
        return loss.sum()
    if reduction == "mean":
        den = Tensor._wrap(lp._xp().asarray(np.maximum(tl, 1).astype(
            lp._data.dtype)))
        return (loss / den).mean()
    raise ValueError(f"{reduction} is not a valid value for reduction")


__all__ += ["ctc_loss"]
