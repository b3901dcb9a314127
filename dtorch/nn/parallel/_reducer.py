"""DDP's gradient reducer: buckets, the order they launch in, and the two
ways a bucket is reduced.

``Reducer`` packs the trainable parameters, in reverse registration order
(the order backward produces their gradients), into buckets of one dtype
and device; ``mark_ready`` counts a bucket's gradients and hands a full
bucket to the communication thread, in bucket order on every rank;
``finish`` waits for the buckets and writes the results back.

How a bucket is reduced is a strategy chosen per step (the same on every
rank, since all ranks must issue the same collectives):

- ``CoalescedReduction`` (the default): one ``all_reduce_coalesced(grads,
  AVG)`` over the ``p.grad`` tensors themselves. Backends that reduce from
  and into the arrays (MPI on one host, through shared memory) make no
  copies at all; the others pack and unpack once.
- ``HookReduction`` (a communication hook, or ``join()``): gradients are
  copied into the bucket's flat buffer as they arrive, the hook gets that
  buffer as a ``GradBucket``, and its result is written back.

All communication goes through ``dtorch.distributed``'s public API.
"""
import time

from ... import distributed as dist
from ...futures import Future
from ...tensor import Tensor
from ..._backend import device_of
from ._comm_thread import _CommThread

# As PyTorch: the first bucket (the last layers, whose gradients arrive
# first) is capped at 1 MiB so that communication starts early.
_FIRST_BUCKET_BYTES = 1024 * 1024


class GradBucket:
    """A bucket handed to communication hooks (PyTorch's ``GradBucket``)."""

    def __init__(self, index, flat, params, offsets):
        self._index = index
        self._flat = flat             # the flat gradient array
        self._params = params
        self._offsets = offsets

    def index(self):
        return self._index

    def buffer(self):
        return Tensor._wrap(self._flat)

    def parameters(self):
        return list(self._params)

    def gradients(self):
        return [Tensor._wrap(self._flat[o:o + p.numel()].reshape(p.shape))
                for p, o in zip(self._params, self._offsets)]

    def is_last(self):
        return self._index == 0


def _allreduce_hook(group, bucket):
    """The sum over ranks (DDP averages while writing back). A normal step
    does not call it (``CoalescedReduction`` reduces the gradients in
    place instead); it runs when ranks shadow each other in ``join()``.

    Reductions run on DDP's communication thread; the blocking call
    releases the GIL, so backward goes on computing meanwhile. Measured on
    2 cores with Open MPI (MLP 784-1024-1024-10, per-rank batch 256, paired
    steps): a blocking MPI call gave weak-scaling efficiency 0.80-0.86; a
    nonblocking one tested every 50 us gave only 0.69-0.71, because a large
    reduction then progresses only once per test. What helps is a wait that
    sleeps and a transfer driven by the rank itself: `collectives.shm_reduce`.
    """
    t = bucket.buffer()
    dist.all_reduce(t, group=group)
    fut = Future()
    fut.set_result(t)
    return fut


class _Bucket:
    __slots__ = ("index", "params", "offsets", "flat", "pending", "ready",
                 "future", "dtype", "xp")

    def __init__(self, index, params, xp, dtype):
        self.index = index
        self.params = params
        self.offsets = []
        n = 0
        for p in params:
            self.offsets.append(n)
            n += p.numel()
        self.xp, self.dtype = xp, dtype
        self.flat = xp.zeros(n, dtype)
        self.pending = len(params)
        self.ready = set()
        self.future = None

    def reset(self):
        self.pending = len(self.params)
        self.ready = set()
        self.future = None


def _is_view_of(a, base):
    return a is base or getattr(a, "base", None) is base


