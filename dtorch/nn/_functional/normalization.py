"""Normalization functions: batch/layer/group/instance norm,
local_response_norm, normalize."""
import functools

from ... import _backend as B
from ... import ops as N
from ..._creation import _write_out, cat
from ...amp.autocast_mode import is_autocast_enabled
from ...tensor import Tensor
from .padding import pad
from .pooling import avg_pool2d


# ========================================================= normalisation ==

def _mixed_dtypes(fn):
    """PyTorch's CPU norms with parameters (weight, bias, running stats)
    of another dtype than the input: a float16/bfloat16 input with float32
    parameters runs in float32 and returns the input's dtype; any other
    mix raises PyTorch's error (no promotion)."""
    @functools.wraps(fn)
    def norm(input, *args, **kwargs):
        dts = {a.dtype for a in args + tuple(kwargs.values())
               if isinstance(a, Tensor)}
        if not dts or dts == {input.dtype} or (
                input.device.type == "cuda" and is_autocast_enabled("cuda")):
            # (CUDA autocast: the op's fp32 policy casts, as PyTorch's list)
            return fn(input, *args, **kwargs)
        if dts == {B.float32} and input.dtype in (B.float16, B.bfloat16):
            return fn(input.float(), *args, **kwargs).to(input.dtype)
        raise RuntimeError(
            "mixed dtype (CPU): all inputs must share same datatype.")
    return norm


@_mixed_dtypes
def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    ns = tuple(normalized_shape) if isinstance(normalized_shape,
                                               (tuple, list)) \
        else (int(normalized_shape),)
    if tuple(input.shape[input.ndim - len(ns):]) != ns or \
            input.ndim < len(ns):
        raise RuntimeError(
            f"Given normalized_shape={list(ns)}, expected input with shape "
            f"[*, {', '.join(map(str, ns))}], but got input of size"
            f"{list(input.shape)}")
    return N.LayerNorm.apply(input, weight, bias, nd=len(ns), eps=eps)


@_mixed_dtypes
def batch_norm(input, running_mean, running_var, weight=None, bias=None,
               training=False, momentum=0.1, eps=1e-5):
    if training:
        size = input.numel() // input.shape[1]
        if size == 1:
            raise ValueError(
                f"Expected more than 1 value per channel when training, got "
                f"input size {input.shape}")
        out = N.BatchNorm.apply(
            input, weight, bias, eps=eps,
            running_mean=None if running_mean is None else running_mean._data,
            running_var=None if running_var is None else running_var._data,
            momentum=momentum)
        for buf in (running_mean, running_var):
            if buf is not None:
                buf._bump_version()
        return out
    if running_mean is None or running_var is None:
        raise RuntimeError("running_mean and running_var must be defined "
                           "in evaluation mode")
    # per channel x * scale + shift: one node (N.ChannelAffine)
    scale = (running_var + eps).rsqrt()
    if weight is not None:
        scale = scale * weight
    shift = -running_mean * scale
    if bias is not None:
        shift = shift + bias
    if input.ndim < 2:
        return input * scale + shift
    return N.ChannelAffine.apply(input, scale, shift)


def normalize(input, p=2.0, dim=1, eps=1e-12, out=None):
    res = input / input.norm(p, dim, keepdim=True).clamp_min(eps)
    return _write_out(out, res, "normalize")


# ============================================================== norms =====

@_mixed_dtypes
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
    if weight is None and bias is None:
        return out
    return N.ChannelAffine.apply(out, weight, bias)


@_mixed_dtypes
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
    shape = list(t.shape)
    shape[dim] = 1
    return cat([t.new_zeros(shape), t], dim)
