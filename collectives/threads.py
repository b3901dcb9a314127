"""`threads` backend: N ranks as N threads of ONE process.

This is the single-process test mode: multi-rank logic (DDP, tensor
parallel) is unit-tested without a launcher. Each collective is a *slot*
keyed by (group, sequence number): a rank posts a copy of its contribution
when it calls the op (so async ops never block), and collects every rank's
contribution when it waits. Every rank reduces the same list in rank order,
so results are bitwise equal across ranks, as the real backends promise.

    def fn(group):
        x = np.full(3, group.rank, np.float32)
        group.all_reduce(x)
        return x
    results = spawn_threads(fn, world_size=4)   # one result per rank
"""
from __future__ import annotations
import collections
import sys
from collections.abc import Callable
from typing import Any
import threading
import time


from .arrays import describe, reduce_into, row
from .errors import CollectiveMismatchError, _Expired, RankFailureError
from .group import ProcessGroup, Timeout, as_seconds


class _World:
    """State shared by the groups of one spawn_threads world."""

    def __init__(self, size):
        self.size = size
        self.cond = threading.Condition()
        self.slots = {}      # (group key, seq) -> _Slot
        self.mail = collections.defaultdict(collections.deque)
        self.groups = {}     # (group key, group rank) -> ThreadGroup
        self.failed = None   # (global rank, exception) of the first failure

    def check_failed(self, rank):
        if self.failed is not None and self.failed[0] != rank:
            r, e = self.failed
            raise RankFailureError(
                f"rank {r} failed ({type(e).__name__}: {e}); rank {rank} "
                f"gives up its pending collective", rank=r)

    def fail(self, rank, exc):
        with self.cond:
            if self.failed is None:
                self.failed = (rank, exc)
            self.cond.notify_all()


class _Slot:
    __slots__ = ('vals', 'ops', 'sigs', 'arrived', 'read', 'error')

    def __init__(self, n):
        self.vals, self.ops, self.sigs = [None] * n, [None] * n, [None] * n
        self.arrived, self.read = 0, 0
        self.error = None    # a mismatch: every rank of the slot raises it


class ThreadGroup(ProcessGroup):
    backend = 'threads'

    def __init__(self, world, key, rank, ranks, name='world',
                 timeout=None):
        super().__init__(rank, len(ranks), name, ranks, timeout)
        self._world, self._key = world, key
        self._nslot = 0
        # seconds this rank waited for each rank's contribution (from the
        # start of a wait to its arrival): straggler detection's input
        self.peer_wait = [0.0] * len(ranks)
        world.groups[(key, rank)] = self

    # ---- the slot protocol
    def _post(self, payload, opname, sig=None):
        # slots count posts, not collectives: object ops and the debug
        # check post several times within one collective
        self._nslot += 1
        w, seq = self._world, self._nslot
        with w.cond:
            w.check_failed(self.ranks[self.rank])
            slot = w.slots.get((self._key, seq))
            if slot is None:
                slot = w.slots[(self._key, seq)] = _Slot(self.size)
            if slot.error is not None:
                raise slot.error
            for r, other in enumerate(slot.ops):
                if other is not None and other != opname:
                    slot.error = CollectiveMismatchError(
                        f"collective mismatch on group {self.name!r} at "
                        f"#{self._seq}: rank {self.rank} calls {opname} but "
                        f"rank {r} calls {other}", rank=r)
                # the same op with another buffer: NumPy would broadcast a
                # [] into a [4] (a silent wrong answer) or fail on one rank
                # only, as the real backends would misread the bytes
                elif other is not None and slot.sigs[r] != sig:
                    slot.error = CollectiveMismatchError(
                        f"collective mismatch on group {self.name!r} at "
                        f"#{self._seq}: rank {self.rank} calls {opname} "
                        f"with {sig} but rank {r} with {slot.sigs[r]}",
                        rank=r)
                if slot.error is not None:
                    # the ranks waiting on this slot raise it too, instead
                    # of waiting for the timeout
                    w.cond.notify_all()
                    raise slot.error
            slot.vals[self.rank], slot.ops[self.rank] = payload, opname
            slot.sigs[self.rank] = sig
            slot.arrived += 1
            w.cond.notify_all()
        return seq

    def _collect(self, seq, deadline):
        w, key = self._world, (self._key, seq)
        with w.cond:
            slot = w.slots[key]
            late, t0 = (), None
            while slot.arrived < self.size:
                if slot.error is not None:
                    raise slot.error
                w.check_failed(self.ranks[self.rank])
                left = deadline - time.monotonic()
                if left <= 0:
                    raise _Expired([r for r in range(self.size)
                                    if slot.ops[r] is None])
                if t0 is None:
                    t0 = time.perf_counter()
                    late = [r for r in range(self.size)
                            if slot.ops[r] is None]
                w.cond.wait(min(left, 0.5))
                late = self._arrived(slot, late, t0)
            slot.read += 1
            if slot.read == self.size:
                del w.slots[key]
            return slot.vals

    def _arrived(self, slot, late, t0):
        """Charge the wait since t0 to the late ranks that have now
        posted (peer_wait); the ones still late."""
        now = time.perf_counter()
        still = []
        for r in late:
            if slot.ops[r] is None:
                still.append(r)
            else:
                self.peer_wait[r] += now - t0
        return still

    def _exchange(self, payload, opname, then, like=None):
        """Post now; the finisher collects and calls then(vals). `like`:
        the buffer whose shape and dtype every rank must match."""
        seq = self._post(payload, opname, describe(like))

        def fin(deadline):
            then(_on_current_device(self._collect(seq, deadline)))
        return fin

    def _peer_statuses(self, grace):
        w = self._world
        return {r: w.groups[(self._key, r)].status()
                if (self._key, r) in w.groups else None
                for r in range(self.size)}

    def _new_group(self, sub, global_ranks, me, name, timeout):
        key = (self._key, self._nsub, tuple(global_ranks))
        if me is None:
            return None
        return ThreadGroup(self._world, key, me, global_ranks, name,
                           timeout)

    # ---- ops
    def _start_all_reduce(self, arr, op, deadline):
        return self._exchange(arr.copy(), 'all_reduce',
                              lambda v: reduce_into(arr, v, op, self.size),
                              arr)

    def _start_reduce(self, arr, dst, op, deadline):
        def then(v):
            if self.rank == dst:
                reduce_into(arr, v, op, self.size)
        return self._exchange(arr.copy(), 'reduce', then, arr)

    def _start_broadcast(self, arr, src, deadline):
        mine = arr.copy() if self.rank == src else None

        def then(v):
            if self.rank != src:
                arr[...] = v[src]
        return self._exchange(mine, 'broadcast', then, arr)

    def _start_all_gather(self, out, inp, deadline):
        def then(v):
            for r in range(self.size):
                row(out, r)[...] = v[r]
        return self._exchange(inp.copy(), 'all_gather', then, inp)

    def _start_gather(self, out, inp, dst, deadline):
        def then(v):
            if self.rank == dst:
                for r in range(self.size):
                    row(out, r)[...] = v[r]
        return self._exchange(inp.copy(), 'gather', then, inp)

    def _start_scatter(self, out, inp, src, deadline):
        mine = ([a.copy() for a in inp] if self.rank == src else None)

        def then(v):
            out[...] = v[src][self.rank]
        return self._exchange(mine, 'scatter', then, out)

    def _start_reduce_scatter(self, out, inp, op, deadline):
        def then(v):
            reduce_into(out, [x[self.rank] for x in v], op, self.size)
        return self._exchange([a.copy() for a in inp], 'reduce_scatter',
                              then, out)

    def _start_all_to_all(self, out, inp, deadline):
        def then(v):
            for r in range(self.size):
                row(out, r)[...] = v[r][self.rank]
        return self._exchange([a.copy() for a in inp], 'all_to_all', then,
                              row(out, 0))

    def _start_barrier(self, deadline):
        return self._exchange(None, 'barrier', lambda v: None)

    def _start_send(self, arr, dst, tag, deadline):
        w = self._world
        with w.cond:
            w.check_failed(self.ranks[self.rank])
            w.mail[(self._key, self.rank, dst, tag)].append(arr.copy())
            w.cond.notify_all()
        return None

    def _start_recv(self, arr, src, tag, deadline):
        w = self._world
        box = w.mail[(self._key, src, self.rank, tag)]

        def fin(deadline):
            with w.cond:
                while not box:
                    w.check_failed(self.ranks[self.rank])
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise _Expired([src])
                    w.cond.wait(min(left, 0.5))
                msg = box.popleft()
            if msg.shape != arr.shape or msg.dtype != arr.dtype:
                raise CollectiveMismatchError(
                    f"recv on rank {self.rank}: rank {src} sent "
                    f"{list(msg.shape)} {msg.dtype} with tag {tag}, but "
                    f"the buffer is {list(arr.shape)} {arr.dtype}",
                    rank=src)
            arr[...] = msg
        fin.test = lambda: bool(box)
        return fin


