"""SyncBatchNorm: batch normalisation whose statistics are those of the
global batch (all ranks), so N ranks with batch b equal BatchNorm on the
concatenated batch of N b. One all-reduce in forward (sums and counts), one
in backward (the two gradient sums). Under deterministic DDP the rank's
virtual shards run in lockstep and meet at each SyncBatchNorm
(``_lockstep``), whose statistics and their gradients are exact sums over
all shards (``_functions._ShardStats``): the same bits on any world size."""
from ... import distributed as dist
from ..modules.module import Module
from ..parameter import Parameter
from ... import _creation as C
from ._functions import _ShardNorm, _ShardStats, _SyncBN
from . import _lockstep


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
        shard = _lockstep.current()
        if shard is not None:
            return self._shard_forward(x, *shard)
        # None: a single process with no process group, plain batch norm
        group = self.process_group if self.process_group is not None \
            else dist.group.WORLD
        size = 1 if group is None else dist.get_world_size(group)
        if x.numel() // x.shape[1] <= 1 and size == 1:
            raise ValueError(f"Expected more than 1 value per channel when "
                             f"training, got input size {list(x.shape)}")
        st = {}
        y = _SyncBN.apply(x, self.weight, self.bias, eps=self.eps,
                          group=group, stats=st)
        self._track(st)
        return y

    def _track(self, st):
        """The running statistics take one step from the batch's (the
        global batch's mean, its biased variance, its count)."""
        if self.training and self.track_running_stats:
            mean, var, n = st["mean"], st["var"], st["n"]
            m = self.momentum
            unbiased = var * n / max(n - 1, 1)
            rm, rv = self.running_mean, self.running_var
            rm._data[...] = (1 - m) * rm._data + m * mean
            rv._data[...] = (1 - m) * rv._data + m * unbiased
            self.num_batches_tracked._data += 1
            for t in (rm, rv, self.num_batches_tracked):
                t._bump_version()

    def _shard_forward(self, x, step, u):
        # one virtual shard of deterministic DDP: the statistics of all
        # shards (``_combine``), then this shard's normalisation in float64
        stats = step.barrier(u, self._combine, x)
        return _ShardNorm.apply(x, stats, self.weight, self.bias)

    def _combine(self, step, xs):
        st = {}
        out = _ShardStats.apply(self.eps, step.group, step.shards, st, *xs)
        self._track(st)
        return out

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
