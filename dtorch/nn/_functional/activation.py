"""Non-linear activation functions (softmax family included) and their
in-place forms."""
import functools

from ... import _backend as B
from ... import ops as P
from ... import ops as N
from ...autograd.grad_mode import no_grad
from ...ops.base import dtype_name


# ============================================================ activations ==

def _float_kernel(kernel, ints=True, bools=True):
    """PyTorch's CPU kernel ``kernel`` of an activation has no integer
    (``ints``) or bool (``bools``) version: such an input raises its
    NotImplementedError instead of giving a float result silently."""
    def wrap(fn):
        @functools.wraps(fn)
        def op(input, *args, **kwargs):
            dt = input.dtype
            if not dt.is_floating_point and (
                    bools if dt is B.bool_ else ints):
                raise NotImplementedError(
                    f'"{kernel}" not implemented for '
                    f"'{dtype_name(input._data.dtype)}'")
            return fn(input, *args, **kwargs)
        return op
    return wrap


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
    input._bump_version()
    return input


def relu6(input, inplace=False):
    return hardtanh(input, 0.0, 6.0, inplace)


def hardtanh(input, min_val=-1.0, max_val=1.0, inplace=False):
    """clamp, but with no gradient at the bounds themselves (PyTorch)."""
    if input.dtype is B.bool_:
        raise RuntimeError("Bool inputs not supported for hardtanh")
    if inplace:
        return _inplace(input, lambda t: hardtanh(t, min_val, max_val))
    return P.Hardtanh.apply(input, min=min_val, max=max_val)


@_float_kernel("leaky_relu_cpu")
def leaky_relu(input, negative_slope=0.01, inplace=False):
    if inplace:
        return _inplace(input, lambda t: leaky_relu(t, negative_slope))
    return N.LeakyRelu.apply(input, slope=negative_slope)


@_float_kernel("elu_cpu")
def elu(input, alpha=1.0, inplace=False):
    if inplace:
        return _inplace(input, lambda t: elu(t, alpha))
    return N.Elu.apply(input, alpha=alpha)


@_float_kernel("GeluKernelImpl")
def gelu(input, approximate="none"):
    if approximate not in ("none", "tanh"):
        raise RuntimeError(f"approximate argument must be either none or "
                           f"tanh., got {approximate!r}")
    return N.Gelu.apply(input, approximate=approximate)


def _one_node(name, op, bools=True):
    """F.<name>(input, inplace=False) for an activation that is one op:
    PyTorch's float-only kernel check, and the in-place form written into
    input."""
    def fn(input, inplace=False):
        if inplace:
            return _inplace(input, fn)
        return op.apply(input)
    fn.__name__ = fn.__qualname__ = name
    return _float_kernel(f"{name}_cpu", bools=bools)(fn)


silu = _one_node("silu", N.Silu, bools=False)


mish = _one_node("mish", N.Mish)


def sigmoid(input):
    return input.sigmoid()


def tanh(input):
    return input.tanh()


@_float_kernel("softplus_cpu")
def softplus(input, beta=1.0, threshold=20.0):
    return N.Softplus.apply(input, beta=beta, threshold=threshold)


@_float_kernel("log_sigmoid_cpu", bools=False)
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


# ====================================================== activations =======

# the piecewise activations are one node each with PyTorch's backward
# (dtorch/ops/activation.py): composed from clamp, their gradients at the kinks
# and under an infinite upstream gradient differed
# (tests/core/test_boundary_grads.py)
hardswish = _one_node("hardswish", N.Hardswish)


hardsigmoid = _one_node("hardsigmoid", N.Hardsigmoid)


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
    if inplace:
        return _inplace(input, lambda t: rrelu(t, lower, upper, training))
    if training:
        a = input.new_empty(input.shape).uniform_(lower, upper).detach()
        return N.PRelu.apply(input, a)
    return N.LeakyRelu.apply(input, slope=(lower + upper) / 2)


_SELU_ALPHA = 1.6732632423543772848170429916717


_SELU_SCALE = 1.0507009873554804934193349852946


@_float_kernel("elu_cpu")
def selu(input, inplace=False):
    if inplace:
        return _inplace(input, selu)
    return _SELU_SCALE * elu(input, _SELU_ALPHA)


@_float_kernel("elu_cpu")
def celu(input, alpha=1.0, inplace=False):
    if inplace:
        return _inplace(input, lambda t: celu(t, alpha))
    return N.Elu.apply(input, alpha=alpha, input_scale=1.0 / alpha)


@_float_kernel("threshold_cpu", ints=False)
def threshold(input, threshold, value, inplace=False):
    if inplace:
        return _inplace(input, lambda t: _threshold(t, threshold, value))
    return _threshold(input, threshold, value)


def _threshold(input, th, value):
    # (PyTorch's parameter name `threshold` hides the function above)
    return N.Threshold.apply(input, threshold=th, value=value) \
        if isinstance(value, (int, float)) else input.where(input > th, value)


@_float_kernel("abs_cpu", ints=False)
def softsign(input):
    return input / (1 + input.abs())


def tanhshrink(input):
    return input - input.tanh()


@_float_kernel("hardshrink_cpu")
def hardshrink(input, lambd=0.5):
    return N.Shrink.apply(input, lambd=lambd)


@_float_kernel("softshrink_check")
def softshrink(input, lambd=0.5):
    return N.Shrink.apply(input, lambd=lambd, soft=True)


def gumbel_softmax(logits, tau=1.0, hard=False, eps=1e-10, dim=-1):
    g = -logits.new_empty(logits.shape).exponential_().log()
    y = softmax((logits + g) / tau, dim)
    if not hard:
        return y
    idx = y.argmax(dim, keepdim=True)
    onehot = y.new_zeros(y.shape).scatter_(dim, idx, 1.0)
    return onehot - y.detach() + y     # straight-through


def _inplace_of(f):
    def fn(input, *args, **kwargs):
        out = f(input, *args, **kwargs)
        return input.copy_(out) if not input.requires_grad else \
            input._rebase(lambda t: f(t, *args, **kwargs))
    fn.__name__ = f.__name__ + "_"
    return fn


silu_ = _inplace_of(silu)
relu_ = _inplace_of(relu)
elu_ = _inplace_of(elu)
leaky_relu_ = _inplace_of(leaky_relu)
hardtanh_ = _inplace_of(hardtanh)
threshold_ = _inplace_of(threshold)
