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
- each worker: its RNG states (Python, NumPy, dtorch) and its dataset
  iterator's position right after its last consumed batch (a dataset or
  iterator with ``state_dict``/``load_state_dict`` is asked; otherwise the
  iterator is fast-forwarded by the samples it had produced), and which
  worker is next in turn.

The state is a nested dict of ints, floats, lists and NumPy arrays, so a
checkpoint can carry it. The main process's own RNG (used by transforms
when ``num_workers=0``) is the training script's to save, as in PyTorch.
"""
import itertools
import multiprocessing
import select
import socket
import sys
import time
import warnings

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
    def __init__(self, dataset, auto_collation, collate_fn, drop_last,
                 state=None):
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

    def state(self):
        return None


class _IterableFetcher:
    """Pulls samples from ``iter(dataset)``; its ``state`` is the
    iterator's (or dataset's) own ``state_dict`` when it has one, else
    the number of samples pulled so far."""

    def __init__(self, dataset, auto_collation, collate_fn, drop_last,
                 state=None):
        self.dataset = dataset
        self.auto_collation = auto_collation
        self.collate_fn = collate_fn
        self.drop_last = drop_last
        self.ended = False
        self.pulled = 0
        kind = state and state["kind"]
        if kind == "dataset":
            dataset.load_state_dict(state["state"])
        self.it = iter(dataset)
        if kind == "iterator":
            self.it.load_state_dict(state["state"])
        elif kind == "count":
            for _ in range(int(state["state"])):
                try:
                    next(self.it)
                except StopIteration:
                    break
                self.pulled += 1
        if state is not None and state.get("ended"):
            self.ended = True

    def _next(self):
        item = next(self.it)
        self.pulled += 1
        return item

    def fetch(self, index):
        if self.ended:
            raise StopIteration
        if not self.auto_collation:
            try:
                return self.collate_fn(self._next())
            except StopIteration:
                self.ended = True
                raise
        data = []
        for _ in index:
            try:
                data.append(self._next())
            except StopIteration:
                self.ended = True
                break
        if not data or (self.ended and self.drop_last):
            raise StopIteration
        return self.collate_fn(data)

    def state(self):
        if hasattr(self.it, "state_dict"):
            s = {"kind": "iterator", "state": self.it.state_dict()}
        elif hasattr(self.dataset, "state_dict"):
            s = {"kind": "dataset", "state": self.dataset.state_dict()}
        else:
            s = {"kind": "count", "state": self.pulled}
        s["ended"] = self.ended
        return s


class _MakeFetcher:
    """Builds the fetcher inside each worker (picklable for spawn)."""

    def __init__(self, kind, auto_collation, collate_fn, drop_last):
        self.kind = kind
        self.args = (auto_collation, collate_fn, drop_last)

    def __call__(self, dataset, state=None):
        return self.kind(dataset, *self.args, state=state)


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
        module's documentation. A plain nested dict."""
        if self._pending_state is not None:
            return self._pending_state
        if self._last is None:
            return {"_iterator_finished": True, "_num_yielded": 0}
        return self._last.state_dict()

    def load_state_dict(self, state_dict):
        """Make the next ``iter(self)`` continue where ``state_dict``
        left off (a finished epoch's state starts the next epoch of the
        uninterrupted run)."""
        if not isinstance(state_dict, dict) or \
                "_iterator_finished" not in state_dict:
            raise ValueError("not a DataLoader state_dict (no "
                             "'_iterator_finished' key)")
        nxt = state_dict.get("_next_pass")
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


class _LastIterator:
    """The loader's view of its latest iterator: a weak reference (a
    loader must not keep non-persistent workers alive), with the state the
    iterator leaves behind when it is collected or finished."""

    def __init__(self, it):
        import weakref
        self.ref = weakref.ref(it)
        self.final = None
        it._last_box = self

    def state_dict(self):
        it = self.ref()
        if it is not None:
            return it.state_dict()
        return self.final


