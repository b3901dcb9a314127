"""Quantized modules; ``dynamic``: int8 weights, activations quantized on
the fly at each call."""
from . import dynamic  # noqa: F401
