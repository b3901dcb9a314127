"""FullyShardedDataParallel (ZeRO stage 3): each rank stores 1/N of every
parameter; a unit's parameters exist in full only while that unit runs.

A *unit* is one FSDP wrapper: the parameters of its module that no nested
FSDP wrapper owns, laid end to end in one flat array, cut into N equal
chunks (the last padded); rank r keeps chunk r as the 1-D parameter
``_flat_param``, the only parameter an optimizer sees. An
``auto_wrap_policy`` makes submodules units of their own (e.g.
``ModuleWrapPolicy({TransformerBlock})``); the root wrapper owns the rest.

A unit without nested units (a block) runs as one autograd node
(``_UnitFunction``):

- forward: all-gather the flat parameter, run the module without
  recording a graph, free the gathered array. Nothing from the forward keeps
  the full parameters alive: dtorch's ops save raw arrays for backward (no
  storage to resize to zero, as PyTorch does), so a recorded graph would
  hold every layer's full weights until backward.
- backward: all-gather again, recompute the unit's forward with the graph
  (the RNG and autocast state replayed by activation checkpointing's
  ``ForwardState``, so dropout draws the same mask; the buffers put
  back afterwards, so BatchNorm's running statistics move once),
  back-propagate the incoming gradient through it, reduce-scatter the full
  flat gradient (averaged over ranks, as DDP) into this rank's chunk, free.

A unit around nested units (the root, usually) keeps its gathered
parameters from its forward to the end of backward instead, as PyTorch's
FSDP2 keeps the root unsharded: recomputing it would run every nested
unit's forward once more. Its gradient is reduce-scattered in an engine
callback when backward ends.

So at any time the full parameters of the running block and of the units
around it are alive, next to the shards; the cost is one more forward per
block.

``state_dict()`` is the unsharded model's (FULL_STATE_DICT, gathered on
every rank) or, under ``state_dict_type(SHARDED_STATE_DICT)``, every
parameter's local piece of its flattened elements, marked with
``dcp.shard_of`` as a box of a 1-D tensor of ``numel`` elements: ``dcp.save``
writes it, and ``dcp.load`` into the sharded state dict of a model on
another world size fills that rank's boxes. ``load_state_dict`` takes
either kind. ``clip_grad_norm_`` clips by the global norm.

A model built on the meta device (``with dtorch.device("meta"):``) is
materialised unit by unit as it is wrapped (on ``device_id``, else the
CPU): each unit's meta modules get storage (``to_empty``) and
``reset_parameters()`` with the default generator seeded by
(``dtorch.initial_seed()``, the module's name), then only this rank's
chunk is kept; ``reset_parameters_by_name`` gives an unsharded model the
same values. ``fully_shard`` does not materialise meta modules (their
names in the root are unknown when a block is sharded first).

Mixed precision (``mixed_precision=MixedPrecision(...)``, or
``fully_shard(mp_policy=MixedPrecisionPolicy(...))``): the shards stay in
their dtype (float32 master weights for the optimizer); a unit casts its
shard to ``param_dtype`` before the all-gather, so forward and the
recomputation in backward see low-precision parameters; the gradient is
reduce-scattered in ``reduce_dtype`` (default ``param_dtype``; divided
before and after the sum, as PyTorch, so float16 does not overflow) and
cast back to the shard's dtype unless ``keep_low_precision_grads``.
Auto-wrapped units inherit the configuration.
"""
import contextlib
import hashlib
import threading
import time
import weakref

from ... import distributed as dist
from ..._ignored import ignored_argument
from ..._settings import are_deterministic_algorithms_enabled
from ...autograd import backward as _backward
from ...autograd.function import Function
from ...autograd import engine as _engine
from ...autograd.grad_mode import is_grad_enabled, no_grad
from ...nn.modules.module import Module
from ...nn.parallel._straggler import StragglerDetector
from ...nn.parameter import Parameter
from ... import random as _random
from ...tensor import Tensor
from ...utils.checkpoint import ForwardState
from ..clip_grad import global_norm
from .api import MixedPrecision, MixedPrecisionPolicy

__all__ = ["FullyShardedDataParallel", "StateDictType", "fully_shard",
           "FSDPModule"]

_WRAPPED = "_fsdp_wrapped_module"


class StateDictType:
    FULL_STATE_DICT = "FULL_STATE_DICT"
    SHARDED_STATE_DICT = "SHARDED_STATE_DICT"


class _Stats:
    """Bytes of parameters this rank holds: the shards always, a unit's
    gathered flat array while it runs; ``peak`` of the sum. ``freed``:
    weak references to gathered arrays after their free (a test checks
    that nothing else keeps them)."""

    def __init__(self):
        self.shard_bytes = 0
        self.wait_s = 0.0    # seconds in (blocking) all-gathers and
        # reduce-scatters: straggler detection's communication wait
        self.live = 0
        self.peak = 0
        self.freed = []

    def add(self, n):
        self.live += n
        self.peak = max(self.peak, self.shard_bytes + self.live)


