"""A rank's virtual shards run in lockstep, for ops that combine shards
inside the forward (SyncBatchNorm under deterministic DDP, issue 26).

Deterministic DDP runs the module once per virtual shard. SyncBatchNorm
needs the statistics of all V shards before any shard goes past it, and
its backward needs all shards' statistic gradients before any reaches the
layer below. So each of the rank's V / W shard forwards runs in its own
thread, **one at a time** (a baton passed by the rank's thread, which never
runs two at once): a shard runs until it reaches such an op, parks there
with what it brings (``barrier``), the next shard runs, and when all have
parked the rank's thread combines them (with the collectives across ranks)
and hands each shard its answer. The combining node is created after every
shard's inputs and before any shard's consumers, so creation order is still
a topological order of the graph (what the backward engine relies on), and
it sees all V/W shards' gradients in one backward call.

A shard thread is the rank's thread for every thread-local setting: it
takes a copy of each ``threading.local`` a dtorch module keeps (grad mode,
autocast, saved-tensor hooks, the thread rank's process group and RNG ...)
and the rank's RankLocal values. The RNG state each shard's keyed stream
sets is put back at every hand-over, and the caller's after the run.
"""
import contextlib
import sys
import threading

from ... import _rank_local
from ... import random as _random

_here = threading.local()       # .step, .u in a shard thread


def current():
    """(the Lockstep, this shard's index) in a shard thread, else None."""
    step = getattr(_here, "step", None)
    return None if step is None else (step, _here.u)


_found = [(), -1]        # the threading.locals, len(sys.modules) then


def _snapshot():
    """The calling thread's value of every module-level threading.local of
    dtorch (except this module's and the rank-value table, handled apart;
    the list is found again when modules were imported since)."""
    if _found[1] != len(sys.modules):
        tls = []
        for name, mod in list(sys.modules.items()):
            if mod is None or not name.startswith("dtorch"):
                continue
            for v in list(vars(mod).values()):
                if isinstance(v, threading.local) and v is not _here \
                        and v is not _rank_local._tls:
                    tls.append(v)
        _found[:] = [tls, len(sys.modules)]
    return [(tl, dict(tl.__dict__)) for tl in _found[0]]


class _Abort(BaseException):
    """Unwinds a parked shard when another shard failed."""


class Lockstep:
    """Runs ``fn(u)`` for the rank's ``k`` shards as described above;
    ``group`` and ``shards`` (V) are what a combining op needs."""

    def __init__(self, k, group, shards):
        self.k, self.group, self.shards = k, group, shards
        self._go = [threading.Semaphore(0) for _ in range(k)]
        self._back = threading.Semaphore(0)
        self._state = [None] * k
        self._reply = [None] * k
        self._abort = False

    def barrier(self, u, combine, payload):
        """Called in shard ``u``: park with ``payload`` until every shard
        has reached the same ``combine``; returns ``combine(self,
        payloads)[u]`` (run once, in the rank's thread)."""
        rng = _random._state.get()
        self._state[u] = ("wait", combine, payload)
        self._back.release()
        self._go[u].acquire()
        if self._abort:
            raise _Abort()
        _random._state.set(rng)
        return self._reply[u]

    def _body(self, u, fn, snap, values):
        self._go[u].acquire()
        if self._abort:
            return
        for tl, d in snap:
            tl.__dict__.update(d)
        _here.step, _here.u = self, u
        try:
            with _rank_local.rank_scope(values) if values is not None \
                    else contextlib.nullcontext():
                self._state[u] = ("done", fn(u))
        except _Abort:
            return
        except BaseException as e:   # re-raised in the rank's thread
            self._state[u] = ("error", e)
        self._back.release()

    def run(self, fn, before):
        """The k outputs of ``fn``; ``before(u)`` runs in the rank's thread
        each time shard u is about to (re)start."""
        snap, values = _snapshot(), _rank_local.current()
        rng = _random._state.get()
        threads = [threading.Thread(target=self._body,
                                    args=(u, fn, snap, values),
                                    name=f"dtorch-shard-{u}", daemon=True)
                   for u in range(self.k)]
        for t in threads:
            t.start()
        try:
            while True:
                for u in range(self.k):
                    before(u)
                    self._go[u].release()
                    self._back.acquire()
                for s in self._state:
                    if s[0] == "error":
                        raise s[1]
                kinds = [s[0] for s in self._state]
                if all(kd == "done" for kd in kinds):
                    return [s[1] for s in self._state]
                if any(kd == "done" for kd in kinds) or any(
                        s[1] != self._state[0][1] for s in self._state):
                    raise RuntimeError(
                        "deterministic DDP: the virtual shards of this rank "
                        "took different paths through the forward (one "
                        "reached a SyncBatchNorm another did not); every "
                        "shard must call the same layers in the same order")
                combine = self._state[0][1]
                self._reply = combine(self, [s[2] for s in self._state])
        finally:
            _random._state.set(rng)
            self._abort = True
            for u, t in enumerate(threads):
                if t.is_alive():
                    self._go[u].release()
            for t in threads:
                t.join()