def _write_back(b, scale, as_bucket_view):
    """The reduced flat buffer (times ``scale``) into the parameters'
    gradients: in place, as a view of the buffer, or as a new tensor."""
    xp = b.xp
    for p, off in zip(b.params, b.offsets):
        n = p._data.size
        view = b.flat[off:off + n].reshape(p._data.shape)
        g = p._grad
        is_view = g is not None and _is_view_of(g._data, b.flat)
        if is_view or as_bucket_view:
            if scale is not None:
                view *= scale
            if is_view:
                g._bump_version()
            else:
                p._grad = Tensor._wrap(view)
        elif g is None:
            p._grad = Tensor._wrap(view * scale if scale is not None
                                   else view.copy())
        else:
            if scale is not None:
                xp.multiply(view, scale, out=g._data)
            else:
                g._data[...] = view
            g._bump_version()


class CoalescedReduction:
    """Reduce each bucket's gradients where they are: one
    ``all_reduce_coalesced(grads, AVG)`` per bucket."""

    def __init__(self, group):
        self.group = group

    def gradient_ready(self, b, j, p, zero):
        # a parameter without a gradient takes part with zeros and gets
        # the average, as in HookReduction
        g = p._grad
        if g is None:
            p._grad = Tensor._wrap(b.xp.zeros(p._data.shape, b.dtype))
        elif zero:
            g._data[...] = 0

    def work(self, b):
        """What the communication thread runs for bucket ``b``."""
        grads = [p._grad for p in b.params]
        if not all(type(t._data) is type(b.flat) and t._data.dtype == b.dtype
                   and t._data.flags.c_contiguous for t in grads):
            # a gradient the backend cannot use in place: reduce the packed
            # copy instead (the same collective, bitwise)
            for t, off in zip(grads, b.offsets):
                b.flat[off:off + t._data.size] = t._data.reshape(-1)
            grads = [Tensor._wrap(b.flat)]
        group = self.group

        def run():
            dist.all_reduce_coalesced(grads, op=dist.ReduceOp.AVG,
                                      group=group)
            return grads
        return run

    def finish(self, b, result, as_bucket_view):
        if result[0]._data is b.flat:
            _write_back(b, None, as_bucket_view)    # the packed fallback
        # else: reduced in place (all_reduce_coalesced bumped the versions)


class HookReduction:
    """Reduce each bucket's flat buffer with ``hook(state, GradBucket)``."""

    def __init__(self, group, hook, state):
        self.group, self.hook, self.state = group, hook, state

    def gradient_ready(self, b, j, p, zero):
        g = p._grad
        off, n = b.offsets[j], p._data.size
        view = b.flat[off:off + n]
        if zero or g is None:
            view[...] = 0
        elif not _is_view_of(g._data, b.flat):
            view[...] = g._data.reshape(-1)

    def work(self, b):
        bucket = GradBucket(b.index, b.flat, b.params, b.offsets)
        hook, state = self.hook, self.state
        return lambda: hook(state, bucket).wait()

    def finish(self, b, result, as_bucket_view):
        flat = result._data if isinstance(result, Tensor) else result
        if flat is not b.flat:
            b.flat[...] = flat
        # the default hook leaves sums: average while writing back
        scale = 1.0 / dist.get_world_size(self.group) \
            if self.hook is _allreduce_hook else None
        _write_back(b, scale, as_bucket_view)


