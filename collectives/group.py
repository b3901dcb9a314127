"""The process-group interface every backend implements, and what they share.

A `ProcessGroup` moves NumPy or CuPy arrays between ranks, in place, on
contiguous buffers. The public methods here do the bookkeeping once for every
backend (argument checks, sequence numbers, the flight recorder, the debug
agreement check, timeouts turned into desync reports); a backend supplies
`_start_<op>` methods that start the transfer and return either None (done) or
a *finisher* ``fin(deadline)`` that completes it. Sync calls run the finisher
at once, `async_op=True` hands it to a `Work`.

Why a flight recorder: the commonest distributed failure is a silent hang with
no culprit. Every rank remembers the collective it is in (or last left); when a
wait times out, the statuses of all ranks are gathered and the error names
where each one is.
"""
from __future__ import annotations
import datetime
import pickle
import time
from collections.abc import Callable, Sequence
from typing import Any, Union

import numpy as np

from .env import env_choice, env_number
from .arrays import (Array, PerRank, ReduceOp, check_buffer, describe,
                     divide_avg, get_array_module, reduce_op, row)
from .errors import (CollectiveError, CollectiveMismatchError,
                     CollectiveTimeoutError, _Expired)
from . import timeline as _timeline

DEFAULT_TIMEOUT = 600.0
# seconds, or a timedelta (torch's spelling); None: the default
Timeout = Union[float, datetime.timedelta, None]


def as_seconds(timeout: Timeout, default: float | None = None) -> float:
    """Seconds from a float or a datetime.timedelta (torch's spelling)."""
    if timeout is None:
        if default is not None:
            return default
        return env_number('DTORCH_COLLECTIVE_TIMEOUT', DEFAULT_TIMEOUT)
    if isinstance(timeout, datetime.timedelta):
        return timeout.total_seconds()
    t = float(timeout)
    if not t > 0:
        raise ValueError(f"timeout must be positive, got {timeout!r}")
    return t


def debug_level():
    """DTORCH_DISTRIBUTED_DEBUG: OFF (default), INFO or DETAIL."""
    return env_choice('DTORCH_DISTRIBUTED_DEBUG', 'OFF',
                      ('OFF', 'INFO', 'DETAIL'))


# --------------------------------------------------------------- work

class Work:
    """Handle of an async collective: wait(timeout=None), is_completed().

    wait() raises the collective's error (CollectiveTimeoutError after the
    group timeout, counted from the call, or after `timeout` seconds).
    """

    _tl = None     # (Timeline, token) while DTORCH_TIMELINE records

    def __init__(self, group: ProcessGroup, rec: tuple,
                 fin: Callable[[float], None] | None, deadline: float,
                 test: Callable[[], bool] | None = None) -> None:
        self._group, self._rec = group, rec
        self._fin, self._deadline, self._test = fin, deadline, test
        self._done = fin is None
        self._exc = None
        if self._done:
            group._pending.pop(rec[0], None)

    def wait(self, timeout: Timeout = None) -> bool:
        if self._exc is not None:
            raise self._exc
        if self._done:
            return True
        deadline = self._deadline
        if timeout is not None:
            deadline = min(deadline, time.monotonic() + as_seconds(timeout))
        try:
            self._group._finish(self._rec, self._fin, deadline)
        except BaseException as e:
            self._exc = e
            raise
        self._done = True
        if self._tl is not None:
            self._tl[0].end(self._tl[1])
        return True

    def is_completed(self) -> bool:
        if not self._done and self._test is not None and self._test():
            self.wait()
        return self._done

    def exception(self) -> BaseException | None:
        return self._exc


def _behind(st, seq):
    """A peer's status says it is busy in an earlier collective than #seq."""
    return st is not None and bool(st[0]) and st[1] < seq


