"""``dtorch.ao.quantization``: post-training dynamic quantization.

``quantize_dynamic(model, {nn.Linear, nn.LSTM}, dtype=dtorch.qint8)``
replaces those submodules by ``dtorch.ao.nn.quantized.dynamic`` ones: int8
weights with one scale per output channel, activations quantized on the fly
(per tensor, uint8) at each call, int32 accumulation (see ``_core``).
"""
import copy

from ...nn.modules.linear import Linear as _FloatLinear
from ...nn.modules.rnn import LSTM as _FloatLSTM
from ._dtypes import qint8, quint8, qint32
from ..nn.quantized import dynamic as _dyn

__all__ = ["quantize_dynamic", "qint8", "quint8", "qint32",
           "default_dynamic_qconfig", "per_channel_dynamic_qconfig"]

# The qconfig names PyTorch users pass as dict values; dtorch has one scheme
# (per-channel symmetric int8 weights, per-tensor uint8 activations), so
# both spellings select it.
default_dynamic_qconfig = per_channel_dynamic_qconfig = "per_channel_dynamic"

DEFAULT_DYNAMIC_QUANT_MODULE_MAPPINGS = {
    _FloatLinear: _dyn.Linear,
    _FloatLSTM: _dyn.LSTM,
}


def _wanted(spec, name, mod):
    if type(mod) in spec:
        return spec[type(mod)] is not None
    if name in spec:
        return spec[name] is not None
    return False


def quantize_dynamic(model, qconfig_spec=None, dtype=qint8, mapping=None,
                     inplace=False):
    """Return ``model`` with its Linear/LSTM submodules dynamically
    quantized (a copy unless ``inplace``).

    ``qconfig_spec``: a set of module types, or a dict whose keys are module
    types or submodule names (``"head.0"``) and whose values are a qconfig
    (any non-None value) or None to leave that one alone. Default: every
    nn.Linear and nn.LSTM. As in PyTorch, the submodules are replaced, never
    ``model`` itself.
    """
    if dtype is not qint8:
        raise NotImplementedError(
            f"quantize_dynamic: dtype {dtype} is not supported; dtorch "
            f"quantizes dynamically to dtorch.qint8 only")
    mapping = DEFAULT_DYNAMIC_QUANT_MODULE_MAPPINGS if mapping is None \
        else mapping
    if qconfig_spec is None:
        qconfig_spec = set(mapping)
    if isinstance(qconfig_spec, (set, frozenset, list, tuple)):
        spec = {k: default_dynamic_qconfig for k in qconfig_spec}
    elif isinstance(qconfig_spec, dict):
        spec = dict(qconfig_spec)
    else:
        raise TypeError(f"quantize_dynamic: qconfig_spec must be a set of "
                        f"module types or a dict, got "
                        f"{type(qconfig_spec).__name__}")
    for k in spec:
        if isinstance(k, type) and k not in mapping:
            raise NotImplementedError(
                f"quantize_dynamic: no dynamically quantized version of "
                f"{k.__name__} (supported: "
                f"{', '.join(t.__name__ for t in mapping)})")
    if not inplace:
        model = copy.deepcopy(model)
    _swap(model, "", spec, mapping)
    return model


def _swap(module, prefix, spec, mapping):
    for name, child in list(module.named_children()):
        full = prefix + name
        target = mapping.get(type(child))
        if target is not None and _wanted(spec, full, child):
            setattr(module, name, target.from_float(child))
        else:
            _swap(child, full + ".", spec, mapping)
