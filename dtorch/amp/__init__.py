"""``dtorch.amp``: mixed precision, PyTorch's ``torch.amp``.

``autocast`` runs matmul/linear/conv (and the rest of PyTorch's lower-
precision list) in float16/bfloat16 and keeps range-sensitive ops in
float32 (``autocast_mode``); ``GradScaler`` scales the loss so float16
gradients do not underflow and skips steps whose gradients overflowed,
identically on every rank (``grad_scaler``).
"""
from .autocast_mode import (autocast, is_autocast_available,
                            is_autocast_enabled, get_autocast_dtype)
from .grad_scaler import GradScaler

__all__ = ["autocast", "GradScaler", "is_autocast_available",
           "is_autocast_enabled", "get_autocast_dtype"]
