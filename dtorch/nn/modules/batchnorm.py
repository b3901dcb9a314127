"""``torch.nn.modules.batchnorm``'s path: the batch-norm classes (defined in
``normalization.py``) and SyncBatchNorm."""
from .normalization import (_BatchNorm, BatchNorm1d, BatchNorm2d,  # noqa
                            BatchNorm3d)
from .normalization import _BatchNorm as _NormBase  # noqa: F401


def __getattr__(name):
    # SyncBatchNorm lives with the distributed layers, loaded on demand
    if name == "SyncBatchNorm":
        from ..parallel.sync_batchnorm import SyncBatchNorm
        return SyncBatchNorm
    raise AttributeError(name)
