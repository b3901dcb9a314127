"""``DataLoader``: batches from a dataset, in the main process or in
worker processes, with PyTorch's options and ordering guarantees.

With ``num_workers > 0`` each worker has its own index queue and all share
one result queue; the main process keeps ``prefetch_factor`` batches per
worker in flight and hands batches out in sampler order. Workers are
seeded with ``base_seed + worker_id`` (``base_seed`` drawn from the
loader's generator), so with a seeded generator the batches equal those of
``num_workers=0``. Worker errors come back with the worker's traceback;
workers are joined (never left as zombies) when the iterator is exhausted,
deleted or fails.
"""
import itertools
import multiprocessing
import pickle
import queue
import sys

from ...random import _rng
from . import _worker
from ._collate import default_collate, default_convert
from ._worker import ExceptionWrapper, get_worker_info  # noqa: F401
from .dataset import IterableDataset
from .sampler import (BatchSampler, RandomSampler, Sampler,
                      SequentialSampler)

__all__ = ["DataLoader", "get_worker_info"]

# how long shutdown waits for a worker to exit before terminating it: an
# idle worker exits at once; a busy one is working on a batch nobody wants
_JOIN_TIMEOUT = 1.0


class _InfiniteConstantSampler(Sampler):
    """Endless ``None`` keys: an IterableDataset ignores them."""

    def __iter__(self):
        while True:
            yield None


class _MapFetcher:
    def __init__(self, dataset, auto_collation, collate_fn, drop_last):
        self.dataset = dataset
        self.auto_collation = auto_collation
        self.collate_fn = collate_fn

    def fetch(self, index):
        if self.auto_collation:
            getitems = getattr(self.dataset, "__getitems__", None)
            if getitems is not None:
                data = getitems(index)
            else:
                data = [self.dataset[i] for i in index]
        else:
            data = self.dataset[index]
        return self.collate_fn(data)


class _IterableFetcher:
    def __init__(self, dataset, auto_collation, collate_fn, drop_last):
        self.it = iter(dataset)
        self.auto_collation = auto_collation
        self.collate_fn = collate_fn
        self.drop_last = drop_last
        self.ended = False

    def fetch(self, index):
        if self.ended:
            raise StopIteration
        if not self.auto_collation:
            return self.collate_fn(next(self.it))
        data = []
        for _ in index:
            try:
                data.append(next(self.it))
            except StopIteration:
                self.ended = True
                break
        if not data or (self.ended and self.drop_last):
            raise StopIteration
        return self.collate_fn(data)


class _MakeFetcher:
    """Builds the fetcher inside each worker (picklable for spawn)."""

    def __init__(self, kind, auto_collation, collate_fn, drop_last):
        self.kind = kind
        self.args = (auto_collation, collate_fn, drop_last)

    def __call__(self, dataset):
        return self.kind(dataset, *self.args)