def _consumed_sampler(s):
    """The sampler that resumes by samples consumed (DistributedSampler,
    maybe inside a BatchSampler), or None."""
    if isinstance(s, BatchSampler) and not getattr(
            s, "_resume_by_consumed", False):
        s = s.sampler
    return s if getattr(s, "_resume_by_consumed", False) else None


def _next_pass(stateful, consumed_sampler, generator, workers_kept):
    """Where the pass after a finished one starts: the sampler's state (a
    DistributedSampler: its epoch from the start; set_epoch moves on),
    the loader's generator (which draws the workers' base seed), and
    whether persistent workers go on with their RNG streams."""
    if consumed_sampler is not None:
        st = dict(consumed_sampler.state_dict(consumed=0), consumed=0)
    else:
        get = getattr(stateful, "state_dict", None)
        st = get() if get is not None else None
    return {"sampler": _plain(st),
            "generator": None if generator is None
            else _plain(generator.get_state()),
            "workers_kept": workers_kept}


def _plain(obj):
    """Deep copy of a state made of dicts, lists, tuples and leaves."""
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if hasattr(obj, "copy") and hasattr(obj, "dtype"):
        return obj.copy()
    return obj


def _batch_len(index):
    try:
        return len(index)
    except TypeError:
        return 1


class _BaseIter:
    def __init__(self, loader, resume=None):
        self._dataset = loader.dataset
        self._index_sampler = loader._index_sampler
        self._stateful = loader._stateful_sampler
        self._iterable = loader._iterable
        self._num_workers = loader.num_workers
        self._pin = loader.pin_memory
        self._pin_device = loader.pin_memory_device
        self._last_box = None
        self._generator = loader.generator
        self._next = None         # a finished pass: where the next starts
        self._last_worker = -1
        self._finished = False
        self._keep = _keeps_workers(loader, resume)
        if resume is not None and (not resume.get("_iterator_finished")
                                   or self._keep):
            # drawn, not loaded, would consume the generator once more
            self._base_seed = int(resume["_base_seed"])
        else:
            # drawn with or without workers, so that both consume the
            # generator alike and shuffle identically
            self._base_seed = int(
                _rng(loader.generator).integers(0, 2 ** 63 - 1))
        self._start_pass(resume)

    def _by_consumed(self):
        return _consumed_sampler(self._stateful) is not None

    def _consumed_sampler(self):
        return _consumed_sampler(self._stateful)

    def _start_pass(self, resume):
        """A new pass over the sampler: from its start, or from where a
        loaded state left it."""
        self._num_yielded = 0
        self._samples_in_pass = 0
        skip = 0
        if resume is not None and not resume.get("_iterator_finished"):
            state = resume.get("_sampler_state")
            if self._by_consumed():
                if state is not None:
                    self._consumed_sampler().load_state_dict(state)
                self._sampler_start = None
            else:
                if state is not None:
                    self._stateful.load_state_dict(state)
                self._sampler_start = state
                skip = int(resume.get("_sampler_skip", 0))
            self._num_yielded = int(resume["_num_yielded"])
        elif self._by_consumed():
            self._sampler_start = None
        else:
            get = getattr(self._stateful, "state_dict", None)
            self._sampler_start = _plain(get()) if get is not None else None
        self._sampler_iter = iter(self._index_sampler)
        if not self._iterable:
            for _ in range(skip):
                try:
                    next(self._sampler_iter)
                except StopIteration:
                    break

    def __iter__(self):
        return self

    def _next_index(self):
        return next(self._sampler_iter)

    def __len__(self):
        return len(self._index_sampler)

    def _pin_batch(self, data):
        if self._pin:
            return _pin_memory(data, self._pin_device)
        return data

    def _sampler_state(self):
        if self._iterable:
            return None, 0
        if self._by_consumed():
            s = self._consumed_sampler()
            return _plain(s.state_dict(consumed=self._samples_in_pass)), 0
        return _plain(self._sampler_start), self._num_yielded

    def state_dict(self):
        sampler_state, skip = self._sampler_state()
        state = {"_num_yielded": self._num_yielded,
                "_sampler_state": sampler_state,
                "_sampler_skip": skip,
                "_base_seed": self._base_seed,
                "_iterator_finished": self._finished,
                "_num_workers": self._num_workers,
                "_last_yielded_worker_id": self._last_worker,
                "_worker_snapshots": self._snapshots(),
                "_workers_done": self._done_flags()}
        if self._finished and self._next is not None:
            state["_next_pass"] = self._next
        return state

    def _finish(self):
        self._finished = True
        if not self._iterable:
            # taken now, whether or not anyone asks for a state: a seed a
            # sampler draws for the next pass is then drawn at the same
            # point of the run either way
            self._next = _next_pass(
                self._stateful, self._consumed_sampler(), self._generator,
                bool(getattr(self, "_persistent", False)))
        self._leave_state()

    def _leave_state(self):
        box = self._last_box
        if box is not None and box.ref() is self:
            box.final = self.state_dict()


