"""``dtorch.distributed.elastic``: data-parallel training that survives a
lost rank and takes new ones, in place (issue 27).

Under ``dtorch-launch --elastic MIN:MAX`` a rank that dies (SIGKILL
included, rank 0 included) costs the others a second or so: they agree on
the new membership through the launcher's store (``collectives.
elastic_store``), rebuild the process group, the DDP wrapper and the
sampler's partition, take the state of the member that got furthest, and
go on from the last completed step. No process restarts, no checkpoint is
read. Ranks started with ``dtorch-launch --join`` are admitted at the next
step boundary and receive the parameters, the optimizer's and the RNG's
state and the position in the epoch from a member.

The change to a training loop::

    job = elastic.ElasticJob(model, optimizer, train_ds, batch_size=48)
    for epoch in job.epochs(args.epochs):
        for step in job.steps():
            with step:                        # a lost rank: retried
                x, y = step.batch
                optimizer.zero_grad()
                out = job.model(x)            # the current DDP wrapper
                loss = F.cross_entropy(out, y, reduction="sum") * step.scale
                loss.backward()
                optimizer.step()
        scheduler.step()                      # per epoch, as usual
    job.close()                               # the last membership agrees

``batch_size`` is the *global* batch: each of the W ranks gets
``batch_size // W`` samples of it. A step that fails because a peer died
(a ``CollectiveError`` inside ``with step``) is swallowed, the job
re-forms, and the loop yields the same step again, re-dealt among the
survivors; every sample of an epoch is trained on exactly once. The sampler
(a ``DistributedSampler`` rebuilt for each membership from the job's
position, its ``state_dict``) is the source of truth for the data order.
``step.scale`` is ``W / (samples in the step)``: with ``reduction="sum"``
the gradient is the global mean even for the last, shorter step of an epoch
(where a rank may get no sample at all after a resize); a mean loss is as
good when every step is full. Code after ``optimizer.step()`` inside the
``with`` must not run collectives (the step counts as done once the
optimizer has stepped).

Under ``use_deterministic_algorithms(True)`` (DDP's world-size-independent
virtual shards) the final parameters of a run that shrank and grew are
bitwise those of an uninterrupted run with the same global batch.

ZeRO-1 (``ZeroRedundancyOptimizer`` over ``model.parameters()``, built
before the job: its shards are laid out over each membership) works the
same way: each rank's shard of the optimizer state has a buddy replica in
the next rank, refreshed every step, from which the members rebuild a lost
rank's shard and re-shard over the new world size (``_buddy.py``; a rank
and its ring neighbour lost together stop the job, naming it).

FSDP: ``ElasticJob(model, lambda params: optim.Adam(params, lr=...), ...,
fsdp={FullyShardedDataParallel kwargs})`` with the plain module. The job
wraps it once, on its first group (``job.model``), and builds the optimizer
over the flat parameters (``job.optimizer``: use it in the loop); each
new membership re-lays the units' shards and the optimizer state out over
the new world size in place (the same parameter objects), from the same
buddy replicas as ZeRO-1's (``_buddy.py``). Buffers come from the member
that got furthest.

Outside ``--elastic`` the same loop runs on the job's fixed process group
(or one process), so a script runs both ways. Not supported: a module
already wrapped in FSDP (``fully_shard`` included: refused), ZeRO-2
(``reduce_scatter_hook``), the mpi and nccl backends (an MPI communicator
cannot shrink portably).
"""
import contextlib
import functools
import io
import json
import os
import sys
import time

import numpy as np

import collectives as _c
from collectives.elastic_store import ElasticStop, Membership, key
from collectives.store import TCPStore
from collectives.tcp import TCPGroup

from ... import distributed as dist
from ... import random as _random
from ..._settings import are_deterministic_algorithms_enabled
from ...autograd.grad_mode import no_grad
from ...nn.parallel import DistributedDataParallel
from ...serialization import load, save
from ...utils.data import DistributedSampler
from ...utils.data._collate import default_collate
from ..fsdp import FSDPModule, FullyShardedDataParallel
from ..optim import ZeroRedundancyOptimizer
from ._buddy import fsdp_buddy, zero_buddy

