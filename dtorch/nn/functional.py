"""``dtorch.nn.functional``: PyTorch's functional API.

Heavy ops call the fused ops of ``dtorch/ops`` (conv,
pooling, softmax, nll, norms, embedding, dropout, GELU), and so do the
activations and losses whose gradient a composition would get wrong at a
kink or under a mask (their own backward, PyTorch's formula); the rest is a
few lines of Tensor code. Argument names, defaults and error texts are
PyTorch's.
"""
import math
import warnings

import numpy as np

from .. import _backend as B
from .. import ops as P
from .. import ops as N
from ..tensor import Tensor
from ..autograd.grad_mode import no_grad


# ============================================================ helpers ==

def _ntuple(v, n, name="argument"):
    if isinstance(v, (tuple, list)):
        if len(v) == 1:
            return tuple(v) * n
        if len(v) != n:
            raise ValueError(f"{name} must be an int or a tuple of {n} ints, "
                             f"got {v}")
        return tuple(int(a) for a in v)
    return (int(v),) * n


def _pair(v, name="argument"):
    return _ntuple(v, 2, name)


def _reduce(loss, reduction):
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    if reduction == "none":
        return loss
    raise ValueError(f"{reduction} is not a valid value for reduction")


def _legacy_reduction(size_average, reduce, reduction):
    if size_average is None and reduce is None:
        return reduction
    size_average = True if size_average is None else size_average
    reduce = True if reduce is None else reduce
    if not reduce:
        return "none"
    return "mean" if size_average else "sum"


def _keep_mask(x, p, generator=None, shape=None):
    """A boolean array of ``shape`` (default x's), True with probability
    1 - p, on x's device."""
    from ..random import draw
    shape = x.shape if shape is None else shape
    # drawn on x's device, by its generator (float32 on a GPU)
    u = draw("random", size=shape, device=x.device, generator=generator)
    with B.device_guard(u):
        return u >= p


# ============================================================ linear ==

def linear(input, weight, bias=None):
    """y = input @ weight.T + bias, one fused node."""
    return P.Linear.apply(input, weight, bias)


def bilinear(input1, input2, weight, bias=None):
    """y_k = x1^T A_k x2 + b_k for weight (out, in1, in2)."""
    o, i1, i2 = weight.shape
    t = input1 @ weight.permute(1, 0, 2).reshape(i1, o * i2)
    t = t.reshape(*input1.shape[:-1], o, i2)
    out = (t * input2.unsqueeze(-2)).sum(-1)
    return out if bias is None else out + bias


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


def _check_conv_input(input, weight, groups, nd, name):
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
    return c


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1,
           groups=1):
    """2-D convolution over (N, C, H, W) or unbatched (C, H, W) input."""
    c = _check_conv_input(input, weight, groups, 2, "conv2d")
    unbatched = input.ndim == 3
    if unbatched:
        input = input.unsqueeze(0)
    if c != weight.shape[1] * groups:
        raise RuntimeError(
            f"Given groups={groups}, weight of size {list(weight.shape)}, "
            f"expected input{list(input.shape)} to have "
            f"{weight.shape[1] * groups} channels, but got {c} channels "
            f"instead")
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


def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1,
           groups=1):
    """1-D convolution over (N, C, L), run as a 2-D one with height 1."""
    _check_conv_input(input, weight, groups, 1, "conv1d")
    unbatched = input.ndim == 2
    if unbatched:
        input = input.unsqueeze(0)
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
    c = _check_conv_input(input, weight, groups, 2, "conv_transpose2d")
    unbatched = input.ndim == 3
    if unbatched:
        input = input.unsqueeze(0)
    if c != weight.shape[0]:
        raise RuntimeError(
            f"Given transposed=1, weight of size {list(weight.shape)}, "
            f"expected input{list(input.shape)} to have {weight.shape[0]} "
            f"channels, but got {c} channels instead")
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


def adaptive_avg_pool1d(input, output_size):
    o = _ntuple(output_size, 1)[0]
    return adaptive_avg_pool2d(input.unsqueeze(-2), (1, o)).squeeze(-2)


# ============================================================ activations ==

def relu(input, inplace=False):
    if inplace:
        return input.relu_()
    return input.relu()


