"""ZeroRedundancyOptimizer: optimizer state sharded over a data-parallel
group (ZeRO stage 1; stage 2 with ``zero_hook.reduce_scatter_hook``).

Sharding is by element, as DeepSpeed does, not by whole parameter as
PyTorch's version does: the parameters are laid end to end in *units*
(by default one per parameter group, dtype and device) and each unit is cut
into ``world_size`` equal contiguous chunks, rank r owning chunk r. So every
rank holds ~1/N of the state whatever the parameter sizes (a parameter
smaller than the world size lives on one or two ranks), and a parameter
may be split between ranks.

Each piece of a parameter that a rank owns is a 1-D view of that
parameter's elements, given to a local ``optimizer_class`` instance in a
copy of the parameter's group. A step copies the hyper-parameters (an LR
scheduler changes ``self.param_groups``), points each piece's gradient at
its part of ``p.grad``, runs the local step (which updates the viewed
elements in place), then all-gathers each unit so every rank has the whole
updated model. This is exact for the element-wise optimizers (SGD, Adam,
AdamW, RMSprop, Adagrad, Adadelta, Adamax, ASGD, NAdam, RAdam, Rprop):
a piece is updated as its elements would be inside the whole parameter.
LBFGS (whole-model line search) is refused.

Stage 2: register ``reduce_scatter_hook`` on the DDP model with this
optimizer as the state. DDP's buckets then become the units (each bucket
reduce-scattered: rank r receives the averaged chunk r it owns, half the
traffic of an all-reduce), and the step reads the owned part of each
gradient only. The other elements of ``p.grad`` are left zero, so clip
with ``self.clip_grad_norm_`` (the global norm), not
``nn.utils.clip_grad_norm_``.

Example::

    model = DDP(net)
    opt = ZeroRedundancyOptimizer(model.parameters(), optim.Adam, lr=1e-3)
    model.register_comm_hook(opt, reduce_scatter_hook)    # optional: ZeRO-2
    loss_fn(model(x), y).backward()
    opt.step()
"""
import os

import numpy as np

from ... import distributed as dist
from ..._ignored import ignored_argument
from ...autograd.grad_mode import no_grad
from ...optim.optimizer import Optimizer
from ...tensor import Tensor
from ..clip_grad import global_norm

__all__ = ["ZeroRedundancyOptimizer"]

# the size of a unit of the default layout: bounds the all-gather's
# buffer after a step (8 x 4 MiB layers measured: 48 MiB of step peak with
# one unit for the whole model)
_UNIT_BYTES = 8 * 1024 * 1024


class _Piece:
    """The elements [lo, hi) of ``param`` (flattened) that this rank owns,
    as a 1-D tensor ``shard`` handed to the local optimizer."""
    __slots__ = ("param", "index", "lo", "hi", "shard", "is_view")

    def __init__(self, param, index, lo, hi):
        self.param, self.index, self.lo, self.hi = param, index, lo, hi
        self.shard = Tensor._wrap(self._flat()[lo:hi])
        self.is_view = True

    def _flat(self):
        return self.param._data.reshape(-1)

    def attach(self):
        """Point the shard at the parameter's current elements and
        gradient (the arrays may have been replaced since the last step):
        a view, so the local step updates the parameter in place, unless
        the parameter is not contiguous (then a copy, written back)."""
        p = self.param
        self.is_view = p._data.flags.c_contiguous
        self.shard._data = self._flat()[self.lo:self.hi]
        g = p.grad
        self.shard._grad = None if g is None else Tensor._wrap(
            g._data.reshape(-1)[self.lo:self.hi])

    def write_back(self):
        if not self.is_view:
            flat = self.param._data.reshape(-1)
            flat[self.lo:self.hi] = self.shard._data
            self.param._data[...] = flat.reshape(self.param._data.shape)


