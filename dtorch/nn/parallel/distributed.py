"""DistributedDataParallel: bucketed all-reduce overlapped with backward.

How a step goes:

1. ``__init__`` broadcasts parameters and buffers from rank 0 and packs the
   trainable parameters, in reverse registration order (the order backward
   produces their gradients), into buckets of at most ``bucket_cap_mb`` of
   one dtype and device, each with one flat gradient buffer.
2. Each parameter's post-accumulate-grad hook marks its gradient ready;
   when a bucket's last gradient arrives the bucket goes to a
   communication thread, which reduces it while backward goes on computing
   earlier layers (NumPy and MPI both release the GIL, so the overlap is
   real on a CPU too).
3. When backward ends (an engine callback) the step waits for the buckets.

With the default hook a bucket is one ``all_reduce_coalesced(grads,
'avg')`` over the ``p.grad`` arrays themselves: backends that reduce from
and into the arrays (MPI on one host, through shared memory) then make no
copies at all, and the others pack and unpack once, as before. With a
communication hook, gradients are copied into the bucket's flat buffer as
they arrive, the hook gets that buffer, and its result is written back.

One all-reduce per bucket per step; ``no_sync()`` skips them for gradient
accumulation. The state_dict keys carry PyTorch's ``module.`` prefix;
``load_state_dict`` also accepts a state dict saved from the bare module.
"""
import contextlib
import time

import numpy as np

from ... import distributed as dist
from ...autograd import engine as _engine
from ...autograd.function import AccumulateGrad
from ...autograd.grad_mode import is_grad_enabled, no_grad
from ... import _backend as B
from ..._backend import device_of
from ...tensor import Tensor
from ..modules.module import Module
from ._comm_thread import _CommThread


_FIRST_BUCKET_BYTES = 1024 * 1024


class _Future:
    """The result of a communication hook: ``wait()`` returns the tensor."""

    def __init__(self, work=None, value=None, then=None):
        self._work, self._value, self._then = work, value, then

    def wait(self):
        if self._work is not None:
            self._work.wait()
            self._work = None
        if self._then is not None:
            self._value = self._then(self._value)
            self._then = None
        return self._value

    def value(self):
        return self.wait()

    def then(self, fn):
        prev = self._then

        def chain(v):
            return fn(prev(v) if prev else v)
        return _Future(self._work, self._value, chain)


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
    """The default: sum over ranks, averaged by DDP. DDP does not call it
    in a normal step: it reduces the gradients in place with
    ``all_reduce_coalesced(grads, 'avg')`` instead (see the module
    docstring). It runs when ranks shadow each other in ``join()``.

    Reductions run on DDP's communication thread; the blocking call
    releases the GIL, so backward goes on computing meanwhile. Measured on
    2 cores with Open MPI (MLP 784-1024-1024-10, per-rank batch 256, paired
    steps): a blocking MPI call gave weak-scaling efficiency 0.80-0.86; a
    nonblocking one tested every 50 us gave only 0.69-0.71, because a large
    reduction then progresses only once per test. What helps is a wait that
    sleeps and a transfer driven by the rank itself: `collectives.shm`.
    """
    t = bucket.buffer()
    group.all_reduce(t._data, "sum")
    return _Future(value=t)


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


