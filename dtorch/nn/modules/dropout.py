"""Dropout."""
from .module import Module
from .. import functional as F


class Dropout(Module):
    """Zero elements with probability p during training and scale the rest
    by 1 / (1 - p); identity in eval mode."""

    def __init__(self, p=0.5, inplace=False):
        super().__init__()
        if p < 0 or p > 1:
            raise ValueError(f"dropout probability has to be between 0 and "
                             f"1, but got {p}")
        self.p = p
        self.inplace = inplace

    def forward(self, input):
        return F.dropout(input, self.p, self.training, self.inplace)

    def extra_repr(self):
        return f"p={self.p}, inplace={self.inplace}"


class Dropout1d(Dropout):
    pass


class Dropout2d(Dropout):
    pass