def _inplace(input, fn):
    """``fn(input)`` written into input: PyTorch's in-place activations.
    Under autograd the input takes over the new graph node (a copy_ under
    no_grad would leave backward with the old one)."""
    if input._tracked():
        return input._rebase(fn)
    with no_grad():
        out = fn(input)
    input._data[...] = out._data
    input._vc[0] += 1
    return input


def relu6(input, inplace=False):
    return hardtanh(input, 0.0, 6.0, inplace)


def hardtanh(input, min_val=-1.0, max_val=1.0, inplace=False):
    """clamp, but with no gradient at the bounds themselves (PyTorch)."""
    if inplace:
        return _inplace(input, lambda t: hardtanh(t, min_val, max_val))
    return P.Hardtanh.apply(input, min=min_val, max=max_val)


def leaky_relu(input, negative_slope=0.01, inplace=False):
    if inplace:
        return _inplace(input, lambda t: leaky_relu(t, negative_slope))
    return N.LeakyRelu.apply(input, slope=negative_slope)


def elu(input, alpha=1.0, inplace=False):
    if inplace:
        return _inplace(input, lambda t: elu(t, alpha))
    return N.Elu.apply(input, alpha=alpha)


def gelu(input, approximate="none"):
    if approximate not in ("none", "tanh"):
        raise RuntimeError(f"approximate argument must be either none or "
                           f"tanh., got {approximate!r}")
    return N.Gelu.apply(input, approximate=approximate)


def silu(input, inplace=False):
    if inplace:
        return _inplace(input, silu)
    return N.Silu.apply(input)


def mish(input, inplace=False):
    if inplace:
        return _inplace(input, mish)
    return N.Mish.apply(input)


def sigmoid(input):
    return input.sigmoid()


def tanh(input):
    return input.tanh()


def softplus(input, beta=1.0, threshold=20.0):
    return N.Softplus.apply(input, beta=beta, threshold=threshold)


def logsigmoid(input):
    return N.LogSigmoid.apply(input)


def _softmax_dim(ndim):
    return 0 if ndim in (0, 1, 3) else 1


def softmax(input, dim=None, _stacklevel=3, dtype=None):
    if dim is None:
        dim = _softmax_dim(input.ndim)
    return input.softmax(dim, dtype=dtype)


def log_softmax(input, dim=None, _stacklevel=3, dtype=None):
    if dim is None:
        dim = _softmax_dim(input.ndim)
    return input.log_softmax(dim, dtype=dtype)


def softmin(input, dim=None, _stacklevel=3, dtype=None):
    return softmax(-input, dim, dtype=dtype)


# ========================================================= regularisation ==

def dropout(input, p=0.5, training=True, inplace=False):
    return _dropout(input, p, training, inplace, input.shape)


def _dropout(input, p, training, inplace, mask_shape):
    """Dropout with one keep/zero draw per element of ``mask_shape``
    (broadcast over the rest of ``input``)."""
    if p < 0.0 or p > 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, "
                         f"but got {p}")
    if not training or p == 0.0:
        return input
    if p == 1.0:
        out = input * 0.0
    else:
        keep = _keep_mask(input, p, shape=tuple(mask_shape))
        out = N.Dropout.apply(input, keep=keep, p=p)
    if inplace:
        with no_grad():
            input.copy_(out)
        return input
    return out


def _feature_dropout(input, p, training, inplace, batched=True):
    """One draw per (sample, channel): whole feature maps are zeroed. An
    unbatched input is treated as a batch of one."""
    if batched:
        return _dropout(input, p, training, inplace,
                        input.shape[:2] + (1,) * (input.dim() - 2))
    if p < 0.0 or p > 1.0 or not training or p == 0.0:
        return _dropout(input, p, training, inplace, input.shape)
    out = _feature_dropout(input.unsqueeze(0), p, True, False).squeeze(0)
    if inplace:
        with no_grad():
            input.copy_(out)
        return input
    return out


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


# ============================================================== embedding ==

