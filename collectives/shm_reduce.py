"""All-reduce among the ranks of one host through one shared-memory file.

Why: when ranks share a host, MPI's all-reduce busy-polls while it waits
for a peer. During DDP's overlapped backward that poll runs on the core the
rank computes on, and a pipelined transfer needs both ranks' communication
threads scheduled at once; on a machine with one core per rank both cost
more than the reduction itself. Here a rank that waits sleeps (after a
short spin), so the core goes back to the computation, and the data moves
in a few large steps, each a plain NumPy pass in the calling thread.

Layout: one shared file, one segment per rank: a 128-byte header (two
int64 counters, ``arrived`` and ``reduced``, in their own cache lines) and
two slots of ``chunk`` bytes. The logical buffer (one array, or several
arrays back to back for ``all_reduce_coalesced``) goes through chunk by
chunk, the slots alternating:

1. copy my piece of the chunk into my slot, publish ``arrived = k``;
2. wait until every rank has arrived at k;
3. reduce my 1/n of the chunk over all ranks' slots, in rank order, into my
   slot (only I read or write that part now), then (avg) divide;
   publish ``reduced = k``;
4. wait until every rank has reduced k; copy every rank's reduced part out
   of its slot into the destination arrays.

Each part is reduced by exactly one rank, so every rank gets bitwise the
same result. Two slots make step 1 of chunk k + 2 safe: a rank that starts
it has seen every rank's ``reduced = k + 1``, so all of them have finished
copying chunk k out. The counters only grow, so calls follow each other
without extra synchronisation.

Ordering: the data is written by NumPy and the counter after it with plain
stores; x86-64 (TSO) keeps stores in program order and loads too, so a
reader that sees the counter sees the data. Other architectures need
fences Python cannot issue: there ``usable()`` is False and the backend
keeps MPI's reduction.

The file is made and opened through `collectives.shm` (no name: see
`shm.anonymous_file`).
"""
import os
import platform
import time

import numpy as np

from .arrays import UFUNC_NAMES, ReduceOp, ufunc
from .env import env_flag
from .errors import _Expired
from .shm import anonymous_ok, attach_mapped, create_mapped

HEADER = 128                  # counters in their own cache lines
CHUNK = 1024 * 1024           # bytes per slot (two slots per rank)
SPIN = 300                    # busy checks (~20-30 us) before sleeping
NAP = 50e-6                   # seconds per sleep while a peer is late
CHECK = 100                   # naps between calls of the liveness check


def usable():
    """Whether this machine may use it (see Ordering above; opt out with
    DTORCH_SHM=0)."""
    if not env_flag('DTORCH_SHM', True):
        return False
    return (platform.machine().lower() in ('x86_64', 'amd64')
            and anonymous_ok())


def supports(arrs, op):
    """Whether all_reduce can take these host arrays and this op."""
    if op not in UFUNC_NAMES:
        return False
    dt = arrs[0].dtype
    for a in arrs:
        if (type(a) is not np.ndarray or a.dtype != dt
                or not a.flags.c_contiguous):
            return False
    return dt.kind in 'fiu' and (op is not ReduceOp.AVG or dt.kind == 'f')


