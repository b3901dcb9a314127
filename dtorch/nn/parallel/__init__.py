"""Parallel training modules: data parallel (DDP) and model parallel."""
from .distributed import DistributedDataParallel, GradBucket  # noqa: F401
from .sync_batchnorm import SyncBatchNorm  # noqa: F401
from .data_parallel import DataParallel  # noqa: F401
from .tensor_parallel import (  # noqa: F401
    ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding,
    make_dp_tp_groups)
