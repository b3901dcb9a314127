"""FSDP's parameter handling: a unit's own parameters laid end to end in
one flat array cut into equal chunks (``_Sharding._shard_params``), the
all-gather that makes them exist in full while the unit runs and the free
after (``_gather``, ``_free``), the reduce-scatter of the full flat
gradient into this rank's chunk, and the walks over a unit's modules and
the meta-device materialisation they share with the wrapper
(fully_sharded_data_parallel.py) and its state dicts (_state_dict.py)."""
import hashlib
import threading
import time
import weakref

from ... import distributed as dist
from ... import random as _random
from ...nn.parameter import Parameter
from ...nn.parallel._straggler import StragglerDetector
from ...tensor import Tensor
from .api import MixedPrecision

_WRAPPED = "_fsdp_wrapped_module"


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


class _Sharding:
    """The flat-parameter half of an FSDP unit (mixed into
    FullyShardedDataParallel)."""

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

    def _relayout(self, group, fulls):
        """An elastic job's new membership (distributed/elastic/
        _buddy.py): lay every unit of this root out again over ``group``;
        ``fulls``: the full (unpadded) flat array of each unit that has a
        flat parameter, in ``_units()`` order. The flat parameters stay the
        same objects (an optimizer over them keeps working); a gradient
        and the cached per-step helpers are dropped."""
        w, r = dist.get_world_size(group), dist.get_rank(group)
        fulls = iter(fulls)
        for u in self._units():
            object.__setattr__(u, "process_group", group)
            u.world_size, u.rank = w, r
            fp = u._flat_param
            if fp is None:
                continue
            full = next(fulls)
            chunk = -(-u._numel // w)
            mine = fp._xp().zeros(chunk, fp._data.dtype)
            lo, hi = min(r * chunk, u._numel), min((r + 1) * chunk, u._numel)
            mine[:hi - lo] = fp.device.send(full[lo:hi])
            object.__setattr__(u, "_chunk", chunk)
            fp._data, fp._grad = mine, None
            fp._bump_version()
        for name in ("_det", "_keep"):
            self.__dict__.pop(name, None)
        object.__setattr__(self, "_straggler", StragglerDetector(group)
                           if w > 1 and StragglerDetector.enabled() else None)
        self._stats.shard_bytes = sum(u._flat_param._data.nbytes
                                      for u in self._units()
                                      if u._flat_param is not None)

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
    if isinstance(m, _Sharding):
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
