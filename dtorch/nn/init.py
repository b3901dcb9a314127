"""``dtorch.nn.init``: in-place initialisers with PyTorch's names, formulas
and defaults. Every function runs under ``no_grad`` and returns its tensor.
"""
import math
import warnings

import numpy as np

from .. import _backend as B
from ..autograd.grad_mode import no_grad


def calculate_gain(nonlinearity, param=None):
    """The recommended gain for a nonlinearity (PyTorch's table)."""
    linear_fns = ["linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d",
                  "conv_transpose2d", "conv_transpose3d"]
    if nonlinearity in linear_fns or nonlinearity == "sigmoid":
        return 1
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        if param is None:
            slope = 0.01
        elif not isinstance(param, bool) and isinstance(param, (int, float)):
            slope = param
        else:
            raise ValueError(f"negative_slope {param} not a valid number")
        return math.sqrt(2.0 / (1 + slope ** 2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"Unsupported nonlinearity {nonlinearity}")


def _calculate_fan_in_and_fan_out(tensor):
    if tensor.dim() < 2:
        raise ValueError("Fan in and fan out can not be computed for tensor "
                         "with fewer than 2 dimensions")
    fan_in = tensor.size(1)
    fan_out = tensor.size(0)
    receptive = 1
    for s in tensor.shape[2:]:
        receptive *= s
    return fan_in * receptive, fan_out * receptive


def _calculate_correct_fan(tensor, mode):
    mode = mode.lower()
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"Mode {mode} not supported, please use one of "
                         f"fan_in, fan_out")
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return fan_in if mode == "fan_in" else fan_out


@B.on_own_device
def _fill(tensor, values):
    """Write an array (made on tensor's device) into tensor's memory."""
    tensor._data[...] = tensor.device.send(values).astype(
        tensor._data.dtype)
    tensor._bump_version()
    return tensor


def uniform_(tensor, a=0.0, b=1.0, generator=None):
    with no_grad():
        return tensor.uniform_(a, b, generator=generator)


def normal_(tensor, mean=0.0, std=1.0, generator=None):
    with no_grad():
        return tensor.normal_(mean, std, generator=generator)


def trunc_normal_(tensor, mean=0.0, std=1.0, a=-2.0, b=2.0, generator=None):
    """Normal(mean, std) truncated to [a, b], by the inverse CDF of a
    uniform draw between the bounds' CDFs (PyTorch's method)."""
    from ..random import draw
    if mean < a - 2 * std or mean > b + 2 * std:
        warnings.warn("mean is more than 2 std from [a, b] in "
                      "nn.init.trunc_normal_. The distribution of values may "
                      "be incorrect.", stacklevel=2)

    def norm_cdf(x):
        return (1.0 + math.erf(x / math.sqrt(2.0))) / 2.0
    lo, hi = norm_cdf((a - mean) / std), norm_cdf((b - mean) / std)
    # drawn and transformed on the tensor's device
    u = draw("uniform", 2 * lo - 1, 2 * hi - 1, size=tuple(tensor.shape),
             device=tensor.device, generator=generator, dtype=np.float64)
    with B.device_guard(u):
        xp = B.get_array_module(u)
        if xp is np:
            v = _erfinv(u)
        else:
            from cupyx.scipy.special import erfinv
            v = erfinv(u)
        v = xp.clip(v * (std * math.sqrt(2.0)) + mean, a, b)
    with no_grad():
        return _fill(tensor, v)


def _erfinv(y):
    try:
        from scipy.special import erfinv
        return erfinv(y)
    except ImportError:  # Giles' approximation, refined by Newton steps
        w = -np.log((1.0 - y) * (1.0 + y))
        x = np.where(w < 5, _giles_small(w - 2.5), _giles_big(np.sqrt(w) - 3))
        x = x * y
        erf = np.vectorize(math.erf)
        for _ in range(2):
            x -= (erf(x) - y) / (2 / math.sqrt(math.pi) * np.exp(-x * x))
        return x


def _giles_small(w):
    p = 2.81022636e-08
    for c in (3.43273939e-07, -3.5233877e-06, -4.39150654e-06,
              0.00021858087, -0.00125372503, -0.00417768164, 0.246640727,
              1.50140941):
        p = c + p * w
    return p


def _giles_big(w):
    p = -0.000200214257
    for c in (0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
              -0.0076224613, 0.00943887047, 1.00167406, 2.83297682):
        p = c + p * w
    return p


def constant_(tensor, val):
    with no_grad():
        return tensor.fill_(val)


def ones_(tensor):
    return constant_(tensor, 1.0)


def zeros_(tensor):
    with no_grad():
        return tensor.zero_()


def eye_(tensor):
    if tensor.ndim != 2:
        raise ValueError("Only tensors with 2 dimensions are supported")
    with no_grad():
        return _fill(tensor, np.eye(*tensor.shape))


