"""``dtorch.distributed.optim``: optimizers for sharded data parallelism
(PyTorch's module path)."""
from .zero_redundancy_optimizer import ZeroRedundancyOptimizer

__all__ = ["ZeroRedundancyOptimizer"]
