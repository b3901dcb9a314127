"""``get_state_dict`` / ``set_state_dict`` for a model and its optimizers,
as ``torch.distributed.checkpoint.state_dict``.

What they add over ``model.state_dict()`` / ``optimizer.state_dict()``:

- keys are the parameters' names (FQNs) of the model without its DDP /
  DataParallel wrapper, also in the optimizer's state
  (``state[fqn]``, ``param_groups[i]['params'] = [fqn, ...]``), so that a
  checkpoint does not depend on the wrapper or the optimizer's numbering;
- tensor-parallel parameters (and their optimizer state) are marked as
  the box of the full tensor that this rank holds (``shard_of``), so dcp
  saves each shard once and loads any TP size into any other;
- the optimizer's state is created first if it is still empty (a step
  with learning rate 0 and zero gradients, as PyTorch does), so that a
  fresh optimizer can be the template that dcp.load fills in place.

Example::

    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.load({"model": model_sd, "optim": optim_sd}, checkpoint_id=DIR)
    set_state_dict(model, optimizer, model_state_dict=model_sd,
                   optim_state_dict=optim_sd)
"""
import collections
import dataclasses

from ...tensor import Tensor
from ._shards import shard_of

__all__ = ["StateDictOptions", "get_model_state_dict",
           "get_optimizer_state_dict", "get_state_dict",
           "set_model_state_dict", "set_optimizer_state_dict",
           "set_state_dict"]


@dataclasses.dataclass
class StateDictOptions:
    """PyTorch's options. ``full_state_dict``: gather tensor-parallel
    shards to full tensors (a collective) and, on set, cut full tensors to
    this rank's shards. ``cpu_offload``: host copies of device tensors.
    ``ignore_frozen_params``: leave out parameters without requires_grad.
    ``strict``: as ``Module.load_state_dict``. The others are accepted
    for compatibility and change nothing here."""
    full_state_dict: bool = False
    cpu_offload: bool = False
    ignore_frozen_params: bool = False
    keep_submodule_prefixes: bool = True
    strict: bool = True
    broadcast_from_rank0: bool = False
    flatten_optimizer_state_dict: bool = False


def _unwrap(model):
    while type(model).__name__ in ("DistributedDataParallel",
                                   "DataParallel") \
            and hasattr(model, "module"):
        model = model.module
    return model


def _opts(optimizers):
    return list(optimizers) if isinstance(optimizers, (list, tuple)) \
        else [optimizers]


def _shards(module):
    """{fqn: (local shape, global shape, offsets, dim, group)} of the
    tensor-parallel parameters."""
    from ...nn.parallel import tensor_parallel as tp
    out = {}
    for key, (dim, g) in tp._sharded_params(module).items():
        local = tuple(module.get_parameter(key).shape)
        glob = list(local)
        glob[dim] = local[dim] * g.size
        off = [0] * len(local)
        off[dim] = local[dim] * g.rank
        out[key] = (local, tuple(glob), tuple(off), dim, g)
    return out


def _view(v, spec, options):
    """A tensor sharing ``v``'s memory, marked with its box if sharded
    (gathered to the full tensor under full_state_dict)."""
    if not isinstance(v, Tensor):
        return v
    if spec is not None and v.dim() > 0 and tuple(v.shape) == spec[0]:
        if options.full_state_dict:
            from ...nn.parallel import tensor_parallel as tp
            v = Tensor._wrap(tp._unshard(v._data, spec[3], spec[4]))
        else:
            v = shard_of(v, spec[1], spec[2])
    else:
        v = Tensor._wrap(v._data)
    if options.cpu_offload and v.device.type != "cpu":
        marks = getattr(v, "_dcp_shard", None)
        v = v.cpu()
        if marks is not None:
            v._dcp_shard = marks
    return v


def get_model_state_dict(model, *, submodules=None, options=None):
    """The model's state_dict by FQN (no DDP prefix); TP shards marked."""
    options = options or StateDictOptions()
    m = _unwrap(model)
    sd = m.state_dict()
    specs = _shards(m)
    frozen = {n for n, p in m.named_parameters() if not p.requires_grad} \
        if options.ignore_frozen_params else set()
    return collections.OrderedDict(
        (k, _view(v, specs.get(k), options)) for k, v in sd.items()
        if k not in frozen)


