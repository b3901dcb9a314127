"""The DataLoader's state as the user sees it: always the same keys, every
value an int, a bool, None or a string. The parts whose shape depends on
the run (the sampler's and the workers' states, per worker lists, the
next pass) travel as one JSON string each, so a checkpoint that loads
into a template state (``dcp.load`` with a fresh loader's
``state_dict()``, as PyTorch's dcp does) carries the whole state, and a
fresh loader's state has the same structure as a mid-epoch one.
"""
import json

import numpy as np

from ...tensor import Tensor

# the keys every state has; those in _PACKED are JSON strings
STATE_KEYS = ("_iterator_finished", "_num_yielded", "_base_seed",
              "_generator_state", "_num_workers", "_last_yielded_worker_id",
              "_sampler_state", "_sampler_skip", "_worker_snapshots",
              "_workers_done", "_next_pass")
_PACKED = ("_generator_state", "_sampler_state", "_worker_snapshots",
           "_workers_done", "_next_pass")
_ARRAY = "__ndarray__"
_DICT = "__items__"


def fresh_state(num_workers):
    """A loader that has not iterated: the next ``iter()`` starts a pass
    as the uninterrupted run's first one does."""
    n = max(num_workers, 1)
    return {"_iterator_finished": True, "_num_yielded": 0,
            "_base_seed": None, "_generator_state": None,
            "_num_workers": num_workers, "_last_yielded_worker_id": -1,
            "_sampler_state": None, "_sampler_skip": 0,
            "_worker_snapshots": [None] * n, "_workers_done": [False] * n,
            "_next_pass": None}


def pack(state):
    """The iterator's nested state as the user's flat one."""
    return {k: json.dumps(_to_json(state[k], k), separators=(",", ":"))
            if k in _PACKED else state[k] for k in STATE_KEYS}


def unpack(state):
    """The user's state back as the nested one, with a clear error for a
    state that is not a DataLoader's or lacks keys. Packed values given
    nested (a state built by hand) are taken as they are."""
    if not isinstance(state, dict):
        raise TypeError("DataLoader.load_state_dict: expected a dict from "
                        f"DataLoader.state_dict(), got {type(state).__name__}")
    missing = [k for k in STATE_KEYS if k not in state]
    if len(missing) == len(STATE_KEYS):
        raise ValueError(f"not a DataLoader state_dict (it has the keys "
                         f"{sorted(map(str, state))[:8]}, none of "
                         f"{list(STATE_KEYS)})")
    if missing:
        raise ValueError(
            f"DataLoader.load_state_dict: the state lacks the keys "
            f"{missing} (it has {sorted(map(str, state))}); pass a state "
            "from DataLoader.state_dict() whole")
    if not state["_iterator_finished"] and state["_base_seed"] is None:
        raise ValueError("DataLoader.load_state_dict: a mid-epoch state "
                         "(_iterator_finished False) needs its _base_seed")
    out = {}
    for k in STATE_KEYS:
        v = state[k]
        if k in _PACKED and isinstance(v, str):
            try:
                v = _from_json(json.loads(v))
            except ValueError as e:
                raise ValueError(f"DataLoader.load_state_dict: {k!r} is "
                                 f"not a saved DataLoader state ({e})") \
                    from None
        out[k] = v
    return out


def _to_json(obj, where):
    if isinstance(obj, dict):
        if all(isinstance(k, str) for k in obj) and _ARRAY not in obj \
                and _DICT not in obj:
            return {k: _to_json(v, f"{where}[{k!r}]") for k, v in obj.items()}
        # keys JSON cannot keep (ints, tuples): as pairs
        return {_DICT: [[_to_json(k, where), _to_json(v, f"{where}[{k!r}]")]
                        for k, v in obj.items()]}
    if isinstance(obj, (list, tuple)):
        return [_to_json(v, f"{where}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, Tensor):         # restored on the CPU
        return dict(_to_json(obj.detach().cpu().numpy(), where), tensor=1)
    if isinstance(obj, np.ndarray):
        return {_ARRAY: obj.dtype.str, "shape": list(obj.shape),
                "data": obj.ravel().tolist()}
    if isinstance(obj, np.generic):
        return obj.item()
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"DataLoader.state_dict: {where} is a "
                    f"{type(obj).__name__}; a dataset's or sampler's state "
                    "may hold ints, floats, strings, None, lists, dicts, "
                    "NumPy arrays and tensors")


def _from_json(obj):
    if isinstance(obj, list):
        return [_from_json(v) for v in obj]
    if isinstance(obj, dict):
        if _ARRAY in obj:
            a = np.asarray(obj["data"], dtype=np.dtype(obj[_ARRAY])) \
                .reshape(obj["shape"])
            return Tensor._wrap(a) if obj.get("tensor") else a
        if _DICT in obj:
            return {_key(_from_json(k)): _from_json(v)
                    for k, v in obj[_DICT]}
        return {k: _from_json(v) for k, v in obj.items()}
    return obj


def _key(k):
    return tuple(k) if isinstance(k, list) else k
