"""The DataLoader's iterator in the main process (``num_workers=0``), the
part every iterator shares (the pass over the sampler, the state it
reports, pinning), and what a loaded state gives back to each worker."""
import sys
import warnings

from ...random import _rng
from . import _worker
from .sampler import BatchSampler


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
            gen = resume.get("_generator_state")
            if gen is not None and self._generator is not None:
                # its base-seed draw is loaded, not made: without this the
                # generator would end the pass one draw behind
                self._generator.set_state(gen)
        elif self._by_consumed():
            self._sampler_start = None
        else:
            get = getattr(self._stateful, "state_dict", None)
            self._sampler_start = _plain(get()) if get is not None else None
        # the loader's generator as the pass starts (after the base seed,
        # before the sampler draws from it): a mid-pass state restores it
        self._generator_start = None if self._generator is None \
            else _plain(self._generator.get_state())
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
                "_generator_state": self._generator_start,
                "_iterator_finished": self._finished,
                "_num_workers": self._num_workers,
                "_last_yielded_worker_id": self._last_worker,
                "_worker_snapshots": self._snapshots(),
                "_workers_done": self._done_flags(),
                "_next_pass": self._next if self._finished else None}
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
