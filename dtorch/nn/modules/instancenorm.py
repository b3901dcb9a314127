"""InstanceNorm1d/2d/3d: each channel of each sample normalised over its
positions; optional affine and running statistics, as in PyTorch."""
import warnings

from .module import Module
from ..parameter import Parameter
from .. import functional as F
from .. import init
from ..._creation import empty, zeros, ones, tensor
from ... import _backend as B


class _InstanceNorm(Module):
    _nd = 2

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=False,
                 track_running_stats=False, device=None, dtype=None):
        super().__init__()
        fk = {"device": device, "dtype": dtype}
        self.num_features = num_features
        self.eps = eps
        self.momentum = momentum
        self.affine = affine
        self.track_running_stats = track_running_stats
        if affine:
            self.weight = Parameter(empty(num_features, **fk))
            self.bias = Parameter(empty(num_features, **fk))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        if track_running_stats:
            self.register_buffer("running_mean", zeros(num_features, **fk))
            self.register_buffer("running_var", ones(num_features, **fk))
            self.register_buffer("num_batches_tracked",
                                 tensor(0, dtype=B.int64, device=device))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)
        if affine:
            init.ones_(self.weight)
            init.zeros_(self.bias)

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

    def extra_repr(self):
        return (f"{self.num_features}, eps={self.eps}, "
                f"momentum={self.momentum}, affine={self.affine}, "
                f"track_running_stats={self.track_running_stats}")


class InstanceNorm1d(_InstanceNorm):
    _nd = 1


class InstanceNorm2d(_InstanceNorm):
    _nd = 2


class InstanceNorm3d(_InstanceNorm):
    _nd = 3