class Reducer:
    """The buckets of one DDP model and their reduction (see the module
    docstring). ``stats``: seconds spent reducing buckets (communication
    thread) and waiting for them at the end of backward (main thread);
    1 - wait/comm is the share of communication hidden behind backward."""
    # DTORCH_TIMELINE: the rank's timeline (set by DDP), and when each
    # bucket of this step became ready (perf_counter_ns)
    _tl = None

    def __init__(self, params, names, group, bucket_cap_mb):
        self.params, self.names, self.group = params, names, group
        self.buckets = self._build(params, bucket_cap_mb)
        self.where = {id(p): (b, j) for b in self.buckets
                      for j, p in enumerate(b.params)}
        self.comm = _CommThread(f"ddp-comm-r{dist.get_rank(group)}")
        self.stats = {"comm_s": 0.0, "wait_s": 0.0, "buckets": 0}
        self.strategy = None
        self._next = 0
        self._ready_ns = {}

    @staticmethod
    def _build(params, bucket_cap_mb):
        cap = int(bucket_cap_mb * 1024 * 1024)
        first_cap = min(cap, _FIRST_BUCKET_BYTES)
        groups, cur, size, key = [], [], 0, None
        for p in reversed(params):
            k = (type(p._data), p._data.dtype)
            nbytes = p._data.nbytes
            limit = first_cap if not groups else cap
            if cur and (k != key or size + nbytes > limit):
                groups.append(cur)
                cur, size = [], 0
            cur.append(p)
            size += nbytes
            key = k
        if cur:
            groups.append(cur)
        return [_Bucket(i, ps, ps[0]._xp(), ps[0]._data.dtype)
                for i, ps in enumerate(groups)]

    def reset(self, strategy):
        """Start a step reduced by ``strategy``."""
        for b in self.buckets:
            b.reset()
        self.strategy = strategy
        self._next = 0

    def mark_ready(self, p, zero=False):
        """``p``'s gradient is final (``zero``: it takes part as zeros)."""
        b, j = self.where[id(p)]
        if j in b.ready:
            return
        self.strategy.gradient_ready(b, j, p, zero)
        b.ready.add(j)
        b.pending -= 1
        if self._tl is not None and b.pending == 0:
            self._ready_ns[b.index] = time.perf_counter_ns()
        # launch in bucket order, whatever order gradients arrive in, so
        # that every rank issues the same sequence of all-reduces
        while (self._next < len(self.buckets)
               and self.buckets[self._next].pending == 0):
            self._launch(self.buckets[self._next])
            self._next += 1

    def _launch(self, b):
        work, stats = self.strategy.work(b), self.stats
        if self._tl is not None:
            work = self._recorded(b, work)

        def run():
            t0 = time.perf_counter()
            out = work()
            stats["comm_s"] += time.perf_counter() - t0
            stats["buckets"] += 1
            return out
        b.future = self.comm.submit(run, device_of(b.flat))

    def _recorded(self, b, work):
        """``work`` that records the bucket on its own timeline row:
        "pending" (ready, waiting for earlier buckets to fill), "queued"
        (launched, the communication thread busy with earlier ones) and
        "allreduce" (reduced)."""
        tl, now = self._tl, time.perf_counter_ns
        launched = now()
        ready = self._ready_ns.pop(b.index, launched)
        row = tl.track(f"DDP bucket {b.index}")
        args = {"bucket": b.index, "bytes": int(b.flat.nbytes),
                "params": len(b.params), "dtype": str(b.dtype)}

        def run():
            started = now()
            try:
                return work()
            finally:
                done = now()
                if launched > ready:
                    tl.complete("pending", "ddp", ready, launched, args, row)
                tl.complete("queued", "ddp", launched, started, args, row)
                tl.complete("allreduce", "ddp", started, done, args, row)
        return run

    def missing(self):
        """Names of the parameters whose gradient never became ready, in
        registration order."""
        out = []
        for b in self.buckets:
            if b.pending:
                out += [b.params[j] for j in range(len(b.params))
                        if j not in b.ready]
        order = {id(p): i for i, p in enumerate(self.params)}
        return [self.names.get(id(p), "?")
                for p in sorted(out, key=lambda p: order[id(p)])]

    def finish(self, as_bucket_view):
        """Wait for the launched buckets and write their results back."""
        if self._tl is not None:
            t = time.perf_counter_ns()
            try:
                return self._finish(as_bucket_view)
            finally:
                self._tl.complete("DDP wait for buckets", "ddp", t,
                                  time.perf_counter_ns())
        return self._finish(as_bucket_view)

    def _finish(self, as_bucket_view):
        t0 = time.perf_counter()
        for b in self.buckets:
            if b.future is None:
                continue
            result = self.comm.result(b.future)
            self.stats["wait_s"] += time.perf_counter() - t0
            t0 = time.perf_counter()
            self.strategy.finish(b, result, as_bucket_view)

    def close(self):
        self.comm.close()
