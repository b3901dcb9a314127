"""``DataLoader``: batches from a dataset, in the main process or in
worker processes, with PyTorch's options and ordering guarantees, and
torchdata's ``StatefulDataLoader`` resumption (``state_dict`` /
``load_state_dict``).

With ``num_workers > 0`` each worker has its own socket to the main
process; the main process keeps ``prefetch_factor`` batches per worker in
flight, sends batch ``k`` to the next live worker in turn and reads the
results in that same order, so batches come out in sampler order. Arrays
travel in shared memory (see ``_worker``). Workers are seeded with
``base_seed + worker_id`` (``base_seed`` drawn from the loader's
generator), so with a seeded generator the batches equal those of
``num_workers=0``. Worker errors come back with the worker's traceback;
workers are joined (never left as zombies) when the iterator is exhausted,
deleted or fails.

Resumption. ``loader.state_dict()`` describes the most recent iterator
just after the last batch it handed out; ``load_state_dict`` makes the
next ``iter(loader)`` continue from there, so a resumed run sees exactly
the batches the uninterrupted run would have seen:

- the sampler: its state at the start of the pass plus the number of
  batches consumed (replayed over indices only, no data is read), or, for
  ``DistributedSampler``, the samples consumed, which re-partitions the
  rest onto another world size;
- the loader's ``generator``: its state as the pass started (after the
  base seed, which is loaded, not drawn again); draws a script makes from
  it itself are the script's to restore;
- each worker: its RNG states (Python, NumPy, dtorch) and its dataset
  iterator's position right after its last consumed batch (a dataset or
  iterator with ``state_dict``/``load_state_dict`` is asked; otherwise the
  iterator is fast-forwarded by the samples it had produced), and which
  worker is next in turn.

The state has the same keys whatever the run (a fresh loader's too), each
an int, a bool, None or a string: the parts whose shape depends on the
run (sampler, workers, next pass) are one JSON string each, so any
checkpoint carries it, ``dcp.load`` into a fresh loader's state included
(see ``_state``). The main process's own RNG (used by transforms
when ``num_workers=0``) is the training script's to save, as in PyTorch.
"""
from ._collate import default_collate, default_convert
from ._fetch import _InfiniteConstantSampler, _IterableFetcher, \
    _MakeFetcher, _MapFetcher
from ._iter import _consumed_sampler, _LastIterator, _SingleProcessIter
from ._mp_iter import _MultiProcessIter
from ._state import fresh_state, pack, unpack
from ._worker import ExceptionWrapper, get_worker_info  # noqa: F401
from .dataset import IterableDataset
from .sampler import (BatchSampler, RandomSampler, SequentialSampler)

__all__ = ["DataLoader", "get_worker_info"]


class DataLoader:
    """Iterate over ``dataset`` in batches, as ``torch.utils.data
    .DataLoader``, resumable mid-epoch as torchdata's
    ``StatefulDataLoader``.

    Example::

        loader = DataLoader(TensorDataset(x, y), batch_size=32,
                            shuffle=True, num_workers=2)
        for step, (xb, yb) in enumerate(loader):
            ...
            if step == 100:
                ckpt = {"loader": loader.state_dict(), ...}
        # later, in a new process
        loader.load_state_dict(ckpt["loader"])
        for xb, yb in loader:      # continues with batch 101
            ...

    ``in_order=False`` is accepted and changes nothing: batches always
    come in the sampler's order, which PyTorch's out-of-order mode allows.
    """

    def __init__(self, dataset, batch_size=1, shuffle=None, sampler=None,
                 batch_sampler=None, num_workers=0, collate_fn=None,
                 pin_memory=False, drop_last=False, timeout=0,
                 worker_init_fn=None, multiprocessing_context=None,
                 generator=None, *, prefetch_factor=None,
                 persistent_workers=False, pin_memory_device="",
                 in_order=True):
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
        if num_workers > 0 and prefetch_factor == 0:
            # PyTorch asserts this when iterating; nothing in flight would
            # end every epoch at once
            raise ValueError("prefetch_factor must be greater than 0 for "
                             "MultiProcessingDataLoaderIter")
        if persistent_workers and num_workers == 0:
            raise ValueError("persistent_workers option needs num_workers > 0")
        self.dataset = dataset
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor
        self.pin_memory = pin_memory
        self.pin_memory_device = pin_memory_device
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = multiprocessing_context
        # in_order=False lets PyTorch yield batches as workers finish them;
        # batches here always come in the sampler's order, one of the
        # orders that allows, so it changes nothing (docstring)
        self.in_order = in_order
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
        self._user_batch_sampler = batch_sampler is not None
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
        self._iterator = None          # the persistent-workers iterator
        self._last = None              # the latest iterator (weakly)
        self._pending_state = None     # from load_state_dict

    @property
    def _auto_collation(self):
        return self.batch_sampler is not None

    @property
    def _index_sampler(self):
        return self.batch_sampler if self._auto_collation else self.sampler

    @property
    def _stateful_sampler(self):
        """The sampler whose state decides the order: a user's batch
        sampler, else the (unbatched) sampler."""
        return (self.batch_sampler if self._user_batch_sampler
                else self.sampler)

    def _make_fetcher(self):
        kind = _IterableFetcher if self._iterable else _MapFetcher
        return _MakeFetcher(kind, self._auto_collation, self.collate_fn,
                            self.drop_last)

    def __iter__(self):
        resume, self._pending_state = self._pending_state, None
        if self.num_workers == 0:
            it = _SingleProcessIter(self, resume)
        elif self.persistent_workers:
            if self._iterator is None:
                self._iterator = _MultiProcessIter(self, resume)
            else:
                self._iterator._reset(self, resume=resume)
            it = self._iterator
        else:
            it = _MultiProcessIter(self, resume)
        self._last = _LastIterator(it)
        return it

    def __len__(self):
        if self._iterable:
            n = len(self.dataset)
            if self.batch_size is not None:
                if self.drop_last:
                    return n // self.batch_size
                return -(-n // self.batch_size)
            return n
        return len(self._index_sampler)

    # --------------------------------------------------- resumability --
    def state_dict(self):
        """The position of the latest iterator after the last batch it
        handed out (a fresh loader's: the start of an epoch); see the
        module's documentation. A dict with the same keys in every state
        (a fresh loader's too), of ints, bools, None and strings."""
        if self._pending_state is not None:
            state = self._pending_state
        elif self._last is None:
            state = fresh_state(self.num_workers)
        else:
            state = self._last.state_dict()
        return pack(state)

    def load_state_dict(self, state_dict):
        """Make the next ``iter(self)`` continue where ``state_dict``
        left off (a finished epoch's state starts the next epoch of the
        uninterrupted run). A state that lacks keys is refused, naming
        them."""
        state_dict = unpack(state_dict)
        nxt = state_dict["_next_pass"]
        if state_dict["_iterator_finished"] and nxt is not None:
            # now, not at iter(): a set_epoch called after this still wins
            s = _consumed_sampler(self._stateful_sampler) or \
                self._stateful_sampler
            if nxt["sampler"] is not None:
                s.load_state_dict(nxt["sampler"])
            if nxt["generator"] is not None and self.generator is not None:
                self.generator.set_state(nxt["generator"])
        self._pending_state = state_dict

    def __del__(self):
        it = self.__dict__.get("_iterator")
        if it is not None:
            it._shutdown_workers()
