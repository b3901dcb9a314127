"""Linear layers: Identity, Linear, Bilinear (PyTorch's init and repr)."""
import math

from .module import Module
from ..parameter import Parameter
from .. import functional as F
from .. import init
from ..._creation import empty


def _factory(device, dtype):
    return {"device": device, "dtype": dtype}


def _weight_and_bias(module, shape, bias, fk, bias_size=None):
    """``module.weight`` of ``shape`` and ``module.bias`` of
    ``bias_size`` (default: the weight's first dim) or a None bias,
    uninitialised: ``reset_parameters`` fills them."""
    module.weight = Parameter(empty(shape, **fk))
    if bias:
        module.bias = Parameter(empty(shape[0] if bias_size is None
                                      else bias_size, **fk))
    else:
        module.register_parameter("bias", None)


class Identity(Module):
    """Returns its input; arguments are accepted and ignored."""

    def __init__(self, *args, **kwargs):
        super().__init__()

    def forward(self, input):
        return input


class Linear(Module):
    """y = x A^T + b.

    Args:
        in_features: size of each input sample
        out_features: size of each output sample
        bias: if False, no additive bias. Default: True

    Shape:
        - Input: (*, in_features); Output: (*, out_features)

    Example::

        m = nn.Linear(20, 30)
        out = m(dtorch.randn(128, 20))    # (128, 30)
    """

    def __init__(self, in_features, out_features, bias=True, device=None,
                 dtype=None):
        super().__init__()
        fk = _factory(device, dtype)
        self.in_features = in_features
        self.out_features = out_features
        _weight_and_bias(self, (out_features, in_features), bias, fk)
        self.reset_parameters()

    def reset_parameters(self):
        init._linear_default_(self.weight, self.bias)

    def forward(self, input):
        return F.linear(input, self.weight, self.bias)

    def extra_repr(self):
        return (f"in_features={self.in_features}, "
                f"out_features={self.out_features}, "
                f"bias={self.bias is not None}")


class NonDynamicallyQuantizableLinear(Linear):
    """PyTorch's name for MultiheadAttention.out_proj's class (it lives in
    ``nn.modules.linear``, where scripts import it from)."""


class LazyLinear(Linear):
    def __init__(self, *args, **kwargs):
        raise NotImplementedError("lazy modules are not supported by dtorch")


class Bilinear(Module):
    """y = x1^T A x2 + b with A of shape (out, in1, in2)."""

    def __init__(self, in1_features, in2_features, out_features, bias=True,
                 device=None, dtype=None):
        super().__init__()
        fk = _factory(device, dtype)
        self.in1_features = in1_features
        self.in2_features = in2_features
        self.out_features = out_features
        _weight_and_bias(self, (out_features, in1_features, in2_features),
                         bias, fk)
        self.reset_parameters()

    def reset_parameters(self):
        bound = 1 / math.sqrt(self.weight.size(1))
        init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            init.uniform_(self.bias, -bound, bound)

    def forward(self, input1, input2):
        return F.bilinear(input1, input2, self.weight, self.bias)

    def extra_repr(self):
        return (f"in1_features={self.in1_features}, "
                f"in2_features={self.in2_features}, "
                f"out_features={self.out_features}, "
                f"bias={self.bias is not None}")
