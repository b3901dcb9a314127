"""Deterministic data parallelism: DDP under
``dtorch.use_deterministic_algorithms(True)`` gives the same bits on any
number of ranks (issue 26).

Three things make a data-parallel step depend on the world size W, and each
is removed here:

1. **Shapes.** BLAS blocks a GEMM by its shape, so a 12-row and an 8-row
   product of the same rows sum in different orders. The global batch of B
   samples is cut into a fixed number V of *virtual shards* of B / V
   samples; each rank runs the forward once per shard it holds (V / W of
   them), so every shard is computed with the same shapes on any W.
   DistributedSampler deals position q of a global batch to rank q mod W;
   shard v is the positions q = v (mod V), so it lies whole on rank v mod W,
   as the local rows u, u + V/W, ... with u = v // W. V is fixed by the job
   (``virtual_shards``), not by the membership, so a resized job (issue 27)
   reuses it.
2. **Sums.** Shard gradients are combined by an exact, order-free sum: each
   is rounded once onto a fixed-point grid (integers below 2^53 held in
   float64, quantum 2^(e - P), e the global maximum exponent of that
   parameter's gradients, P = 52 - log2 V), and such integers add
   exactly, so the local sum and the all-reduce (any algorithm, any
   backend) give the same integers whatever the grouping
   (``_fixed_point.py``).
   Chosen over a fixed reduction tree of the V shards: a tree needs every
   shard's gradient gathered (V / W times the bytes) or a fixed schedule
   per layout, while the fixed-point sum moves 8 bytes per float32 gradient
   (2x normal DDP) plus one small all-reduce of exponents. The grid's step
   is 2^-(52 - log2 V) of the parameter's largest shard gradient (2^-48 at
   V = 12): every element within 2^-24 of the largest keeps float32's full
   precision, smaller ones an absolute error below that step. Under
   ZeRO-2's hook the grid is reduce-scattered by DDP's buckets instead
   (half the bytes; integers add exactly there too).
3. **Normalisation and randomness.** DDP averages over W ranks; here that
   1/W goes into the implicit ``backward()`` seed of the loss instead, so
   that a mean loss's 1/n_local and the 1/W multiply to exactly the global
   1/B (exact when W or n_local is a power of two; other layouts are
   refused before the first step). Each shard's random ops (dropout) draw
   from generators keyed by (a per-step key from rank 0's default
   generator, the global shard index), so a sample's mask does not depend
   on which rank holds it, and every rank's generator advances alike.

4. **BLAS threads.** OpenBLAS's threaded GEMM sums in another order than
   its 1-thread one (45% of a 32 x 256 x 256 float32 product's elements
   differ), so the switch holds the BLAS pools at one thread
   (``dtorch/_blas_threads.py``, with the figures) and each forward here
   re-pins them in case a script set the count after the switch.

SyncBatchNorm needs all shards at once: a rank's shards then run in
lockstep threads and meet at each one (``_lockstep.py``). FSDP reuses this
step through the hooks at the end of ``DeterministicStep``
(distributed/fsdp/_deterministic.py).

Measured figures: benchmarks/determinism.py.
"""
import warnings

import numpy as np

from ... import distributed as dist
from ... import random as _random
from ... import _blas_threads
from ... import _compile
from ..._backend import get_array_module
from ..._creation import stack
from ..._settings import is_deterministic_algorithms_warn_only_enabled
from ...autograd import _api
from ...autograd import engine as _engine
from ...autograd.grad_mode import is_grad_enabled
from ...tensor import Tensor
from ..modules.normalization import _BatchNorm
from ._fixed_point import fixed_point_sum
from ._lockstep import Lockstep
from .sync_batchnorm import SyncBatchNorm

DEFAULT_SHARDS = 12     # divisible by every world size from 1 to 4


def _refuse(msg):
    if is_deterministic_algorithms_warn_only_enabled():
        warnings.warn(msg + " (warn_only=True: going on, results may "
                      "differ between world sizes)")
    else:
        raise RuntimeError(msg)


def _is_pow2(n):
    return n > 0 and n & (n - 1) == 0