def _on_current_device(vals):
    """Rank threads may work on different GPUs (the current device is per
    thread): peers' CuPy arrays come to this thread's device as copies."""
    cp = sys.modules.get('cupy')
    if cp is None:
        return vals
    here = cp.cuda.Device().id

    def move(v):
        if isinstance(v, cp.ndarray) and v.device.id != here:
            return cp.asarray(v)
        if isinstance(v, list):
            return [move(x) for x in v]
        return v
    return [move(v) for v in vals]


def spawn_threads(fn: Callable[..., Any], world_size: int,
                  timeout: Timeout = None, args: tuple = ()) -> list[Any]:
    """Run fn(group, *args) on `world_size` threads, one per rank, and
    return their results in rank order.

    The first exception raised by any rank is re-raised here (with a note
    naming its rank); the other ranks' pending collectives then fail within
    half a second instead of hanging. `timeout` (seconds) bounds every
    collective; it defaults to DTORCH_COLLECTIVE_TIMEOUT or 10 minutes.
    """
    if int(world_size) < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    world = _World(int(world_size))
    timeout = as_seconds(timeout)
    groups = [ThreadGroup(world, 'world', r, range(world_size), 'world',
                          timeout) for r in range(world_size)]
    results = [None] * world_size
    order = []   # (time, rank, exc) of failures, in the order they happened

    def body(r):
        try:
            results[r] = fn(groups[r], *args)
        except BaseException as e:
            order.append((time.monotonic(), r, e))
            world.fail(r, e)

    if world_size == 1:
        body(0)
    else:
        threads = [threading.Thread(target=body, args=(r,),
                                    name=f"dtorch-rank-{r}", daemon=True)
                   for r in range(world_size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if order:
        # the root cause is the first failure that is not a consequence
        first = min(order, key=lambda x: (
            isinstance(x[2], RankFailureError), x[0]))
        _, r, e = first
        note = f"(raised in thread rank {r} of {world_size})"
        if hasattr(e, 'add_note'):
            e.add_note(note)
        else:   # Python 3.10: the attribute only, no traceback line
            e.__notes__ = list(getattr(e, '__notes__', [])) + [note]
        raise e
    return results


def single_group(timeout: Timeout = None) -> ThreadGroup:
    """A group of size 1 in this process: every op is a local copy."""
    world = _World(1)
    return ThreadGroup(world, 'world', 0, [0], 'world', timeout)