class _Unit:
    """Parameters laid end to end, cut into ``n`` chunks of ``chunk``
    elements (the last padded)."""

    def __init__(self, params, n, rank):
        self.params = list(params)
        self.offsets, total = [], 0
        for p in self.params:
            self.offsets.append(total)
            total += p.numel()
        self.numel, self.n = total, n
        self.chunk = -(-total // n) if total else 0
        self.lo = min(rank * self.chunk, total)
        self.hi = min((rank + 1) * self.chunk, total)

    def owned(self, with_offset=False):
        """(param, lo, hi) of the pieces in this rank's chunk (lo, hi
        within the parameter; with_offset: and lo within the chunk)."""
        for p, o in zip(self.params, self.offsets):
            lo, hi = max(o, self.lo), min(o + p.numel(), self.hi)
            if lo < hi:
                if with_offset:
                    yield p, lo - o, hi - o, lo - self.lo
                else:
                    yield p, lo - o, hi - o

    def all_gather(self, group):
        """Every rank's chunk into every rank's parameters."""
        if not self.numel:
            return
        p0 = self.params[0]
        xp = p0._xp()
        send = xp.zeros(self.chunk, p0._data.dtype)
        for p, lo, hi, o in self.owned(with_offset=True):
            send[o:o + hi - lo] = p._data.reshape(-1)[lo:hi]
        out = xp.empty(self.chunk * self.n, send.dtype)
        dist.all_gather_into_tensor(Tensor._wrap(out), Tensor._wrap(send),
                                    group=group)
        for p, o in zip(self.params, self.offsets):
            p._data[...] = out[o:o + p.numel()].reshape(p._data.shape)
            p._bump_version()


class ZeroRedundancyOptimizer(Optimizer):
    """PyTorch's ``ZeroRedundancyOptimizer(params, optimizer_class,
    process_group=None, parameters_as_bucket_view=False,
    overlap_with_ddp=False, **defaults)``: ``optimizer_class(**defaults)``
    runs on this rank's shard of the parameters (see the module doc).

    ``state_dict()`` needs ``consolidate_state_dict(to)`` first on the rank
    that calls it; it returns the state of the unsharded
    ``optimizer_class`` (loadable there, and back here on any world size
    with ``load_state_dict``). ``clip_grad_norm_`` clips by the global
    norm (stage 1 and 2)."""

    def __init__(self, params, optimizer_class, process_group=None,
                 parameters_as_bucket_view=False, overlap_with_ddp=False,
                 **defaults):
        if overlap_with_ddp:
            raise NotImplementedError(
                "ZeroRedundancyOptimizer(overlap_with_ddp=True) is not "
                "supported; for ZeRO-2 register dtorch.distributed."
                "algorithms.ddp_comm_hooks.zero_hook.reduce_scatter_hook "
                "on the DDP model instead")
        if parameters_as_bucket_view:
            ignored_argument("ZeroRedundancyOptimizer",
                             "parameters_as_bucket_view", True,
                             "shards are views of the parameters already")
        if getattr(optimizer_class, "__name__", "") == "LBFGS":
            raise ValueError("ZeroRedundancyOptimizer: LBFGS needs the "
                             "whole model in one line search and cannot "
                             "run on shards; use an element-wise optimizer")
        super().__init__(params, defaults)
        self.process_group = process_group if process_group is not None \
            else dist.group.WORLD
        # in a rank of dtorch-launch --elastic the group forms inside
        # ElasticJob, which lays the shards out over it (_reshard)
        self._awaits_group = self.process_group is None \
            and "DTORCH_ELASTIC" in os.environ
        if self.process_group is None and not self._awaits_group:
            raise RuntimeError("ZeroRedundancyOptimizer needs an initialized "
                               "process group (init_process_group)")
        self.world_size = 1 if self._awaits_group else \
            dist.get_world_size(self.process_group)
        self.rank = 0 if self._awaits_group else \
            dist.get_rank(self.process_group)
        self._optim_class = optimizer_class
        self._optim_defaults = defaults
        self._buckets = {}        # DDP bucket index -> params (stage 2)
        self._stage2 = False
        self._consolidated = None
        self._build(None)

    # ------------------------------------------------------------ layout --
    def _default_units(self, params_in_order, taken=()):
        """Parameters of one group, dtype and device, in order, cut into
        units of about ``_UNIT_BYTES`` (whole parameters): the all-gather
        after a step needs a buffer of one unit, not of the model."""
        units = {}
        for gi, group in enumerate(self.param_groups):
            for p in group["params"]:
                if id(p) in taken:
                    continue
                key = (gi, type(p._data), p._data.dtype, str(p.device))
                units.setdefault(key, [[]])
                cur = units[key][-1]
                if cur and sum(q._data.nbytes for q in cur) \
                        + p._data.nbytes > _UNIT_BYTES:
                    cur = []
                    units[key].append(cur)
                cur.append(p)
        return [u for us in units.values() for u in us]

    def _build(self, bucket_params):
        """(Re)build units, pieces and the local optimizer (no state yet)."""
        all_params = [p for g in self.param_groups for p in g["params"]]
        if bucket_params is None:
            unit_params = self._default_units(all_params)
        else:
            mine = {id(p) for p in all_params}
            unit_params, taken = [], set()
            for ps in bucket_params:
                ps = [p for p in ps if id(p) in mine]
                if ps:
                    unit_params.append(ps)
                    taken.update(id(p) for p in ps)
            unit_params += self._default_units(all_params, taken)
        self._units = [_Unit(ps, self.world_size, self.rank)
                       for ps in unit_params]
        index = {id(p): i for i, p in enumerate(all_params)}
        group_of = {id(p): gi for gi, g in enumerate(self.param_groups)
                    for p in g["params"]}
        self._pieces = []
        local_groups = [dict(g, params=[]) for g in self.param_groups]
        for u in self._units:
            for p, lo, hi in u.owned():
                piece = _Piece(p, index[id(p)], lo, hi)
                self._pieces.append(piece)
                local_groups[group_of[id(p)]]["params"].append(piece.shard)
        self.optim = self._optim_class(local_groups, **self._optim_defaults)
        # the local optimizer filled in its defaults: show them here too,
        # so that schedulers see 'lr' etc. on self.param_groups
        for g, lg in zip(self.param_groups, self.optim.param_groups):
            for k, v in lg.items():
                if k != "params":
                    g.setdefault(k, v)

    def _check_reshardable(self):
        if self._stage2 or self._buckets:
            raise NotImplementedError(
                "ZeroRedundancyOptimizer with reduce_scatter_hook (ZeRO-2) "
                "cannot be re-sharded by an elastic job: use ZeRO-1 (no "
                "hook) under ElasticJob")

    def _reshard(self, process_group, state_dict=None):
        """Lay the shards out again over ``process_group`` (an elastic
        job's new membership) and load the unsharded ``state_dict`` into
        them (None: no state yet)."""
        self._check_reshardable()
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        self.rank = dist.get_rank(process_group)
        self._awaits_group = False
        self._build(None)
        if state_dict is not None:
            self.load_state_dict(state_dict)
        self._consolidated = None

    def _note_bucket(self, index, params):
        """Called by the stage-2 hook for each DDP bucket it reduces."""
        known = self._buckets.get(index)
        ids = [id(p) for p in params]
        if known is not None:
            if [id(p) for p in known] != ids:
                raise RuntimeError("ZeroRedundancyOptimizer: DDP bucket "
                                   f"{index} changed its parameters")
            return
        if self._stage2:
            raise RuntimeError(
                "ZeroRedundancyOptimizer: a new DDP bucket appeared after "
                "the shards were laid out by buckets")
        self._buckets[index] = list(params)

    def _sync_layout(self):
        if self._buckets and not self._stage2:
            if any(self.optim.state.values()):
                raise RuntimeError(
                    "ZeroRedundancyOptimizer: reduce_scatter_hook was "
                    "registered after the first step; register it before "
                    "(the shards follow DDP's buckets)")
            self._build([self._buckets[i] for i in sorted(self._buckets)])
            self._stage2 = True

    # ------------------------------------------------------------- steps --
    def _sync_hyperparameters(self):
        for g, lg in zip(self.param_groups, self.optim.param_groups):
            for k, v in g.items():
                if k != "params":
                    lg[k] = v

    def step(self, closure=None):
        """The local optimizer's step on this rank's shard, then every
        unit all-gathered (a collective over the group)."""
        if self._awaits_group:
            raise RuntimeError(
                "ZeroRedundancyOptimizer: no process group yet; in an "
                "elastic rank, pass the optimizer to ElasticJob before the "
                "first step (it lays the shards out over the job's group)")
        self._sync_layout()
        self._sync_hyperparameters()
        loss = None
        if closure is not None:
            from ...autograd.grad_mode import enable_grad
            with enable_grad():
                loss = closure()
        for piece in self._pieces:
            piece.attach()
        with no_grad():
            self.optim.step()
            for piece in self._pieces:
                piece.write_back()
                piece.shard._grad = None       # no reference to p.grad
            for u in self._units:
                u.all_gather(self.process_group)
        self._consolidated = None
        return loss

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        if hasattr(self, "optim"):     # after __init__: a unit of its own
            if self._stage2:
                raise RuntimeError("ZeroRedundancyOptimizer: add_param_group"
                                   " with the stage-2 hook is unsupported")
            params = param_group["params"]
            u = _Unit(params, self.world_size, self.rank)
            self._units.append(u)
            lg = dict(param_group, params=[])
            all_params = [p for g in self.param_groups for p in g["params"]]
            index = {id(p): i for i, p in enumerate(all_params)}
            for p, lo, hi in u.owned():
                piece = _Piece(p, index[id(p)], lo, hi)
                self._pieces.append(piece)
                lg["params"].append(piece.shard)
            self.optim.add_param_group(lg)

    # ---------------------------------------------------------- clipping --
    def clip_grad_norm_(self, max_norm, norm_type=2.0,
                        error_if_nonfinite=False):
        """Clip the gradients by the global norm of the model's gradient
        (a collective): with the stage-2 hook each rank holds only its
        chunk of the averaged gradient, so the partial norms of the chunks
        are reduced; in stage 1 every rank has the whole gradient."""
        from ...nn.utils.clip_grad import clip_grads_with_norm_
        self._sync_layout()     # the hook has run: the shards follow it
        params = [p for g in self.param_groups for p in g["params"]]
        grads = [p for p in params if p.grad is not None]
        dtype = grads[0].grad.dtype if grads else params[0].dtype
        device = grads[0].grad.device if grads else params[0].device
        if self._stage2:
            arrays = [p.grad._data.reshape(-1)[lo:hi] for u in self._units
                      for p, lo, hi in u.owned() if p.grad is not None]
            groups = (self.process_group,)
        else:
            arrays, groups = [p.grad._data for p in grads], ()
        total = global_norm(arrays, norm_type, groups, dtype, device,
                            error_if_nonfinite)
        clip_grads_with_norm_(params, max_norm, total)
        return total

    # -------------------------------------------------------- state dict --
    def local_state_bytes(self):
        """Bytes of optimizer state tensors held by this rank."""
        return sum(v._data.nbytes for s in self.optim.state.values()
                   for v in s.values() if isinstance(v, Tensor))

    def _piece_state(self, piece):
        """{key: host array or value} of a piece's optimizer state."""
        return {k: _host(v._data) if isinstance(v, Tensor) else v
                for k, v in (self.optim.state.get(piece.shard) or {}).items()}

    def _local_pieces_state(self):
        """[(global index, lo, hi, {key: array or value})] of my pieces."""
        return [(piece.index, piece.lo, piece.hi, st)
                for piece in self._pieces
                for st in (self._piece_state(piece),) if st]

    def _shard_snapshot(self):
        """[(global index, lo, hi, parameter elements, state)] of every
        piece this rank owns, host copies: what an elastic job's buddy
        replica keeps."""
        return [(piece.index, piece.lo, piece.hi,
                 _host(piece.param._data.reshape(-1)[piece.lo:piece.hi]),
                 self._piece_state(piece)) for piece in self._pieces]

    def consolidate_state_dict(self, to=0):
        """Gather every rank's shard of the state on rank ``to`` (a
        collective over the group; ``to`` is a rank of the group, as in
        PyTorch), so that ``state_dict()`` works there."""
        gathered = [None] * self.world_size
        dist.all_gather_object(gathered, self._local_pieces_state(),
                               group=self.process_group)
        self._consolidated = gathered if self.rank == to else None

    def state_dict(self):
        """The unsharded optimizer's state dict (after
        ``consolidate_state_dict`` on this rank)."""
        if self._consolidated is None:
            raise RuntimeError(
                "Optimizer state has not been consolidated on this rank. "
                f"Please call `consolidate_state_dict(to={self.rank})` on "
                "all ranks beforehand if you meant to save the global "
                "state.")
        params = [p for g in self.param_groups for p in g["params"]]
        pieces = {}
        for rank_pieces in self._consolidated:
            for idx, lo, hi, vals in rank_pieces:
                pieces.setdefault(idx, []).append((lo, hi, vals))
        state = {}
        for idx, ps in sorted(pieces.items()):
            ps.sort(key=lambda t: t[0])
            p = params[idx]
            full = {}
            for k, v0 in ps[0][2].items():
                if _elementwise(v0, ps[0][1] - ps[0][0]):
                    arr = np.concatenate([vals[k] for _, _, vals in ps])
                    full[k] = Tensor._wrap(p.device.send(
                        arr.reshape(p.shape)))
                elif isinstance(v0, np.ndarray):
                    full[k] = Tensor._wrap(v0.copy())
                else:
                    full[k] = v0
            state[idx] = full
        groups = []
        start = 0
        for g in self.param_groups:
            packed = {k: v for k, v in g.items() if k != "params"}
            packed["params"] = list(range(start, start + len(g["params"])))
            start += len(g["params"])
            groups.append(packed)
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict):
        """Load an unsharded state dict (this class's ``state_dict()`` or a
        plain ``optimizer_class``'s): every rank keeps its pieces."""
        saved = state_dict["param_groups"]
        if len(saved) != len(self.param_groups):
            raise ValueError("loaded state dict has a different number of "
                             "parameter groups")
        for g, s in zip(self.param_groups, saved):
            if len(g["params"]) != len(s["params"]):
                raise ValueError("loaded state dict contains a parameter "
                                 "group that doesn't match the size of "
                                 "optimizer's group")
            for k, v in s.items():
                if k != "params":
                    g[k] = v
        order = [i for s in saved for i in s["params"]]
        by_index = {}
        for k, v in state_dict["state"].items():
            key = int(k) if isinstance(k, str) and k.isdigit() else k
            by_index[key] = v
        self._sync_hyperparameters()
        new_state = {}
        for piece in self._pieces:
            st = by_index.get(order[piece.index])
            if st is None:
                continue
            p = piece.param
            mine = {}
            for k, v in st.items():
                if isinstance(v, Tensor) and tuple(v.shape) == tuple(p.shape) \
                        and v.dim() > 0:
                    a = v._data.reshape(-1)[piece.lo:piece.hi]
                    if k != "step" and v.is_floating_point():
                        a = a.astype(p._data.dtype)
                    mine[k] = Tensor._wrap(p.device.send(a).copy())
                elif isinstance(v, Tensor):
                    mine[k] = Tensor._wrap(v._data.copy())
                else:
                    mine[k] = v
            new_state[piece.shard] = mine
        self.optim.state.clear()
        self.optim.state.update(new_state)
        self._consolidated = None


def _elementwise(v, n):
    """A per-element state array of a piece of n elements (not a 0-d
    scalar like 'step')."""
    return isinstance(v, np.ndarray) and v.ndim == 1 and v.shape[0] == n


def _host(a):
    """A host (NumPy) copy of a NumPy or CuPy array."""
    return np.array(a.get() if hasattr(a, "get") else a, copy=True)
