"""Dropout functions: dropout, dropout1d/2d/3d, alpha dropouts."""
import warnings

from ... import ops as N
from ._common import _keep_mask
from .activation import _SELU_ALPHA, _SELU_SCALE, _inplace


# ========================================================= regularisation ==

def dropout(input, p=0.5, training=True, inplace=False):
    return _dropout(input, p, training, inplace, input.shape)


def _check_p(p):
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, "
                         f"but got {p}")


def _dropout(input, p, training, inplace, mask_shape):
    """Dropout with one keep/zero draw per element of ``mask_shape``
    (broadcast over the rest of ``input``)."""
    _check_p(p)
    if not training or p == 0.0:
        return input
    if inplace:
        # through _inplace, so backward sees the mask (a copy_ under no_grad
        # left the input's old graph node: gradients as if no dropout)
        return _inplace(input,
                        lambda t: _dropout(t, p, True, False, mask_shape))
    if p == 1.0:
        return input * 0.0
    keep = _keep_mask(input, p, shape=tuple(mask_shape))
    return N.Dropout.apply(input, keep=keep, p=p)


def _feature_dropout(input, p, training, inplace, batched=True):
    """One draw per (sample, channel): whole feature maps are zeroed. An
    unbatched input is treated as a batch of one."""
    if batched:
        return _dropout(input, p, training, inplace,
                        input.shape[:2] + (1,) * (input.dim() - 2))
    if p < 0.0 or p > 1.0 or not training or p == 0.0:
        return _dropout(input, p, training, inplace, input.shape)
    if inplace:
        return _inplace(input,
                        lambda t: _feature_dropout(t, p, True, False, False))
    return _feature_dropout(input.unsqueeze(0), p, True, False).squeeze(0)


def dropout1d(input, p=0.5, training=True, inplace=False):
    """Zero whole channels of (N, C, L) or (C, L) input."""
    nd = input.dim()
    if nd not in (2, 3):
        raise RuntimeError(
            f"dropout1d: Expected 2D or 3D input, but received a {nd}D "
            f"input. Note that dropout1d exists to provide channel-wise "
            f"dropout on inputs with 1 spatial dimension, a channel "
            f"dimension, and an optional batch dimension (i.e. 2D or 3D "
            f"inputs).")
    return _feature_dropout(input, p, training, inplace, batched=nd == 3)


def _warn_feature_dims(name, nd, dims):
    if nd not in dims:
        warnings.warn(
            f"{name}: Received a {nd}-D input to {name}, which is "
            f"deprecated and will result in an error in a future release. "
            f"To retain the behavior and silence this warning, please use "
            f"dropout instead.", stacklevel=3)


def dropout2d(input, p=0.5, training=True, inplace=False):
    """Zero whole channels of (N, C, H, W) input. As in PyTorch, a 3-D
    input is taken as (N, C, L), with a warning."""
    nd = input.dim()
    _warn_feature_dims("dropout2d", nd, (3, 4))
    if nd == 3:
        warnings.warn(
            "dropout2d: Received a 3D input to dropout2d and assuming that "
            "channel-wise 1D dropout behavior is desired - input is "
            "interpreted as shape (N, C, L), where C is the channel dim.",
            stacklevel=2)
    return _feature_dropout(input, p, training, inplace, batched=nd >= 2)


def dropout3d(input, p=0.5, training=True, inplace=False):
    """Zero whole channels of (N, C, D, H, W) or (C, D, H, W) input."""
    nd = input.dim()
    _warn_feature_dims("dropout3d", nd, (4, 5))
    return _feature_dropout(input, p, training, inplace, batched=nd != 4)


def alpha_dropout(input, p=0.5, training=False, inplace=False):
    _check_p(p)
    if not training or p == 0:
        return input
    if inplace:
        return _inplace(input, lambda t: alpha_dropout(t, p, True))
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
    if inplace:
        return _inplace(input, lambda t: feature_alpha_dropout(t, p, True))
    alpha_p = -_SELU_ALPHA * _SELU_SCALE
    a = ((1 - p) * (1 + p * alpha_p ** 2)) ** -0.5
    b = -a * alpha_p * p
    shape = tuple(input.shape[:2]) + (1,) * (input.ndim - 2)
    keep = (input.new_empty(shape).uniform_() >= p).to(input.dtype)
    return (input * keep + alpha_p * (1 - keep)) * a + b