class DistributedDataParallel(Module):
    """Data parallelism: one model replica per rank, gradients averaged.

    Args:
        module: the model to replicate.
        device_ids, output_device, dim: accepted for PyTorch compatibility
            (one device per process is assumed).
        broadcast_buffers: broadcast rank 0's buffers before each forward.
        process_group: the group to reduce over (default: the world).
        bucket_cap_mb: maximum bucket size in MiB (default 25).
        find_unused_parameters: find, after each forward, the parameters
            that do not take part in the loss, so their buckets still reduce.
        gradient_as_bucket_view: make ``p.grad`` a view into the bucket
            buffer, saving a copy per step when a communication hook is
            registered (with the default all-reduce the gradients are
            reduced where they are, so there is no copy to save).

    Example::

        dist.init_process_group()
        model = DistributedDataParallel(Net())
        loss_fn(model(x), y).backward()    # gradients are averaged here
        opt.step()
    """

    def __init__(self, module, device_ids=None, output_device=None, dim=0,
                 broadcast_buffers=True, process_group=None,
                 bucket_cap_mb=None, find_unused_parameters=False,
                 check_reduction=False, gradient_as_bucket_view=False,
                 static_graph=False, init_sync=True):
        super().__init__()
        if not isinstance(module, Module):
            raise TypeError(f"DistributedDataParallel expects an "
                            f"nn.Module, got {type(module).__name__}")
        self.module = module
        group = process_group if process_group is not None \
            else dist._group(None)
        # plain attributes, not registered as submodules or parameters
        object.__setattr__(self, "process_group", group)
        self.broadcast_buffers = broadcast_buffers
        self.find_unused_parameters = find_unused_parameters
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.require_backward_grad_sync = True
        self.bucket_cap_mb = 25 if bucket_cap_mb is None else bucket_cap_mb
        self._names = {}
        for name, p in module.named_parameters():
            self._names[id(p)] = name
        self._params = [p for p in module.parameters() if p.requires_grad]
        if not self._params:
            raise RuntimeError("DistributedDataParallel is not needed when "
                               "a module doesn't have any parameter that "
                               "requires a gradient.")
        self._comm_hook = _allreduce_hook
        self._comm_state = group
        self._join_active = False
        if init_sync:
            self._sync_module_states()
        self._build_buckets()
        self._hooks = [p.register_post_accumulate_grad_hook(self._grad_ready)
                       for p in self._params]
        self._comm = _CommThread(f"ddp-comm-r{group.rank}")
        self._unfinished = None      # set if a sync backward left buckets
        # seconds spent reducing buckets (comm thread) and waiting for them
        # at the end of backward (main thread): 1 - wait/comm is the share
        # of communication hidden behind backward
        self.stats = {"comm_s": 0.0, "wait_s": 0.0, "buckets": 0}
        self._step_started = False
        self._unused = ()

    # ------------------------------------------------------------ set-up --
    def _sync_module_states(self):
        g = self.process_group
        if g.size == 1:
            return
        tensors = [p for p in self.module.parameters()] + \
            [b for b in self.module.buffers()]
        _broadcast_coalesced(g, tensors, self.bucket_cap_mb)

    def _build_buckets(self):
        # As PyTorch: the first bucket (the last layers, whose gradients
        # arrive first) is capped at 1 MiB so that communication starts
        # early; the others at bucket_cap_mb.
        cap = int(self.bucket_cap_mb * 1024 * 1024)
        first_cap = min(cap, _FIRST_BUCKET_BYTES)
        buckets, cur, size, key = [], [], 0, None
        for p in reversed(self._params):
            k = (type(p._data), p._data.dtype)
            nbytes = p._data.nbytes
            limit = first_cap if not buckets else cap
            if cur and (k != key or size + nbytes > limit):
                buckets.append(cur)
                cur, size = [], 0
            cur.append(p)
            size += nbytes
            key = k
        if cur:
            buckets.append(cur)
        self._buckets = []
        self._where = {}
        for i, ps in enumerate(buckets):
            xp = ps[0]._xp()
            b = _Bucket(i, ps, xp, ps[0]._data.dtype)
            self._buckets.append(b)
            for j, p in enumerate(ps):
                self._where[id(p)] = (b, j)

    @property
    def bucket_sizes(self):
        """Number of parameters in each bucket, in reduction order."""
        return [len(b.params) for b in self._buckets]

    # ----------------------------------------------------------- forward --
    def forward(self, *inputs, **kwargs):
        g = self.process_group
        if self._unfinished:
            names = self._unfinished
            self._unfinished = None
            raise RuntimeError(
                "Expected to have finished reduction in the prior iteration "
                "before starting a new one. This error indicates that your "
                "module has parameters that were not used in producing "
                "loss. You can enable unused parameter detection by passing "
                "the keyword argument `find_unused_parameters=True` to "
                "`DistributedDataParallel`. Parameters that did not receive "
                f"a gradient on rank {g.rank}: {', '.join(names)}")
        if self._join_active:
            _active_count(g, 1)
            self._join_steps += 1
        if self.broadcast_buffers and g.size > 1:
            bufs = list(self.module.buffers())
            if bufs:
                _broadcast_coalesced(g, bufs, self.bucket_cap_mb)
        out = self.module(*inputs, **kwargs)
        # a step whose backward will reduce gradients (not evaluation)
        self._step_started = (self.require_backward_grad_sync
                              and is_grad_enabled())
        if self._step_started:
            self._reset_buckets()
            if self.find_unused_parameters:
                self._unused = self._find_unused(out)
        return out

    def _reset_buckets(self):
        for b in self._buckets:
            b.pending = len(b.params)
            b.ready = set()
            b.future = None
        self._queued = False
        self._next_bucket = 0
        # the same on every rank (join is entered by all of them): ranks
        # must issue the same collectives
        self._direct = (self._comm_hook is _allreduce_hook
                        and not self._join_active)

    def _find_unused(self, out):
        """Parameters that the graph of ``out`` does not reach."""
        seen, stack, reached = set(), [], set()
        for t in _tensors_in(out):
            if t.grad_fn is not None:
                stack.append(t.grad_fn)
            elif t.requires_grad:
                reached.add(id(t))
        while stack:
            fn = stack.pop()
            if id(fn) in seen:
                continue
            seen.add(id(fn))
            if type(fn) is AccumulateGrad:
                reached.add(id(fn.variable))
                continue
            for e in fn.next_edges:
                if e is not None:
                    stack.append(e[0])
        return [p for p in self._params if id(p) not in reached]

    # -------------------------------------------------------- gradients --
    def _grad_ready(self, p):
        if not (self.require_backward_grad_sync and self._step_started):
            return
        if not self._queued:
            self._queued = True
            _engine.queue_callback(self._finish_backward)
            for q in self._unused:
                self._mark_ready(q, zero=True)
        self._mark_ready(p)

    def _mark_ready(self, p, zero=False):
        b, j = self._where[id(p)]
        if j in b.ready:
            return
        g = p._grad
        if self._direct:
            # reduced where it is; a parameter without a gradient here
            # takes part with zeros and gets the average, as below
            if g is None:
                p._grad = Tensor._wrap(b.xp.zeros(p._data.shape, b.dtype))
            elif zero:
                g._data[...] = 0
        else:
            off, n = b.offsets[j], p._data.size
            view = b.flat[off:off + n]
            if zero or g is None:
                view[...] = 0
            elif not _is_view_of(g._data, b.flat):
                view[...] = g._data.reshape(-1)
        b.ready.add(j)
        b.pending -= 1
        # launch in bucket order, whatever order gradients arrive in, so
        # that every rank issues the same sequence of all-reduces
        while (self._next_bucket < len(self._buckets)
               and self._buckets[self._next_bucket].pending == 0):
            self._launch(self._buckets[self._next_bucket])
            self._next_bucket += 1

    def _launch(self, b):
        stats = self.stats
        if self._direct:
            arrs = [p._grad._data for p in b.params]
            if not all(type(a) is type(b.flat) and a.dtype == b.dtype
                       and a.flags.c_contiguous for a in arrs):
                # a gradient the backend cannot use in place: reduce the
                # packed copy instead (the same collective, bitwise)
                for a, off in zip(arrs, b.offsets):
                    b.flat[off:off + a.size] = a.reshape(-1)
                arrs = [b.flat]
            group = self.process_group

            def direct():
                t0 = time.perf_counter()
                group.all_reduce_coalesced(arrs, "avg")
                stats["comm_s"] += time.perf_counter() - t0
                stats["buckets"] += 1
                return arrs
            b.future = self._comm.submit(direct, device_of(b.flat))
            return
        bucket = GradBucket(b.index, b.flat, b.params, b.offsets)
        hook, state = self._comm_hook, self._comm_state

        def run():
            t0 = time.perf_counter()
            out = hook(state, bucket).wait()
            stats["comm_s"] += time.perf_counter() - t0
            stats["buckets"] += 1
            return out
        b.future = self._comm.submit(run, device_of(b.flat))

    def _finish_backward(self):
        missing = []
        for b in self._buckets:
            if b.pending:
                missing += [b.params[j] for j in range(len(b.params))
                            if j not in b.ready]
        order = {id(p): i for i, p in enumerate(self._params)}
        missing = [self._names.get(id(p), "?")
                   for p in sorted(missing, key=lambda p: order[id(p)])]
        if missing:
            # PyTorch reports this at the next forward; so do we, after
            # finishing the buckets that did fill up
            self._unfinished = missing
        t0 = time.perf_counter()
        for b in self._buckets:
            if b.future is None:
                continue
            result = self._comm.result(b.future)
            self.stats["wait_s"] += time.perf_counter() - t0
            t0 = time.perf_counter()
            if self._direct:
                if result[0] is b.flat:
                    self._write_back(b, None)        # the packed fallback
                else:
                    for p in b.params:
                        p._grad._vc[0] += 1
                continue
            flat = result._data if isinstance(result, Tensor) else result
            if flat is not b.flat:
                b.flat[...] = flat
            # the default hook leaves sums: average while writing back
            scale = 1.0 / self.process_group.size \
                if self._comm_hook is _allreduce_hook else None
            self._write_back(b, scale)
        self._step_started = False

    def _write_back(self, b, scale):
        xp = b.xp
        for p, off in zip(b.params, b.offsets):
            n = p._data.size
            view = b.flat[off:off + n].reshape(p._data.shape)
            g = p._grad
            as_view = g is not None and _is_view_of(g._data, b.flat)
            if as_view or self.gradient_as_bucket_view:
                if scale is not None:
                    view *= scale
                if as_view:
                    g._vc[0] += 1
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
                g._vc[0] += 1

    # ---------------------------------------------------------- user API --
    @contextlib.contextmanager
    def no_sync(self):
        """Accumulate gradients locally: backward inside this context does
        no communication; the next backward outside it reduces the sum."""
        prev = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = prev

    def register_comm_hook(self, state, hook):
        """Replace the all-reduce of each bucket by ``hook(state, bucket)``,
        which returns a future whose ``wait()`` gives the averaged flat
        gradient tensor (see ``dtorch.distributed.algorithms``)."""
        if not callable(hook):
            raise TypeError("hook must be callable")
        # None means this model's group (the default group may be
        # thread-local, and hooks run on the communication thread)
        if state is None:
            state = self.process_group
        self._comm_hook, self._comm_state = hook, state

    @contextlib.contextmanager
    def join(self, divide_by_initial_world_size=True, enable=True,
             throw_on_early_termination=False):
        """Train on uneven inputs: a rank that runs out of batches leaves
        the ``with`` block and shadows the others' collectives (zeros) until
        every rank is done, so nobody hangs."""
        if not enable:
            yield
            return
        if not divide_by_initial_world_size:
            raise NotImplementedError("join(divide_by_initial_world_size="
                                      "False) is not supported")
        self._join_active = True
        self._join_steps = 0
        try:
            yield
        finally:
            self._join_active = False
            self._shadow_until_all_joined(throw_on_early_termination)
            self._sync_final_model()

    def _sync_final_model(self):
        # ranks that joined early skipped optimizer steps: everyone takes
        # the model of the rank that trained longest (PyTorch does the same)
        g = self.process_group
        if g.size == 1:
            return
        key = np.array([self._join_steps * g.size + g.rank], np.int64)
        g.all_reduce(key, "max")
        src = int(key[0]) % g.size
        tensors = list(self.module.parameters()) + list(self.module.buffers())
        _broadcast_coalesced(g, tensors, self.bucket_cap_mb, src)

    def _shadow_until_all_joined(self, throw):
        g = self.process_group
        while _active_count(g, 0) > 0:
            if throw:
                raise RuntimeError(f"rank {g.rank} exhausted all inputs "
                                   f"before the others")
            if self.broadcast_buffers and g.size > 1:
                bufs = list(self.module.buffers())
                if bufs:
                    _broadcast_coalesced(g, bufs, self.bucket_cap_mb)
            for b in self._buckets:
                b.flat[...] = 0
                bucket = GradBucket(b.index, b.flat, b.params, b.offsets)
                self._comm_hook(self._comm_state, bucket).wait()

    # ------------------------------------------------------- state dict --
    def load_state_dict(self, state_dict, strict=True, assign=False):
        keys = list(state_dict)
        if keys and not any(k.startswith("module.") for k in keys):
            return self.module.load_state_dict(state_dict, strict=strict)
        return super().load_state_dict(state_dict, strict=strict)

    def __getstate__(self):
        raise TypeError("DistributedDataParallel is not picklable; save "
                        "model.module.state_dict() instead")

    def __del__(self):
        comm = self.__dict__.get("_comm")
        if comm is not None:
            comm.close()


