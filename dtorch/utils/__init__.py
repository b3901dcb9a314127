"""``dtorch.utils``: ``data`` (datasets, samplers, DataLoader) and
``summary(model, input_size)``, a torchsummary-style layer table."""
from . import data
# binds the name to the function, not to the submodule of the same name
from .summary import summary

__all__ = ["data", "summary"]
