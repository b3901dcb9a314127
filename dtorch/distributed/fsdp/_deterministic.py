"""FSDP under ``dtorch.use_deterministic_algorithms(True)`` (issue 26): the
bits of deterministic DDP on one rank, on any world size.

The root unit runs the step as deterministic DDP does
(nn/parallel/_deterministic.py): the global batch in V virtual shards of
identical shapes, each shard's random ops keyed by its global index, every
gradient the exact fixed-point sum of all V shard gradients. What differs
is where the parameters live: every unit's full parameters are gathered at
the root's forward (nested units then run their modules directly) and
freed when backward ends, and the fixed-point grid of each unit's flat
gradient is reduce-scattered (integers add exactly there too), so a rank
gets the exact sum on its chunk, cast to the shard's dtype: the element
DDP would have. So under the switch an FSDP step holds the whole model's
parameters, as DDP does (the shards and the optimizer state stay
sharded); the default mode keeps FSDP's unit-at-a-time memory.
"""
from ...autograd.grad_mode import is_grad_enabled
from ...nn.parallel._deterministic import DeterministicStep, _refuse
from ...tensor import Tensor


class FSDPDeterministicStep(DeterministicStep):
    """The deterministic step of a root FSDP unit (see the module doc)."""

    def __init__(self, root, virtual_shards=None):
        if any(u._mp is not None for u in root._units()):
            _refuse("FullyShardedDataParallel: mixed precision under "
                    "use_deterministic_algorithms(True) is not supported "
                    "(its casts and low-precision reduce-scatter have no "
                    "deterministic path here); drop mixed_precision")
        super().__init__(root, virtual_shards)
        self.units = [u for u in root._units() if u._flat_param is not None]
        self.leaves = []

    def forward(self, inputs, kwargs):
        self._free()
        for u in self.units:
            u.__dict__["_det_running"] = True
            self.leaves.append((u, u._gather(requires_grad=False)))
        try:
            out = super().forward(inputs, kwargs)
        except BaseException:
            self._free()
            raise
        if not is_grad_enabled():
            self._free()
        return out

    def finish(self):
        try:
            super().finish()
        finally:
            self._free()

    def _free(self):
        for u, _ in self.leaves:
            u._free()
            u.__dict__.pop("_det_running", None)
        self.leaves = []

    # DeterministicStep's hooks: the gathered parameters, FSDP's layout
    def _params(self):
        return [(owner, name, t) for u, leaves in self.leaves
                if u._flat_param.requires_grad
                for (_, places), t in zip(u._own, leaves)
                for owner, name in places]

    @staticmethod
    def _install(m, name, t):
        m.__dict__[name] = t

    def _call(self, args, kwargs):
        return self.ddp._call_inner(args, kwargs)

    def _sync(self):
        return True

    def _order(self):
        return [t for u, leaves in self.leaves if u._flat_param.requires_grad
                for t in leaves]

    def _regions(self):
        # FSDP's chunks are those of a reduce-scatter: ceil(n / world)
        return [u._numel for u, _ in self.leaves
                if u._flat_param.requires_grad]

    def _store(self, order, sums):
        it = iter(sums)
        for u, leaves in self.leaves:
            if not u._flat_param.requires_grad:
                continue
            xp = u._flat_param._xp()
            mine = xp.zeros(u._chunk, u._flat_param._data.dtype)
            lo, o = u.rank * u._chunk, 0
            for _ in leaves:
                g = next(it).reshape(-1)
                a, b = max(o, lo), min(o + g.size, lo + u._chunk)
                if a < b:
                    mine[a - lo:b - lo] = g[a - o:b - o]
                o += g.size
            u._accumulate(Tensor._wrap(mine))
