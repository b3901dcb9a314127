"""``dtorch.ao``: architecture optimisation - dynamic quantization
(``dtorch.ao.quantization``) and its quantized modules (``dtorch.ao.nn``).
Reads trained models; never changes how training runs."""
from . import quantization, nn  # noqa: F401

__all__ = ["quantization", "nn"]
