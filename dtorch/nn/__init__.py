"""``dtorch.nn``: modules, parameters, ``functional``, ``init`` and
``utils``, with PyTorch's names and semantics."""
from .parameter import Parameter, Buffer, UninitializedParameter
from .modules import *  # noqa: F401,F403
from .modules import Module  # noqa: F401
from . import functional, init, utils  # noqa: F401
from . import parallel  # noqa: F401,E402
from .parallel.sync_batchnorm import SyncBatchNorm  # noqa: F401,E402
from .parallel.data_parallel import DataParallel  # noqa: F401,E402