def dirac_(tensor, groups=1):
    d = tensor.ndim
    if d not in (3, 4, 5):
        raise ValueError("Only tensors with 3, 4, or 5 dimensions are "
                         "supported")
    out_g = tensor.shape[0] // groups
    m = min(out_g, tensor.shape[1])
    a = np.zeros(tuple(tensor.shape))
    centre = tuple(s // 2 for s in tensor.shape[2:])
    for g in range(groups):
        for i in range(m):
            a[(g * out_g + i, i) + centre] = 1
    with no_grad():
        return _fill(tensor, a)


def xavier_uniform_(tensor, gain=1.0, generator=None):
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    std = gain * math.sqrt(2.0 / float(fan_in + fan_out))
    a = math.sqrt(3.0) * std
    return uniform_(tensor, -a, a, generator)


def xavier_normal_(tensor, gain=1.0, generator=None):
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    std = gain * math.sqrt(2.0 / float(fan_in + fan_out))
    return normal_(tensor, 0.0, std, generator)


def _kaiming_std(tensor, a, mode, nonlinearity):
    """He et al.'s standard deviation, gain / sqrt(fan); None (with
    PyTorch's warning) for a zero-element tensor."""
    if 0 in tensor.shape:
        warnings.warn("Initializing zero-element tensors is a no-op")
        return None
    fan = _calculate_correct_fan(tensor, mode)
    return calculate_gain(nonlinearity, a) / math.sqrt(fan)


def kaiming_uniform_(tensor, a=0, mode="fan_in", nonlinearity="leaky_relu",
                     generator=None):
    std = _kaiming_std(tensor, a, mode, nonlinearity)
    if std is None:
        return tensor
    bound = math.sqrt(3.0) * std      # PyTorch's rounding: sqrt(3) * std
    return uniform_(tensor, -bound, bound, generator)


def kaiming_normal_(tensor, a=0, mode="fan_in", nonlinearity="leaky_relu",
                    generator=None):
    std = _kaiming_std(tensor, a, mode, nonlinearity)
    if std is None:
        return tensor
    return normal_(tensor, 0.0, std, generator)


def orthogonal_(tensor, gain=1, generator=None):
    """A (semi-)orthogonal matrix from the QR of a Gaussian one, signs
    fixed so the distribution is uniform (PyTorch's method)."""
    from ..random import draw
    if tensor.ndim < 2:
        raise ValueError("Only tensors with 2 or more dimensions are "
                         "supported")
    if tensor.numel() == 0:
        return tensor
    rows = tensor.shape[0]
    cols = tensor.numel() // rows
    # drawn and factorised on the tensor's device
    flat = draw("normal", 0.0, 1.0, size=(rows, cols), device=tensor.device,
                generator=generator, dtype=np.float64)
    with B.device_guard(flat):
        xp = B.get_array_module(flat)
        if rows < cols:
            flat = flat.T
        q, r = xp.linalg.qr(flat)
        q *= xp.sign(xp.diag(r))
        if rows < cols:
            q = q.T
        q = (gain * q).reshape(tuple(tensor.shape))
    with no_grad():
        return _fill(tensor, q)


def sparse_(tensor, sparsity, std=0.01, generator=None):
    from ..random import draw
    if tensor.ndim != 2:
        raise ValueError("Only tensors with 2 dimensions are supported")
    rows, cols = tensor.shape
    dev = tensor.device     # drawn on the tensor's device
    a = draw("normal", 0, std, size=(rows, cols), device=dev,
             generator=generator, dtype=np.float64)
    nz = int(math.ceil(sparsity * rows))
    with B.device_guard(a):
        for c in range(cols):
            a[draw("permutation", rows, device=dev,
                   generator=generator)[:nz], c] = 0
    with no_grad():
        return _fill(tensor, a)


# the deprecated names without the trailing underscore
def _deprecated(fn):
    def wrapper(*args, **kwargs):
        warnings.warn(f"nn.init.{fn.__name__[:-1]} is now deprecated in "
                      f"favor of nn.init.{fn.__name__}.", FutureWarning,
                      stacklevel=2)
        return fn(*args, **kwargs)
    return wrapper


uniform = _deprecated(uniform_)
normal = _deprecated(normal_)
constant = _deprecated(constant_)
xavier_uniform = _deprecated(xavier_uniform_)
xavier_normal = _deprecated(xavier_normal_)
kaiming_uniform = _deprecated(kaiming_uniform_)
kaiming_normal = _deprecated(kaiming_normal_)
orthogonal = _deprecated(orthogonal_)


def _linear_default_(weight, bias):
    """PyTorch's default initialisation of Linear and Conv layers:
    kaiming_uniform_(a=sqrt(5)), i.e. U(-1/sqrt(fan_in), 1/sqrt(fan_in)),
    for the weight, and the same bound for the bias."""
    kaiming_uniform_(weight, a=math.sqrt(5))
    if bias is not None:
        fan_in, _ = _calculate_fan_in_and_fan_out(weight)
        bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
        uniform_(bias, -bound, bound)