class DeterministicStep:
    """The forward and gradient reduction of one DDP model in
    deterministic mode (see the module docstring)."""

    def __init__(self, ddp, virtual_shards=None, zero=None):
        self.ddp = ddp
        self.zero = zero          # ZeRO-2: its ZeroRedundancyOptimizer
        self.group = ddp.process_group
        self.world = dist.get_world_size(self.group)
        self.rank = dist.get_rank(self.group)
        self.shards = DEFAULT_SHARDS if virtual_shards is None \
            else int(virtual_shards)
        if self.shards < 1 or self.shards % self.world:
            _refuse(f"deterministic DDP: the world size {self.world} does "
                    f"not divide the {self.shards} virtual shards of the "
                    f"global batch; pass {type(ddp).__name__}("
                    f"virtual_shards=) a multiple of {self.world} (the "
                    f"same on every world size to compare)")
        # plain batch norm in training normalises over the rank's batch,
        # whose split depends on the world size; SyncBatchNorm's shards
        # meet in lockstep (``_lockstep``) and normalise over the global one
        if not _blas_threads.available():
            _refuse("deterministic DDP: the BLAS thread count changes the "
                    "bits of a GEMM and threadpoolctl, which holds it at "
                    "one thread under the switch, is not installed (pip "
                    "install threadpoolctl)")
        self.norms = [(name, m) for name, m in ddp.module.named_modules()
                      if isinstance(m, _BatchNorm)]
        self.syncs = [m for m in ddp.module.modules()
                      if isinstance(m, SyncBatchNorm)]
        for m in self.syncs:
            g = m.process_group
            if g is not None and g is not self.group:
                _refuse("deterministic DDP: a SyncBatchNorm with its own "
                        "process_group; under the switch it normalises "
                        "over DDP's global batch (process_group=None)")
        self.pending = None       # the step whose gradients are reduced
        self.held = []            # shard gradients of no_sync micro-steps
        self.micro, self.key = 0, None   # micro-batches since the sync
        # the shards replayed by dtorch.compile (``_replayer``); None: on
        # where this class's own _call and _install run (DDP), not FSDP's
        self.compile_shards = None
        self._replay = None

    # ------------------------------------------------------------ forward
    def _step_key(self):
        # rank 0's draw, so shards' streams agree even if ranks were
        # seeded differently; every rank draws one, so all advance alike
        key = np.asarray(_random.draw("integers", 0, 2 ** 62, size=(1,)),
                         np.int64)
        if self.world > 1:
            t = Tensor._wrap(key)
            dist.broadcast(t, 0, group=self.group)
        return int(key[0])

    def forward(self, inputs, kwargs):
        _blas_threads.repin()
        k = self.shards // self.world          # shards on this rank
        n = _batch_rows(inputs, kwargs)
        if n % k:
            _refuse(f"deterministic DDP: the local batch of {n} samples "
                    f"on rank {self.rank} does not split into its {k} "
                    f"virtual shards (global batch {n * self.world}, "
                    f"{self.shards} shards, world size {self.world})")
        training = is_grad_enabled()
        for name, m in self.norms:
            if m.training:
                _refuse(f"deterministic DDP: {type(m).__name__} '{name}' "
                        f"in training mode normalises over the rank's "
                        f"batch, whose split depends on the world size; "
                        f"use nn.SyncBatchNorm.convert_sync_batchnorm (the "
                        f"global batch's statistics, deterministic), eval "
                        f"mode, LayerNorm or GroupNorm")
        if training and not (_is_pow2(self.world) or _is_pow2(n)):
            _refuse(f"deterministic DDP: neither the world size "
                    f"{self.world} nor the local batch {n} is a power of "
                    f"two, so a mean loss's 1/{n} times DDP's 1/"
                    f"{self.world} does not round like the global "
                    f"1/{n * self.world}")
        # one key per optimizer step, drawn at its first micro-batch; a
        # shard's index counts through the micro-batches of the step, so
        # that with one sample per shard (virtual_shards = the global
        # micro-batch) a sample's index and stream are the same for any
        # split of the step into ranks x accumulation micro-batches
        if not training or self.micro == 0:
            self.key = self._step_key()
        key, first = self.key, self.micro * self.shards if training else 0
        if training:
            sync = self._sync()
            self.micro = 0 if sync else self.micro + 1
        params = self._params()
        # per-shard leaves sharing the parameters' storage: the engine
        # sums a shard's own uses of a weight in its graph (the same on
        # every layout), never two shards' gradients
        replay = self._replayer(params) if training else None
        taps = [[_tap(p, replay) for _, _, p in params]
                if training else None for _ in range(k)]

        def install(u):
            if training:
                for (m, name, _), a in zip(params, taps[u]):
                    self._install(m, name, a)

        def shard(u):
            sl = slice(u, None, k)
            args = [_rows(a, n, sl) for a in inputs]
            kw = {name: _rows(a, n, sl) for name, a in kwargs.items()}
            # the global shard index keys the shard's random stream
            with _random.keyed_streams(key, first + u * self.world
                                       + self.rank):
                if replay is not None:
                    return replay(*taps[u], *args, **kw)
                return self._call(args, kw)

        try:
            if any(m.training or not m.track_running_stats
                   for m in self.syncs):
                outs = Lockstep(k, self.group, self.shards).run(shard,
                                                                install)
            else:
                outs = []
                for u in range(k):
                    if replay is None:
                        install(u)
                    outs.append(shard(u))
        finally:
            if training:
                for m, name, p in params:
                    self._install(m, name, p)
        if training:
            self.pending = (params, taps, self._sync())
            self._queued = False
            for a in taps[0]:
                a.register_post_accumulate_grad_hook(self._queue)
            _api.scale_next_seed(1.0 / self.world)
        return _interleave(outs, k)

    def _replayer(self, params):
        """The shards' forward as a ``dtorch.compile``d function of (the
        shard's parameter taps, its inputs), or None (eager shards).

        Every shard has the same shapes, so after the two captures and the
        validation replay compile does on the first shards, each shard is
        a replay: one graph node per shard instead of one per op, the same
        ops' forward/backward on the same arrays in the same order, hence
        the same bits (tests/distributed/test_determinism_compiled.py).
        The taps are the compiled call's inputs, so the gradient of shard
        u reaches its own taps as in eager shards. Whatever compile cannot
        replay (a graph break such as ``.item()``, forward hooks, a guard
        past its cache) runs the shard eagerly, as compile falls back, with
        the reason in ``dtorch.compiler.explain(ddp._det._replay)``."""
        on = self.compile_shards
        if on is None:
            on = type(self)._call is DeterministicStep._call and \
                type(self)._install is DeterministicStep._install
        if not on or self.syncs:
            return None
        rep = self._replay
        if rep is None or [(id(m), n, id(p)) for m, n, p in rep.params] \
                != [(id(m), n, id(p)) for m, n, p in params]:
            n = len(params)
            install = self._install

            def shard(*flat, **kw):
                for (m, name, _), a in zip(params, flat[:n]):
                    install(m, name, a)
                try:
                    return self._call(flat[n:], kw)
                finally:
                    for m, name, p in params:
                        install(m, name, p)
            module = self.ddp.module
            rep = _compile._Compiled(shard, module, False, False,
                                     f"{type(module).__name__} shard")
            rep.params = params
            self._replay = rep
        return rep

    # ------------------------------------------------------------ backward
    def _queue(self, _):
        if not self._queued:
            self._queued = True
            _engine.queue_callback(self.finish)

    def finish(self):
        """At the end of backward: every parameter's gradient becomes the
        exact fixed-point sum of all V shard gradients (of every micro-step
        since the last sync, under no_sync). With ZeRO-2's hook each DDP
        bucket is reduce-scattered instead: a rank gets the exact sum on
        the chunk of the bucket whose optimizer state it owns, zeros
        elsewhere, as the hook gives."""
        if self.pending is None:
            return
        params, taps, sync = self.pending
        self.pending = None
        order = self._order()
        # a tied weight has one alias per module that holds it: its shard
        # gradient is their sum, in module order (the same on every layout)
        mine = {id(p): [] for p in order}
        for i, (_, _, p) in enumerate(params):
            mine[id(p)].append(i)
        grads = [[_sum(_grad_of(t[i], p) for i in mine[id(p)])
                  for t in taps] for p in order]
        if self.held:
            grads = [h + g for h, g in zip(self.held, grads)]
        if not sync:
            # no communication: the sum waits for the step that syncs
            self.held = grads
            return
        self.held = []
        steps = len(grads[0]) // len(taps)
        self._store(order, fixed_point_sum(grads, self.shards * steps,
                                           self.group, self._regions()))

    # ---------------------------------- what a wrapper (FSDP) overrides
    def _params(self):
        """(owner module, name, tensor) of every trainable parameter, as
        the forward reads them (a tied one once per owner)."""
        return [(m, name, p) for m in self.ddp.module.modules()
                for name, p in m._parameters.items()
                if p is not None and p.requires_grad]

    @staticmethod
    def _install(m, name, t):
        m._parameters[name] = t

    def _call(self, args, kwargs):
        return self.ddp.module(*args, **kwargs)

    def _sync(self):
        return self.ddp.require_backward_grad_sync

    def _order(self):
        """The parameters in the order of the sum's buffer."""
        if self.zero is not None:
            return [p for b in self.ddp._reducer.buckets for p in b.params]
        return self.ddp._params

    def _regions(self):
        """None (all-reduce), or ZeRO-2's buckets (reduce-scatter)."""
        if self.zero is None:
            return None
        for b in self.ddp._reducer.buckets:
            self.zero._note_bucket(b.index, b.params)
        return [sum(p.numel() for p in b.params)
                for b in self.ddp._reducer.buckets]

    @staticmethod
    def _store(order, sums):
        for p, g in zip(order, sums):
            g = g.astype(p._data.dtype, copy=False)
            if p._grad is None:
                p._grad = Tensor._wrap(g)
            else:
                p._grad._data += g


