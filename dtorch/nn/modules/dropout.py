"""Dropout: element-wise, and channel-wise (whole feature maps)."""
from .module import Module
from .. import functional as F


class Dropout(Module):
    """Zero elements with probability p during training and scale the rest
    by 1 / (1 - p); identity in eval mode."""
    _fn = staticmethod(F.dropout)

    def __init__(self, p=0.5, inplace=False):
        super().__init__()
        if p < 0 or p > 1:
            raise ValueError(f"dropout probability has to be between 0 and "
                             f"1, but got {p}")
        self.p = p
        self.inplace = inplace

    def forward(self, input):
        return self._fn(input, self.p, self.training, self.inplace)

    def extra_repr(self):
        return f"p={self.p}, inplace={self.inplace}"


class Dropout1d(Dropout):
    """Zero whole channels of (N, C, L) or (C, L) input."""
    _fn = staticmethod(F.dropout1d)


class Dropout2d(Dropout):
    """Zero whole channels of (N, C, H, W) input."""
    _fn = staticmethod(F.dropout2d)


class Dropout3d(Dropout):
    """Zero whole channels of (N, C, D, H, W) or (C, D, H, W) input."""
    _fn = staticmethod(F.dropout3d)