class _UnitFunction(Function):
    @staticmethod
    def forward(ctx, unit, flat_shard, kwargs, *args):
        ctx.unit, ctx.kwargs, ctx.args = unit, kwargs, args
        # what the recomputation replays: activation checkpointing's own
        ctx.state = ForwardState(args)
        unit._gather(requires_grad=False, compute=True)
        try:
            with no_grad():          # no graph: it would keep the weights
                out = unit._call_inner(args, kwargs)
        finally:
            unit._free()
        ctx.is_tuple = isinstance(out, (tuple, list))
        outs = tuple(out) if ctx.is_tuple else (out,)
        for o in outs:
            if not isinstance(o, Tensor):
                raise TypeError(
                    f"FullyShardedDataParallel: the wrapped "
                    f"{type(unit._fsdp_wrapped_module).__name__} returned "
                    f"a {type(o).__name__}; a unit's forward must return "
                    f"tensors (one or a tuple)")
        return tuple(outs) if ctx.is_tuple else outs[0]

    @staticmethod
    def backward(ctx, *grads):
        unit = ctx.unit
        leaves = unit._gather(requires_grad=True, compute=True)
        try:
            inputs = [a.detach().requires_grad_(a.requires_grad)
                      if isinstance(a, Tensor) else a for a in ctx.args]
            # the recomputation must not update buffers a second time
            # (BatchNorm's running statistics): put them back after it
            bufs = [b for b in unit._fsdp_wrapped_module.buffers()]
            kept = [b._data.copy() for b in bufs]
            try:
                with ctx.state.replay():
                    out = unit._call_inner(inputs, ctx.kwargs)
            finally:
                for b, a in zip(bufs, kept):
                    b._data[...] = a
            outs = tuple(out) if ctx.is_tuple else (out,)
            pairs = [(o, g) for o, g in zip(outs, grads)
                     if g is not None and o.requires_grad]
            if pairs:
                _backward([o for o, _ in pairs], [g for _, g in pairs])
            shard_grad = unit._reduce_scatter_grads(leaves)
            if unit._straggler is not None:     # a root: its step ends
                _engine.queue_callback(unit._step_end)
            if shard_grad.dtype != unit._flat_param.dtype:
                # keep_low_precision_grads: the engine would cast it
                unit._accumulate(shard_grad)
                shard_grad = None
        finally:
            unit._free()
            # the recomputed graph's nodes and the leaves refer to each
            # other (a cycle, freed only by the garbage collector): let
            # the leaves drop the gathered array and their gradients now
            for t in leaves:
                t._data = t._data.reshape(-1)[:0].copy()
                t._grad = None
        in_grads = [a.grad if isinstance(a, Tensor) and a.requires_grad
                    else None for a in inputs]
        return (None, shard_grad, None, *in_grads)


