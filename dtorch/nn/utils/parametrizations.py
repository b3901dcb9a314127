"""``nn.utils.parametrizations.weight_norm``: weight norm as a
parametrization (``parametrizations.weight.original0`` is g,
``original1`` is v), PyTorch's current form of ``weight_norm``."""
from ..modules.module import Module
from .parametrize import register_parametrization
from .weight_norm import _norm_except_dim

__all__ = ["weight_norm"]


class _WeightNorm(Module):
    def __init__(self, dim=0):
        super().__init__()
        self.dim = -1 if dim is None else dim

    def _norm(self, v):
        return _norm_except_dim(v, None if self.dim == -1 else self.dim)

    def forward(self, weight_g, weight_v):
        return weight_v * (weight_g / self._norm(weight_v))

    def right_inverse(self, weight):
        return self._norm(weight), weight


def weight_norm(module, name="weight", dim=0):
    register_parametrization(module, name, _WeightNorm(dim), unsafe=True)
    return module