def _is_view_of(a, base):
    return a is base or getattr(a, "base", None) is base


def _tensors_in(obj):
    if isinstance(obj, Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _tensors_in(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors_in(o)


def _active_count(group, me):
    flag = np.array([me], dtype=np.int64)
    if group.size > 1:
        group.all_reduce(flag, "sum")
    return int(flag[0])


def _broadcast_coalesced(group, tensors, cap_mb, src=0):
    """Broadcast rank src's tensors with one call per dtype/device chunk."""
    groups = {}
    for t in tensors:
        groups.setdefault((type(t._data), t._data.dtype), []).append(t)
    cap = max(int(cap_mb * 1024 * 1024), 1)
    with no_grad():
        for ts in groups.values():
            chunk, size = [], 0
            for t in ts + [None]:
                if t is None or (chunk and size + t._data.nbytes > cap):
                    xp = chunk[0]._xp()
                    flat = xp.concatenate(
                        [c._data.reshape(-1) for c in chunk])
                    group.broadcast(flat, src)
                    off = 0
                    for c in chunk:
                        n = c._data.size
                        c._data[...] = flat[off:off + n].reshape(c.shape)
                        c._vc[0] += 1
                        off += n
                    chunk, size = [], 0
                if t is not None:
                    chunk.append(t)
                    size += t._data.nbytes