def _tap(p, replay):
    """A shard's leaf over ``p``'s storage. For a replay each tap gets an
    array object of its own (a view): compile keys an array's slot by the
    object, and a tied weight has one tap per owner, summed apart (made
    directly: p is a float leaf; its version counter, as detach shares)."""
    if replay is None:
        return p.detach().requires_grad_()
    t = Tensor._make(p._data.view(), True, None)
    t._vc = p._vc
    return t


def _sum(arrays):
    it = iter(arrays)
    out = next(it)
    for a in it:
        out = out + a
    return out


def _grad_of(alias, p):
    if alias.grad is None:
        return get_array_module(p._data).zeros(p._data.shape,
                                               p._data.dtype)
    return alias.grad._data


# ------------------------------------------------------ batch plumbing --

def _batch_rows(inputs, kwargs):
    for a in list(inputs) + list(kwargs.values()):
        if isinstance(a, Tensor) and a.ndim:
            return a.shape[0]
    raise RuntimeError("deterministic DDP: the forward got no batched "
                       "tensor to cut into virtual shards")


def _rows(a, n, sl):
    if isinstance(a, Tensor) and a.ndim and a.shape[0] == n:
        return a[sl]
    if isinstance(a, (list, tuple)):
        return type(a)(_rows(x, n, sl) for x in a)
    if isinstance(a, dict):
        return {key: _rows(x, n, sl) for key, x in a.items()}
    return a


def _interleave(outs, k):
    """The shards' outputs back in the local batch order: row i * k + u
    is row i of shard u."""
    first = outs[0]
    if isinstance(first, Tensor):
        if k == 1:
            return first
        if first.ndim == 0:
            raise RuntimeError(
                "deterministic DDP: the module returned a 0-d tensor; "
                "each shard's output must keep the batch dimension")
        # (s, k, ...) -> (s * k, ...): row i * k + u is shard u's row i
        return stack(outs, 1).reshape(-1, *first.shape[1:])
    if isinstance(first, (list, tuple)):
        return type(first)(_interleave([o[j] for o in outs], k)
                           for j in range(len(first)))
    if isinstance(first, dict):
        return {key: _interleave([o[key] for o in outs], k)
                for key in first}
    raise RuntimeError(f"deterministic DDP: cannot put the shards' "
                       f"outputs of type {type(first).__name__} together")
