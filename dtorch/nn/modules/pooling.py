"""Pooling layers over the pooling primitives. Each family (max, average,
adaptive average) is one base holding the arguments and one forward; a
layer names its functional form ``_pool``, as PyTorch's _MaxPoolNd /
_AvgPoolNd bases do. The adaptive ones are one functional call each
(``_more._simple``)."""
from .module import Module
from .. import functional as F
from ._more import AdaptiveAvgPool1d, AdaptiveAvgPool2d  # noqa: F401


class _MaxPoolNd(Module):
    _pool = None

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1,
                 return_indices=False, ceil_mode=False):
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = stride if (stride is not None) else kernel_size
        self.padding = padding
        self.dilation = dilation
        self.return_indices = return_indices
        self.ceil_mode = ceil_mode

    def forward(self, input):
        return self._pool(input, self.kernel_size, self.stride,
                          self.padding, self.dilation, self.ceil_mode,
                          self.return_indices)

    def extra_repr(self):
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, dilation={self.dilation}, "
                f"ceil_mode={self.ceil_mode}")


class MaxPool1d(_MaxPoolNd):
    _pool = staticmethod(F.max_pool1d)


class MaxPool2d(_MaxPoolNd):
    """Max over kernel_size windows of (N, C, H, W) input.

    Example::

        m = nn.MaxPool2d(2)            # stride defaults to kernel_size
        out = m(dtorch.randn(1, 3, 8, 8))    # (1, 3, 4, 4)
    """
    _pool = staticmethod(F.max_pool2d)


class MaxPool3d(_MaxPoolNd):
    _pool = staticmethod(F.max_pool3d)


class _AvgPoolNd(Module):
    """AvgPool2d and AvgPool3d; AvgPool1d (no divisor_override, its
    arguments as 1-tuples, as PyTorch's) overrides __init__ and forward."""
    _pool = None

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False,
                 count_include_pad=True, divisor_override=None):
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = stride if (stride is not None) else kernel_size
        self.padding = padding
        self.ceil_mode = ceil_mode
        self.count_include_pad = count_include_pad
        self.divisor_override = divisor_override

    def forward(self, input):
        return self._pool(input, self.kernel_size, self.stride,
                          self.padding, self.ceil_mode,
                          self.count_include_pad, self.divisor_override)

    def extra_repr(self):
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}")


class AvgPool1d(_AvgPoolNd):
    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False,
                 count_include_pad=True):
        Module.__init__(self)
        self.kernel_size = F._ntuple(kernel_size, 1)
        self.stride = F._ntuple(stride if stride is not None
                                else kernel_size, 1)
        self.padding = F._ntuple(padding, 1)
        self.ceil_mode = ceil_mode
        self.count_include_pad = count_include_pad

    def forward(self, input):
        return F.avg_pool1d(input, self.kernel_size, self.stride,
                            self.padding, self.ceil_mode,
                            self.count_include_pad)


class AvgPool2d(_AvgPoolNd):
    _pool = staticmethod(F.avg_pool2d)


class AvgPool3d(_AvgPoolNd):
    _pool = staticmethod(F.avg_pool3d)
