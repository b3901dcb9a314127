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

_autocast, _GradScaler = autocast, GradScaler

__all__ = ["autocast", "GradScaler", "is_autocast_available",
           "is_autocast_enabled", "get_autocast_dtype"]


def _device_spellings(device_type, module):
    """``torch.<device_type>.amp``'s older ``autocast`` and ``GradScaler``
    (of ``module``): this package's classes with the device fixed."""
    class autocast(_autocast):
        __doc__ = (f"``torch.{device_type}.amp.autocast(enabled=True, "
                   f"dtype=None, cache_enabled=True)``.")

        def __init__(self, enabled=True, dtype=None, cache_enabled=True):
            super().__init__(device_type, dtype=dtype, enabled=enabled,
                             cache_enabled=cache_enabled)

    class GradScaler(_GradScaler):
        def __init__(self, init_scale=2.0 ** 16, growth_factor=2.0,
                     backoff_factor=0.5, growth_interval=2000, enabled=True):
            super().__init__(device_type, init_scale, growth_factor,
                             backoff_factor, growth_interval, enabled)

    for cls in (autocast, GradScaler):
        cls.__module__, cls.__qualname__ = module, cls.__name__
    return autocast, GradScaler
