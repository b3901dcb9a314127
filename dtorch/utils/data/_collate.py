"""``default_collate`` (samples -> a batch) and ``default_convert``
(arrays -> tensors, no batching), as in ``torch.utils.data``."""
import collections.abc
import re

import numpy as np

from ... import _creation
from ...tensor import Tensor
from . import _worker

__all__ = ["default_collate", "default_convert"]

_ERR = ("default_collate: batch must contain tensors, numpy arrays, "
        "numbers, dicts or lists; found {}")
_STRINGS = re.compile(r"[SaUO]")


def default_collate(batch):
    """Stack a list of samples into a batch: tensors and arrays are stacked
    along a new first dim, Python floats become float64 and ints int64
    tensors, strings stay a list, and dicts/tuples/lists are collated
    field by field (tuples come back as lists, as in PyTorch).

    Example::

        default_collate([(x0, 0), (x1, 1)])
        # -> [stack([x0, x1]), tensor([0, 1])]
    """
    elem = batch[0]
    if isinstance(elem, Tensor):
        if _worker._shm_live is not None:
            arrays = [t._data for t in batch]
            if all(type(a) is np.ndarray for a in arrays) and not any(
                    t.requires_grad for t in batch):
                return Tensor._wrap(_stack_for_transfer(arrays))
        return _creation.stack(batch, 0)
    if isinstance(elem, (np.ndarray, np.generic)) and not isinstance(
            elem, (np.str_, np.bytes_)):
        if _STRINGS.search(elem.dtype.str) is not None:
            raise TypeError(_ERR.format(elem.dtype))
        if _worker._shm_live is not None:
            return _creation.as_tensor(_stack_for_transfer(batch))
        return _creation.as_tensor(np.stack(batch))
    if isinstance(elem, float):
        return _creation.tensor(batch, dtype="float64")
    if isinstance(elem, int):           # bool too: a bool tensor
        return _creation.tensor(batch)
    if isinstance(elem, (str, bytes)):
        return batch
    if isinstance(elem, collections.abc.Mapping):
        out = {key: default_collate([d[key] for d in batch]) for key in elem}
        try:
            return type(elem)(out)
        except TypeError:               # a Mapping that takes no dict
            return out
    if isinstance(elem, tuple) and hasattr(elem, "_fields"):  # namedtuple
        return type(elem)(*(default_collate(s) for s in zip(*batch)))
    if isinstance(elem, collections.abc.Sequence):
        n = len(elem)
        if not all(len(e) == n for e in batch):
            raise RuntimeError(
                "each element in list of batch should be of equal size")
        columns = [default_collate(s) for s in zip(*batch)]
        if isinstance(elem, tuple):
            return columns
        try:
            return type(elem)(columns)
        except TypeError:
            return columns
    raise TypeError(_ERR.format(type(elem)))


def _stack_for_transfer(arrays):
    """``np.stack`` into the memory the batch will travel in: in a
    DataLoader worker, shared memory (no second copy on the way)."""
    first = np.asarray(arrays[0])
    shape = first.shape
    for a in arrays:
        if np.shape(a) != shape:
            return np.stack(arrays)     # NumPy's error text
    dtype = np.result_type(*{np.asarray(a).dtype for a in arrays})
    out = _worker.shm_empty((len(arrays),) + shape, dtype)
    return np.stack(arrays, out=out)


def default_convert(data):
    """NumPy arrays (and those inside containers) to tensors; everything
    else unchanged. The collate function when ``batch_size=None``."""
    if isinstance(data, Tensor):
        return data
    if isinstance(data, np.ndarray):
        if _STRINGS.search(data.dtype.str) is not None:
            return data
        return _creation.as_tensor(data)
    if isinstance(data, np.generic) and not isinstance(
            data, (np.str_, np.bytes_)):
        return _creation.as_tensor(data)
    if isinstance(data, collections.abc.Mapping):
        out = {k: default_convert(v) for k, v in data.items()}
        try:
            return type(data)(out)
        except TypeError:
            return out
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(default_convert(d) for d in data))
    if isinstance(data, tuple):
        return [default_convert(d) for d in data]
    if isinstance(data, collections.abc.Sequence) and not isinstance(
            data, (str, bytes)):
        try:
            return type(data)([default_convert(d) for d in data])
        except TypeError:
            return [default_convert(d) for d in data]
    return data
