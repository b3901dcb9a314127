"""``dtorch.nn``: modules, parameters, ``functional``, ``init`` and
``utils``, with PyTorch's names and semantics."""
from .parameter import Parameter, Buffer, UninitializedParameter
from .modules import *  # noqa: F401,F403
from .modules import Module  # noqa: F401
from . import functional, init, utils  # noqa: F401

# Distribution code loads on first use: a single-process `import dtorch.nn`
# imports no collectives and no dtorch.distributed (nn.parallel needs both).
_LAZY = {"parallel": None, "SyncBatchNorm": "sync_batchnorm",
         "DataParallel": "data_parallel"}


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module 'dtorch.nn' has no attribute {name!r}")
    import importlib
    parallel = importlib.import_module(".parallel", __name__)
    return parallel if _LAZY[name] is None else getattr(parallel, name)


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


# `from dtorch.nn import *` exports what it did before nn.parallel became
# lazy: every public name, the lazy ones resolved through __getattr__ (so the
# star import loads nn.parallel, a plain `import dtorch.nn` does not)
__all__ = sorted(k for k in globals() if not k.startswith("_")) + list(_LAZY)
