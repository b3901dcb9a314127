"""``dtorch.onnx``: export a model to an ONNX file, as ``torch.onnx.export``.

Importing this package needs no ``onnx``; ``export`` imports it and, when it
is missing, says which extra to install (in the dtorch clone:
``pip install -e '.[onnx]'``).

The exporter traces one forward pass: every dtorch op (``Function.apply``)
run while tracing is recorded with its arguments and translated into ONNX
nodes (``_export``). Parameters and buffers become initializers named as in
``state_dict``; anything computed from constants alone (a causal mask, a
position index, ``b_ih + b_hh``) is folded into an initializer.
"""
from .errors import OnnxExporterError, UnsupportedOperatorError

__all__ = ["export", "is_in_onnx_export", "OnnxExporterError",
           "UnsupportedOperatorError"]


def export(model, args, f, input_names=None, output_names=None,
           dynamic_axes=None, opset_version=17, **kwargs):
    """Export ``model`` run on ``args`` to ``f`` (a path or a binary file).

    ``dynamic_axes`` maps an input/output name to ``{axis: name}`` or a list
    of axes, as in PyTorch. PyTorch keyword arguments with no effect here
    (``export_params``, ``do_constant_folding``, ``verbose``, ...) are
    accepted with a warning. Returns None."""
    from ._export import export as _impl
    return _impl(model, args, f, input_names, output_names, dynamic_axes,
                 opset_version, **kwargs)


def is_in_onnx_export():
    """True while ``export`` runs the model's forward."""
    from . import _state
    return _state.active
