"""DistributedDataParallel: bucketed all-reduce overlapped with backward.

How a step goes:

1. ``__init__`` broadcasts parameters and buffers from rank 0 and packs the
   trainable parameters, in reverse registration order (the order backward
   produces their gradients), into buckets of at most ``bucket_cap_mb`` of
   one dtype and device, each with one flat gradient buffer (``_reducer``).
2. Each parameter's post-accumulate-grad hook marks its gradient ready;
   when a bucket's last gradient arrives the bucket goes to a
   communication thread, which reduces it while backward goes on computing
   earlier layers (NumPy and MPI both release the GIL, so the overlap is
   real on a CPU too).
3. When backward ends (an engine callback) the step waits for the buckets.

Without a communication hook a bucket is one ``all_reduce_coalesced(grads,
AVG)`` over the ``p.grad`` tensors themselves (``CoalescedReduction``);
with one, gradients are copied into the bucket's flat buffer as they
arrive, the hook gets that buffer, and its result is written back
(``HookReduction``).

One all-reduce per bucket per step; ``no_sync()`` skips them for gradient
accumulation. The state_dict keys carry PyTorch's ``module.`` prefix;
``load_state_dict`` also accepts a state dict saved from the bare module.
"""
import contextlib

import numpy as np

from ... import distributed as dist
from ...distributed import _timeline
from ..._ignored import ignored_argument
from ...autograd import engine as _engine
from ...autograd.function import AccumulateGrad
from ...autograd.grad_mode import is_grad_enabled, no_grad
from ...tensor import Tensor
from ..modules.module import Module
from ..._settings import are_deterministic_algorithms_enabled
from ...distributed.algorithms.ddp_comm_hooks.zero_hook import \
    reduce_scatter_hook
from ._deterministic import DeterministicStep
from ._functions import resolve_group
from ._reducer import (CoalescedReduction, GradBucket,  # noqa: F401
                       HookReduction, Reducer, _allreduce_hook)
from ._straggler import StragglerDetector


