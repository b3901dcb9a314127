"""PyTorch's ``torch.distributed.tensor.experimental`` names that dtorch
has: context parallelism (``context_parallel``; ``set_rotate_method`` and
``context_parallel_unshard`` live in ``._attention`` as in PyTorch)."""
from ._attention import (context_parallel, context_parallel_unshard,
                         set_rotate_method)

__all__ = ["context_parallel", "context_parallel_unshard",
           "set_rotate_method"]