@B.on_own_device
def embedding(input, weight, padding_idx=None, max_norm=None,
              norm_type=2.0, scale_grad_by_freq=False, sparse=False):
    idx = input._data if isinstance(input, Tensor) else np.asarray(input)
    if idx.dtype.kind not in "iu":
        raise RuntimeError(
            f"Expected tensor for argument #1 'indices' to have one of the "
            f"following scalar types: Long, Int; but got "
            f"{B.from_np(idx.dtype)} instead (while checking arguments for "
            f"embedding)")
    n = weight.shape[0]
    if idx.size:    # no host sync on a device (raised at the next one)
        B.check_or_defer(((idx < 0) | (idx >= n)).any(),
                         lambda: IndexError("index out of range in self"))
    if padding_idx is not None and padding_idx < 0:
        padding_idx += n
    if max_norm is not None:
        with no_grad():
            rows = weight._data[idx.reshape(-1)]
            norms = (np.abs(rows) ** norm_type).sum(-1) ** (1 / norm_type) \
                if B.get_array_module(rows) is np else \
                (abs(rows) ** norm_type).sum(-1) ** (1 / norm_type)
            scale = (max_norm / (norms + 1e-7)).clip(max=1.0)
            weight._data[idx.reshape(-1)] = rows * scale[:, None]
            weight._vc[0] += 1
    # sparse=True: the gradient is dense (dtorch has no sparse tensors);
    # optimizers treat it as they would the dense one
    return N.Embedding.apply(weight, idx, padding_idx=padding_idx,
                             scale_grad_by_freq=scale_grad_by_freq)


@B.on_own_device
def one_hot(tensor, num_classes=-1):
    a = tensor._data
    if a.dtype.kind not in "iu":
        raise RuntimeError("one_hot is only applicable to index tensor of "
                           "type LongTensor.")
    xp = tensor._xp()
    if num_classes == -1:
        num_classes = int(a.max()) + 1 if a.size else 0
    if a.size and (int(a.min()) < 0 or int(a.max()) >= num_classes):
        raise RuntimeError("Class values must be smaller than num_classes."
                           if a.min() >= 0 else
                           "Class values must be non-negative.")
    out = (a[..., None] == xp.arange(num_classes)).astype(np.int64)
    return Tensor._wrap(out)


# ========================================================= normalisation ==

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
                buf._vc[0] += 1
        return out
    if running_mean is None or running_var is None:
        raise RuntimeError("running_mean and running_var must be defined "
                           "in evaluation mode")
    shape = [1] * input.ndim
    shape[1] = input.shape[1]
    scale = (running_var + eps).rsqrt()
    if weight is not None:
        scale = scale * weight
    shift = -running_mean * scale
    if bias is not None:
        shift = shift + bias
    return input * scale.reshape(shape) + shift.reshape(shape)


def normalize(input, p=2.0, dim=1, eps=1e-12, out=None):
    return input / input.norm(p, dim, keepdim=True).clamp_min(eps)


# ================================================================ padding ==

