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

Under ``dtorch.use_deterministic_algorithms(True)`` the root runs the step
as deterministic DDP, with every unit gathered (``_deterministic.py``;
``virtual_shards=`` as DistributedDataParallel's): the same bits on any
world size. This file is the wrapper (forward, backward, clipping,
``fully_shard``); the flat-parameter sharding is ``_flat_param.py``, the
state dicts ``_state_dict.py``.
"""
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
from ... import random as _random
from ...tensor import Tensor
from ...utils.checkpoint import ForwardState
from ..clip_grad import global_norm
from ._deterministic import FSDPDeterministicStep
from ._flat_param import (_Sharding, _Stats, _init_lock, _join,
                          _materialize, _numel_unwrapped, _unit_of, _walk,
                          reset_parameters_by_name)  # noqa: F401
from ._state_dict import StateDictType, _StateDicts
from .api import MixedPrecision, MixedPrecisionPolicy

__all__ = ["FullyShardedDataParallel", "StateDictType", "fully_shard",
           "FSDPModule"]



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


class FullyShardedDataParallel(_StateDicts, _Sharding, Module):
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
                 ignored_states=None, device_mesh=None,
                 virtual_shards=None):
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
        # dtorch's, as DistributedDataParallel's: the number of shards of
        # the global batch under use_deterministic_algorithms(True)
        object.__setattr__(self, "virtual_shards", virtual_shards)
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

    @property
    def straggler_reports(self):
        """The slow ranks straggler detection named so far (as
        DistributedDataParallel.straggler_reports)."""
        return [] if self._straggler is None else self._straggler.reports

    def _step_end(self):
        self._straggler.backward_end(self._stats.wait_s,
                                     device=self._flat_param.device)

    # ----------------------------------------------------------- forward --
    def _call_inner(self, args, kwargs):
        return self._fsdp_wrapped_module(*args, **kwargs)

    def forward(self, *args, **kwargs):
        if are_deterministic_algorithms_enabled():
            return self._deterministic(args, kwargs)
        if self._straggler is not None and is_grad_enabled():
            self._straggler.forward()
        if self._mp is not None:
            args, kwargs = self._cast_inputs(args, kwargs)
        out = self._forward(args, kwargs)
        odt = getattr(self._mp, "output_dtype", None)
        return out if odt is None else _map_float(out, odt)

    def _deterministic(self, args, kwargs):
        """The root runs the step as deterministic DDP
        (``_deterministic``); nested units, gathered by it, run their
        modules as they are."""
        if not self._is_root:
            if not self.__dict__.get("_det_running"):
                raise RuntimeError(
                    "FullyShardedDataParallel: under use_deterministic_"
                    "algorithms(True) a nested unit runs inside its root's "
                    "forward only")
            return self._call_inner(args, kwargs)
        det = self.__dict__.get("_det")
        if det is None:
            det = FSDPDeterministicStep(self, self.virtual_shards)
            object.__setattr__(self, "_det", det)
        return det.forward(args, kwargs)

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
