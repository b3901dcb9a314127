"""The older spelling of ``dtorch.ao.quantization`` (as ``torch.quantization``
still re-exports ``torch.ao.quantization``)."""
from ..ao.quantization import *  # noqa: F401,F403
from ..ao.quantization import __all__  # noqa: F401