def _loads_all(dataset):
    return getattr(dataset, "_loads_all_worker_states", False)


def _keeps_workers(loader, resume):
    """A finished pass of persistent workers, loaded into a loader like
    it: the next pass keeps the workers' base seed and RNG streams, as the
    uninterrupted run's persistent workers do (not their positions)."""
    return (resume is not None and resume.get("_iterator_finished")
            and (resume.get("_next_pass") or {}).get("workers_kept", False)
            and loader.persistent_workers
            and int(resume.get("_num_workers", 0)) == loader.num_workers)


def _worker_resumes(dataset, resume, num_workers, keep=False):
    """What each of ``num_workers`` workers (1 for the main process)
    restores from a loaded state: its RNG and its fetcher's state
    (``keep``: its RNG only, see _keeps_workers)."""
    n = max(num_workers, 1)
    if keep:
        return [{"fetcher": None, "rng": _worker.rng_from_plain(s["rng"])}
                if s is not None and s.get("rng") is not None else None
                for s in (resume.get("_worker_snapshots") or [None] * n)]
    if resume is None or resume.get("_iterator_finished"):
        return [None] * n
    snaps = resume.get("_worker_snapshots") or []
    old = max(int(resume.get("_num_workers", 0)), 1)
    same = old == n
    fetchers = [s and s.get("fetcher") for s in snaps]
    if _loads_all(dataset) and any(f is not None for f in fetchers):
        kind = next(f["kind"] for f in fetchers if f is not None)
        merged = {"kind": kind, "state": {"workers": [
            f and f["state"] for f in fetchers]}}
        out = []
        for i in range(n):
            f = fetchers[i] if same and i < len(fetchers) else None
            out.append({"fetcher": dict(merged,
                                        ended=bool(f and f.get("ended"))),
                        "rng": None})
    elif same:
        out = [{"fetcher": fetchers[i] if i < len(fetchers) else None,
                "rng": None} for i in range(n)]
    elif any(f is not None for f in fetchers):
        raise ValueError(
            f"DataLoader state was saved with {old} dataset iterator(s) "
            f"(num_workers={resume.get('_num_workers')}); this loader has "
            f"{n}, and {type(dataset).__name__} cannot re-split its "
            "position (give it _loads_all_worker_states, or resume with "
            "the same num_workers)")
    else:
        out = [{"fetcher": None, "rng": None} for _ in range(n)]
    if same and num_workers > 0:
        for i, s in enumerate(snaps[:n]):
            if s is not None and s.get("rng") is not None:
                out[i]["rng"] = _worker.rng_from_plain(s["rng"])
    elif num_workers > 0 and int(resume.get("_num_workers", 0)) > 0:
        warnings.warn("DataLoader resumed with a different num_workers: the "
                      "order of samples is restored, the workers' random "
                      "states start afresh")
    return out


