"""A nested state_dict as ``{dotted key: leaf}``: Stateful objects through
their ``state_dict()`` (a Module through ``get_model_state_dict``, so
tensor-parallel shards carry their place), non-tensor values as JSON."""
import json

import numpy as np

from ... import serialization as S
from ...tensor import Tensor
from ._shards import CheckpointException, _is_tensor
from .state_dict import get_model_state_dict


def _is_stateful(v):
    return (not isinstance(v, (Tensor, np.ndarray, dict, list, tuple))
            and callable(getattr(v, "state_dict", None))
            and callable(getattr(v, "load_state_dict", None)))


def _is_module(v):
    return any(c.__name__ == "Module" and c.__module__.startswith("dtorch")
               for c in type(v).__mro__)


class _Flat:
    """The leaves of a nested state_dict by dotted key, each with the
    container and slot it sits in (to replace a non-tensor value on load),
    and the Stateful objects met on the way, with their dicts."""

    def __init__(self, state_dict):
        if not isinstance(state_dict, dict):
            raise TypeError(f"dcp: state_dict must be a dict, got "
                            f"{type(state_dict).__name__}")
        self.leaves = {}
        self.statefuls = []
        self._walk(state_dict, "", None, None)

    def _walk(self, v, key, parent, slot):
        if _is_tensor(v):
            return self._leaf(key, parent, slot, v)
        if _is_stateful(v):
            if _is_module(v):
                sub = get_model_state_dict(v)
            else:
                sub = v.state_dict()
            if not isinstance(sub, dict):
                raise TypeError(f"dcp: {key or 'state_dict'}: "
                                f"{type(v).__name__}.state_dict() returned "
                                f"{type(sub).__name__}, not a dict")
            self._walk(sub, key, None, None)
            self.statefuls.append((v, sub))
            return
        if isinstance(v, dict):
            for k, x in v.items():
                self._walk(x, f"{key}.{k}" if key else str(k), v, k)
            return
        if isinstance(v, list):
            for i, x in enumerate(v):
                self._walk(x, f"{key}.{i}" if key else str(i), v, i)
            return
        self._leaf(key, parent, slot, v)

    def _leaf(self, key, parent, slot, v):
        if key in self.leaves:
            raise ValueError(f"dcp: two entries of the state_dict flatten "
                             f"to the same key {key!r}; rename one")
        self.leaves[key] = (parent, slot, v)


def _encode_object(key, v):
    enc = S._Encoder()
    tree = enc(v, key)
    if enc.arrays:
        raise TypeError(f"dcp: {key!r} holds tensors inside a "
                        f"{type(v).__name__}; use dicts or lists around "
                        "tensors")
    return json.dumps(tree, allow_nan=False, sort_keys=True)


def _decode_object(text, where):
    try:
        return S._Decoder({}, where, None)(json.loads(text))
    except (ValueError, RecursionError) as e:
        # crafted metadata: JSON nested past Python's recursion limit
        raise CheckpointException(
            f"{where}: the saved value is corrupt ({type(e).__name__}: "
            f"{str(e)[:80]})") from None