def _is_zero(opt):
    """A ZeroRedundancyOptimizer: its state is in its local optimizer,
    one flat piece of each parameter it owns elements of."""
    return hasattr(opt, "_pieces") and hasattr(opt, "optim")


def _init_optim_state(opt):
    """Create an empty optimizer's state: zero gradients, one step at
    learning rate 0 (the parameters do not change), gradients cleared.
    (A ZeroRedundancyOptimizer's step is a collective: every rank of its
    group calls this, as they all call get_state_dict.)"""
    state = opt.optim.state if _is_zero(opt) else opt.state
    if state or type(opt).__name__ == "LBFGS":
        return
    params = [p for g in opt.param_groups for p in g["params"]]
    if any(p.grad is not None for p in params):
        return
    from ... import zeros_like
    for p in params:
        if p.requires_grad:
            p.grad = zeros_like(p)
    lrs = [g.get("lr") for g in opt.param_groups]
    for g in opt.param_groups:
        if "lr" in g:
            g["lr"] = 0.0
    try:
        opt.step()
    finally:
        for g, lr in zip(opt.param_groups, lrs):
            if lr is not None:
                g["lr"] = lr
        for p in params:
            p.grad = None


def _index_names(model, opt):
    """[fqn] in the optimizer's numbering (Optimizer.state_dict's)."""
    fqn = {id(p): n for n, p in model.named_parameters()}
    names, seen = [], set()
    for g in opt.param_groups:
        for p in g["params"]:
            if id(p) in seen:
                continue
            seen.add(id(p))
            if id(p) not in fqn:
                raise ValueError(
                    f"{type(opt).__name__} holds a parameter of shape "
                    f"{list(p.shape)} that is not in the model")
            names.append(fqn[id(p)])
    return names


def get_optimizer_state_dict(model, optimizers, *, submodules=None,
                             options=None):
    """The optimizers' state keyed by parameter FQN (several optimizers
    merge into one dict); TP shards of the state marked like their
    parameters."""
    options = options or StateDictOptions()
    m = _unwrap(model)
    specs = _shards(m)
    out = {"state": {}, "param_groups": []}
    for opt in _opts(optimizers):
        _init_optim_state(opt)
        names = _index_names(m, opt)
        if _is_zero(opt):
            _zero_state(opt, names, out)
            continue
        osd = opt.state_dict()
        for idx, st in osd["state"].items():
            n = names[int(idx)]
            out["state"][n] = {k: _view(v, specs.get(n), options)
                               for k, v in st.items()}
        for g in osd["param_groups"]:
            g = dict(g)
            g["params"] = [names[i] for i in g["params"]]
            out["param_groups"].append(g)
    return out


def _zero_state(opt, names, out):
    """A ZeroRedundancyOptimizer's pieces as flat shards of each
    parameter's state (dcp reads them into any other layout: another
    world size, or a plain optimizer's whole tensors)."""
    for piece in opt._pieces:
        st = opt.optim.state.get(piece.shard)
        if not st:
            continue
        p, n = piece.param, piece.hi - piece.lo
        out["state"][names[piece.index]] = {
            k: (shard_of(v, (p.numel(),), (piece.lo,), flat_of=p.shape)
                if isinstance(v, Tensor) and v.dim() == 1
                and v.shape[0] == n else
                Tensor._wrap(v._data) if isinstance(v, Tensor) else v)
            for k, v in st.items()}
    for g in opt.param_groups:
        g = {k: v for k, v in g.items() if k != "params"}
        out["param_groups"].append(g)
    # the parameters of each group, by name, as get_optimizer_state_dict
    # lays them out
    start = 0
    for g, dst in zip(opt.param_groups,
                      out["param_groups"][-len(opt.param_groups):]):
        dst["params"] = names[start:start + len(g["params"])]
        start += len(g["params"])


