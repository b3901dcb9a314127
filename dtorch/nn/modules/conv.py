"""Convolutions: Conv1d, Conv2d, ConvTranspose1d, ConvTranspose2d, over the
im2col ops of ``dtorch/ops/conv.py``."""

from .module import Module
from .. import functional as F
from .. import init
from .linear import _weight_and_bias


class _ConvNd(Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride,
                 padding, dilation, transposed, output_padding, groups, bias,
                 padding_mode, n, device=None, dtype=None):
        super().__init__()
        if groups <= 0:
            raise ValueError("groups must be a positive integer")
        if in_channels % groups != 0:
            raise ValueError("in_channels must be divisible by groups")
        if out_channels % groups != 0:
            raise ValueError("out_channels must be divisible by groups")
        valid = {"zeros", "reflect", "replicate", "circular"}
        if padding_mode not in valid:
            raise ValueError(f"padding_mode must be one of {valid}, but got "
                             f"padding_mode='{padding_mode}'")
        k = F._ntuple(kernel_size, n, "kernel_size")
        stride = F._ntuple(stride, n, "stride")
        dilation = F._ntuple(dilation, n, "dilation")
        if isinstance(padding, str):
            if padding not in ("same", "valid"):
                raise ValueError(f"Invalid padding string {padding!r}, "
                                 f"should be one of {{'valid', 'same'}}")
            if padding == "same" and any(s != 1 for s in stride):
                raise ValueError("padding='same' is not supported for "
                                 "strided convolutions")
        else:
            padding = F._ntuple(padding, n, "padding")
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = k
        self.stride = stride
        self.padding = padding
        self.dilation = dilation
        self.transposed = transposed
        self.output_padding = F._ntuple(output_padding, n)
        self.groups = groups
        self.padding_mode = padding_mode
        fk = {"device": device, "dtype": dtype}
        if transposed:
            shape = (in_channels, out_channels // groups) + k
        else:
            shape = (out_channels, in_channels // groups) + k
        _weight_and_bias(self, shape, bias, fk, out_channels)
        self.reset_parameters()

    def reset_parameters(self):
        init._linear_default_(self.weight, self.bias)

    def _mode_pad(self, input):
        """Non-zero padding modes pad explicitly, then convolve unpadded."""
        if isinstance(self.padding, str):
            total = [d * (k - 1) for d, k in zip(self.dilation,
                                                 self.kernel_size)]
            pairs = [(t // 2, t - t // 2) for t in total]
        else:
            pairs = [(p, p) for p in self.padding]
        flat = []
        for lo, hi in reversed(pairs):
            flat += [lo, hi]
        return F.pad(input, flat, mode=self.padding_mode)

    def extra_repr(self):
        s = ("{in_channels}, {out_channels}, kernel_size={kernel_size}"
             ", stride={stride}")
        n = len(self.kernel_size)
        if self.padding != (0,) * n:
            s += ", padding={padding}"
        if self.dilation != (1,) * n:
            s += ", dilation={dilation}"
        if self.output_padding != (0,) * n:
            s += ", output_padding={output_padding}"
        if self.groups != 1:
            s += ", groups={groups}"
        if self.bias is None:
            s += ", bias=False"
        if self.padding_mode != "zeros":
            s += ", padding_mode={padding_mode}"
        return s.format(**self.__dict__)


class _Conv(_ConvNd):
    """Conv1d, Conv2d, Conv3d: one signature and one forward; each names
    its number of spatial dims ``_n`` and its functional form ``_conv``."""
    _n = _conv = None

    def __init__(self, in_channels, out_channels, kernel_size, stride=1,
                 padding=0, dilation=1, groups=1, bias=True,
                 padding_mode="zeros", device=None, dtype=None):
        super().__init__(in_channels, out_channels, kernel_size, stride,
                         padding, dilation, False, 0, groups, bias,
                         padding_mode, self._n, device, dtype)

    def forward(self, input):
        if self.padding_mode != "zeros":
            return self._conv(self._mode_pad(input), self.weight, self.bias,
                              self.stride, 0, self.dilation, self.groups)
        return self._conv(input, self.weight, self.bias, self.stride,
                          self.padding, self.dilation, self.groups)


class Conv1d(_Conv):
    """1-D convolution over (N, C_in, L) input (or unbatched (C_in, L))."""
    _n, _conv = 1, staticmethod(F.conv1d)


class Conv2d(_Conv):
    """2-D convolution over (N, C_in, H, W) input (or unbatched (C_in, H,
    W)); stride, padding (int, tuple, 'same', 'valid'), dilation, groups.

    Example::

        m = nn.Conv2d(16, 33, 3, stride=2)
        out = m(dtorch.randn(20, 16, 50, 100))
    """
    _n, _conv = 2, staticmethod(F.conv2d)


def _output_padding(m, input, output_size):
    """The output_padding that makes transposed convolution ``m`` produce
    ``output_size`` (PyTorch's forward(input, output_size)); None: the
    module's own."""
    if output_size is None:
        return m.output_padding
    n = len(m.kernel_size)
    output_size = list(output_size)[-n:]
    out = []
    for d in range(n):
        size = input.shape[d - n]
        base = ((size - 1) * m.stride[d] - 2 * m.padding[d]
                + m.dilation[d] * (m.kernel_size[d] - 1) + 1)
        extra = output_size[d] - base
        if not 0 <= extra < max(m.stride[d], m.dilation[d]):
            raise ValueError(
                f"requested an output size of {output_size}, but valid "
                f"sizes range from {base} to "
                f"{base + max(m.stride[d], m.dilation[d]) - 1} "
                f"(for an input of {list(input.shape[-n:])})")
        out.append(extra)
    return tuple(out)


class _ConvTranspose(_ConvNd):
    """ConvTranspose1d and ConvTranspose2d: one signature and one forward
    (``_n`` spatial dims, functional form ``_conv``); zero padding only,
    as PyTorch's."""
    _n = _conv = None

    def __init__(self, in_channels, out_channels, kernel_size, stride=1,
                 padding=0, output_padding=0, groups=1, bias=True,
                 dilation=1, padding_mode="zeros", device=None, dtype=None):
        if padding_mode != "zeros":
            raise ValueError(f'Only "zeros" padding mode is supported for '
                             f'{type(self).__name__}')
        super().__init__(in_channels, out_channels, kernel_size, stride,
                         padding, dilation, True, output_padding, groups,
                         bias, padding_mode, self._n, device, dtype)

    def forward(self, input, output_size=None):
        op = _output_padding(self, input, output_size)
        return self._conv(input, self.weight, self.bias, self.stride,
                          self.padding, op, self.groups, self.dilation)


class ConvTranspose1d(_ConvTranspose):
    _n, _conv = 1, staticmethod(F.conv_transpose1d)


class ConvTranspose2d(_ConvTranspose):
    """Transposed 2-D convolution; weight (C_in, C_out/groups, kH, kW)."""
    _n, _conv = 2, staticmethod(F.conv_transpose2d)


class Conv3d(_Conv):
    """3-D convolution over (N, C_in, D, H, W) input (windows gathered,
    one einsum; see F.conv3d)."""
    _n, _conv = 3, staticmethod(F.conv3d)
