"""``dtorch.multiprocessing``: Python's ``multiprocessing`` re-exported (as
``torch.multiprocessing`` does: ``Process``, ``Queue``, ``Pool``,
``get_context``, ``set_start_method``, ...) plus ``spawn`` /
``start_processes``, which run ``fn(i, *args)`` in ``nprocs`` processes and
raise in the parent, with the child's traceback, if any of them fails.

dtorch tensors are not pickled (no pickle anywhere in dtorch), so a tensor
put on a Queue raises; send ``t.numpy()`` and rebuild with
``dtorch.from_numpy``, or use ``dtorch.distributed`` between processes."""
import multiprocessing as _mp
from multiprocessing import *  # noqa: F401,F403

from .spawn import (spawn, start_processes, ProcessContext,  # noqa: F401
                    SpawnContext, ProcessException, ProcessRaisedException,
                    ProcessExitedException)

_sharing = ["file_system"]


def get_all_sharing_strategies():
    return {"file_system"}


def get_sharing_strategy():
    return _sharing[0]


def set_sharing_strategy(new_strategy):
    if new_strategy not in get_all_sharing_strategies():
        raise ValueError(f"unknown sharing strategy {new_strategy!r}")
    _sharing[0] = new_strategy


__all__ = list(_mp.__all__) + [
    "spawn", "start_processes", "ProcessContext", "SpawnContext",
    "ProcessException", "ProcessRaisedException", "ProcessExitedException",
    "get_all_sharing_strategies", "get_sharing_strategy",
    "set_sharing_strategy"]