__all__ = ["ElasticJob", "ElasticStop", "Step", "is_elastic"]


def is_elastic():
    """True in a rank started by ``dtorch-launch --elastic`` or
    ``--join``."""
    return "DTORCH_ELASTIC" in os.environ


def _failure(exc):
    """The CollectiveError (a lost peer) in ``exc``'s chain, or None."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, (_c.CollectiveError, _c.RendezvousError)):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


class Step:
    """One training step of this rank: ``indices`` (its sample ids),
    ``batch`` (them, collated), ``scale`` (module docstring). Use as
    ``with step:``; a peer's death inside is caught and the step retried."""

    def __init__(self, job, indices, total):
        self.job, self.indices, self.total = job, indices, total
        self.scale = job.world_size / total
        self.error = None
        self.stepped = False
        self._batch = None

    def __len__(self):
        return len(self.indices)

    @property
    def batch(self):
        if self._batch is None:
            self._batch = self.job._collate(self.indices)
        return self._batch

    def __enter__(self):
        return self

    def __exit__(self, et, exc, tb):
        if exc is None or not self.job.elastic:
            return False
        lost = _failure(exc)
        if lost is None:
            return False
        self.error = lost
        self.job._t_fail = time.time()
        return True


class ElasticJob:
    """The elastic training state of one rank (module docstring).

    ``model``: the plain module (``job.model`` is its current DDP wrapper;
    the optimizer keeps working across re-wraps, the parameters are the
    same objects). ``state``: other objects with ``state_dict()`` /
    ``load_state_dict()`` that a joiner must receive (an LR scheduler).
    ``ddp_kwargs``: passed to each ``DistributedDataParallel``.
    ``fsdp``: FullyShardedDataParallel's kwargs: the job wraps the module
    in FSDP instead of DDP, and ``optimizer`` is then a function of the
    parameters (module docstring), and a value of ``state`` may be a
    function of the optimizer (``lambda opt: CosineAnnealingLR(opt, E)``):
    built with it, as ``job.extra[name]`` (with or without ``fsdp``).
    ``join_every``: look for waiting joiners every that many steps (one
    store read and an 8-byte all-reduce; 0.5 ms median on 3 loopback
    ranks of a loaded 2-core machine)."""

    def __init__(self, model, optimizer, dataset, batch_size, *,
                 shuffle=True, seed=0, state=None, collate_fn=None,
                 ddp_kwargs=None, join_every=1, fsdp=None):
        if batch_size < 1:
            raise ValueError(f"ElasticJob: batch_size must be >= 1 (the "
                             f"global batch), got {batch_size}")
        _refuse_sharded(model, optimizer)
        self.fsdp = None if fsdp is None else dict(fsdp)
        if self.fsdp is not None:
            # FSDP: the job wraps the module once and builds the optimizer
            # over its flat parameters (optimizer: params -> Optimizer)
            if not callable(optimizer) or hasattr(optimizer, "step"):
                raise TypeError(
                    "ElasticJob(fsdp=...): pass the optimizer as a function "
                    "of the parameters (e.g. lambda ps: optim.Adam(ps, "
                    "lr=1e-3)): it is built over the FSDP flat parameters "
                    f"once the job has its group, got "
                    f"{type(optimizer).__name__}")
            self._make_optimizer = optimizer
            # what the fingerprint reads: the same optimizer, unsharded
            self._probe = optimizer(list(model.parameters()))
            optimizer = None
        self.module, self.optimizer = model, optimizer
        self.dataset, self.batch_size = dataset, int(batch_size)
        self.shuffle, self.seed = shuffle, int(seed)
        self.extra = dict(state or {})
        self.collate_fn = collate_fn or default_collate
        self.ddp_kwargs = dict(ddp_kwargs or {})
        self.join_every = max(1, int(join_every))
        self.epoch = self.consumed = self.done = 0
        self.model = self.group = self.sampler = None
        self.elastic = is_elastic()
        self.lost_total = 0
        self._t_fail = self._t_formed = self._t_register = None
        self._stepped = False
        # ZeRO-1: buddy replicas of the optimizer-state shards (_buddy.py)
        self._buddy = zero_buddy(optimizer) if self.elastic and isinstance(
            optimizer, ZeroRedundancyOptimizer) else None
        if optimizer is not None:
            optimizer.register_step_post_hook(self._after_step)
            self._build_extra()
        if not self.elastic:
            if not dist.is_initialized():
                dist.init_process_group()
            self.group = dist.group.WORLD
            self.rank, self.world_size = self.group.rank, self.group.size
            self._wrap(sync=True)
            return
        env = os.environ
        self.uid = int(env["DTORCH_ELASTIC_UID"])
        self.store = TCPStore(env.get("MASTER_ADDR", "127.0.0.1"),
                              int(env["MASTER_PORT"]),
                              env.get("DTORCH_RDZV_TOKEN"),
                              timeout=_c.env_number(
                                  "DTORCH_ELASTIC_CONNECT", 60.0))
        self.members = Membership(self.store, self.uid)
        self.timeout = _c.env_number("DTORCH_ELASTIC_OP_TIMEOUT", 300.0)
        mine = self._fingerprint()
        with _stops():
            if env.get("DTORCH_ELASTIC_JOIN") == "1":
                self._check_config(mine, json.loads(
                    self.store.get(key("config"), timeout=self.timeout)))
                self._t_register = time.time()
                self.members.join(f"pid {os.getpid()}")
            else:
                self.members.initial()
            self._form(config=mine)

    # ------------------------------------------------------------ state
    def _build_extra(self):
        """State given as a function of the optimizer (an LR scheduler
        under fsdp=, whose optimizer the job builds): built with it."""
        self.extra = {k: v(self.optimizer) if callable(v) and not
                      hasattr(v, "state_dict") else v
                      for k, v in self.extra.items()}

    def _after_step(self, *_):
        if self._buddy is not None:
            self._buddy.step_done(self.group, self.done + 1)
        self._stepped = True

    def _fingerprint(self):
        """What every member must agree on, as JSON-able values."""
        opt = self.optimizer if self.fsdp is None else self._probe
        groups = [{k: (v if isinstance(v, (int, float, str, bool))
                       or v is None else repr(v))
                   for k, v in g.items() if k != "params"}
                  for g in opt.param_groups]
        return {
            "parameters": {n: [list(p.shape), str(p.dtype)]
                           for n, p in self.module.named_parameters()},
            "optimizer": {"type": type(opt).__name__, "groups": groups},
            "batch_size": self.batch_size, "dataset": len(self.dataset),
            "shuffle": self.shuffle, "seed": self.seed,
            "deterministic": are_deterministic_algorithms_enabled(),
            "ddp": {k: _stable(v) for k, v in self.ddp_kwargs.items()},
            "fsdp": None if self.fsdp is None else
            {k: _stable(v) for k, v in self.fsdp.items()},
        }

    @staticmethod
    def _check_config(mine, job):
        diffs = list(_differences(mine, job, ""))
        if diffs:
            raise ElasticStop(
                "this process cannot join the elastic job: its "
                + "; ".join(diffs[:5])
                + ("; ..." if len(diffs) > 5 else ""))

    def _state_bytes(self):
        buf = io.BytesIO()
        # FSDP: the parameters come from the shards and their buddies,
        # the buffers from here
        save({"model": self.module.state_dict() if self.fsdp is None else
              dict(self.module.named_buffers()),
              # ZeRO: the state comes from the shards and their buddies
              "optimizer": None if self._buddy else
              self.optimizer.state_dict(),
              "groups": [{k: v for k, v in g.items() if k != "params"}
                         for g in self.optimizer.param_groups],
              "rng": _random.get_rng_state(),
              "extra": {k: v.state_dict() for k, v in self.extra.items()},
              "position": [self.epoch, self.consumed, self.done]}, buf)
        return buf.getvalue()

    def _load_state(self, blob):
        st = load(io.BytesIO(blob), weights_only=True)
        if self.fsdp is None:
            self.module.load_state_dict(st["model"])
        else:
            with no_grad():
                for n, b in self.module.named_buffers():
                    b.copy_(st["model"][n])
        if st["optimizer"] is not None:
            self.optimizer.load_state_dict(st["optimizer"])
        for g, saved in zip(self.optimizer.param_groups, st["groups"]):
            g.update(saved)
        _random.set_rng_state(st["rng"])
        for k, v in self.extra.items():
            v.load_state_dict(st["extra"][k])
        self.epoch, self.consumed, self.done = map(int, st["position"])

    # ------------------------------------------------------- membership
    def _form(self, config=None):
        """Form the decided round's group, take the source's state, wrap
        the model; on a failure meanwhile, the next round."""
        while True:
            dec = self.members.decision
            self.rank = dec["members"].index(self.uid)
            self.world_size = len(dec["members"])
            try:
                g = TCPGroup(self.store, self.rank, self.world_size,
                             f"elastic.{dec['round']}",
                             _c.env_number("DTORCH_ELASTIC_FORM_TIMEOUT",
                                           20.0))
                g.timeout = self.timeout
                self.group = g
                dist._world[0] = g
                if config is not None and self.rank == 0 \
                        and dec["round"] == 0:
                    self.store.set(key("config"), json.dumps(config))
                if self.fsdp is not None:   # a joiner's optimizer first
                    self._wrap(sync=dec["source"] is None)
                if dec["source"] is not None:
                    src = dec["members"].index(dec["source"])
                    blob = self._state_bytes() if self.rank == src else None
                    self._load_state(g.broadcast_object(blob, src))
                if self.fsdp is None:
                    self._wrap(sync=dec["source"] is None)
                if self._buddy is not None:
                    self._buddy.formed(g, self.done,
                                       recover=dec["source"] is not None)
                self._t_formed = time.time() if dec["round"] else None
                if config is not None and dec["round"] == 0:
                    self._check_config(config, json.loads(self.store.get(
                        key("config"), timeout=self.timeout)))
                return
            except Exception as e:
                if _failure(e) is None:
                    raise
                self._drop_group()
                self.members.reform(self.done)

    def _trace(self, step):
        """After the first step of a new membership: rank 0 says how long
        the re-formation took; DTORCH_ELASTIC_TRACE=FILE gets a JSON line
        per member (what benchmarks/elastic_recovery.py reads)."""
        now, dec = time.time(), self.members.decision
        rec = {"uid": self.uid, "round": dec["round"],
               "world": self.world_size, "t_fail": self._t_fail,
               "t_formed": self._t_formed, "t_step": now,
               "joined": self.uid in dec["joined"],
               "t_register": self._t_register}
        self._t_formed = self._t_fail = None
        path = _c.env_str("DTORCH_ELASTIC_TRACE", "")
        if path:
            with open(path, "a") as f:
                f.write(json.dumps(rec) + "\n")
        if self.rank == 0 and rec["t_fail"] is not None:
            print(f"dtorch.distributed.elastic: membership round "
                  f"{rec['round']}: {self.world_size} ranks; first step "
                  f"done {now - rec['t_fail']:.2f} s after the failure was "
                  f"seen", file=sys.stderr, flush=True)

    def _drop_group(self):
        g, self.group = self.group, None
        if dist._world[0] is g:
            dist._world[0] = None
        if self.model is not None and self.fsdp is None:
            _retire(self.model)
            self.model = None
        if g is not None:
            try:
                g.destroy()
            except Exception:   # the group broke: its sockets are closed
                pass

    def _reform(self):
        self._drop_group()
        with _stops():
            dec = self.members.reform(self.done)
            self.lost_total += len(dec["lost"])
            self._form()
        self.sampler = None

    def _wrap(self, sync):
        if self.fsdp is not None:
            # FSDP is wrapped once; a new membership re-lays its shards out
            # (the buddy's formed: the parameters stay the same objects)
            if self.model is None:
                self.model = FullyShardedDataParallel(
                    self.module, process_group=self.group,
                    sync_module_states=sync, **self.fsdp)
                self.optimizer = self._make_optimizer(
                    list(self.model.parameters()))
                self.optimizer.register_step_post_hook(self._after_step)
                self._build_extra()
                if self.elastic:
                    self._buddy = fsdp_buddy(self.model, self.optimizer)
            return
        if self.model is not None:
            _retire(self.model)
        self.model = DistributedDataParallel(
            self.module, process_group=self.group, init_sync=sync,
            **self.ddp_kwargs)

    def _joins_waiting(self):
        """Whether any member sees a joiner waiting: one store read and a
        tiny all-reduce, so every member re-forms at the same step."""
        seen = self.members.joins_waiting() \
            > self.members.decision["join_seq"]
        flag = np.array([int(seen)], np.int64)
        if self.world_size > 1:
            self.group.all_reduce(flag, _c.ReduceOp.MAX)
        return bool(flag[0])

    # ------------------------------------------------------------ loops
    def epochs(self, n):
        """The epoch numbers left, from the job's current one (a joiner
        starts where the job is)."""
        while self.epoch < n:
            yield self.epoch
            if self.consumed >= len(self.dataset):
                self.epoch += 1
                self.consumed = 0
                self.sampler = None

    def _partition(self):
        """This rank's rest of the epoch, from the sampler's state."""
        s = DistributedSampler(self.dataset, num_replicas=self.world_size,
                               rank=self.rank, shuffle=self.shuffle,
                               seed=self.seed, pad=False)
        s.load_state_dict({"epoch": self.epoch, "seed": self.seed,
                           "consumed": self.consumed,
                           "shuffle": self.shuffle,
                           "dataset_len": len(self.dataset)})
        self.sampler, self._start = s, self.consumed
        self._mine = list(iter(s))

    def steps(self):
        """The steps left in the current epoch (module docstring)."""
        n_all = len(self.dataset)
        while self.consumed < n_all:
            if self.sampler is None:
                self._partition()
            w, r = self.world_size, self.rank
            rem = n_all - self.consumed
            n = min(max(self.batch_size // w, 1) * w, rem)
            if 0 < rem - n < w:
                n = rem         # the tail joins this step: none is empty
            first = (self.consumed - self._start) // w
            indices = self._mine[first:first + len(range(r, n, w))]
            step = Step(self, indices, n)
            rng = _random.get_rng_state()
            self._stepped = False
            yield step
            if step.error is not None and not self._stepped:
                _random.set_rng_state(rng)     # the step is done again
                self._reform()
                continue
            self.consumed += n
            self.done += 1
            if self._t_formed is not None:
                self._trace(step)
            if step.error is not None:
                self._reform()
            elif self.elastic and self.done % self.join_every == 0:
                try:
                    if self._joins_waiting():
                        self._reform()
                except Exception as e:
                    if _failure(e) is None:
                        raise
                    self._t_fail = time.time()
                    self._reform()

    def _collate(self, indices):
        if not indices:
            # a rank with no sample in the last step of an epoch: a batch
            # of 0 rows shaped like the others
            return _rows0(self.collate_fn([self.dataset[0]]))
        getitems = getattr(self.dataset, "__getitems__", None)
        items = getitems(list(indices)) if getitems is not None \
            else [self.dataset[i] for i in indices]
        return self.collate_fn(items)

    def close(self):
        """Leave the job's group and store (at the end of training;
        processes still waiting to join are told the job finished)."""
        if self.elastic:
            # a last collective: a member lost since the last step (while
            # the others evaluated) is dropped in a round of its own, so
            # that the final membership is the ranks that finished
            while True:
                try:
                    flag = np.ones(1, np.int64)
                    if self.world_size > 1:
                        self.group.all_reduce(flag, _c.ReduceOp.SUM)
                    break
                except Exception as e:
                    if _failure(e) is None:
                        raise
                    self._reform()
            if self.rank == 0:
                self.store.set(key("finished"), "1")
            self._drop_group()
            self.store.close()


def _refuse_sharded(model, optimizer):
    """The job wraps the plain module itself (DDP once per membership, or
    FSDP once with ``fsdp=``, its shards re-laid out per membership)."""
    if isinstance(model, DistributedDataParallel):
        raise TypeError("ElasticJob takes the plain module: it wraps it in "
                        "DistributedDataParallel itself (job.model), once "
                        "per membership")
    if any(isinstance(m, (FullyShardedDataParallel, FSDPModule))
           for m in model.modules()):
        raise TypeError(
            "ElasticJob takes the plain module, not one wrapped in FSDP "
            "(fully_shard / FullyShardedDataParallel): pass "
            "ElasticJob(model, lambda params: optimizer, ..., fsdp={"
            "FullyShardedDataParallel kwargs}); the job wraps it (job.model, "
            "job.optimizer) and keeps buddy replicas of the shards")


@contextlib.contextmanager
def _stops():
    """ElasticStop (below MIN, refused, left out) ends the process with
    its reason as the message, not a traceback."""
    try:
        yield
    except ElasticStop as e:
        raise SystemExit(f"dtorch.distributed.elastic: {e}") from None
    except _c.RendezvousError as e:
        raise SystemExit(
            f"dtorch.distributed.elastic: the job's store is gone ({e}); "
            f"it is served by the launcher of node 0 (dtorch-launch "
            f"--elastic): without it the ranks cannot agree on a "
            f"membership, so this rank stops") from None


def _rows0(batch):
    if isinstance(batch, (list, tuple)):
        return type(batch)(_rows0(b) for b in batch)
    if isinstance(batch, dict):
        return {k: _rows0(v) for k, v in batch.items()}
    return batch[:0]


def _retire(ddp):
    """Detach an old DDP wrapper from the parameters (its hooks) and stop
    its communication thread."""
    for h in ddp._hooks:
        h.remove()
    ddp._hooks = []
    ddp._reducer.close()


def _stable(v):
    """repr(v) without the addresses of a default repr (a wrap policy, a
    communication hook): the same in every process for the same config."""
    if isinstance(v, functools.partial):
        return (f"partial({_stable(v.func)}, {_stable(v.args)}, "
                f"{_stable(v.keywords)})")
    if isinstance(v, type) or callable(v) and hasattr(v, "__qualname__"):
        return f"{v.__module__}.{v.__qualname__}"
    if isinstance(v, (list, tuple, set, frozenset)):
        items = [_stable(x) for x in v]
        return repr(sorted(items) if isinstance(v, (set, frozenset))
                    else items)
    if isinstance(v, dict):
        return repr({k: _stable(x) for k, x in v.items()})
    if " at 0x" in repr(v) and hasattr(v, "__dict__"):
        return f"{type(v).__qualname__}({_stable(vars(v))})"
    return repr(v)


def _differences(mine, job, where):
    """Readable lines for what differs between two fingerprints."""
    if isinstance(mine, dict) and isinstance(job, dict):
        for k in list(job) + [k for k in mine if k not in job]:
            name = f"{where}{k}"
            if k not in mine:
                yield f"{name!r} is missing here (the job has {job[k]})"
            elif k not in job:
                yield f"{name!r} is not in the job (here {mine[k]})"
            else:
                yield from _differences(mine[k], job[k], name + ".")
    elif mine != job:
        what = where.rstrip(".")
        yield f"{what} is {mine} here but {job} in the job"