class _SingleProcessIter(_BaseIter):
    def __init__(self, loader, resume=None):
        super().__init__(loader, resume)
        r = _worker_resumes(loader.dataset, resume, 0)[0]
        self._fetcher = loader._make_fetcher()(loader.dataset,
                                               r and r["fetcher"])

    def __next__(self):
        try:
            index = self._next_index()
            data = self._fetcher.fetch(index)
        except StopIteration:
            self._finish()
            raise
        self._num_yielded += 1
        self._samples_in_pass += _batch_len(index)
        return self._pin_batch(data)

    def _snapshots(self):
        return [{"rng": None, "fetcher": _plain(self._fetcher.state())}]

    def _done_flags(self):
        return [bool(getattr(self._fetcher, "ended", False))]

    def __del__(self):
        if not sys.is_finalizing():
            self._leave_state()


class _MultiProcessIter(_BaseIter):
    # until the workers exist (a failed __init__ still meets __del__)
    _shutdown = True
    _workers = ()
    _socks = ()
    _outbox = ()

    def __init__(self, loader, resume=None):
        super().__init__(loader, resume)
        self._persistent = loader.persistent_workers
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
        n = self._num_workers
        resumes = _worker_resumes(loader.dataset, resume, n, self._keep)
        self._workers = []
        self._shutdown = False
        pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
                 for _ in range(n)]
        self._outbox = [bytearray() for _ in range(n)]
        self._socks = [p[0] for p in pairs]
        make_fetcher = loader._make_fetcher()
        try:
            for i in range(n):
                others = [s for j, p in enumerate(pairs) for s in p
                          if s is not pairs[i][1]]
                w = ctx.Process(
                    target=_worker.worker_loop,
                    args=(make_fetcher, loader.dataset, pairs[i][1], others,
                          loader.worker_init_fn, self._base_seed, i, n,
                          resumes[i]),
                    daemon=True)
                w.start()
                self._workers.append(w)
        finally:
            for p in pairs:
                p[1].close()
            if len(self._workers) < n:
                self._shutdown_workers()
        self._reset(loader, first_iter=True, resume=resume,
                    resumes=resumes)

    def _reset(self, loader, first_iter=False, resume=None, resumes=None):
        if not first_iter:
            self._finished = False
            self._start_pass(resume)
            resumes = _worker_resumes(loader.dataset, resume,
                                      self._num_workers,
                                      _keeps_workers(loader, resume))
        n = self._num_workers
        self._send_idx = 0
        self._rcvd_idx = 0
        self._task_info = {}
        self._tasks_outstanding = 0
        self._workers_status = [True] * n
        if first_iter or not hasattr(self, "_snaps"):
            self._snaps = [None] * n
        else:
            # a new pass: keep each worker's RNG, forget its old position
            self._snaps = [s and {"rng": s["rng"], "fetcher": None}
                           for s in self._snaps]
        for i, r in enumerate(resumes):
            if r is not None and r.get("rng") is not None:
                self._snaps[i] = {"rng": r["rng"], "fetcher": r["fetcher"]}
            elif r is not None and r.get("fetcher") is not None:
                old = self._snaps[i]
                self._snaps[i] = {"rng": old and old["rng"],
                                  "fetcher": r["fetcher"]}
        start = 0
        if resume is not None and not resume.get("_iterator_finished"):
            start = (int(resume.get("_last_yielded_worker_id", -1)) + 1) % n
            done = resume.get("_workers_done") or []
            if len(done) == n:
                self._workers_status = [not bool(d) for d in done]
            self._last_worker = int(resume.get("_last_yielded_worker_id",
                                               -1))
        else:
            self._last_worker = -1
        self._worker_cycle = itertools.cycle(
            list(range(start, n)) + list(range(start)))
        if not first_iter:
            # new pass with persistent workers: each acknowledges the
            # resume after any results still queued from the last pass
            epoch = getattr(self._dataset, "epoch", None) if hasattr(
                self._dataset, "set_epoch") else None
            for i in range(n):
                self._post(i, _worker._ResumeIteration(resumes[i], epoch))
            for i in range(n):
                while True:
                    msg, fds = self._recv_from(i)
                    for fd in fds:
                        _sock_close_fd(fd)
                    if isinstance(msg[0], _worker._ResumeIteration):
                        break
                    if msg[2] is not None and (
                            resumes[i] is None or resumes[i]["rng"] is None):
                        # a batch of the abandoned pass: the worker's RNG
                        # moved on with it
                        self._snaps[i] = {"rng": msg[2][0], "fetcher": None}
        for _ in range(self._prefetch_factor * n):
            self._try_put_index()

    def _try_put_index(self):
        if self._shutdown:
            return
        for _ in range(self._num_workers):
            w = next(self._worker_cycle)
            if self._workers_status[w]:
                break
        else:
            return      # every worker has run out (IterableDataset)
        try:
            index = self._next_index()
        except StopIteration:
            return
        self._post(w, (self._send_idx, index))
        self._task_info[self._send_idx] = (w, _batch_len(index))
        self._tasks_outstanding += 1
        self._send_idx += 1

    def _worker_died(self, w):
        proc = self._workers[w]
        proc.join(_JOIN_TIMEOUT)
        pid, code = proc.pid, proc.exitcode
        self._shutdown_workers()
        raise RuntimeError(f"DataLoader worker (pid(s) {pid}) exited "
                           f"unexpectedly (exit code(s) {code})") from None

    # The main process never blocks sending to a worker: a worker blocked
    # sending its batch is not reading, so a blocking send of a large
    # index list could wait on it forever. Messages wait in an outbox,
    # written as the sockets take them while waiting for results.
    def _post(self, w, msg):
        self._outbox[w] += _worker.frame(msg)
        self._flush(w)

    def _flush(self, w):
        box = self._outbox[w]
        sock = self._socks[w]
        # non-blocking mode: with a timeout set, a send that would block
        # waits for it, then raises TimeoutError mid-message
        sock.settimeout(0.0)
        while box:
            try:
                sent = sock.send(box)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:        # the worker has gone: _recv_from says
                box.clear()
                return
            del box[:sent]

    def _wait_readable(self, w, limit):
        """Flush outboxes until worker ``w`` has something to read; False
        after ``limit`` seconds."""
        sock = self._socks[w]
        deadline = time.monotonic() + limit
        while True:
            pending = [i for i, b in enumerate(self._outbox) if b]
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            readable, writable, _ = select.select(
                [sock], [self._socks[i] for i in pending], [], left)
            for i in pending:
                if self._socks[i] in writable:
                    self._flush(i)
            if readable:
                return True

    def _recv_from(self, w):
        """The next message from worker ``w`` (its results come in the
        order of its tasks)."""
        sock = self._socks[w]
        limit = self._timeout if self._timeout > 0 else \
            _worker.STATUS_CHECK_INTERVAL
        while True:
            try:
                if not self._wait_readable(w, limit):
                    raise socket.timeout
                sock.settimeout(limit)
                return _worker.recv(sock)
            except socket.timeout:
                if self._timeout > 0:
                    self._shutdown_workers()
                    raise RuntimeError(
                        f"DataLoader timed out after {self._timeout} "
                        "seconds") from None
                if not self._workers[w].is_alive():
                    self._worker_died(w)
            except (_worker.ChannelClosed, ConnectionResetError):
                self._worker_died(w)

    def __next__(self):
        if self._shutdown:
            raise StopIteration
        while True:
            # skip tasks of workers whose IterableDataset has ended
            while self._rcvd_idx < self._send_idx:
                w, _ = self._task_info[self._rcvd_idx]
                if self._workers_status[w]:
                    break
                del self._task_info[self._rcvd_idx]
                self._tasks_outstanding -= 1
                self._rcvd_idx += 1
            else:
                self._finish()
                if not self._persistent:
                    self._shutdown_workers()
                raise StopIteration
            w, size = self._task_info.pop(self._rcvd_idx)
            self._rcvd_idx += 1
            self._tasks_outstanding -= 1
            (idx, data, state), fds = self._recv_from(w)
            assert idx == self._rcvd_idx - 1, (idx, self._rcvd_idx)
            if isinstance(data, _worker._IterableDatasetStopIteration):
                self._workers_status[w] = False
                self._try_put_index()
                continue
            return self._process(w, size, data, state, fds)

    def _process(self, w, size, data, state, fds):
        try:
            batch = _worker.from_payload(data, fds)
        finally:
            self._try_put_index()
        if isinstance(batch, ExceptionWrapper):
            if not self._persistent:
                self._shutdown_workers()
            batch.reraise()
        if state is not None:
            self._snaps[w] = {"rng": state[0], "fetcher": state[1]}
        self._last_worker = w
        self._num_yielded += 1
        self._samples_in_pass += size
        return self._pin_batch(batch)

    def _snapshots(self):
        out = []
        for s in self._snaps:
            if s is None:
                out.append(None)
                continue
            rng = s["rng"]
            if rng is not None and not isinstance(rng, dict):
                rng = _worker.rng_to_plain(rng)
            out.append({"rng": _plain(rng), "fetcher": _plain(s["fetcher"])})
        return out

    def _done_flags(self):
        return [not s for s in self._workers_status]

    def _shutdown_workers(self):
        """Stop and join every worker; terminate one that does not exit.
        Safe to call more than once."""
        if self._shutdown:
            return
        self._shutdown = True
        for sock in self._socks:
            if not self._outbox[self._socks.index(sock)]:
                try:        # a polite stop; closing the socket suffices
                    sock.send(_worker.frame(None), socket.MSG_DONTWAIT)
                except OSError:
                    pass
            # a worker waiting on the socket sees its end close, one
            # blocked sending a batch gets EPIPE; undelivered batches'
            # shared memory is freed with the socket
            sock.close()
        for w in self._workers:
            w.join(_JOIN_TIMEOUT)
            if w.is_alive():
                w.terminate()
                w.join()

    def __del__(self):
        if sys.is_finalizing():
            return
        if not self._shutdown:
            self._leave_state()
        self._shutdown_workers()


def _sock_close_fd(fd):
    import os
    os.close(fd)


def _pin_memory(data, device=""):
    """``pin_memory=True``: CPU tensors copied into page-locked host memory
    (CuPy's pinned allocator) so that a later ``.cuda()`` copies fast and
    asynchronously; without CuPy (no GPU) a no-op, as PyTorch's is
    without CUDA."""
    from ... import _backend as B
    cp = B._load_cupy()
    if cp is None:
        return data
    return _pin_nested(data, cp)


def _pin_nested(obj, cp):
    import numpy as np

    from ...tensor import Tensor
    if isinstance(obj, Tensor):
        a = obj._data
        if not isinstance(a, np.ndarray) or a.nbytes == 0:
            return obj
        mem = cp.cuda.alloc_pinned_memory(a.nbytes)
        pinned = np.frombuffer(mem, a.dtype, a.size).reshape(a.shape)
        pinned[...] = a
        t = Tensor._wrap(pinned)
        if obj.requires_grad:
            t.requires_grad_(True)
        return t
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(_pin_nested(o, cp) for o in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_pin_nested(o, cp) for o in obj)
    if isinstance(obj, dict):
        return {k: _pin_nested(v, cp) for k, v in obj.items()}
    return obj
