"""Hierarchical all-reduce for tcp groups whose ranks span several hosts.

Why: the flat ring crosses the network wherever two ring neighbours sit on
different hosts, and every byte goes round all n ranks: with 2 hosts x 2
ranks each direction of the link carries 2(n-1)/n = 1.5 x the buffer. Two
levels (NCCL's and Horovod's hierarchical all-reduce) send only what the
hosts must exchange, 2(N-1)/N x the buffer for N hosts (1 x for 2), and
keep the rest in shared memory, which is 10-100 x faster than the link.

How, per chunk of CHUNK bytes of the logical buffer (one array, or a list
read back to back for ``all_reduce_coalesced``):

1. every rank of a host copies its piece into its slot of the host's shared
   file (`shm_reduce.ShmReducer`'s file and counters) and says "arrived";
2. the chunk is cut into O parts, O = the fewest ranks any host has; local
   rank j < O reduces part j over its host's slots (so each host holds its
   sum of part j in exactly one place) ...
3. ... and all-reduces it with local rank j of every other host (the
   "cross" group of one rank per host): recursive doubling for parts up to
   SMALL bytes (log2 N messages), the tcp ring above (bandwidth-optimal);
   then (avg) divides by the group size and says "reduced";
4. every rank copies the O reduced parts out of their owners' slots.

Each value is reduced once per host by one rank, then combined across
hosts in an order every member of the cross group shares, so every rank
gets bitwise the same result. O parallel cross groups use every rank of a
host for the network step (Horovod runs one, NCCL one ring per channel);
hosts with unequal numbers of ranks use the first O of each.

Pipelining: step 3 of chunk k runs on a worker thread while the ranks do
steps 1-2 of chunk k + 1; a third slot per rank keeps that safe (a rank
that writes chunk k + 3 into a slot has seen every rank arrive at k + 2,
which each did after copying chunk k out of it).

Hosts: each rank reports ``host_key()`` (hostname + kernel boot id, or
DTORCH_HOST_ID in tests) through the store at set-up. Same key = same host;
the shared file is then the proof (a rank that cannot map it makes every
rank fall back to the flat ring, with the reason in ``group.hierarchy``).
DTORCH_HIERARCHICAL=0 keeps the flat ring.

Failures: a rank that waits for a host peer checks that its process lives
(/proc) and that no peer has flagged a failure in the shared file; a rank
that fails flags it there, notes the culprit in the store and closes its
sockets, so every rank raises RankFailureError soon, naming the culprit.
"""
from __future__ import annotations
import json
import os
import queue
import socket
import threading
import time

import numpy as np

from . import shm_reduce
from .arrays import ReduceOp, divide_avg, get_array_module, ufunc
from .env import env_flag, hierarchical, host_override
from .errors import RankFailureError, _Expired

CHUNK = 1 << 20        # bytes per slot (the whole-host reducer's size)
SLOTS = 3              # per rank: one more than ShmReducer, to pipeline
SMALL = 64 * 1024      # cross-host parts up to this: recursive doubling
_POISON = 8            # int64 index in a rank's header: 1 + culprit rank


def host_key() -> str:
    """Who shares this host: DTORCH_HOST_ID (tests), else hostname and
    the kernel's boot id (two machines can share a hostname, not a boot)."""
    v = host_override()
    if v:
        return v
    try:
        with open('/proc/sys/kernel/random/boot_id') as fh:
            boot = fh.read().strip()
    except OSError:
        boot = ''
    return f"{socket.gethostname()}/{boot}"


def exchange_hosts(store, prefix, rank, size, timeout):
    """[(host key, pid)] of every rank of the group, through the store."""
    store.set(f"{prefix}host/{rank}", json.dumps([host_key(), os.getpid()]))
    return [tuple(json.loads(store.get(f"{prefix}host/{r}",
                                       timeout=timeout)))
            for r in range(size)]


def nodes_of(hosts):
    """Group ranks by host, hosts in order of their first rank."""
    nodes = {}
    for r, (key, _) in enumerate(hosts):
        nodes.setdefault(key, []).append(r)
    return list(nodes.values())