def pad(input, pad, mode="constant", value=None):
    """Pad the last len(pad) // 2 dims; pad = (left, right, top, bottom, ...)
    starting from the last dim, as in PyTorch. Negative pads crop."""
    if len(pad) % 2:
        raise RuntimeError("Padding length must be divisible by 2")
    if len(pad) // 2 > input.ndim:
        raise RuntimeError("Padding length should be less than or equal to "
                           "two times the input dimension but got padding "
                           f"length {len(pad)} and input of dimension "
                           f"{input.ndim}")
    if mode not in ("constant", "reflect", "replicate", "circular"):
        raise NotImplementedError(f"Unrecognised padding mode {mode}")
    pads = [[0, 0] for _ in range(input.ndim)]
    for i in range(len(pad) // 2):
        pads[input.ndim - 1 - i] = [int(pad[2 * i]), int(pad[2 * i + 1])]
    if any(a < 0 for pr in pads for a in pr):
        key = tuple(slice(-lo if lo < 0 else 0, hi if hi < 0 else None)
                    for lo, hi in pads)
        input = input[key]
        pads = [[max(lo, 0), max(hi, 0)] for lo, hi in pads]
    return N.Pad.apply(input, pads=tuple(map(tuple, pads)), mode=mode,
                       value=0.0 if value is None else value)


# ================================================================= losses ==

def _check_same_size(input, target, name):
    if tuple(input.shape) != tuple(target.shape):
        import warnings
        warnings.warn(
            f"Using a target size ({target.shape}) that is different to the "
            f"input size ({input.shape}). This will likely lead to incorrect "
            f"results due to broadcasting. Please ensure they have the same "
            f"size.", stacklevel=3)


def mse_loss(input, target, size_average=None, reduce=None,
             reduction="mean", weight=None):
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_same_size(input, target, "mse_loss")
    d = input - target
    return _reduce(d * d, reduction)


def l1_loss(input, target, size_average=None, reduce=None,
            reduction="mean"):
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_same_size(input, target, "l1_loss")
    return _reduce((input - target).abs(), reduction)


def smooth_l1_loss(input, target, size_average=None, reduce=None,
                   reduction="mean", beta=1.0):
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_same_size(input, target, "smooth_l1_loss")
    if beta == 0:      # PyTorch runs l1_loss then
        return _reduce((input - target).abs(), reduction)
    return _reduce(N.SmoothL1.apply(input, target, beta=beta), reduction)


def huber_loss(input, target, reduction="mean", delta=1.0):
    return _reduce(N.Huber.apply(input, target, delta=delta), reduction)


@B.on_own_device   # direct CuPy checks: on input's device
def _check_targets(t, c, ignore_index):
    """Class indices must lie in [0, C) (ignore_index excepted)."""
    a = t._data
    if a.dtype.kind not in "iu":
        raise RuntimeError(
            f"expected scalar type Long but found {B.from_np(a.dtype)}")
    if not a.size:
        return
    bad = (a < 0) | (a >= c)
    if ignore_index is not None:
        bad &= a != ignore_index

    def error():
        v = int(a[bad].reshape(-1)[0])
        return IndexError(f"Target {v} is out of bounds: the input has {c} "
                          f"classes, so class indices must be in "
                          f"[0, {c - 1}]")
    # no host sync on a device (raised at the next one)
    B.check_or_defer(bad.any(), error)


def nll_loss(input, target, weight=None, size_average=None,
             ignore_index=-100, reduce=None, reduction="mean"):
    reduction = _legacy_reduction(size_average, reduce, reduction)
    return _nll(N.NllLoss, input, target, weight, ignore_index, reduction)


def _nll(op, input, target, weight, ignore_index, reduction):
    """nll_loss's checks, then ``op`` (NllLoss, or CrossEntropy on
    logits)."""
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(f"{reduction} is not a valid value for reduction")
    unbatched = input.ndim == 1
    if unbatched:
        input, target = input.unsqueeze(0), target.unsqueeze(0)
    if input.ndim < 2:
        raise ValueError(f"Expected 2 or more dimensions (got {input.ndim})")
    if input.shape[0] != target.shape[0] or \
            tuple(input.shape[2:]) != tuple(target.shape[1:]):
        raise ValueError(
            f"Expected input batch_size ({input.shape[0]}) to match target "
            f"batch_size ({target.shape[0]}).")
    c = input.shape[1]
    _check_targets(target, c, ignore_index)
    if weight is not None and tuple(weight.shape) != (c,):
        raise RuntimeError(
            f"weight tensor should be defined either for all {c} classes or "
            f"no classes but got weight tensor of shape: "
            f"{list(weight.shape)}")
    out = op.apply(input, target._data,
                   None if weight is None else weight._data,
                   ignore_index=ignore_index, reduction=reduction)
    return out.squeeze(0) if unbatched and reduction == "none" else out


@B.on_own_device   # direct CuPy code: on input's device
def cross_entropy(input, target, weight=None, size_average=None,
                  ignore_index=-100, reduce=None, reduction="mean",
                  label_smoothing=0.0):
    """log_softmax over dim 1 then nll; targets are class indices (N, ...)
    or class probabilities shaped like the input."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    if not 0.0 <= label_smoothing <= 1.0:
        raise RuntimeError(f"label_smoothing must be between 0.0 and 1.0. "
                           f"Got: {label_smoothing}")
    cdim = 0 if input.ndim == 1 else 1
    c = input.shape[cdim]
    if not target.is_floating_point() and label_smoothing <= 0:
        return _nll(N.CrossEntropy, input, target, weight, ignore_index,
                    reduction)
    logp = log_softmax(input, cdim)
    if target.is_floating_point():
        if tuple(target.shape) != tuple(input.shape):
            raise RuntimeError(
                f"Expected target size {list(input.shape)}, got "
                f"{list(target.shape)}")
        if label_smoothing > 0:
            target = target * (1 - label_smoothing) + label_smoothing / c
        prod = logp * target
        if weight is not None:
            shape = [1] * input.ndim
            shape[cdim] = c
            prod = prod * weight.reshape(shape)
        loss = -prod.sum(cdim)
        if reduction == "mean":
            n = max(input.numel() // c, 1) if input.ndim > 1 else 1
            return loss.sum() / n
        return _reduce(loss, reduction)
    nll = nll_loss(logp, target, weight, ignore_index=ignore_index,
                   reduction=reduction)
    if label_smoothing <= 0:
        return nll
    if weight is not None:
        shape = [1] * input.ndim
        shape[cdim] = c
        smooth = -(logp * weight.reshape(shape)).sum(cdim)
    else:
        smooth = -logp.sum(cdim)
    keep = target._data != ignore_index
    # masked_fill, not a product with the mask: an ignored row may hold
    # -inf log-probabilities, and inf * 0 is NaN
    smooth = P.Where.apply(keep, smooth, 0.0)
    if reduction == "none":
        red = smooth
    elif reduction == "sum":
        red = smooth.sum()
    elif weight is not None:
        t = target._data[keep]
        red = smooth.sum() / weight[Tensor._wrap(t)].sum()
    else:
        red = smooth.sum() / int(keep.sum())
    return nll * (1 - label_smoothing) + red * (label_smoothing / c)


@B.on_own_device   # direct CuPy checks: on input's device
def binary_cross_entropy(input, target, weight=None, size_average=None,
                         reduce=None, reduction="mean"):
    reduction = _legacy_reduction(size_average, reduce, reduction)
    if tuple(target.shape) != tuple(input.shape):
        raise ValueError(
            f"Using a target size ({target.shape}) that is different to the "
            f"input size ({input.shape}) is deprecated. Please ensure they "
            f"have the same size.")
    a = input._data
    # NaN is out of range too (PyTorch checks 0 <= x <= 1)
    # (no host sync on a device: raised at the next one)
    if a.size:
        B.check_or_defer(~((a >= 0) & (a <= 1)).all(), lambda: RuntimeError(
            "all elements of input should be between 0 and 1"))
    b = target._data
    if b.size:
        B.check_or_defer(~((b >= 0) & (b <= 1)).all(), lambda: RuntimeError(
            "all elements of target should be between 0 and 1"))
    if weight is not None and tuple(weight.shape) != tuple(input.shape):
        weight = weight.expand(input.shape)
    return _reduce(N.BinaryCrossEntropy.apply(input, target, weight),
                   reduction)


def binary_cross_entropy_with_logits(input, target, weight=None,
                                     size_average=None, reduce=None,
                                     reduction="mean", pos_weight=None):
    reduction = _legacy_reduction(size_average, reduce, reduction)
    if tuple(target.shape) != tuple(input.shape):
        raise ValueError(
            f"Target size ({target.shape}) must be the same as input size "
            f"({input.shape})")
    return _reduce(N.BinaryCrossEntropyWithLogits.apply(
        input, target, weight, pos_weight), reduction)


def kl_div(input, target, size_average=None, reduce=None, reduction="mean",
           log_target=False):
    reduction = _legacy_reduction(size_average, reduce, reduction)
    if log_target:
        loss = target.exp() * (target - input)
    else:
        # PyTorch's xlogy(t, t) - t * x: 0 where t == 0, NaN where t < 0,
        # and differentiable in the target too
        loss = P.XLogY.apply(target, target) - target * input
    if reduction == "batchmean":
        return loss.sum() / input.shape[0]
    return _reduce(loss, reduction)


# ============================================================== attention ==

def scaled_dot_product_attention(query, key, value, attn_mask=None,
                                 dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):
    """softmax(q k^T * scale + mask) v over the last two dims; a boolean
    mask marks the positions that may attend (True = keep)."""
    L, S = query.shape[-2], key.shape[-2]
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    att = (query @ key.transpose(-2, -1)) * scale
    xp = query._xp()
    if is_causal:
        keep = xp.tril(xp.ones((L, S), dtype=bool))
        att = att.masked_fill(Tensor._wrap(~keep), float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == B.bool_:
            att = att.masked_fill(attn_mask.logical_not(), float("-inf"))
        else:
            att = att + attn_mask
    # a fully masked row attends to nothing: 0, not NaN (PyTorch's
    # _safe_softmax)
    att = N.Softmax.apply(att, dim=att.ndim - 1, safe=True)
    if dropout_p > 0.0:
        att = dropout(att, dropout_p)
    return att @ value


def _mha_masks(attn_mask, key_padding_mask, bsz, heads, L, S, dtype):
    """One float mask (adds -inf where attention is not allowed), shaped to
    broadcast over (N * heads, L, S), or None."""
    mask = None
    if attn_mask is not None:
        if attn_mask.dtype == B.bool_:
            m = attn_mask._data
            mask = attn_mask._xp().where(m, -np.inf, 0.0).astype(dtype)
        else:
            mask = attn_mask._data.astype(dtype, copy=False)
        if mask.ndim == 2:
            mask = mask[None]
    if key_padding_mask is not None:
        k = key_padding_mask._data
        if k.dtype == np.bool_:
            k = key_padding_mask._xp().where(k, -np.inf, 0.0).astype(dtype)
        k = key_padding_mask._xp().broadcast_to(
            k.reshape(bsz, 1, 1, S), (bsz, heads, 1, S)).reshape(
                bsz * heads, 1, S)
        mask = k if mask is None else mask + k
    return mask


def multi_head_attention_forward(
        query, key, value, embed_dim_to_check, num_heads, in_proj_weight,
        in_proj_bias, bias_k, bias_v, add_zero_attn, dropout_p,
        out_proj_weight, out_proj_bias, training=True, key_padding_mask=None,
        need_weights=True, attn_mask=None, use_separate_proj_weight=False,
        q_proj_weight=None, k_proj_weight=None, v_proj_weight=None,
        static_k=None, static_v=None, average_attn_weights=True,
        is_causal=False):
    """PyTorch's multi-head attention on (L, N, E) inputs."""
    if bias_k is not None or add_zero_attn or static_k is not None:
        raise NotImplementedError(
            "multi_head_attention_forward: bias_k/bias_v, add_zero_attn and "
            "static_k/static_v are not supported")
    L, bsz, E = query.shape
    S = key.shape[0]
    if E != embed_dim_to_check:
        raise AssertionError(
            f"was expecting embedding dimension of {embed_dim_to_check}, "
            f"but got {E}")
    hd = E // num_heads
    if use_separate_proj_weight:
        bq = bk = bv = None
        if in_proj_bias is not None:
            bq, bk, bv = in_proj_bias.chunk(3)
        q = linear(query, q_proj_weight, bq)
        k = linear(key, k_proj_weight, bk)
        v = linear(value, v_proj_weight, bv)
    else:
        wq, wk, wv = in_proj_weight.chunk(3)
        bq = bk = bv = None
        if in_proj_bias is not None:
            bq, bk, bv = in_proj_bias.chunk(3)
        if query is key and key is value:
            q, k, v = linear(query, in_proj_weight, in_proj_bias).chunk(3, -1)
        else:
            q = linear(query, wq, bq)
            k = linear(key, wk, bk)
            v = linear(value, wv, bv)
    q = q.reshape(L, bsz * num_heads, hd).transpose(0, 1)
    k = k.reshape(S, bsz * num_heads, hd).transpose(0, 1)
    v = v.reshape(S, bsz * num_heads, hd).transpose(0, 1)
    att = (q @ k.transpose(1, 2)) * (1.0 / math.sqrt(hd))
    if is_causal and attn_mask is None:
        xp = query._xp()
        attn_mask = Tensor._wrap(~xp.tril(xp.ones((L, S), dtype=bool)))
    mask = _mha_masks(attn_mask, key_padding_mask, bsz, num_heads, L, S,
                      query._data.dtype)
    if mask is not None:
        att = att + Tensor._wrap(mask)
    att = softmax(att, -1)
    if dropout_p > 0.0 and training:
        att = dropout(att, dropout_p)
    out = (att @ v).transpose(0, 1).reshape(L, bsz, E)
    out = linear(out, out_proj_weight, out_proj_bias)
    if not need_weights:
        return out, None
    w = att.reshape(bsz, num_heads, L, S)
    if average_attn_weights:
        w = w.mean(1)
    return out, w


# group/instance norm, distances, more activations, losses, interpolate,
# fold/unfold, ... (issue 14)
from ._functional_more import *  # noqa: F401,F403,E402
