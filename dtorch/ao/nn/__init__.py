"""Quantized modules (``dtorch.ao.nn.quantized.dynamic``)."""
from . import quantized  # noqa: F401