def _pid_alive(pid):
    """Whether process pid exists and is not a zombie (a dead rank stays
    a zombie until its parent reaps it)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            st = fh.read()
    except OSError:
        return False
    return st.rsplit(')', 1)[-1].split()[:1] not in (['Z'], ['X'])


def setup(g, hosts):
    """(HierReducer or None, reason) for TCPGroup g; collective over g's
    ranks (talks through the store only). Every rank gets the same
    answer."""
    nodes = nodes_of(hosts)
    shape = '+'.join(str(len(n)) for n in nodes)
    if not hierarchical():
        return None, "flat: DTORCH_HIERARCHICAL=0"
    if len(nodes) == 1:
        return None, "flat: one host"
    if all(len(n) == 1 for n in nodes):
        return None, f"flat: one rank on each of {len(nodes)} hosts"
    node = next(i for i, n in enumerate(nodes) if g.rank in n)
    local = nodes[node]
    me = local.index(g.rank)
    key = f"{g._prefix}hier/"
    red = None
    if len(local) > 1:
        def bcast(obj):
            k = f"{key}{node}/offer"
            if me == 0:
                g.store.set(k, json.dumps(
                    [obj[0], obj[1].hex() if obj[1] else None]))
            path, cookie = json.loads(g.store.get(k, timeout=g.timeout))
            return path, bytes.fromhex(cookie) if cookie else None

        def all_true(flag):
            g.store.set(f"{key}{node}/ok/{me}", b'1' if flag else b'0')
            return all(g.store.get(f"{key}{node}/ok/{i}",
                                   timeout=g.timeout) == b'1'
                       for i in range(len(local)))
        red = shm_reduce.ShmReducer.setup(
            me, len(local), bcast, all_true, CHUNK,
            enabled=shm_reduce.usable() and env_flag('DTORCH_TCP_SHM', True),
            slots=SLOTS)
    g.store.set(f"{key}ok/{g.rank}",
                b'1' if len(local) == 1 or red is not None else b'0')
    bad = [r for r in range(g.size)
           if g.store.get(f"{key}ok/{r}", timeout=g.timeout) != b'1']
    if bad:
        if red is not None:
            red.close()
        return None, (f"flat: ranks {bad} could not share memory with "
                      f"the ranks of their host (DTORCH_TCP_SHM=0, "
                      f"DTORCH_SHM=0, not x86-64, or no /proc)")
    o = min(len(n) for n in nodes)
    cross = None
    if me < o:
        # one rank per host; the class is g's (no import cycle)
        cross = type(g)(g.store, node, len(nodes), f"{g.name}/hier{me}",
                        g.timeout, [g.ranks[n[me]] for n in nodes])
    # each rank's address, for failure reports (which host to look at)
    addrs = [g.store.get(f"{g._prefix}addr/{r}", timeout=g.timeout)
             .decode().rsplit(':', 1)[0] for r in range(g.size)]
    return (HierReducer(g, nodes, node, red, cross, [p for _, p in hosts],
                        addrs),
            f"hierarchical: {len(nodes)} hosts x {shape} ranks, {o} cross-"
            f"host group{'s' if o > 1 else ''}")


class HierReducer:
    """The two-level all-reduce of one group on one rank."""

    def __init__(self, g, nodes, node, red, cross, pids, addrs):
        self.g, self.nodes, self.node = g, nodes, node
        self.addrs = addrs
        self.local = nodes[node]
        self.me = self.local.index(g.rank)
        self.owners = min(len(n) for n in nodes)
        self.red, self.cross, self.pids = red, cross, pids
        if red is None:      # alone on this host: private slots
            seg = np.zeros(shm_reduce.HEADER + SLOTS * CHUNK, np.uint8)
            self._segs = [seg]
            self._k = 0
        else:
            self._segs = red._segs
        self._flags = [s[:shm_reduce.HEADER].view(np.int64)
                       for s in self._segs]
        self._xseq = 0
        self._jobs = None    # the cross worker's queue, started lazily

    # ------------------------------------------------------- liveness --
    def _alive(self, which, k):
        """Raise RankFailureError when a rank of this host that has not
        yet reached step `which` of chunk k died, or any rank flagged a
        failure. (Not the ring sockets: a rank of another host that is
        done may exit while this host still copies out.)"""
        g = self.g
        for i, r in enumerate(self.local):
            if i == self.me:
                continue
            bad = int(self._flags[i][_POISON])
            if bad:
                raise self._failed(bad - 1, f"rank {r} (global "
                                   f"{g.ranks[r]}) flagged a failure in "
                                   f"the host's shared memory")
            if self._flags[i][which] < k and not _pid_alive(self.pids[r]):
                raise self._failed(r, "its process is gone")

    def _failed(self, culprit, why):
        g = self.g
        return RankFailureError(
            f"rank {culprit} (global {g.ranks[culprit]}, host "
            f"{self.addrs[culprit]}) of group "
            f"{g.name!r} died or gave up during {self._op}: {why} (seen by "
            f"rank {g.rank} in the hierarchical all-reduce)", rank=culprit)

    def _wait(self, which, k, deadline):
        if self.red is None:
            return
        try:
            self.red._wait(which, k, deadline,
                           lambda: self._alive(which, k))
        except _Expired:
            # a late rank of this host may only be waiting on its own
            # cross-host peer: the statuses of all ranks say who is missing
            raise _Expired(None) from None

    # ---------------------------------------------------------- cross --
    def _cross_run(self, part, op, deadline, seq):
        c = self.cross
        try:
            if part.nbytes <= SMALL:
                _doubling(c, part, op, deadline, seq)
            else:
                c._all_reduce(part, op, deadline, seq)
        except _Expired as e:
            raise _Expired([self.nodes[i][self.me]
                            for i in (e.missing or [])] or None) from None
        except RankFailureError as e:
            # in the group's terms: which of its ranks, in which op
            if e.rank is None:
                raise
            raise self._failed(self.nodes[e.rank][self.me], (
                f"its connection in the cross-host group {c.name!r} "
                f"broke")) from None

    def _cross_start(self, part, op, deadline, inline):
        """Start the cross-host all-reduce of part: run now (inline) or on
        the worker thread; returns what _cross_wait needs."""
        self._xseq += 1
        if inline:
            self._cross_run(part, op, deadline, self._xseq)
            return None
        if self._jobs is None:
            self._jobs = queue.Queue()
            threading.Thread(target=self._worker, daemon=True,
                             name=f"dtorch-hier-{self.g.name}").start()
        done, box = threading.Event(), []
        self._jobs.put((part, op, deadline, self._xseq, done, box))
        return done, box

    def _worker(self):
        while True:
            job = self._jobs.get()
            if job is None:
                return
            part, op, deadline, seq, done, box = job
            try:
                self._cross_run(part, op, deadline, seq)
            except BaseException as e:
                box.append(e)
            done.set()

    @staticmethod
    def _cross_wait(job, deadline):
        if job is None:
            return
        done, box = job
        # the worker's op has this deadline too; a little grace for its
        # own _Expired to arrive with the missing ranks
        if not done.wait(max(0.0, deadline - time.monotonic()) + 5.0):
            raise _Expired(None)
        if box:
            raise box[0]

    # ----------------------------------------------------------- work --
    def all_reduce(self, arrs, op, deadline, what='all_reduce'):
        """arrs (same-dtype contiguous arrays, read as one buffer back to
        back) <- op over the group's ranks, in place."""
        self._op = what
        dt = arrs[0].dtype
        if op is ReduceOp.AVG and dt.kind not in 'fc':
            divide_avg(arrs[0], self.g.size)     # raises the TypeError
        if any(get_array_module(a) is not np for a in arrs):
            # CuPy: sockets and shared files move host memory
            host = [a.get() for a in arrs]
            self.all_reduce(host, op, deadline, what)
            for a, h in zip(arrs, host):
                a.set(h)
            return
        try:
            self._all_reduce(arrs, op, deadline)
        except _Expired:
            raise          # the group's timeout report
        except BaseException as e:
            self._break(e)
            raise

    def _break(self, e):
        """After a failure: flag it for this host, note the culprit in the
        store, close the sockets, so every rank stops soon, naming it."""
        g = self.g
        culprit = g.rank
        if isinstance(e, RankFailureError) and e.rank is not None:
            culprit = e.rank
        if not int(self._flags[self.me][_POISON]):
            self._flags[self.me][_POISON] = culprit + 1
        try:
            k = f"{g._prefix}hier/failed"
            first = g.store.try_get(k)
            if first is None:
                g.store.set(k, str(e))
            elif isinstance(e, RankFailureError) and \
                    first.decode() != str(e):
                e.args = (f"{e.args[0]}; first failure reported in the "
                          f"group: {first.decode()}",)
        except Exception:
            pass         # the store went with rank 0
        g._broken = e
        g._close_sockets()
        if self.cross is not None:
            self.cross._close_sockets()

    def _all_reduce(self, arrs, op, deadline):
        dt = arrs[0].dtype
        flats = [a.reshape(-1) for a in arrs]
        starts = [0]
        for f in flats:
            starts.append(starts[-1] + f.size)
        total = starts[-1]
        per = max(1, CHUNK // dt.itemsize)
        f = ufunc(op)
        xop = ReduceOp.SUM if op is ReduceOp.AVG else op
        me, o = self.me, self.owners
        segs, flags = self._segs, self._flags
        inline = total <= per          # one chunk: nothing to overlap
        prev = None
        for lo in range(0, total, per):
            hi = min(total, lo + per)
            k = self._next()
            base = shm_reduce.HEADER + (k % SLOTS) * CHUNK
            slots = [s[base:base + (hi - lo) * dt.itemsize].view(dt)
                     for s in segs]
            mine = slots[me]
            for i, a, b in shm_reduce._pieces(starts, lo, hi):
                mine[a - lo:b - lo] = flats[i][a - starts[i]:b - starts[i]]
            flags[me][0] = k
            self._wait(0, k, deadline)
            cut = [(hi - lo) * j // o for j in range(o + 1)]
            job = None
            if me < o and cut[me] < cut[me + 1]:
                part = mine[cut[me]:cut[me + 1]]
                for r in range(len(slots)):
                    if r != me:
                        f(part, slots[r][cut[me]:cut[me + 1]], out=part)
                job = self._cross_start(part, xop, deadline, inline)
            if prev is not None:
                self._finish(*prev, flats, starts, op, deadline)
            prev = (k, lo, cut, slots, job)
        if prev is not None:
            self._finish(*prev, flats, starts, op, deadline)

    def _next(self):
        if self.red is not None:
            self.red._k += 1
            return self.red._k
        self._k += 1
        return self._k

    def _finish(self, k, lo, cut, slots, job, flats, starts, op, deadline):
        """Steps 3 (the end) and 4 of chunk k."""
        me = self.me
        self._cross_wait(job, deadline)
        if op is ReduceOp.AVG and me < self.owners:
            part = slots[me][cut[me]:cut[me + 1]]
            np.divide(part, self.g.size, out=part)
        self._flags[me][1] = k
        self._wait(1, k, deadline)
        for r in range(self.owners):
            src = slots[r]
            for i, a, b in shm_reduce._pieces(starts, lo + cut[r],
                                              lo + cut[r + 1]):
                flats[i][a - starts[i]:b - starts[i]] = src[a - lo:b - lo]

    def close(self):
        if self._jobs is not None:
            self._jobs.put(None)
        if self.cross is not None:
            self.cross.destroy()
            self.cross = None
        if self.red is not None:
            self.red.close()
        self._segs = self._flags = None


# ------------------------------------------------ recursive doubling --

def _doubling(c, buf, op, deadline, seq):
    """buf <- op over the ranks of tcp group c, in log2(n) exchanges (plus
    one before and one after for the ranks beyond the largest power of two
    p: rank 2i folds into 2i + 1 and gets the result back). Partners
    combine as op(lower ranks' data, higher ranks' data), so both get the
    same bits."""
    from .tcp.transport import _HDR, _mv, kind
    n, r = c.size, c.rank
    f = ufunc(op)
    p = 1 << (n.bit_length() - 1)
    rem = n - p
    tmp = np.empty_like(buf)
    base = seq * 4096 + 3584
    what = kind(buf.dtype, op)

    def xchg(peer, step, send, recv):
        so = c._connect('p', peer, deadline) if send is not None else None
        si = c._wait_incoming('p', peer, deadline) \
            if recv is not None else None
        out = [] if send is None else [
            _HDR.pack(base + step, send.nbytes, what), _mv(send)]
        hb = bytearray(_HDR.size)
        inn = [] if recv is None else [memoryview(hb), _mv(recv)]
        exp = None if recv is None else (base + step, recv.nbytes, what)
        c._pump(so, out, peer, si, inn, peer, deadline, exp)

    if r < 2 * rem:
        if r % 2 == 0:
            xchg(r + 1, 0, buf, None)
            vr = -1
        else:
            xchg(r - 1, 0, None, tmp)
            f(tmp, buf, out=buf)
            vr = r // 2
    else:
        vr = r - rem
    if vr >= 0:
        d, step = 1, 1
        while d < p:
            pv = vr ^ d
            peer = 2 * pv + 1 if pv < rem else pv + rem
            xchg(peer, step, buf, tmp)
            if pv < vr:
                f(tmp, buf, out=buf)
            else:
                f(buf, tmp, out=buf)
            d, step = d << 1, step + 1
    if r < 2 * rem:
        if r % 2:
            xchg(r - 1, 63, buf, None)
        else:
            xchg(r + 1, 63, None, buf)
