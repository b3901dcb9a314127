"""Automatic differentiation: ``backward``, ``grad``, ``Function``, grad modes
and ``gradcheck``, with PyTorch's names and semantics."""
from .function import Function
from .grad_mode import (no_grad, enable_grad, set_grad_enabled,
                        inference_mode, is_grad_enabled)
from ._api import backward, grad
from .gradcheck import gradcheck, gradgradcheck
from .anomaly_mode import detect_anomaly, set_detect_anomaly  # noqa
from .variable import Variable  # noqa: F401
from . import graph  # noqa: F401

__all__ = ["Function", "backward", "grad", "gradcheck", "gradgradcheck",
           "no_grad",
           "enable_grad", "set_grad_enabled", "inference_mode"]


def __getattr__(name):
    # autograd.functional stacks tensors (an op above this layer): loaded
    # on first use, as a submodule import would
    if name == "functional":
        import importlib
        return importlib.import_module(__name__ + ".functional")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
