"""SyncBatchNorm: batch normalisation whose statistics are those of the
global batch (all ranks), so N ranks with batch b equal BatchNorm on the
concatenated batch of N b. One all-reduce in forward (sums and counts), one
in backward (the two gradient sums)."""
import numpy as np

from ... import distributed as dist
from ...ops.primitives import Op, get_array_module
from ..modules.module import Module
from ..parameter import Parameter
from ... import _creation as C


class _SyncBN(Op):
    @staticmethod
    def forward(ctx, x, w, b, eps=1e-5, group=None, stats=None):
        xp = get_array_module(x)
        axes = (0,) + tuple(range(2, x.ndim))
        C_ = x.shape[1]
        n_local = x.size // C_
        x64 = x.astype(np.float64)
        sums = xp.concatenate([x64.sum(axis=axes),
                               (x64 * x64).sum(axis=axes),
                               xp.array([float(n_local)])])
        if group.size > 1:
            group.all_reduce(sums, "sum")
        n = sums[-1]
        mean = sums[:C_] / n
        var = xp.maximum(sums[C_:2 * C_] / n - mean * mean, 0.0)
        shape = (1, C_) + (1,) * (x.ndim - 2)
        invstd = 1.0 / xp.sqrt(var + eps)
        xhat = ((x64 - mean.reshape(shape)) * invstd.reshape(shape))
        out = xhat
        if w is not None:
            out = out * w.reshape(shape) + b.reshape(shape)
        ctx.xhat, ctx.invstd, ctx.n, ctx.w = xhat, invstd, n, w
        ctx.axes, ctx.shape, ctx.group, ctx.xd = axes, shape, group, x.dtype
        stats.update(mean=mean, var=var, n=n)
        return out.astype(x.dtype)

    @staticmethod
    def backward(ctx, g):
        xp = get_array_module(g)
        g64 = g.astype(np.float64)
        xhat, shape, axes = ctx.xhat, ctx.shape, ctx.axes
        gw = (g64 * xhat).sum(axis=axes)
        gb = g64.sum(axis=axes)
        gxhat = g64 * ctx.w.reshape(shape) if ctx.w is not None else g64
        sums = xp.concatenate([gxhat.sum(axis=axes),
                               (gxhat * xhat).sum(axis=axes)])
        if ctx.group.size > 1:
            ctx.group.all_reduce(sums, "sum")
        C_ = xhat.shape[1]
        s_g = sums[:C_].reshape(shape)
        s_gx = sums[C_:].reshape(shape)
        gx = ctx.invstd.reshape(shape) * (gxhat - s_g / ctx.n
                                          - xhat * s_gx / ctx.n)
        w = ctx.w
        return (gx.astype(ctx.xd),
                gw.astype(w.dtype) if w is not None else None,
                gb.astype(w.dtype) if w is not None else None)


class SyncBatchNorm(Module):
    """Batch norm over the global batch of all ranks of ``process_group``.

    In eval mode (or with world size 1) it is plain batch norm with running
    statistics. Example::

        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        model = DistributedDataParallel(model)
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, process_group=None, device=None,
                 dtype=None):
        super().__init__()
        self.num_features = num_features
        self.eps, self.momentum = eps, momentum
        self.affine = affine
        self.track_running_stats = track_running_stats
        self.process_group = process_group
        if affine:
            self.weight = Parameter(C.ones(num_features, dtype=dtype,
                                           device=device))
            self.bias = Parameter(C.zeros(num_features, dtype=dtype,
                                          device=device))
        else:
            self.weight = self.bias = None
        if track_running_stats:
            self.register_buffer("running_mean", C.zeros(
                num_features, dtype=dtype, device=device))
            self.register_buffer("running_var", C.ones(
                num_features, dtype=dtype, device=device))
            self.register_buffer("num_batches_tracked",
                                 C.tensor(0, device=device))
        else:
            self.running_mean = self.running_var = None
            self.num_batches_tracked = None

    def _check_input_dim(self, x):
        if x.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {x.dim()}D "
                             f"input)")
        if x.shape[1] != self.num_features:
            raise ValueError(f"SyncBatchNorm: expected {self.num_features} "
                             f"channels in dim 1, got input of shape "
                             f"{list(x.shape)}")

    def forward(self, x):
        self._check_input_dim(x)
        use_batch = self.training or not self.track_running_stats
        if not use_batch:
            shape = (1, -1) + (1,) * (x.dim() - 2)
            y = (x - self.running_mean.view(shape)) * (
                self.running_var.view(shape) + self.eps).rsqrt()
            if self.affine:
                y = y * self.weight.view(shape) + self.bias.view(shape)
            return y
        group = self.process_group or dist._default_or_none()
        if group is None:
            group = _SoloGroup()
        if x.numel() // x.shape[1] <= 1 and group.size == 1:
            raise ValueError(f"Expected more than 1 value per channel when "
                             f"training, got input size {list(x.shape)}")
        st = {}
        y = _SyncBN.apply(x, self.weight, self.bias, eps=self.eps,
                          group=group, stats=st)
        if self.training and self.track_running_stats:
            mean, var, n = st["mean"], st["var"], st["n"]
            m = self.momentum
            unbiased = var * n / max(n - 1, 1)
            rm, rv = self.running_mean, self.running_var
            rm._data[...] = (1 - m) * rm._data + m * mean
            rv._data[...] = (1 - m) * rv._data + m * unbiased
            self.num_batches_tracked._data += 1
        return y

    @classmethod
    def convert_sync_batchnorm(cls, module, process_group=None):
        """Replace every BatchNorm*d in ``module`` by a SyncBatchNorm with
        the same parameters and running statistics."""
        from ..modules import normalization as _bn
        out = module
        if isinstance(module, _bn._BatchNorm):
            out = cls(module.num_features, module.eps, module.momentum,
                      module.affine, module.track_running_stats,
                      process_group)
            if module.affine:
                out.weight = module.weight
                out.bias = module.bias
            if module.track_running_stats:
                out.running_mean = module.running_mean
                out.running_var = module.running_var
                out.num_batches_tracked = module.num_batches_tracked
            out.train(module.training)
        for name, child in module.named_children():
            out.add_module(name, cls.convert_sync_batchnorm(child,
                                                            process_group))
        return out


class _SoloGroup:
    size = 1
