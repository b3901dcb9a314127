"""FSDP's state dicts: the unsharded one (FULL_STATE_DICT, gathered on
every rank), the sharded one (each parameter's local piece of its
flattened elements, for dcp), the optimizer's in either layout, their
loading, and ``summon_full_params`` (mixed into
FullyShardedDataParallel)."""
import contextlib

from ...autograd.grad_mode import no_grad
from ...tensor import Tensor
from ._flat_param import _WRAPPED, _gather_array, _join, _unit_of, _walk


class StateDictType:
    FULL_STATE_DICT = "FULL_STATE_DICT"
    SHARDED_STATE_DICT = "SHARDED_STATE_DICT"


class _StateDicts:
    """State-dict methods of an FSDP unit (see the module doc)."""

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

