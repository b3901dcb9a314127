"""InstanceNorm1d/2d/3d: each channel of each sample normalised over its
positions; optional affine and running statistics, as in PyTorch."""
import warnings

from .. import functional as F
from .normalization import _NormBase


class _InstanceNorm(_NormBase):
    _nd = 2

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=False,
                 track_running_stats=False, device=None, dtype=None):
        super().__init__(num_features, eps, momentum, affine,
                         track_running_stats, device, dtype)

    def forward(self, input):
        nd = input.dim()
        if nd not in (self._nd + 1, self._nd + 2):
            raise ValueError(f"expected {self._nd + 1}D or {self._nd + 2}D "
                             f"input (got {nd}D input)")
        batched = nd == self._nd + 2
        x = input if batched else input.unsqueeze(0)
        if x.shape[1] != self.num_features and self.affine:
            raise ValueError(
                f"expected input's size at dim=1 to match num_features "
                f"({self.num_features}), but got: {x.shape[1]}.")
        if x.shape[1] != self.num_features and not self.affine:
            warnings.warn(
                f"input's size at dim=1 does not match num_features. You can "
                f"silence this warning by not passing in num_features, "
                f"which is not used because affine=False", stacklevel=2)
        out = F.instance_norm(
            x, self.running_mean, self.running_var, self.weight, self.bias,
            self.training or not self.track_running_stats, self.momentum
            if self.momentum is not None else 0.1, self.eps)
        return out if batched else out.squeeze(0)


class InstanceNorm1d(_InstanceNorm):
    _nd = 1


class InstanceNorm2d(_InstanceNorm):
    _nd = 2


class InstanceNorm3d(_InstanceNorm):
    _nd = 3
