"""``dtorch.utils.tensorboard``: ``SummaryWriter`` writing real TensorBoard
event files through the ``tensorboard`` package (an optional dependency:
``pip install tensorboard``), as ``torch.utils.tensorboard`` does."""
from .writer import SummaryWriter  # noqa: F401

__all__ = ["SummaryWriter"]