class DistributedDataParallel(Module):
    """Data parallelism: one model replica per rank, gradients averaged.

    Args:
        module: the model to replicate.
        device_ids, output_device: None or the one device of this process
            (one device per process, as PyTorch recommends).
        broadcast_buffers: broadcast rank 0's buffers before each forward.
        process_group: the group to reduce over (default: the world).
        bucket_cap_mb: maximum bucket size in MiB (default 25).
        find_unused_parameters: find, after each forward, the parameters
            that do not take part in the loss, so their buckets still reduce.
        gradient_as_bucket_view: make ``p.grad`` a view into the bucket
            buffer, saving a copy per step when a communication hook is
            registered (with the default all-reduce the gradients are
            reduced where they are, so there is no copy to save).
        init_sync: broadcast rank 0's parameters and buffers here.
        virtual_shards: under ``dtorch.use_deterministic_algorithms(True)``,
            the number of equal pieces the global batch is computed in (a
            multiple of the world size; default 12): the same on any world
            size gives the same bits (``_deterministic``).
        compile_shards: under the switch, run the virtual shards through
            ``dtorch.compile``'s replay (the same bits, less Python per
            shard); default (None): on, except under FSDP and with
            SyncBatchNorm; False: eager shards.
        dim, check_reduction, static_graph: accepted for PyTorch scripts;
            a non-default value warns that it has no effect.

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
                 static_graph=False, init_sync=True, virtual_shards=None,
                 compile_shards=None):
        super().__init__()
        if not isinstance(module, Module):
            raise TypeError(f"DistributedDataParallel expects an "
                            f"nn.Module, got {type(module).__name__}")
        _check_compat_args(device_ids, output_device, dim, check_reduction,
                           static_graph)
        self.module = module
        group = process_group if process_group is not None \
            else resolve_group(None)
        # plain attributes, not registered as submodules or parameters
        object.__setattr__(self, "process_group", group)
        # DTORCH_TIMELINE: this rank's ops, buckets and collectives
        tl = _timeline.attach(group) if _timeline.requested() else None
        self.broadcast_buffers = broadcast_buffers
        self.find_unused_parameters = find_unused_parameters
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.require_backward_grad_sync = True
        self.bucket_cap_mb = 25 if bucket_cap_mb is None else bucket_cap_mb
        names = {id(p): name for name, p in module.named_parameters()}
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
        object.__setattr__(self, "_reducer", Reducer(
            self._params, names, group, self.bucket_cap_mb))
        self._reducer._tl = tl
        self._hooks = [p.register_post_accumulate_grad_hook(self._grad_ready)
                       for p in self._params]
        self._unfinished = None      # set if a sync backward left buckets
        # seconds spent reducing buckets (comm thread) and waiting for them
        # at the end of backward (main thread): 1 - wait/comm is the share
        # of communication hidden behind backward
        self.stats = self._reducer.stats
        self._step_started = False
        self._queued = False
        self._unused = ()
        self.virtual_shards = virtual_shards
        self.compile_shards = compile_shards
        self._det = None             # the deterministic mode's step
        # which rank is slow, in which phase (dtorch/nn/parallel/_straggler)
        self._straggler = StragglerDetector(group) \
            if self._world_size() > 1 and StragglerDetector.enabled() \
            else None

    @property
    def straggler_reports(self):
        """The slow ranks found so far: dicts of step, rank, phase
        ('compute', 'data' or 'network'), slower_by, seconds and reference (per step,
        the other ranks' median)."""
        return [] if self._straggler is None else self._straggler.reports

    def _world_size(self):
        return dist.get_world_size(self.process_group)

    def _sync_module_states(self):
        if self._world_size() == 1:
            return
        tensors = list(self.module.parameters()) + list(self.module.buffers())
        _broadcast_coalesced(self.process_group, tensors, self.bucket_cap_mb)

    def _sync_buffers(self):
        if self.broadcast_buffers and self._world_size() > 1:
            bufs = list(self.module.buffers())
            if bufs:
                _broadcast_coalesced(self.process_group, bufs,
                                     self.bucket_cap_mb)

    @property
    def bucket_sizes(self):
        """Number of parameters in each bucket, in reduction order."""
        return [len(b.params) for b in self._reducer.buckets]

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
                f"a gradient on rank {dist.get_rank(g)}: {', '.join(names)}")
        if self._join_active:
            _active_count(g, 1)
            self._join_steps += 1
        self._sync_buffers()
        if are_deterministic_algorithms_enabled():
            if self._join_active:
                raise RuntimeError(
                    "deterministic DDP: join() trains on uneven inputs, "
                    "whose split depends on the world size")
            if self._det is None:
                zero = None
                if self._comm_hook is reduce_scatter_hook:
                    zero = self._comm_state       # ZeRO-2, done exactly
                elif self._comm_hook is not _allreduce_hook:
                    raise RuntimeError(
                        "deterministic DDP: a communication hook's "
                        "arithmetic depends on the world size; remove "
                        "register_comm_hook or the deterministic mode")
                self._det = DeterministicStep(self, self.virtual_shards,
                                              zero)
                self._det.compile_shards = self.compile_shards
            return self._det.forward(inputs, kwargs)
        # (the deterministic step has its own end of backward: straggler
        # detection times the normal mode only)
        if self._straggler is not None and is_grad_enabled():
            self._straggler.forward()
        out = self.module(*inputs, **kwargs)
        # a step whose backward will reduce gradients (not evaluation)
        self._step_started = (self.require_backward_grad_sync
                              and is_grad_enabled())
        if self._step_started:
            self._queued = False
            self._reducer.reset(self._strategy())
            if self.find_unused_parameters:
                self._unused = self._find_unused(out)
        return out

    def _strategy(self):
        # the same on every rank (join is entered by all of them): ranks
        # must issue the same collectives
        if self._comm_hook is _allreduce_hook and not self._join_active:
            return CoalescedReduction(self.process_group)
        return HookReduction(self.process_group, self._comm_hook,
                             self._comm_state)

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
                self._reducer.mark_ready(q, zero=True)
        self._reducer.mark_ready(p)

    def _finish_backward(self):
        missing = self._reducer.missing()
        if missing:
            # PyTorch reports this at the next forward; so do we, after
            # finishing the buckets that did fill up
            self._unfinished = missing
        self._reducer.finish(self.gradient_as_bucket_view)
        self._step_started = False
        if self._straggler is not None:
            self._straggler.backward_end(
                self.stats["wait_s"], joined=self._join_active,
                device=self._params[0].device if self._params else None)

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
        which returns a ``dtorch.futures.Future`` whose ``wait()`` gives the
        averaged flat gradient tensor (see ``dtorch.distributed.algorithms``).
        """
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
        n = self._world_size()
        if n == 1:
            return
        key = Tensor._wrap(_int64([self._join_steps * n + dist.get_rank(g)]))
        dist.all_reduce(key, op=dist.ReduceOp.MAX, group=g)
        src = int(key._data[0]) % n
        tensors = list(self.module.parameters()) + list(self.module.buffers())
        _broadcast_coalesced(g, tensors, self.bucket_cap_mb, src)

    def _shadow_until_all_joined(self, throw):
        g = self.process_group
        while _active_count(g, 0) > 0:
            if throw:
                raise RuntimeError(f"rank {dist.get_rank(g)} exhausted all "
                                   f"inputs before the others")
            self._sync_buffers()
            for b in self._reducer.buckets:
                b.flat[...] = 0
                bucket = GradBucket(b.index, b.flat, b.params, b.offsets)
                self._comm_hook(self._comm_state, bucket).wait()

    # ------------------------------------------------------- state dict --
    def load_state_dict(self, state_dict, strict=True, assign=False):
        if assign:
            # swapping the parameters would orphan the reducer's buckets
            ignored_argument("DistributedDataParallel.load_state_dict",
                             "assign", assign, "values are copied into the "
                             "registered parameters")
        keys = list(state_dict)
        if keys and not any(k.startswith("module.") for k in keys):
            return self.module.load_state_dict(state_dict, strict=strict)
        return super().load_state_dict(state_dict, strict=strict)

    def __getstate__(self):
        raise TypeError("DistributedDataParallel is not picklable; save "
                        "model.module.state_dict() instead")

    def __del__(self):
        reducer = self.__dict__.get("_reducer")
        if reducer is not None:
            reducer.close()


def _check_compat_args(device_ids, output_device, dim, check_reduction,
                       static_graph):
    """PyTorch's arguments that do not change what dtorch's DDP does."""
    owner = "DistributedDataParallel"
    if device_ids is not None and len(list(device_ids)) > 1:
        raise ValueError(
            f"{owner}: device_ids={list(device_ids)}: one device per "
            f"process; device_ids can only be None or contain a single "
            f"element")
    if output_device is not None and (
            not device_ids or str(output_device) != str(list(device_ids)[0])):
        ignored_argument(owner, "output_device", output_device,
                         "outputs stay on the module's device",
                         stacklevel=4)
    if dim != 0:
        ignored_argument(owner, "dim", dim, "inputs are not scattered "
                         "(one device per process)", stacklevel=4)
    if check_reduction:
        ignored_argument(owner, "check_reduction", check_reduction,
                         "deprecated in PyTorch too; unreduced gradients "
                         "are reported at the next forward anyway",
                         stacklevel=4)
    if static_graph:
        ignored_argument(owner, "static_graph", static_graph,
                         "the reducer needs no graph-specific plan",
                         stacklevel=4)


def _int64(values):
    return np.array(values, dtype=np.int64)


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
    """How many ranks of ``group`` pass ``me=1`` (a collective)."""
    flag = Tensor._wrap(_int64([me]))
    if dist.get_world_size(group) > 1:
        dist.all_reduce(flag, group=group)
    return int(flag._data[0])


def _broadcast_coalesced(group, tensors, cap_mb, src=0):
    """Broadcast the tensors of ``group``'s rank ``src`` with one call per
    dtype/device chunk."""
    src = dist.get_global_rank(group, src)
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
                    dist.broadcast(Tensor._wrap(flat), src, group=group)
                    off = 0
                    for c in chunk:
                        n = c._data.size
                        c._data[...] = flat[off:off + n].reshape(c.shape)
                        c._bump_version()
                        off += n
                    chunk, size = [], 0
                if t is not None:
                    chunk.append(t)
                    size += t._data.nbytes