class ShmReducer:
    """The shared file of one group, mapped by each of its ranks."""

    def __init__(self, rank, size, mm, chunk, slots=2):
        self.rank, self.size, self.chunk = rank, size, chunk
        self._mm = mm
        seg = HEADER + slots * chunk
        raw = np.frombuffer(mm, np.uint8)
        self._segs = [raw[r * seg:(r + 1) * seg] for r in range(size)]
        self._flags = [s[:16].view(np.int64) for s in self._segs]
        self._k = int(self._flags[rank][0])   # 0 in a fresh file
        # seconds this rank waited for each rank's counter: from the start
        # of a wait to the moment that rank's counter was seen (the group
        # owning the reducer shares this list: straggler detection)
        self.peer_wait = [0.0] * size

    @classmethod
    def setup(cls, rank, size, bcast, all_true, chunk=CHUNK, enabled=True,
              slots=2):
        """Collective: rank 0 creates the file (`anonymous_file`, a random
        cookie inside), the others map it and check the cookie, then rank
        0 closes its descriptor (the mappings stay). ``bcast(obj)`` returns
        rank 0's obj on every rank; ``all_true(flag)`` whether flag is true
        on every rank. Returns a reducer, or None on every rank when any
        rank is not ``enabled`` or could not map the file - a rank on
        another host cannot: trying is the same-host test. ``slots`` per
        rank: two here (see Layout); `hier` pipelines over three."""
        nbytes = size * (HEADER + slots * chunk)
        path = cookie = mine = mm = None
        try:
            if rank == 0 and enabled:
                try:   # the cookie goes after segment 0's counters
                    mine, path, mm, cookie = create_mapped(nbytes, 'ar', 16)
                except OSError:
                    path = None
            path, cookie = bcast((path, cookie))
            if rank != 0 and path is not None and enabled:
                mm = attach_mapped(path, nbytes, cookie, 16, writable=True)
            ok = all_true(mm is not None)   # also: everyone has mapped it
        finally:
            if mine is not None:   # the file lives on in the mappings
                os.close(mine)
        if not ok:
            if mm is not None:
                mm.close()
            return None
        return cls(rank, size, mm, chunk, slots)

    # ------------------------------------------------------------ waits --
    def _wait(self, which, k, deadline, alive):
        flags = self._flags
        t0 = None
        for r in range(self.size):
            f = flags[r]
            if f[which] >= k:
                continue
            if t0 is None:
                t0 = time.perf_counter()
            n = 0
            while f[which] < k:
                n += 1
                if n > SPIN:
                    time.sleep(NAP)          # releases the GIL and the core
                    if time.monotonic() > deadline:
                        raise _Expired([q for q in range(self.size)
                                        if flags[q][which] < k])
                    if alive is not None and n % CHECK == 0:
                        alive()              # raises if a peer is gone
            self.peer_wait[r] += time.perf_counter() - t0

    # ------------------------------------------------------------- work --
    def all_reduce(self, arrs, op, deadline, alive=None):
        """arrs (same-dtype contiguous host arrays, read as one buffer
        back to back) <- op over ranks, in place; ``supports`` must hold
        and every rank must pass the same total size, dtype and op.
        ``alive()``, called every few ms while a peer is late, raises when
        the backend knows a peer is gone (else the deadline decides)."""
        dt = arrs[0].dtype
        flats = [a.reshape(-1) for a in arrs]
        starts = [0]
        for f in flats:
            starts.append(starts[-1] + f.size)
        per = max(1, self.chunk // dt.itemsize)
        f = ufunc(op)
        n, me = self.size, self.rank
        for lo in range(0, starts[-1], per):
            hi = min(starts[-1], lo + per)
            self._k += 1
            k = self._k
            base = HEADER + (k & 1) * self.chunk
            slots = [s[base:base + (hi - lo) * dt.itemsize].view(dt)
                     for s in self._segs]
            mine = slots[me]
            for i, a, b in _pieces(starts, lo, hi):
                mine[a - lo:b - lo] = flats[i][a - starts[i]:b - starts[i]]
            self._flags[me][0] = k
            self._wait(0, k, deadline, alive)
            cut = [(hi - lo) * j // n for j in range(n + 1)]
            part = mine[cut[me]:cut[me + 1]]
            for r in range(n):
                if r != me:
                    f(part, slots[r][cut[me]:cut[me + 1]], out=part)
            if op is ReduceOp.AVG:
                np.divide(part, n, out=part)
            self._flags[me][1] = k
            self._wait(1, k, deadline, alive)
            for r in range(n):
                src = slots[r]
                for i, a, b in _pieces(starts, lo + cut[r], lo + cut[r + 1]):
                    flats[i][a - starts[i]:b - starts[i]] = \
                        src[a - lo:b - lo]

    def close(self):
        self._segs = self._flags = None
        try:
            self._mm.close()
        except (BufferError, ValueError):
            pass   # a view is still alive; the mapping goes with it


def _pieces(starts, lo, hi):
    """(i, a, b): the part [a, b) of the logical range [lo, hi) that lies
    in array i, whose elements are [starts[i], starts[i + 1])."""
    for i in range(len(starts) - 1):
        a, b = max(lo, starts[i]), min(hi, starts[i + 1])
        if a < b:
            yield i, a, b