def _set_zero_state(opt, names, osd):
    """Into a ZeroRedundancyOptimizer: hyper-parameters by group, and each
    piece's state (already in place after dcp.load into
    get_optimizer_state_dict's tensors; otherwise copied: a piece, or its
    part of the whole tensor)."""
    for g in opt.param_groups:
        first = names[_position(opt, g["params"][0])] if g["params"] \
            else None
        match = [s for s in osd["param_groups"] if first in s["params"]]
        if not match:
            raise ValueError(f"set_optimizer_state_dict: no saved parameter "
                             f"group holds {first!r}")
        g.update({k: v for k, v in match[0].items() if k != "params"})
    opt._sync_hyperparameters()
    for piece in opt._pieces:
        st = osd["state"].get(names[piece.index])
        if st is None:
            continue
        local = opt.optim.state.setdefault(piece.shard, {})
        p, n = piece.param, piece.hi - piece.lo
        for k, v in st.items():
            cur = local.get(k)
            if not isinstance(v, Tensor):
                local[k] = v
            elif isinstance(cur, Tensor) and cur._data is v._data:
                continue                       # loaded in place
            elif v.dim() > 0 and tuple(v.shape) == tuple(p.shape) and \
                    v.numel() != n:
                local[k] = Tensor._wrap(
                    v._data.reshape(-1)[piece.lo:piece.hi].copy())
            else:
                local[k] = Tensor._wrap(v._data.copy())


def _position(opt, p):
    i = 0
    for g in opt.param_groups:
        for q in g["params"]:
            if q is p:
                return i
            i += 1
    raise ValueError("parameter not in the optimizer")


def get_state_dict(model, optimizers, *, submodules=None, options=None):
    """``(model_state_dict, optimizer_state_dict)``."""
    return (get_model_state_dict(model, options=options),
            get_optimizer_state_dict(model, optimizers, options=options))


def set_model_state_dict(model, model_state_dict, *, options=None):
    """Load a state_dict from ``get_model_state_dict`` (or a full one with
    ``full_state_dict``) into the model; returns load_state_dict's
    missing/unexpected keys."""
    options = options or StateDictOptions()
    m = _unwrap(model)
    sd = dict(model_state_dict)
    if options.full_state_dict:
        from ...nn.parallel import tensor_parallel as tp
        sd = tp.shard_state_dict(m, sd)
    return m.load_state_dict(sd, strict=options.strict)


def set_optimizer_state_dict(model, optimizers, optim_state_dict, *,
                             options=None):
    """Load an FQN-keyed optimizer state (``get_optimizer_state_dict``'s)
    into the optimizers; each parameter group is matched by the names of
    its parameters."""
    options = options or StateDictOptions()
    m = _unwrap(model)
    specs = _shards(m)
    saved_groups = optim_state_dict["param_groups"]
    for opt in _opts(optimizers):
        names = _index_names(m, opt)
        if _is_zero(opt):
            _set_zero_state(opt, names, optim_state_dict)
            continue
        index = {n: i for i, n in enumerate(names)}
        state = {}
        for n, st in optim_state_dict["state"].items():
            if n not in index:
                continue
            st = dict(st)
            if options.full_state_dict and n in specs:
                from ...nn.parallel import tensor_parallel as tp
                _, _, _, dim, g = specs[n]
                st = {k: (Tensor._wrap(tp._shard(v._data, dim, g))
                          if isinstance(v, Tensor) and v.dim() > 0 else v)
                      for k, v in st.items()}
            state[index[n]] = st
        fqn = {id(p): n for n, p in m.named_parameters()}
        groups = []
        for g in opt.param_groups:
            mine = [index[fqn[id(p)]] for p in g["params"]]
            first = names[mine[0]] if mine else None
            match = [s for s in saved_groups if first in s["params"]]
            if not match:
                raise ValueError(
                    f"set_optimizer_state_dict: no saved parameter group "
                    f"holds {first!r}")
            s = dict(match[0])
            s["params"] = mine
            groups.append(s)
        opt.load_state_dict({"state": state, "param_groups": groups})


def set_state_dict(model, optimizers, *, model_state_dict,
                   optim_state_dict, options=None):
    """Both setters; returns the model's missing/unexpected keys."""
    keys = set_model_state_dict(model, model_state_dict, options=options)
    set_optimizer_state_dict(model, optimizers, optim_state_dict,
                             options=options)
    return keys
