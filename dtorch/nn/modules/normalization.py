"""LayerNorm, BatchNorm1d/2d (running statistics, momentum, eval mode)."""
from .module import Module
from .. import functional as F
from .. import init
from ..._creation import zeros, ones, tensor
from ... import _backend as B
from .linear import _weight_and_bias


def _affine(module, affine, shape, fk, bias=True):
    """A norm layer's elementwise ``weight`` and ``bias`` of ``shape``
    (uninitialised: reset_parameters fills them), or None ones without
    ``affine`` (a None bias alone with ``bias=False``)."""
    if affine:
        _weight_and_bias(module, shape, bias, fk, shape)
    else:
        module.register_parameter("weight", None)
        module.register_parameter("bias", None)


class LayerNorm(Module):
    """Normalise over the trailing ``normalized_shape`` dims, then scale and
    shift elementwise (weight ones, bias zeros)."""

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True,
                 bias=True, device=None, dtype=None):
        super().__init__()
        if isinstance(normalized_shape, int):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        fk = {"device": device, "dtype": dtype}
        _affine(self, elementwise_affine, self.normalized_shape, fk, bias)
        self.reset_parameters()

    def reset_parameters(self):
        if self.elementwise_affine:
            init.ones_(self.weight)
            if self.bias is not None:
                init.zeros_(self.bias)

    def forward(self, input):
        return F.layer_norm(input, self.normalized_shape, self.weight,
                            self.bias, self.eps)

    def extra_repr(self):
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}")


class _NormBase(Module):
    """Per-channel affine parameters and running statistics shared by batch
    and instance norm (PyTorch's ``_NormBase``)."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, device=None, dtype=None):
        super().__init__()
        fk = {"device": device, "dtype": dtype}
        self.num_features = num_features
        self.eps = eps
        self.momentum = momentum
        self.affine = affine
        self.track_running_stats = track_running_stats
        _affine(self, affine, num_features, fk)
        if track_running_stats:
            self.register_buffer("running_mean", zeros(num_features, **fk))
            self.register_buffer("running_var", ones(num_features, **fk))
            self.register_buffer("num_batches_tracked",
                                 tensor(0, dtype=B.int64, device=device))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)
        self.reset_parameters()

    def reset_running_stats(self):
        if self.track_running_stats:
            self.running_mean.zero_()
            self.running_var.fill_(1)
            self.num_batches_tracked.zero_()

    def reset_parameters(self):
        self.reset_running_stats()
        if self.affine:
            init.ones_(self.weight)
            init.zeros_(self.bias)

    def extra_repr(self):
        return (f"{self.num_features}, eps={self.eps}, "
                f"momentum={self.momentum}, affine={self.affine}, "
                f"track_running_stats={self.track_running_stats}")


class _BatchNorm(_NormBase):
    _dims = ()

    def _check_input_dim(self, input):
        if input.dim() not in self._dims:
            raise ValueError(
                f"expected {' or '.join(f'{d}D' for d in self._dims)} input "
                f"(got {input.dim()}D input)")

    def forward(self, input):
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:   # cumulative moving average
                factor = 1.0 / float(self.num_batches_tracked.item())
        bn_training = self.training or (self.running_mean is None
                                        and self.running_var is None)
        use_stats = not self.training or self.track_running_stats
        return F.batch_norm(
            input, self.running_mean if use_stats else None,
            self.running_var if use_stats else None, self.weight, self.bias,
            bn_training, factor, self.eps)


class BatchNorm1d(_BatchNorm):
    """Batch norm over (N, C) or (N, C, L) input."""
    _dims = (2, 3)


class BatchNorm2d(_BatchNorm):
    """Batch norm over (N, C, H, W) input."""
    _dims = (4,)


class BatchNorm3d(_BatchNorm):
    _dims = (5,)


class GroupNorm(Module):
    """Normalise each sample's channels in ``num_groups`` groups, then scale
    and shift per channel (weight ones, bias zeros), as ``nn.GroupNorm``."""

    def __init__(self, num_groups, num_channels, eps=1e-5, affine=True,
                 device=None, dtype=None):
        super().__init__()
        if num_channels % num_groups != 0:
            raise ValueError("num_channels must be divisible by num_groups")
        fk = {"device": device, "dtype": dtype}
        self.num_groups = num_groups
        self.num_channels = num_channels
        self.eps = eps
        self.affine = affine
        _affine(self, affine, num_channels, fk)
        self.reset_parameters()

    def reset_parameters(self):
        if self.affine:
            init.ones_(self.weight)
            init.zeros_(self.bias)

    def forward(self, input):
        return F.group_norm(input, self.num_groups, self.weight, self.bias,
                            self.eps)

    def extra_repr(self):
        return (f"{self.num_groups}, {self.num_channels}, eps={self.eps}, "
                f"affine={self.affine}")
