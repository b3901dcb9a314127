"""``dtorch.backends``: the flags scripts set or read at their top
(``torch.backends.cudnn.benchmark = True``,
``torch.backends.cuda.matmul.allow_tf32 = True``,
``torch.backends.mps.is_available()``). dtorch has no cuDNN, MPS or TF32
kernels: the flags are accepted and kept so that scripts run unchanged and
read back what they set; ``is_available()`` answers truthfully."""
from . import cuda, cudnn, mps, mkldnn, openmp  # noqa: F401

__all__ = ["cuda", "cudnn", "mps", "mkldnn", "openmp"]