def _arrived(st, seq, op) -> bool:
    """Whether a peer with status `st` (ProcessGroup.status) has reached
    collective #seq: it is in it, has finished it, or is already in a later
    one (a ring's neighbour can complete an op and move on while this rank
    still waits for data from elsewhere: it is not the one missing)."""
    if not st:
        return False
    _, s, o, _ = st
    return s > seq or (s == seq and o == op)


# --------------------------------------------------------------- group

class ProcessGroup:
    """Abstract group of `size` ranks; this process is `rank` in it.

    Attributes: rank, size, name, ranks (global ranks of the members, in
    group-rank order), backend, timeout (seconds). Every op works in place
    on C-contiguous NumPy/CuPy buffers and takes async_op=False; with True it
    returns a `Work`. Ranks are group ranks unless a docstring says global.
    """
    backend = 'abstract'

    def __init__(self, rank: int, size: int, name: str = 'world',
                 ranks: Sequence[int] | None = None,
                 timeout: Timeout = None) -> None:
        self.rank, self.size, self.name = rank, size, name
        self.ranks = list(range(size)) if ranks is None else list(ranks)
        self.timeout = as_seconds(timeout)
        self._seq = 0          # collectives entered (flight recorder)
        self._p2p_seq = 0
        self._last = None      # (seq, op, arr) of the last op entered
        self._pending = {}     # seq -> rec of ops entered, not finished
        self._broken = None    # error that made the group unusable
        self._inflight = None  # rec of a blocking call in progress (mpi)
        self._debug = debug_level() == 'DETAIL'
        self._nsub = 0         # new_group calls, to key sub-groups
        # DTORCH_TIMELINE: the rank's timeline (collectives/timeline.py)
        self._timeline = _timeline.for_group(self)
        # the byte ledger of a dry run or DTORCH_DRY_RUN_REPORT
        # (dtorch/distributed/_accounting.py): tally(op, arr, size)
        self._tally = None

    def __repr__(self):
        return (f"<{type(self).__name__} {self.name!r} rank {self.rank}"
                f"/{self.size} backend={self.backend}>")

    # ---- the flight recorder
    def status(self) -> tuple:
        """(in_flight, seq, op, description) of this rank, for reports."""
        if self._inflight is not None:
            rec, busy = self._inflight, True
        elif self._pending:
            seq = min(self._pending)
            rec, busy = self._pending[seq], True
        elif self._last is not None:
            rec, busy = self._last, False
        else:
            return (False, 0, None, '')
        return (busy, rec[0], rec[1], describe(rec[2]))

    def _peer_statuses(self, grace):
        """rank -> status tuple (or None when unknown). Backends that can
        reach their peers out of band override this."""
        return {self.rank: self.status()}

    @staticmethod
    def format_status(rank: int, st: tuple | None) -> str:
        if st is None:
            return (f"rank {rank} did not report (busy outside this "
                    f"group's collectives, hung or dead)")
        busy, seq, op, desc = st
        if op is None:
            return f"rank {rank} has not called any collective"
        where = f"{op} #{seq}" + (f" {desc}" if desc else '')
        if busy:
            return f"rank {rank} is in {where}"
        return f"rank {rank} is not in a collective (last: {where})"

    def _report_statuses(self):
        """rank -> status for an error report: the peers are asked for at
        most a quarter of the timeout (0.3 to 2 s); if that fails, this
        rank's own (and 'error'): the report must not mask the error it
        explains."""
        try:
            return self._peer_statuses(min(2.0, max(0.3, self.timeout / 4)))
        except Exception as e:
            return {self.rank: self.status(), 'error': repr(e)}

    def _where_ranks_are(self, sts):
        """One line of every rank's status, as error reports quote it."""
        return '; '.join(self.format_status(r, sts.get(r))
                         for r in range(self.size))

    def _timeout_error(self, rec, missing=None, waited=None):
        sts = self._report_statuses()
        seq, op = rec[0], rec[1]
        if missing is None:
            missing = [r for r in range(self.size)
                       if not _arrived(sts.get(r), seq, op)]
        waited = self.timeout if waited is None else waited
        # a live rank still busy in an earlier collective of this group is
        # behind because of the others (a peer vanished mid-transfer after
        # feeding this rank): name it apart, never as the one to blame
        behind = sorted(r for r in missing if _behind(sts.get(r), seq))
        culprits = sorted(set(missing) - set(behind)) or sorted(missing)
        if missing:
            who = f"ranks that did not arrive: {culprits}"
            if culprits != sorted(missing):
                who += (f" (ranks {behind} are still in an earlier "
                        f"collective of this group, waiting on them)")
        else:
            # an empty list would read as "nobody is to blame"
            who = (f"every rank arrived at {op} #{seq}, but the transfer "
                   f"did not complete (a stalled connection or a backend "
                   f"fault, not a missing rank)")
        msg = (f"{op} #{seq} {describe(rec[2])} on group {self.name!r} "
               f"(backend {self.backend}, global ranks {self.ranks}) timed "
               f"out after {waited:.1f} s on rank {self.rank}; {who}. "
               f"Desync report: " + self._where_ranks_are(sts))
        err = CollectiveTimeoutError(
            msg, op=op, group=self.name, seq=seq, missing=missing,
            statuses={r: self.format_status(r, sts.get(r))
                      for r in range(self.size)})
        return err

    # ---- the template every op goes through
    def _check_usable(self):
        if self._broken is not None:
            raise CollectiveError(
                f"group {self.name!r} (rank {self.rank}) is unusable after "
                f"an earlier error: {self._broken}") from self._broken

    def _run(self, name, arr, sig, start, async_op, p2p=False):
        if self._broken is not None:
            self._check_usable()
        if self._tally is not None:
            self._tally(name, arr, self.size)
        if self._timeline is not None:
            return self._run_recorded(name, arr, sig, start, async_op, p2p)
        return self._run_op(name, arr, sig, start, async_op, p2p)

    def _run_op(self, name, arr, sig, start, async_op, p2p):
        if p2p:
            self._p2p_seq += 1
            seq = -self._p2p_seq   # p2p ops do not count as collectives
        else:
            self._seq += 1
            seq = self._seq
        rec = (seq, name, arr)
        if self._debug and not p2p:
            self._debug_check(name, arr, sig)
        deadline = time.monotonic() + self.timeout
        if not p2p:
            self._last = rec
        self._pending[seq] = rec
        try:
            fin = start(deadline)
        except BaseException as e:
            self._pending.pop(seq, None)
            raise self._translate(rec, e) from None
        if async_op:
            return Work(self, rec, fin, deadline, self._tester(fin))
        self._finish(rec, fin, deadline)
        return None

    def _run_recorded(self, name, arr, sig, start, async_op, p2p):
        tl = self._timeline
        if not tl.synced and not p2p and self.size == tl.size:
            tl.start(self)    # the first collective of the world: clocks
        # a point-to-point op's peer is in its signature ("dst=3 tag=0")
        peers = ([self.ranks[int(sig.split()[0][4:])]] if p2p
                 else list(self.ranks))
        tok = tl.collective(self, name, arr, sig, peers)
        w = self._run_op(name, arr, sig, start, async_op, p2p)
        tl.started(tok, -self._p2p_seq if p2p else self._seq, async_op)
        if w is None:
            tl.end(tok)
        else:
            w._tl = (tl, tok)
        return w

    def _finish(self, rec, fin, deadline):
        try:
            if fin is not None:
                fin(deadline)
        except BaseException as e:
            raise self._translate(rec, e) from None
        finally:
            self._pending.pop(rec[0], None)

    def _translate(self, rec, e):
        if isinstance(e, _Expired):
            err = self._timeout_error(rec, e.missing)
            self._broken = err   # streams/slots are mid-op: not reusable
            return err
        return e

    def _tester(self, fin):
        return getattr(fin, 'test', None)

    # ---- debug mode: do all ranks call the same thing?
    def _debug_check(self, name, arr, sig):
        mine = (name, describe(arr), sig)
        allsig = self._gather_objects(mine, time.monotonic() + self.timeout,
                                      'debug_check')
        for r, s in enumerate(allsig):
            if s != allsig[0]:
                raise CollectiveMismatchError(
                    f"collective mismatch on group {self.name!r} before "
                    f"#{self._seq}: rank {r} calls {s[0]} {s[1]} {s[2]} "
                    f"but rank 0 calls {allsig[0][0]} {allsig[0][1]} "
                    f"{allsig[0][2]} (DTORCH_DISTRIBUTED_DEBUG=DETAIL)",
                    rank=r)

    # ---- object transport on top of the byte ops (no recording)
    def _gather_objects(self, obj, deadline, what):
        data = np.frombuffer(pickle.dumps(obj), np.uint8)
        n = np.array([data.size], np.int64)
        sizes = np.zeros((self.size, 1), np.int64)
        self._complete(self._start_all_gather(sizes, n, deadline), deadline)
        buf = np.zeros(int(sizes.max()), np.uint8)
        buf[:data.size] = data
        out = np.zeros((self.size, buf.size), np.uint8)
        self._complete(self._start_all_gather(out, buf, deadline), deadline)
        return [pickle.loads(out[r, :int(sizes[r, 0])].tobytes())
                for r in range(self.size)]

    @staticmethod
    def _complete(fin, deadline):
        if fin is not None:
            fin(deadline)

    # ---- argument checks
    def _check_rank(self, r, what):
        if not isinstance(r, (int, np.integer)) or not 0 <= r < self.size:
            raise ValueError(f"{what} rank {r!r} out of range for group "
                             f"{self.name!r} of size {self.size}")

    def _stacked(self, lst, like, what, n=None):
        """Check a world-dim array or list of `n` arrays shaped like
        `like`; returns it (list or array)."""
        n = self.size if n is None else n
        if isinstance(lst, (list, tuple)):
            if len(lst) != n:
                raise ValueError(f"{what} has {len(lst)} entries; group "
                                 f"{self.name!r} has {n} ranks")
            for i, a in enumerate(lst):
                check_buffer(a, f"{what}[{i}]")
                if a.shape != like.shape or a.dtype != like.dtype:
                    raise ValueError(
                        f"{what}[{i}] is {describe(a)}, expected "
                        f"{describe(like)} (the per-rank buffer)")
            return lst
        check_buffer(lst, what)
        want = (n,) + tuple(like.shape)
        if lst.shape != want or lst.dtype != like.dtype:
            raise ValueError(
                f"{what} is {describe(lst)}, expected {list(want)} "
                f"{like.dtype} (a leading dim of {n} ranks x the per-rank "
                f"buffer {describe(like)})")
        return lst

    # ---- public ops
    def all_reduce(self, arr: Array, op: str | ReduceOp = 'sum',
                   async_op: bool = False) -> Work | None:
        """arr <- op over ranks of arr, in place (bitwise equal on all)."""
        op = reduce_op(op)
        check_buffer(arr)
        return self._run('all_reduce', arr, str(op),
                         lambda d: self._start_all_reduce(arr, op, d),
                         async_op)

    def all_reduce_coalesced(self, arrs: Sequence[Array],
                             op: str | ReduceOp = 'sum',
                             async_op: bool = False) -> Work | None:
        """Every array in the list <- op over ranks, in place, as ONE
        collective over the arrays read back to back (PyTorch's
        ``all_reduce_coalesced``): one message for many small tensors, and
        no packing copy where the backend can reduce from the arrays
        themselves. Same dtype for all; ranks pass matching lists."""
        op = reduce_op(op)
        arrs = list(arrs)
        if not arrs:
            raise ValueError("all_reduce_coalesced needs at least one array")
        for i, a in enumerate(arrs):
            check_buffer(a, f'arrs[{i}]')
            if a.dtype != arrs[0].dtype or type(a) is not type(arrs[0]):
                raise TypeError(
                    f"all_reduce_coalesced needs one dtype and device: "
                    f"arrs[0] is {describe(arrs[0])} ({type(arrs[0]).__name__}"
                    f"), arrs[{i}] is {describe(a)} ({type(a).__name__})")
        return self._run('all_reduce_coalesced', arrs, str(op),
                         lambda d: self._start_all_reduce_coalesced(
                             arrs, op, d), async_op)

    def broadcast(self, arr: Array, src: int = 0,
                  async_op: bool = False) -> Work | None:
        """arr <- rank src's arr."""
        check_buffer(arr)
        self._check_rank(src, 'broadcast src')
        return self._run('broadcast', arr, f"src={src}",
                         lambda d: self._start_broadcast(arr, src, d),
                         async_op)

    def reduce(self, arr: Array, dst: int = 0, op: str | ReduceOp = 'sum',
               async_op: bool = False) -> Work | None:
        """Rank dst's arr <- op over ranks; others' arr is left as is."""
        op = reduce_op(op)
        check_buffer(arr)
        self._check_rank(dst, 'reduce dst')
        return self._run('reduce', arr, f"dst={dst} {op}",
                         lambda d: self._start_reduce(arr, dst, op, d),
                         async_op)

    def all_gather(self, out: PerRank, inp: Array,
                   async_op: bool = False) -> Work | None:
        """out[r] <- rank r's inp; out is [size, *inp.shape] or a list."""
        check_buffer(inp, 'inp')
        out = self._stacked(out, inp, 'all_gather out')
        return self._run('all_gather', inp, '',
                         lambda d: self._start_all_gather(out, inp, d),
                         async_op)

    def gather(self, out: PerRank | None, inp: Array, dst: int = 0,
               async_op: bool = False) -> Work | None:
        """On dst: out[r] <- rank r's inp. out is ignored (may be None)
        elsewhere."""
        check_buffer(inp, 'inp')
        self._check_rank(dst, 'gather dst')
        if self.rank == dst:
            out = self._stacked(out, inp, 'gather out')
        return self._run('gather', inp, f"dst={dst}",
                         lambda d: self._start_gather(out, inp, dst, d),
                         async_op)

    def scatter(self, out: Array, inp: PerRank | None = None, src: int = 0,
                async_op: bool = False) -> Work | None:
        """out <- rank src's inp[rank]; inp is [size, *out.shape] or a
        list on src, ignored elsewhere."""
        check_buffer(out, 'out')
        self._check_rank(src, 'scatter src')
        if self.rank == src:
            inp = self._stacked(inp, out, 'scatter inp')
        return self._run('scatter', out, f"src={src}",
                         lambda d: self._start_scatter(out, inp, src, d),
                         async_op)

    def reduce_scatter(self, out: Array, inp: PerRank,
                       op: str | ReduceOp = 'sum',
                       async_op: bool = False) -> Work | None:
        """out <- op over ranks r of r's inp[rank]; inp is
        [size, *out.shape] or a list."""
        op = reduce_op(op)
        check_buffer(out, 'out')
        inp = self._stacked(inp, out, 'reduce_scatter inp')
        return self._run('reduce_scatter', out, str(op),
                         lambda d: self._start_reduce_scatter(
                             out, inp, op, d), async_op)

    def all_to_all(self, out: PerRank, inp: PerRank,
                   async_op: bool = False) -> Work | None:
        """out[r] <- rank r's inp[rank]; both [size, ...] or lists."""
        if isinstance(inp, (list, tuple)):
            if not inp:
                raise ValueError("all_to_all inp is an empty list")
            like = inp[0]
        else:
            check_buffer(inp, 'inp')
            if inp.ndim == 0 or inp.shape[0] != self.size:
                raise ValueError(
                    f"all_to_all inp is {describe(inp)}; its leading dim "
                    f"must be the group size {self.size}")
            like = inp[0]
        inp = self._stacked(inp, like, 'all_to_all inp')
        out = self._stacked(out, like, 'all_to_all out')
        return self._run('all_to_all', like, '',
                         lambda d: self._start_all_to_all(out, inp, d),
                         async_op)

    def barrier(self, async_op: bool = False) -> Work | None:
        """Return when every rank of the group has called barrier."""
        return self._run('barrier', None, '', self._start_barrier,
                         async_op)

    def send(self, arr: Array, dst: int, tag: int = 0,
             async_op: bool = False) -> Work | None:
        """Send arr to group rank dst (buffered: may return before dst
        receives)."""
        check_buffer(arr)
        self._check_rank(dst, 'send dst')
        if dst == self.rank:
            raise ValueError(f"rank {self.rank} cannot send to itself")
        return self._run('send', arr, f"dst={dst} tag={tag}",
                         lambda d: self._start_send(arr, dst, tag, d),
                         async_op, p2p=True)

    def recv(self, arr: Array, src: int, tag: int = 0,
             async_op: bool = False) -> Work | None:
        """arr <- the next message from group rank src with this tag."""
        check_buffer(arr)
        self._check_rank(src, 'recv src')
        if src == self.rank:
            raise ValueError(f"rank {self.rank} cannot recv from itself")
        return self._run('recv', arr, f"src={src} tag={tag}",
                         lambda d: self._start_recv(arr, src, tag, d),
                         async_op, p2p=True)

    def isend(self, arr: Array, dst: int, tag: int = 0) -> Work:
        return self.send(arr, dst, tag, async_op=True)

    def irecv(self, arr: Array, src: int, tag: int = 0) -> Work:
        return self.recv(arr, src, tag, async_op=True)

    # ---- object variants (pickle; trusted peers of one job only)
    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """Return rank src's obj on every rank."""
        self._check_rank(src, 'broadcast_object src')

        def start(deadline):
            box = [None]
            n = np.zeros(1, np.int64)
            if self.rank == src:
                data = np.frombuffer(pickle.dumps(obj), np.uint8).copy()
                n[0] = data.size
            self._complete(self._start_broadcast(n, src, deadline),
                           deadline)
            if self.rank != src:
                data = np.empty(int(n[0]), np.uint8)
            self._complete(self._start_broadcast(data, src, deadline),
                           deadline)
            box[0] = pickle.loads(data.tobytes())
            self._obj_result = box[0]
        self._run('broadcast_object', None, f"src={src}", start, False)
        res, self._obj_result = self._obj_result, None
        return res

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Return [rank 0's obj, rank 1's obj, ...] on every rank."""
        def start(deadline):
            self._obj_result = self._gather_objects(obj, deadline,
                                                    'all_gather_object')
        self._run('all_gather_object', None, '', start, False)
        res, self._obj_result = self._obj_result, None
        return res

    # ---- sub-groups
    def new_group(self, ranks: Sequence[int], name: str | None = None,
                  timeout: Timeout = None) -> ProcessGroup | None:
        """A group of the given *global* ranks. Like torch, every member
        of this group must call it, in the same order; non-members get
        None."""
        ranks = [int(r) for r in ranks]
        if len(set(ranks)) != len(ranks) or not ranks:
            raise ValueError(f"new_group ranks {ranks} must be a non-empty "
                             f"list without duplicates")
        bad = [r for r in ranks if r not in self.ranks]
        if bad:
            raise ValueError(f"new_group ranks {bad} are not in group "
                             f"{self.name!r} (global ranks {self.ranks})")
        self._nsub += 1
        name = name or f"{self.name}/{self._nsub}"
        sub = [self.ranks.index(r) for r in ranks]   # ranks in this group
        me = sub.index(self.rank) if self.rank in sub else None
        g = self._new_group(sub, ranks, me, name,
                            as_seconds(timeout, self.timeout))
        if g is not None and self._timeline is not None:
            g._timeline = self._timeline   # the rank's one file
        if g is not None:
            g._tally = self._tally
        return g

    def destroy(self) -> None:
        """Release sockets/communicators; the group is unusable after."""
        self._broken = CollectiveError(f"group {self.name!r} destroyed")

    # ---- what a backend implements
    def _new_group(self, sub, global_ranks, me, name, timeout):
        raise NotImplementedError

    def _start_all_reduce(self, arr, op, deadline):
        raise NotImplementedError

    def _start_broadcast(self, arr, src, deadline):
        raise NotImplementedError

    def _start_all_gather(self, out, inp, deadline):
        raise NotImplementedError

    def _start_send(self, arr, dst, tag, deadline):
        raise NotImplementedError

    def _start_recv(self, arr, src, tag, deadline):
        raise NotImplementedError

    # Defaults built on the primitives above: a backend overrides what it
    # can do better.
    def _start_all_reduce_coalesced(self, arrs, op, deadline):
        # pack, reduce, unpack (an average is summed, then divided while
        # unpacking: one pass instead of two)
        xp = get_array_module(arrs[0])
        flat = xp.concatenate([a.reshape(-1) for a in arrs])
        avg = op is ReduceOp.AVG
        if avg and flat.dtype.kind not in 'fc':
            divide_avg(flat, self.size)     # raises the TypeError
        fin = self._start_all_reduce(flat, ReduceOp.SUM if avg else op,
                                     deadline)

        def done(dl):
            self._complete(fin, dl)
            off = 0
            for a in arrs:
                part = flat[off:off + a.size].reshape(a.shape)
                if avg:
                    xp.divide(part, self.size, out=a)
                else:
                    a[...] = part
                off += a.size
        return done

    def _start_reduce(self, arr, dst, op, deadline):
        tmp = arr.copy()
        fin = self._start_all_reduce(tmp, op, deadline)

        def done(dl):
            self._complete(fin, dl)
            if self.rank == dst:
                arr[...] = tmp
        return done

    def _start_gather(self, out, inp, dst, deadline):
        xp = get_array_module(inp)
        full = xp.empty((self.size,) + inp.shape, inp.dtype)
        fin = self._start_all_gather(full, inp, deadline)

        def done(dl):
            self._complete(fin, dl)
            if self.rank == dst:
                for r in range(self.size):
                    row(out, r)[...] = full[r]
        return done

    def _start_scatter(self, out, inp, src, deadline):
        return self._via_rows(out, inp, self.rank == src, lambda full:
                              self._start_broadcast(full, src, deadline))

    def _start_reduce_scatter(self, out, inp, op, deadline):
        return self._via_rows(out, inp, True, lambda full:
                              self._start_all_reduce(full, op, deadline))

    def _via_rows(self, out, inp, fill, start):
        """A scatter as a whole-buffer collective: the ``inp`` rows (when
        ``fill``) stacked into one (size, ...) buffer, ``start(buffer)``,
        then this rank's row into ``out``."""
        xp = get_array_module(out)
        full = xp.empty((self.size,) + out.shape, out.dtype)
        if fill:
            for r in range(self.size):
                full[r] = inp[r]
        fin = start(full)

        def done(dl):
            self._complete(fin, dl)
            out[...] = full[self.rank]
        return done

    def _start_all_to_all(self, out, inp, deadline):
        xp = get_array_module(out[0])
        like = inp[0]
        src = xp.empty((self.size,) + like.shape, like.dtype)
        for r in range(self.size):
            src[r] = inp[r]
        full = xp.empty((self.size,) + src.shape, like.dtype)
        fin = self._start_all_gather(full, src, deadline)

        def done(dl):
            self._complete(fin, dl)
            for r in range(self.size):
                row(out, r)[...] = full[r, self.rank]
        return done

    def _start_barrier(self, deadline):
        return self._start_all_reduce(np.zeros(1, np.int32),
                                      ReduceOp.SUM, deadline)
