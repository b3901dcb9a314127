"""What runs inside a DataLoader worker process, and the messages that
cross the process boundary.

dtorch tensors refuse pickling on purpose, so a worker turns every tensor
of a batch into a ``_TensorPayload`` (its NumPy array) and pickles the batch
itself: a batch that cannot be pickled becomes an error report instead of
a silent failure in the queue's feeder thread. The parent rebuilds the
tensors.
"""
import os
import pickle
import queue
import random
import sys
import traceback

import numpy as np

from ... import _backend as B
from ...tensor import Tensor

# how often a blocked worker checks that its parent is still alive
STATUS_CHECK_INTERVAL = 1.0

_worker_info = None


class WorkerInfo:
    """Inside a worker: ``id``, ``num_workers``, ``seed`` and this
    worker's copy of ``dataset``."""

    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)

    def __repr__(self):
        items = ", ".join(f"{k}={v!r}" for k, v in self.__dict__.items()
                          if k != "dataset")
        return f"WorkerInfo({items})"


def get_worker_info():
    """The current worker's ``WorkerInfo``; ``None`` in the main process.

    Example (an IterableDataset that splits its range among workers)::

        info = get_worker_info()
        lo, step = (0, 1) if info is None else (info.id, info.num_workers)
    """
    return _worker_info


class ExceptionWrapper:
    """An exception caught in a worker, carried to the parent as its type
    and formatted traceback."""

    def __init__(self, exc_info, where):
        self.exc_type = exc_info[0]
        self.exc_msg = "".join(traceback.format_exception(*exc_info))
        self.where = where

    def reraise(self):
        msg = (f"Caught {self.exc_type.__name__} {self.where}.\n"
               f"Original {self.exc_msg}")
        if self.exc_type is KeyError:
            # KeyError would repr() the text and hide the newlines
            msg = _KeyErrorMessage(msg)
        try:
            exc = self.exc_type(msg)
        except Exception:   # an exception type that takes other arguments
            raise RuntimeError(msg) from None
        raise exc


class _KeyErrorMessage(str):
    def __repr__(self):
        return self


class _TensorPayload:
    """A tensor in transit: its (CPU) array and requires_grad flag."""

    __slots__ = ("array", "requires_grad")

    def __init__(self, array, requires_grad):
        self.array = array
        self.requires_grad = requires_grad

    def __reduce__(self):
        return _TensorPayload, (self.array, self.requires_grad)


class _IterableDatasetStopIteration:
    def __init__(self, worker_id):
        self.worker_id = worker_id


class _ResumeIteration:
    """Sent to persistent workers at the start of a new epoch."""


_CUDA_IN_WORKER = (
    # PyTorch's words first, so that its answers on the web apply
    "Cannot re-initialize CUDA in forked subprocess: "
    "a DataLoader worker process cannot use CUDA (it was forked from a "
    "process that had initialised CUDA, whose context a child cannot use): "
    "let the dataset return CPU tensors and move batches to the GPU in the "
    "main process, or pass multiprocessing_context='spawn' with a picklable "
    "dataset")


_cuda_forbidden = False


def _forbid_cuda_after_fork():
    """In a worker forked from a process where CuPy was loaded: any CUDA
    use fails at once with a clear error instead of hanging in the driver
    (PyTorch: "Cannot re-initialize CUDA in forked subprocess")."""
    global _cuda_forbidden
    if B._cupy is not None:
        _cuda_forbidden = True
        B._cupy = None
        B._cupy_tried = True
        B._cupy_error = RuntimeError(_CUDA_IN_WORKER)


def to_payload(obj):
    """Replace tensors in a nested batch by picklable payloads."""
    if isinstance(obj, Tensor):
        a = obj._data
        if type(a) is not np.ndarray:
            if _cuda_forbidden or not B.is_cupy_array(a):
                raise RuntimeError(_CUDA_IN_WORKER + f" (got a {obj.device}"
                                   f" tensor)")
            a = a.get()
        return _TensorPayload(a, obj.requires_grad)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(to_payload(o) for o in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_payload(o) for o in obj)
    if isinstance(obj, dict):
        try:
            return type(obj)((k, to_payload(v)) for k, v in obj.items())
        except TypeError:
            return {k: to_payload(v) for k, v in obj.items()}
    return obj


def from_payload(obj):
    """The inverse of ``to_payload``, in the parent."""
    if isinstance(obj, _TensorPayload):
        t = Tensor._wrap(obj.array)
        if obj.requires_grad:
            t.requires_grad_(True)
        return t
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(from_payload(o) for o in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(from_payload(o) for o in obj)
    if isinstance(obj, dict):
        try:
            return type(obj)((k, from_payload(v)) for k, v in obj.items())
        except TypeError:
            return {k: from_payload(v) for k, v in obj.items()}
    return obj


def _seed_everything(seed, base_seed, worker_id):
    from ... import random as drandom
    random.seed(seed)
    drandom.manual_seed(seed)
    np.random.seed(np.random.SeedSequence(
        [base_seed & 0xFFFF_FFFF_FFFF_FFFF, worker_id]).generate_state(4))


def worker_loop(make_fetcher, dataset, index_queue, data_queue, done_event,
                worker_init_fn, base_seed, worker_id, num_workers):
    """The body of one worker process: seed, init, then fetch batches for
    the indices that arrive until told to stop (``None``) or orphaned."""
    global _worker_info
    _forbid_cuda_after_fork()
    seed = base_seed + worker_id
    _seed_everything(seed, base_seed, worker_id)
    _worker_info = WorkerInfo(id=worker_id, num_workers=num_workers,
                              seed=seed, dataset=dataset)
    where = f"in DataLoader worker process {worker_id}"
    init_error = None
    try:
        if worker_init_fn is not None:
            worker_init_fn(worker_id)
        fetcher = make_fetcher(dataset)
    except Exception:
        init_error = ExceptionWrapper(sys.exc_info(), where)
    parent = os.getppid()
    iteration_end = False
    while True:
        try:
            msg = index_queue.get(timeout=STATUS_CHECK_INTERVAL)
        except queue.Empty:
            if os.getppid() != parent:   # the main process died
                break
            continue
        if msg is None:
            break
        if isinstance(msg, _ResumeIteration):
            data_queue.put(pickle.dumps((msg, None)))
            iteration_end = False
            if init_error is None:
                fetcher = make_fetcher(dataset)
            continue
        if done_event.is_set() or iteration_end:
            continue
        idx, index = msg
        if init_error is not None:
            data, init_error = init_error, None
        else:
            try:
                data = to_payload(fetcher.fetch(index))
            except StopIteration:
                # an IterableDataset ran out: tell the parent once
                data = _IterableDatasetStopIteration(worker_id)
                iteration_end = True
            except Exception:
                data = ExceptionWrapper(sys.exc_info(), where)
        try:
            blob = pickle.dumps((idx, data), pickle.HIGHEST_PROTOCOL)
        except Exception:
            if isinstance(data, ExceptionWrapper):
                data.exc_type = RuntimeError  # its own type won't pickle
            else:
                data = ExceptionWrapper(sys.exc_info(), where)
            blob = pickle.dumps((idx, data), pickle.HIGHEST_PROTOCOL)
        data_queue.put(blob)
    # don't block process exit flushing results nobody will read
    data_queue.cancel_join_thread()
    data_queue.close()
