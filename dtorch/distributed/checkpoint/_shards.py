"""What dcp knows of a tensor: the box of a global tensor that a local
tensor holds (``shard_of``, the metadata hook that DTensor's placements
are in PyTorch), the overlap of two boxes, and the error every part of a
save or load raises."""
import math

import numpy as np

from ... import _backend as B
from ...tensor import Tensor


class CheckpointException(RuntimeError):
    """A save or load that failed on one or more ranks (PyTorch's name);
    the message names each failing rank and its error. ``failures`` maps
    rank -> message."""

    def __init__(self, msg, failures=None):
        super().__init__(msg)
        self.failures = failures or {}


def shard_of(tensor, global_shape, offsets, flat_of=None):
    """A view of ``tensor`` (same memory) marked as the box at ``offsets``
    of a global tensor of ``global_shape``: dcp saves it as that chunk and
    loads into it that box of whatever chunks were saved (the metadata
    hook that DTensor's placements are in PyTorch). ``flat_of``: the
    global tensor is the 1-D flattening of a tensor of this shape (ZeRO's
    element-wise shards), so it loads from and into that shape too."""
    shape, g, o = tuple(tensor.shape), tuple(global_shape), tuple(offsets)
    if len(g) != len(shape) or len(o) != len(shape) or any(
            oi < 0 or oi + s > gi for oi, s, gi in zip(o, shape, g)):
        raise ValueError(f"shard_of: a shard of shape {list(shape)} at "
                         f"offsets {list(o)} does not fit in a global "
                         f"tensor of shape {list(g)}")
    if flat_of is not None and (len(g) != 1 or math.prod(flat_of) != g[0]):
        raise ValueError(f"shard_of: flat_of {list(flat_of)} has "
                         f"{math.prod(flat_of)} elements, the flat tensor "
                         f"{list(g)}")
    view = Tensor._wrap(tensor._data)
    view._dcp_shard = (g, o)
    view._dcp_flat_of = None if flat_of is None else tuple(flat_of)
    return view


def _spec(v, shape):
    s = getattr(v, "_dcp_shard", None) if isinstance(v, Tensor) else None
    return s if s is not None else (tuple(shape), (0,) * len(shape))


def _array(v):
    a = v._data if isinstance(v, Tensor) else v
    return a


def _is_tensor(v):
    return isinstance(v, (Tensor, np.ndarray)) or B.is_cupy_array(v)


def _overlap(a_off, a_size, b_off, b_size):
    lo = [max(x, y) for x, y in zip(a_off, b_off)]
    hi = [min(x + s, y + t) for x, s, y, t in zip(a_off, a_size, b_off,
                                                   b_size)]
    return lo, hi, all(h > l for l, h in zip(lo, hi))