class DataLoader:
    """Iterate over ``dataset`` in batches, as ``torch.utils.data
    .DataLoader``.

    Example::

        loader = DataLoader(TensorDataset(x, y), batch_size=32,
                            shuffle=True, num_workers=2)
        for xb, yb in loader:
            ...
    """

    def __init__(self, dataset, batch_size=1, shuffle=None, sampler=None,
                 batch_sampler=None, num_workers=0, collate_fn=None,
                 pin_memory=False, drop_last=False, timeout=0,
                 worker_init_fn=None, multiprocessing_context=None,
                 generator=None, *, prefetch_factor=None,
                 persistent_workers=False, pin_memory_device=""):
        if num_workers < 0:
            raise ValueError("num_workers option should be non-negative; "
                             "use num_workers=0 to disable multiprocessing.")
        if timeout < 0:
            raise ValueError("timeout option should be non-negative")
        if num_workers == 0 and prefetch_factor is not None:
            raise ValueError(
                "prefetch_factor option could only be specified in "
                "multiprocessing.let num_workers > 0 to enable "
                "multiprocessing, otherwise set prefetch_factor to None.")
        if num_workers > 0 and prefetch_factor is None:
            prefetch_factor = 2
        if prefetch_factor is not None and prefetch_factor < 0:
            raise ValueError("prefetch_factor option should be non-negative")
        if persistent_workers and num_workers == 0:
            raise ValueError("persistent_workers option needs num_workers > 0")
        self.dataset = dataset
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor
        self.pin_memory = pin_memory      # no pinned memory on NumPy
        self.pin_memory_device = pin_memory_device
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = multiprocessing_context
        self._iterable = isinstance(dataset, IterableDataset)
        if self._iterable:
            for name, value in (("shuffle", shuffle), ("sampler", sampler),
                                ("batch_sampler", batch_sampler)):
                if value not in (None, False):
                    raise ValueError(
                        "DataLoader with IterableDataset: expected "
                        f"unspecified {name} option, but got "
                        f"{name}={value}")
        elif shuffle not in (None, False) and sampler is not None:
            raise ValueError("sampler option is mutually exclusive with "
                             "shuffle")
        if batch_sampler is not None:
            if (batch_size != 1 or shuffle or sampler is not None
                    or drop_last):
                raise ValueError(
                    "batch_sampler option is mutually exclusive with "
                    "batch_size, shuffle, sampler, and drop_last")
            batch_size = None
            drop_last = False
        elif batch_size is None and drop_last:
            raise ValueError(
                "batch_size=None option disables auto-batching and is "
                "mutually exclusive with drop_last")
        if sampler is None:
            if self._iterable:
                sampler = _InfiniteConstantSampler()
            elif shuffle:
                sampler = RandomSampler(dataset, generator=generator)
            else:
                sampler = SequentialSampler(dataset)
        if batch_size is not None and batch_sampler is None:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self.generator = generator
        if collate_fn is None:
            collate_fn = (default_collate if self._auto_collation
                          else default_convert)
        self.collate_fn = collate_fn
        self.persistent_workers = persistent_workers
        self._iterator = None

    @property
    def _auto_collation(self):
        return self.batch_sampler is not None

    @property
    def _index_sampler(self):
        return self.batch_sampler if self._auto_collation else self.sampler

    def _make_fetcher(self):
        kind = _IterableFetcher if self._iterable else _MapFetcher
        return _MakeFetcher(kind, self._auto_collation, self.collate_fn,
                            self.drop_last)

    def __iter__(self):
        if self.num_workers == 0:
            return _SingleProcessIter(self)
        if self.persistent_workers:
            if self._iterator is None:
                self._iterator = _MultiProcessIter(self)
            else:
                self._iterator._reset(self)
            return self._iterator
        return _MultiProcessIter(self)

    def __len__(self):
        if self._iterable:
            n = len(self.dataset)
            if self.batch_size is not None:
                if self.drop_last:
                    return n // self.batch_size
                return -(-n // self.batch_size)
            return n
        return len(self._index_sampler)

    def __del__(self):
        it = self.__dict__.get("_iterator")
        if it is not None:
            it._shutdown_workers()


class _BaseIter:
    def __init__(self, loader):
        self._index_sampler = loader._index_sampler
        self._iterable = loader._iterable
        self._num_yielded = 0
        # drawn with or without workers, so that both consume the
        # generator alike and shuffle identically
        self._base_seed = int(_rng(loader.generator).integers(0, 2 ** 63 - 1))
        self._sampler_iter = iter(self._index_sampler)

    def __iter__(self):
        return self

    def _next_index(self):
        return next(self._sampler_iter)

    def __len__(self):
        return len(self._index_sampler)


class _SingleProcessIter(_BaseIter):
    def __init__(self, loader):
        super().__init__(loader)
        self._fetcher = loader._make_fetcher()(loader.dataset)

    def __next__(self):
        index = self._next_index()
        data = self._fetcher.fetch(index)
        self._num_yielded += 1
        return data


class _MultiProcessIter(_BaseIter):
    def __init__(self, loader):
        super().__init__(loader)
        self._persistent = loader.persistent_workers
        self._num_workers = loader.num_workers
        self._prefetch_factor = loader.prefetch_factor
        self._timeout = loader.timeout
        ctx = loader.multiprocessing_context
        if ctx is None:
            # fork: the dataset is inherited, not pickled (dtorch tensors
            # are not picklable). Forking after CUDA is initialised is safe
            # as long as the workers leave CUDA alone: _worker makes sure
            # they do, with a clear error otherwise (PyTorch's rule)
            methods = multiprocessing.get_all_start_methods()
            ctx = "fork" if "fork" in methods else None
        if ctx is None or isinstance(ctx, str):
            ctx = multiprocessing.get_context(ctx)
        self._data_queue = ctx.Queue()
        self._done_event = ctx.Event()
        self._index_queues = []
        self._workers = []
        self._shutdown = False
        make_fetcher = loader._make_fetcher()
        for i in range(self._num_workers):
            q = ctx.Queue()
            # keep a stuck feeder thread from blocking interpreter exit
            q.cancel_join_thread()
            w = ctx.Process(
                target=_worker.worker_loop,
                args=(make_fetcher, loader.dataset, q, self._data_queue,
                      self._done_event, loader.worker_init_fn,
                      self._base_seed, i, self._num_workers),
                daemon=True)
            w.start()
            self._index_queues.append(q)
            self._workers.append(w)
        self._worker_cycle = itertools.cycle(range(self._num_workers))
        self._reset(loader, first_iter=True)

    def _reset(self, loader, first_iter=False):
        self._sampler_iter = iter(self._index_sampler)
        self._num_yielded = 0
        self._send_idx = 0
        self._rcvd_idx = 0
        self._task_info = {}
        self._tasks_outstanding = 0
        self._workers_status = [True] * self._num_workers
        if not first_iter:
            # new epoch with persistent workers: each acknowledges the
            # resume after any results still queued from the last epoch
            for q in self._index_queues:
                q.put(_worker._ResumeIteration())
            pending = self._num_workers
            while pending > 0:
                idx, _ = self._get_data()
                if isinstance(idx, _worker._ResumeIteration):
                    pending -= 1
        for _ in range(self._prefetch_factor * self._num_workers):
            self._try_put_index()

    def _try_put_index(self):
        try:
            index = self._next_index()
        except StopIteration:
            return
        for _ in range(self._num_workers):
            w = next(self._worker_cycle)
            if self._workers_status[w]:
                break
        else:
            return      # every worker has run out (IterableDataset)
        self._index_queues[w].put((self._send_idx, index))
        self._task_info[self._send_idx] = (w,)
        self._tasks_outstanding += 1
        self._send_idx += 1

    def _try_get_data(self, timeout):
        try:
            blob = self._data_queue.get(timeout=timeout)
            return True, pickle.loads(blob)
        except queue.Empty:
            dead = [w for w in self._workers if not w.is_alive()]
            if dead:
                pids = ", ".join(str(w.pid) for w in dead)
                codes = ", ".join(str(w.exitcode) for w in dead)
                self._shutdown_workers()
                raise RuntimeError(
                    f"DataLoader worker (pid(s) {pids}) exited "
                    f"unexpectedly (exit code(s) {codes})") from None
            return False, None

    def _get_data(self):
        if self._timeout > 0:
            ok, data = self._try_get_data(self._timeout)
            if ok:
                return data
            self._shutdown_workers()
            raise RuntimeError(
                f"DataLoader timed out after {self._timeout} seconds")
        while True:
            ok, data = self._try_get_data(_worker.STATUS_CHECK_INTERVAL)
            if ok:
                return data

    def __next__(self):
        if self._shutdown:
            raise StopIteration
        while True:
            # skip tasks of workers whose IterableDataset has ended
            while self._rcvd_idx < self._send_idx:
                info = self._task_info.get(self._rcvd_idx)
                if info and (len(info) == 2
                             or self._workers_status[info[0]]):
                    break
                self._task_info.pop(self._rcvd_idx, None)
                self._rcvd_idx += 1
            else:
                if not self._persistent:
                    self._shutdown_workers()
                raise StopIteration
            info = self._task_info[self._rcvd_idx]
            if len(info) == 2:          # arrived earlier, out of order
                del self._task_info[self._rcvd_idx]
                self._rcvd_idx += 1
                return self._process(info[1])
            idx, data = self._get_data()
            self._tasks_outstanding -= 1
            if isinstance(data, _worker._IterableDatasetStopIteration):
                self._workers_status[data.worker_id] = False
                self._try_put_index()
                continue
            if idx != self._rcvd_idx:
                self._task_info[idx] += (data,)
                continue
            del self._task_info[idx]
            self._rcvd_idx += 1
            return self._process(data)

    def _process(self, data):
        self._try_put_index()
        if isinstance(data, ExceptionWrapper):
            if not self._persistent:
                self._shutdown_workers()
            data.reraise()
        self._num_yielded += 1
        return _worker.from_payload(data)

    def _shutdown_workers(self):
        """Stop and join every worker; terminate one that does not exit.
        Safe to call more than once."""
        if self._shutdown or not hasattr(self, "_workers"):
            return
        self._shutdown = True
        self._done_event.set()
        for q in self._index_queues:
            try:
                q.put(None)
            except (OSError, ValueError):
                pass
        for w in self._workers:
            w.join(_JOIN_TIMEOUT)
            if w.is_alive():
                w.terminate()
                w.join()
        for q in self._index_queues:
            q.close()
        self._data_queue.cancel_join_thread()
        self._data_queue.close()

    def __del__(self):
        if sys.is_finalizing():
            return
        self._shutdown_workers()