class FullyShardedDataParallel(Module):
    """PyTorch's ``FullyShardedDataParallel(module, process_group=None,
    sharding_strategy=None, cpu_offload=None, auto_wrap_policy=None, ...)``
    (see the module doc). Every rank must build the same model (or pass
    ``sync_module_states=True`` to take rank 0's)."""

    def __init__(self, module, process_group=None, sharding_strategy=None,
                 cpu_offload=None, auto_wrap_policy=None,
                 backward_prefetch=None, mixed_precision=None,
                 ignored_modules=None, param_init_fn=None, device_id=None,
                 sync_module_states=False, forward_prefetch=False,
                 limit_all_gathers=True, use_orig_params=False,
                 ignored_states=None, device_mesh=None):
        super().__init__()
        if not isinstance(module, Module):
            raise TypeError(f"FullyShardedDataParallel expects an "
                            f"nn.Module, got {type(module).__name__}")
        for name, val in (("sharding_strategy", sharding_strategy),
                          ("cpu_offload", cpu_offload),
                          ("backward_prefetch", backward_prefetch),
                          ("ignored_modules", ignored_modules),
                          ("param_init_fn", param_init_fn),
                          ("ignored_states", ignored_states),
                          ("device_mesh", device_mesh)):
            if val is not None:
                raise NotImplementedError(
                    f"FullyShardedDataParallel: {name} is not supported "
                    f"(full sharding of every parameter only)")
        if use_orig_params:
            ignored_argument("FullyShardedDataParallel", "use_orig_params",
                             True, "parameters() are the units' flat "
                             "shards (_flat_param)")
        if forward_prefetch:
            ignored_argument("FullyShardedDataParallel", "forward_prefetch",
                             True, "a unit gathers when its forward starts")
        group = process_group if process_group is not None \
            else dist.group.WORLD
        if group is None:
            raise RuntimeError("FullyShardedDataParallel needs an "
                               "initialized process group")
        object.__setattr__(self, "process_group", group)
        if mixed_precision is not None and not isinstance(
                mixed_precision, (MixedPrecision, MixedPrecisionPolicy)):
            raise TypeError(f"FullyShardedDataParallel: mixed_precision "
                            f"must be a MixedPrecision, got "
                            f"{type(mixed_precision).__name__}")
        object.__setattr__(self, "_mp", mixed_precision)
        object.__setattr__(self, "_is_root", True)
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        # a model built on the meta device is materialised unit by unit
        # (each unit's modules in full, then only this rank's chunk kept),
        # initialised by streams keyed by the modules' names
        target = "cpu" if device_id is None else device_id
        with _init_lock:     # not a seed another rank thread has set
            seed = _random.initial_seed()
        if auto_wrap_policy is not None:
            _auto_wrap(module, auto_wrap_policy, group, sync_module_states,
                       mixed_precision, "", target, seed)
        _materialize(module, "", target, seed)
        self._fsdp_wrapped_module = module
        object.__setattr__(self, "_state_dict_type",
                           StateDictType.FULL_STATE_DICT)
        self._shard_params(sync_module_states)
        if sync_module_states and self.world_size > 1:
            # this unit's buffers (nested units sync their own)
            src = dist.get_global_rank(group, 0)
            for _, m in _walk(module, ""):
                for b in m._buffers.values():
                    if b is not None:
                        dist.broadcast(b, src, group=group)
        for u in self._units()[1:]:
            object.__setattr__(u, "_is_root", False)
            object.__setattr__(u, "_straggler", None)
        # which rank is slow, in which phase (nn/parallel/_straggler), on
        # the root: forward start to the end of backward, less the time
        # blocked in all-gathers and reduce-scatters (they are synchronous
        # here, so that is all their time)
        object.__setattr__(self, "_straggler", StragglerDetector(group)
                           if self.world_size > 1
                           and StragglerDetector.enabled() else None)
        self._cast_buffers()
        stats = _Stats()
        for u in self._units():
            object.__setattr__(u, "_stats", stats)
            stats.shard_bytes += u._flat_param._data.nbytes \
                if u._flat_param is not None else 0
        object.__setattr__(self, "_stats", stats)

    # ---------------------------------------------------------- sharding --
    def _shard_params(self, sync):
        """Own parameters -> one flat array, keep chunk ``rank``."""
        own, seen = [], {}
        nested = {}
        for u in self._units()[1:]:
            for p, places in getattr(u, "_own", ()):
                nested[id(p)] = places[0][1]
        for owner, name, p in _own_params(self._fsdp_wrapped_module):
            if id(p) in nested:
                raise ValueError(
                    f"FullyShardedDataParallel: parameter {name!r} of "
                    f"{type(owner).__name__} is shared with a nested unit "
                    f"(its {nested[id(p)]!r}), which has sharded it: wrap "
                    f"the modules that share a parameter in one unit")
            if id(p) in seen:              # a tied parameter: one copy
                seen[id(p)][1].append((owner, name))
                continue
            entry = (p, [(owner, name)])
            seen[id(p)] = entry
            own.append(entry)
        for _, places in own:
            for owner, name in places:
                del owner._parameters[name]
        object.__setattr__(self, "_own", own)
        self.register_parameter("_flat_param", None)
        if not own:
            object.__setattr__(self, "_numel", 0)
            return
        p0 = own[0][0]
        for p, places in own:
            if p._data.dtype != p0._data.dtype or type(p._data) is not \
                    type(p0._data):
                raise ValueError(
                    f"FullyShardedDataParallel: parameter "
                    f"{places[0][1]!r} is {p.dtype} on {p.device}, unlike "
                    f"{p0.dtype} on {p0.device}: a unit flattens its "
                    f"parameters into one array (wrap them apart)")
            if p.requires_grad != p0.requires_grad:
                raise ValueError("FullyShardedDataParallel: a unit mixes "
                                 "frozen and trainable parameters")
        shapes = [p.shape for p, _ in own]
        sizes = [p.numel() for p, _ in own]
        n = sum(sizes)
        chunk = -(-n // self.world_size)
        xp = p0._xp()
        r = self.rank
        if sync and self.world_size > 1:
            flat = xp.zeros(chunk * self.world_size, p0._data.dtype)
            o = 0
            for (p, _), k in zip(own, sizes):
                flat[o:o + k] = p._data.reshape(-1)
                o += k
            src = dist.get_global_rank(self.process_group, 0)
            dist.broadcast(Tensor._wrap(flat), src, group=self.process_group)
            flat = flat[r * chunk:(r + 1) * chunk]
        else:
            # only this rank's chunk: a unit never exists twice in full
            flat = _chunk_of([p for p, _ in own], sizes, r * chunk, chunk,
                             xp.zeros(chunk, p0._data.dtype))
        object.__setattr__(self, "_numel", n)
        object.__setattr__(self, "_chunk", chunk)
        object.__setattr__(self, "_shapes", shapes)
        object.__setattr__(self, "_sizes", sizes)
        self._flat_param = Parameter(
            Tensor._wrap(flat.copy() if flat.base is not None else flat),
            requires_grad=p0.requires_grad)
        # the original parameters give up their arrays: only the shard
        # stays (a caller holding them sees empty tensors, as in PyTorch)
        for p, _ in own:
            p._data = p._data.reshape(-1)[:0].copy()
        self._placeholders()

    def _placeholders(self):
        """Outside the unit's forward its parameters are empty tensors (as
        PyTorch's), so that repr and attribute access still work."""
        for p, places in self._own:
            empty = Tensor._wrap(p._data.reshape(-1)[:0])
            for owner, name in places:
                owner.__dict__[name] = empty

    def _units(self):
        """This wrapper and every nested one, pre-order."""
        out = [self]
        stack = [self._fsdp_wrapped_module]
        while stack:
            m = stack.pop()
            for c in reversed(list(m._modules.values())):
                if c is None:
                    continue
                if _unit_of(c) is not None:
                    out.extend(_unit_of(c)._units())
                else:
                    stack.append(c)
        return out

    def _cast_buffers(self):
        """Floating buffers of this unit's modules (not nested units') to
        ``buffer_dtype``; their original dtypes are what ``state_dict``
        saves."""
        object.__setattr__(self, "_buf_dtypes", {})
        dt = getattr(self._mp, "buffer_dtype", None)
        if dt is None:
            return
        for _, m in _walk(self._fsdp_wrapped_module, ""):
            for b in m._buffers.values():
                if b is not None and b.dtype.is_floating_point \
                        and b.dtype != dt:
                    self._buf_dtypes[id(b)] = b.dtype
                    b._data = b._data.astype(dt.np)

    def _param_dtype(self):
        return getattr(self._mp, "param_dtype", None)

    def _cast_inputs(self, args, kwargs):
        """PyTorch's input casting: floating-point tensors (nested in
        lists, tuples and dicts) to ``param_dtype``, through autograd."""
        mp, dt = self._mp, self._param_dtype()
        if dt is None:
            return args, kwargs
        if isinstance(mp, MixedPrecision):
            cast = mp.cast_root_forward_inputs if self._is_root \
                else mp.cast_forward_inputs
        else:
            cast = mp.cast_forward_inputs
        if not cast:
            return args, kwargs
        return _map_float(args, dt), _map_float(kwargs, dt)

    def _accumulate(self, g):
        """Add a shard gradient to ``_flat_param.grad`` as it is (a
        low-precision one stays low precision)."""
        fp = self._flat_param
        if fp._grad is None:
            fp._grad = g
        else:
            fp._grad._data += g._data
            fp._grad._bump_version()

    def _all_gather_flat(self, dtype=None):
        shard = self._flat_param._data
        if dtype is not None:          # cast before: less to send
            shard = shard.astype(dtype.np)
        xp = self._flat_param._xp()
        full = xp.empty(self._chunk * self.world_size, shard.dtype)
        if self.world_size == 1:
            full[...] = shard
        else:
            self._collective(dist.all_gather_into_tensor, full, shard)
        return full

    def _collective(self, fn, out, inp):
        """fn(out, inp) on the group, its time added to the step's
        communication wait."""
        t0 = time.perf_counter()
        fn(Tensor._wrap(out), Tensor._wrap(inp), group=self.process_group)
        self._stats.wait_s += time.perf_counter() - t0

    @property
    def straggler_reports(self):
        """The slow ranks straggler detection named so far (as
        DistributedDataParallel.straggler_reports)."""
        return [] if self._straggler is None else self._straggler.reports

    def _step_end(self):
        self._straggler.backward_end(self._stats.wait_s,
                                     device=self._flat_param.device)

    def _gather(self, requires_grad, compute=False):
        """Make the own parameters exist in full (views of one gathered
        array) as plain attributes of their modules; with requires_grad
        each is a fresh leaf whose .grad the recomputation fills. With
        ``compute`` they are in the mixed precision ``param_dtype``."""
        prev = self.__dict__.get("_full")
        if prev is not None:     # kept by an earlier forward's leaves
            self._stats.live -= prev.nbytes
            self._stats.freed.append(weakref.ref(prev))
        full = self._all_gather_flat(self._param_dtype() if compute
                                     else None)
        object.__setattr__(self, "_full", full)
        self._stats.add(full.nbytes)
        leaves, o = [], 0
        for (p, places), shape, k in zip(self._own, self._shapes,
                                         self._sizes):
            t = Tensor._wrap(full[o:o + k].reshape(shape))
            if requires_grad:
                t.requires_grad_(True)
            leaves.append(t)
            for owner, name in places:
                owner.__dict__[name] = t
            o += k
        return leaves

    def _free(self):
        full = self.__dict__.pop("_full", None)
        if full is None:
            return
        self._placeholders()
        self._stats.live -= full.nbytes
        self._stats.freed.append(weakref.ref(full))
        del self._stats.freed[:-64]

    def _reduce_scatter_grads(self, leaves):
        full = self._full
        xp = self._flat_param._xp()
        mp = self._mp
        rdt = full.dtype
        if mp is not None and (mp.reduce_dtype or mp.param_dtype):
            rdt = (mp.reduce_dtype or mp.param_dtype).np
        g = xp.zeros(full.size, rdt)
        o = 0
        for t, k in zip(leaves, self._sizes):
            if t is not None and t.grad is not None:
                g[o:o + k] = t.grad._data.reshape(-1)
            o += k
        mine = xp.empty(self._chunk, rdt)
        if self.world_size == 1:
            mine[...] = g
        elif mp is None:
            self._collective(dist.reduce_scatter_tensor, mine, g)
            mine /= self.world_size
        else:
            # a low-precision sum can overflow (float16): divide part of
            # the way before it and the rest after, as PyTorch's FSDP
            pre = 1
            while self.world_size % pre == 0 \
                    and self.world_size / pre > pre:
                pre *= 2
            if pre > 1:
                g /= rdt.type(pre)
            self._collective(dist.reduce_scatter_tensor, mine, g)
            if self.world_size // pre > 1:
                mine /= rdt.type(self.world_size // pre)
        keep = isinstance(mp, MixedPrecision) and mp.keep_low_precision_grads
        if not keep and mine.dtype != self._flat_param._data.dtype:
            mine = mine.astype(self._flat_param._data.dtype)
        return Tensor._wrap(mine)

    # ----------------------------------------------------------- forward --
    def _call_inner(self, args, kwargs):
        return self._fsdp_wrapped_module(*args, **kwargs)

    def forward(self, *args, **kwargs):
        if is_grad_enabled() and are_deterministic_algorithms_enabled():
            # its gradient reduce-scatter sums in an order set by the world
            # size (nn/parallel/_deterministic.py has the DDP path)
            raise RuntimeError(
                "FullyShardedDataParallel does not have a deterministic "
                "implementation for training under use_deterministic_"
                "algorithms(True): its reduce-scatter depends on the world "
                "size; use DistributedDataParallel with "
                "ZeroRedundancyOptimizer (ZeRO-1), or turn the mode off")
        if self._straggler is not None and is_grad_enabled():
            self._straggler.forward()
        if self._mp is not None:
            args, kwargs = self._cast_inputs(args, kwargs)
        out = self._forward(args, kwargs)
        odt = getattr(self._mp, "output_dtype", None)
        return out if odt is None else _map_float(out, odt)

    def _forward(self, args, kwargs):
        if self._flat_param is None:
            return self._call_inner(args, kwargs)
        if self._has_nested() and is_grad_enabled() \
                and self._flat_param.requires_grad:
            return self._forward_keep(args, kwargs)
        return _UnitFunction.apply(self, self._flat_param, kwargs, *args)

    def _has_nested(self):
        return len(self._units()) > 1

    def _forward_keep(self, args, kwargs):
        """A unit around nested units (the root, usually) keeps its full
        parameters from forward to the end of backward instead of
        recomputing: recomputing it would run every nested unit's forward
        once more (PyTorch's FSDP2 does not reshard the root either). Its
        gradients are reduce-scattered when backward ends."""
        keep = self.__dict__.get("_keep")
        if keep is None:
            keep = {"sets": [], "queued": False}
            object.__setattr__(self, "_keep", keep)
        leaves = self._gather(requires_grad=True, compute=True)
        # forward may run again before backward (two inputs, one loss):
        # every call's leaves are reduced when backward ends. Weakly held:
        # a forward whose graph was dropped without backward (evaluation
        # with grad enabled) leaves nothing behind
        keep["sets"].append([weakref.ref(t) for t in leaves])
        for t in leaves:
            t.register_post_accumulate_grad_hook(self._keep_ready)
        return self._call_inner(args, kwargs)

    def _keep_ready(self, _):
        keep = self.__dict__.get("_keep")
        if keep is not None and not keep["queued"]:
            keep["queued"] = True
            _engine.queue_callback(self._keep_finish)
            if self._straggler is not None:    # after the reduce-scatters
                _engine.queue_callback(self._step_end)

    def _keep_finish(self):
        keep = self.__dict__.pop("_keep", None)
        if keep is None:
            return
        g, sets = None, []
        try:
            sets = [[r() for r in refs] for refs in keep["sets"]]
            sets = [ls for ls in sets if any(t is not None for t in ls)]
            for leaves in sets:
                part = self._reduce_scatter_grads(leaves)
                g = part if g is None else Tensor._wrap(g._data + part._data)
        finally:
            self._free()
            for leaves in sets:          # drop the gathered views
                for t in leaves:
                    if t is not None:
                        t._data = t._data.reshape(-1)[:0].copy()
                        t._grad = None
        fp = self._flat_param
        if g is None:
            return
        if g.dtype != fp.dtype:          # keep_low_precision_grads
            self._accumulate(g)
        elif fp.grad is None:
            fp.grad = g
        else:
            fp.grad._data += g._data
            fp.grad._bump_version()

    @property
    def module(self):
        return self._fsdp_wrapped_module

    @contextlib.contextmanager
    def summon_full_params(self, writeback=True):
        """The full parameters of every unit, as plain tensors of their
        modules, inside the block (a collective); with ``writeback``,
        changes made there go back into the shards."""
        units = [u for u in self._units() if u._flat_param is not None]
        for u in units:
            u._gather(requires_grad=False)
        try:
            yield
        finally:
            for u in units:
                if writeback:
                    c, r = u._chunk, u.rank
                    u._flat_param._data[...] = u._full[r * c:(r + 1) * c]
                    u._flat_param._bump_version()
                u._free()

    # ---------------------------------------------------------- clipping --
    def clip_grad_norm_(self, max_norm, norm_type=2.0,
                        error_if_nonfinite=False):
        """Clip every unit's gradient shard by the norm of the whole
        model's gradient (a collective over the group); returns it."""
        from ...nn.utils.clip_grad import clip_grads_with_norm_
        units = [u for u in self._units() if u._flat_param is not None]
        arrays = []
        for u in units:
            g = u._flat_param.grad
            if g is not None:       # the padding is not the model's
                real = max(0, min(u._chunk, u._numel - u.rank * u._chunk))
                arrays.append(g._data[:real])
        fp = units[0]._flat_param
        total = global_norm(arrays, norm_type, (self.process_group,),
                            fp.dtype, fp.device, error_if_nonfinite)
        clip_grads_with_norm_([u._flat_param for u in units], max_norm,
                              total)
        return total

    # -------------------------------------------------------- state dict --
    @contextlib.contextmanager
    def state_dict_type(self, state_dict_type):
        """PyTorch's ``FSDP.state_dict_type(model, type)`` as a method:
        ``state_dict()`` inside the block returns that type."""
        prev = self._state_dict_type
        object.__setattr__(self, "_state_dict_type", state_dict_type)
        try:
            yield
        finally:
            object.__setattr__(self, "_state_dict_type", prev)

    def _named_pieces(self, prefix=""):
        """(unit, full name, offset in the flat, size, shape) of every
        parameter, nested units included."""
        out = []
        pre = {}
        for owner_prefix, m in _walk(self._fsdp_wrapped_module, prefix):
            pre[id(m)] = owner_prefix
        o = 0
        for (p, places), shape, k in zip(self._own, getattr(
                self, "_shapes", []), getattr(self, "_sizes", [])):
            owner, name = places[0]
            out.append((self, _join(pre[id(owner)], name), o, k, shape))
            o += k
        for owner_prefix, m in _walk(self._fsdp_wrapped_module, prefix):
            for cname, c in m._modules.items():
                if _unit_of(c) is not None:
                    out += _unit_of(c)._named_pieces(
                        _join(owner_prefix, cname))
        return out

    def _aliases(self, prefix=""):
        """{other name: first name} of parameters registered under more
        than one name (tied weights), nested units included."""
        pre = {id(m): p for p, m in _walk(self._fsdp_wrapped_module,
                                          prefix)}
        out = {}
        for p, places in self._own:
            first = _join(pre[id(places[0][0])], places[0][1])
            for owner, name in places[1:]:
                out[_join(pre[id(owner)], name)] = first
        for owner_prefix, m in _walk(self._fsdp_wrapped_module, prefix):
            for cname, c in m._modules.items():
                if _unit_of(c) is not None:
                    out.update(_unit_of(c)._aliases(
                        _join(owner_prefix, cname)))
        return out

    def _buffers_named(self):
        out = {}
        for name, b in self._fsdp_wrapped_module.named_buffers():
            out[name.replace(_WRAPPED + ".", "")] = b
        return out

    def _piece_range(self, u, o, k):
        c, r = u._chunk, u.rank
        lo, hi = max(o, r * c), min(o + k, (r + 1) * c)
        return lo, max(lo, hi)

    def optim_state_dict(self, optim):
        """``optim``'s state (an optimizer over ``self.parameters()``)
        keyed by the unsharded parameters' names, as this model's
        ``state_dict`` type says: FULL (gathered: what the unsharded
        optimizer holds, on every rank) or SHARDED (each rank's pieces as
        ``dcp.shard_of`` boxes of the flattened state, for dcp on any world
        size). A collective in FULL mode. PyTorch's
        ``FSDP.optim_state_dict(model, optim)``."""
        from ..checkpoint import shard_of
        sharded = self._state_dict_type == StateDictType.SHARDED_STATE_DICT
        pieces = self._named_pieces()
        by_unit = {}
        for u, name, o, k, shape in pieces:
            by_unit.setdefault(id(u), []).append((u, name, o, k, shape))
        state, names_of = {}, {}
        for u in self._units():
            if u._flat_param is None:
                continue
            names_of[id(u._flat_param)] = [n for _, n, _, _, _ in
                                           by_unit.get(id(u), [])]
            st = optim.state.get(u._flat_param) or {}
            for key, v in st.items():
                elementwise = isinstance(v, Tensor) and v.dim() == 1 \
                    and v.numel() == u._chunk
                full = None
                if elementwise and not sharded:
                    full = _gather_array(u, v._data)
                for _, name, o, k, shape in by_unit.get(id(u), []):
                    ent = state.setdefault(name, {})
                    if not elementwise:
                        ent[key] = v.detach().clone() \
                            if isinstance(v, Tensor) else v
                    elif sharded:
                        lo, hi = self._piece_range(u, o, k)
                        a = v._data[lo - u.rank * u._chunk:
                                    hi - u.rank * u._chunk].copy()
                        ent[key] = shard_of(Tensor._wrap(a), (k,),
                                            (min(lo - o, k),))
                    else:
                        ent[key] = Tensor._wrap(
                            full[o:o + k].reshape(shape).copy())
        groups = []
        for g in optim.param_groups:
            packed = {k: v for k, v in g.items() if k != "params"}
            packed["params"] = [n for p in g["params"]
                                for n in names_of.get(id(p), [])]
            groups.append(packed)
        return {"state": state, "param_groups": groups}

    def optim_state_dict_to_load(self, optim, optim_state_dict):
        """The inverse: a state dict for ``optim.load_state_dict`` from
        one of ``optim_state_dict``'s (full, or sharded and filled by
        ``dcp.load``; saved with any world size and wrapping when full or
        loaded through dcp)."""
        saved = optim_state_dict["state"]
        group_of_name = {}
        for sg in optim_state_dict["param_groups"]:
            for n in sg["params"]:
                group_of_name[n] = sg
        pieces = self._named_pieces()
        index = {}
        for g in optim.param_groups:
            for p in g["params"]:
                index.setdefault(id(p), len(index))
        state, group_opts = {}, {}
        for u, name, o, k, shape in pieces:
            fp = u._flat_param
            if name not in saved or id(fp) not in index:
                continue
            i = index[id(fp)]
            ent = state.setdefault(i, {})
            if name in group_of_name:
                group_opts.setdefault(i, group_of_name[name])
            lo, hi = self._piece_range(u, o, k)
            base = u.rank * u._chunk
            for key, v in saved[name].items():
                box = getattr(v, "_dcp_shard", None) \
                    if isinstance(v, Tensor) else None
                if box is None and not (isinstance(v, Tensor)
                                        and tuple(v.shape) == tuple(shape)
                                        and v.dim() > 0 and key != "step"):
                    ent.setdefault(key, v.detach().clone()
                                   if isinstance(v, Tensor) else v)
                    continue
                if key not in ent:
                    ent[key] = Tensor._wrap(fp._xp().zeros(
                        u._chunk, fp._data.dtype))
                if lo >= hi:
                    continue
                if box is not None:
                    if box != ((k,), (lo - o,)):
                        raise ValueError(
                            f"optim_state_dict_to_load: {name!r}/{key} is "
                            f"the box {box} but rank {u.rank} holds "
                            f"[{lo - o}, {hi - o}) of {k}; dcp.load it "
                            f"into this model's sharded optim_state_dict")
                    src = v._data
                else:
                    src = v._data.reshape(-1)[lo - o:hi - o]
                ent[key]._data[lo - base:hi - base] = fp.device.send(src)
        groups = []
        for gi, g in enumerate(optim.param_groups):
            packed = {k: v for k, v in g.items() if k != "params"}
            ids = [index[id(p)] for p in g["params"]]
            for i in ids:
                if i in group_opts:
                    packed.update({k: v for k, v in group_opts[i].items()
                                   if k != "params"})
                    break
            packed["params"] = ids
            groups.append(packed)
        return {"state": state, "param_groups": groups}

    def state_dict(self, destination=None, prefix="", keep_vars=False):
        sd = {} if destination is None else destination
        sharded = self._state_dict_type == StateDictType.SHARDED_STATE_DICT
        if sharded:
            from ..checkpoint import shard_of
            for u, name, o, k, shape in self._named_pieces():
                c, r = u._chunk, u.rank
                lo, hi = max(o, r * c), min(o + k, (r + 1) * c)
                hi = max(lo, hi)
                piece = u._flat_param._data[lo - r * c:hi - r * c].copy()
                # the flattened parameter's elements [lo - o, hi - o): a
                # 1-D box that dcp saves and loads on any world size
                sd[prefix + name] = shard_of(Tensor._wrap(piece), (k,),
                                             (min(lo - o, k),))
        else:
            fulls = {}
            for u in self._units():
                if u._flat_param is not None:
                    fulls[id(u)] = u._all_gather_flat()
            for u, name, o, k, shape in self._named_pieces():
                sd[prefix + name] = Tensor._wrap(
                    fulls[id(u)][o:o + k].reshape(shape).copy())
        for alias, first in self._aliases().items():
            sd[prefix + alias] = sd[prefix + first]   # tied: one tensor
        orig = {}
        for u in self._units():
            orig.update(u._buf_dtypes)
        for name, b in self._buffers_named().items():
            if id(b) in orig:          # saved in full precision
                sd[prefix + name] = b.detach().to(orig[id(b)])
            else:
                sd[prefix + name] = b if keep_vars else b.detach()
        return sd

    def load_state_dict(self, state_dict, strict=True, assign=False):
        """A full state dict (the unsharded model's) or a sharded one from
        the same world size."""
        pieces = self._named_pieces()
        names = {n for _, n, _, _, _ in pieces}
        bufs = self._buffers_named()
        want = names | set(bufs) | set(self._aliases())
        missing = sorted(want - set(state_dict))
        unexpected = sorted(set(state_dict) - want)
        if strict and (missing or unexpected):
            raise RuntimeError(
                f"Error(s) in loading state_dict for "
                f"FullyShardedDataParallel: missing keys {missing}, "
                f"unexpected keys {unexpected}")
        with no_grad():
            for u, name, o, k, shape in pieces:
                if name not in state_dict:
                    continue
                v = state_dict[name]
                c, r = u._chunk, u.rank
                lo, hi = max(o, r * c), min(o + k, (r + 1) * c)
                if lo >= hi:
                    continue
                dst = u._flat_param._data[lo - r * c:hi - r * c]
                box = getattr(v, "_dcp_shard", None)
                if box is not None:
                    if box != ((k,), (lo - o,)) or v.numel() != hi - lo:
                        raise ValueError(
                            f"FullyShardedDataParallel.load_state_dict: "
                            f"{name!r} is a shard of elements "
                            f"[{box[1][0]}, {box[1][0] + v.numel()}) but "
                            f"rank {r} holds [{lo - o}, {hi - o}); load it "
                            f"with dcp.load into this model's sharded "
                            f"state dict to change the world size")
                    dst[...] = v._data
                else:
                    if tuple(v.shape) != tuple(shape):
                        raise RuntimeError(
                            f"size mismatch for {name}: copying a param "
                            f"with shape {list(v.shape)}, the shape in "
                            f"current model is {list(shape)}")
                    dst[...] = u._flat_param.device.send(
                        v._data.reshape(-1)[lo - o:hi - o])
                u._flat_param._bump_version()
            for name, b in bufs.items():
                if name in state_dict:
                    b._data[...] = state_dict[name]._data.astype(
                        b._data.dtype)
        return _Keys(missing, unexpected)


class _Keys(tuple):
    def __new__(cls, missing, unexpected):
        self = super().__new__(cls, (missing, unexpected))
        self.missing_keys, self.unexpected_keys = missing, unexpected
        return self


def _gather_array(u, shard):
    """The unit-sized array from every rank's chunk (a collective)."""
    xp = u._flat_param._xp()
    out = xp.empty(u._chunk * u.world_size, shard.dtype)
    if u.world_size == 1:
        out[...] = shard
    else:
        dist.all_gather_into_tensor(Tensor._wrap(out), Tensor._wrap(
            xp.ascontiguousarray(shard)), group=u.process_group)
    return out


def _unit_of(m):
    """The FSDP unit that ``m`` is (a wrapper, or a module given to
    ``fully_shard``), else None."""
    if isinstance(m, FullyShardedDataParallel):
        return m
    return m.__dict__.get("_fsdp_state")


def _join(a, b):
    return f"{a}.{b}" if a else b


def _walk(module, prefix):
    """(prefix, module) of ``module`` and its descendants, not entering
    nested FSDP wrappers."""
    out, stack = [], [(prefix, module)]
    while stack:
        pre, m = stack.pop()
        out.append((pre, m))
        for name, c in m._modules.items():
            if c is not None and _unit_of(c) is None:
                stack.append((_join(pre, name), c))
    return out


def _own_params(module):
    """(owner module, name, parameter) of the parameters not inside a
    nested FSDP wrapper, in registration order."""
    out = []

    def visit(m):
        for name, p in m._parameters.items():
            if p is not None:
                out.append((m, name, p))
        for c in m._modules.values():
            if c is not None and _unit_of(c) is None:
                visit(c)
    visit(module)
    return out


def _numel_unwrapped(module):
    return sum(p.numel() for _, _, p in _own_params(module))


def _map_float(obj, dtype):
    """``obj`` with its floating-point tensors (in lists, tuples, dicts)
    cast to ``dtype``."""
    if isinstance(obj, Tensor):
        return obj.to(dtype) if obj.dtype.is_floating_point \
            and obj.dtype != dtype else obj
    if isinstance(obj, (list, tuple)):
        out = [_map_float(o, dtype) for o in obj]
        return type(obj)(out) if type(obj) in (list, tuple) \
            else type(obj)(*out)
    if isinstance(obj, dict):
        return {k: _map_float(v, dtype) for k, v in obj.items()}
    return obj


def _chunk_of(params, sizes, lo, n, out):
    """Elements [lo, lo + n) of the parameters laid end to end, into
    ``out`` (zeros: the padding)."""
    o = 0
    for p, k in zip(params, sizes):
        a, b = max(o, lo), min(o + k, lo + n)
        if a < b:
            out[a - lo:b - lo] = p._data.reshape(-1)[a - o:b - o]
        o += k
    return out


def _name_seed(seed, name):
    h = hashlib.sha256(f"{seed}/{name}".encode()).digest()
    return int.from_bytes(h[:8], "little") >> 1


# thread ranks share the default generator: one materialises at a time
_init_lock = threading.RLock()


def reset_parameters_by_name(module, seed, prefix=""):
    """Call ``reset_parameters()`` of ``module`` and its submodules (not
    inside FSDP units), each with the default generator seeded from
    (``seed``, its qualified name under ``prefix``), then put the
    generator back. A model so initialised has the same values however
    it is built or sharded: FSDP initialises a meta-device model this
    way (seed: ``dtorch.initial_seed()`` when it is wrapped), and a
    one-rank reference gets them with ``reset_parameters_by_name(model,
    seed)``."""
    _reset_by_name(_walk(module, prefix), seed)


def _reset_by_name(named, seed):
    with _init_lock:
        state = _random.get_rng_state()
        try:
            for name, m in sorted(named, key=lambda e: e[0]):
                reset = getattr(m, "reset_parameters", None)
                if callable(reset):
                    _random.default_generator.manual_seed(
                        _name_seed(seed, name))
                    reset()
        finally:
            _random.set_rng_state(state)


def _materialize(module, prefix, device, seed):
    """Modules of this unit still on the meta device: storage on
    ``device`` (``to_empty``), values from ``reset_parameters_by_name``."""
    metas = [(n, m) for n, m in _walk(module, prefix)
             if any(t is not None and t.is_meta
                    for t in (*m._parameters.values(),
                              *m._buffers.values()))]
    for _, m in metas:
        m.to_empty(device=device, recurse=False)
    _reset_by_name(metas, seed)


def _auto_wrap(module, policy, group, sync, mp, prefix, target, seed):
    """Wrap the submodules ``policy`` picks (children first), each
    materialised first if it is on the meta device."""
    for name, child in list(module._modules.items()):
        if child is None or _unit_of(child) is not None:
            continue
        path = _join(prefix, name)
        if policy(module=child, recurse=True,
                  nonwrapped_numel=_numel_unwrapped(child)):
            _auto_wrap(child, policy, group, sync, mp, path, target, seed)
        if policy(module=child, recurse=False,
                  nonwrapped_numel=_numel_unwrapped(child)):
            _materialize(child, path, target, seed)
            module._modules[name] = FullyShardedDataParallel(
                child, process_group=group, sync_module_states=sync,
                mixed_precision=mp)



# ============================================================ fully_shard ==

class FSDPModule:
    """Mixed into the class of a module given to ``fully_shard`` (PyTorch's
    FSDP2 name): its forward runs as an FSDP unit, its ``parameters()``
    are its shards, ``state_dict()`` is the unsharded one (see
    ``FullyShardedDataParallel``)."""

    def forward(self, *args, **kwargs):
        return self.__dict__["_fsdp_state"].forward(*args, **kwargs)

    @property
    def straggler_reports(self):
        return self.__dict__["_fsdp_state"].straggler_reports

    def state_dict(self, *args, **kwargs):
        return self.__dict__["_fsdp_state"].state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict, strict=True, assign=False):
        return self.__dict__["_fsdp_state"].load_state_dict(state_dict,
                                                            strict)

    def clip_grad_norm_(self, max_norm, norm_type=2.0,
                        error_if_nonfinite=False):
        return self.__dict__["_fsdp_state"].clip_grad_norm_(
            max_norm, norm_type, error_if_nonfinite)

    def summon_full_params(self, writeback=True):
        return self.__dict__["_fsdp_state"].summon_full_params(writeback)

    def state_dict_type(self, state_dict_type):
        return self.__dict__["_fsdp_state"].state_dict_type(state_dict_type)


class _InPlaceUnit(FullyShardedDataParallel):
    """The FSDP state of a module sharded in place: its inner call is the
    module's own class's forward."""

    def _call_inner(self, args, kwargs):
        m = self._fsdp_wrapped_module
        return self._orig_cls.forward(m, *args, **kwargs)


def fully_shard(module, *, mesh=None, reshard_after_forward=True,
                process_group=None, mp_policy=None, **kwargs):
    """Shard ``module`` in place (PyTorch's ``fully_shard``): call it on
    each block, then on the root; returns the module, now an FSDP unit
    whose ``parameters()`` are its flat shard."""
    if mesh is not None:
        raise NotImplementedError("fully_shard: mesh is not supported; "
                                  "pass process_group")
    if reshard_after_forward is not True:
        raise NotImplementedError("fully_shard: parameters are always "
                                  "freed after forward")
    if kwargs:
        raise NotImplementedError(f"fully_shard: {sorted(kwargs)} not "
                                  f"supported")
    if not isinstance(module, Module):
        raise TypeError(f"fully_shard expects an nn.Module, got "
                        f"{type(module).__name__}")
    if _unit_of(module) is not None:
        raise ValueError("fully_shard: the module is sharded already")
    if any(t.is_meta for t in (*module.parameters(), *module.buffers())):
        # keyed by names relative to this block, every block would get
        # the same values: refuse rather than initialise them wrongly
        raise NotImplementedError(
            "fully_shard: the module is on the meta device; materialise it "
            "first (to_empty(device=...) and reset_parameters()) or wrap the "
            "model in FullyShardedDataParallel(auto_wrap_policy=...), which "
            "materialises each unit as it shards it")
    orig = type(module)
    state = _InPlaceUnit.__new__(_InPlaceUnit)
    object.__setattr__(state, "_orig_cls", orig)
    if mp_policy is not None and not isinstance(mp_policy,
                                                MixedPrecisionPolicy):
        raise TypeError(f"fully_shard: mp_policy must be a "
                        f"MixedPrecisionPolicy, got "
                        f"{type(mp_policy).__name__}")
    FullyShardedDataParallel.__init__(state, module,
                                      process_group=process_group,
                                      mixed_precision=mp_policy)
    fp = state._flat_param
    if fp is not None:
        module._parameters["_flat_param"] = fp
    module.__dict__["_fsdp_state"] = state
    module.__class__ = type(f"FSDP{orig.__name__}", (FSDPModule, orig), {})
    return module
