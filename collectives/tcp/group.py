"""`tcp` backend: ring collectives over sockets, for jobs without MPI.

The group: set-up, an async lane per kind of op, point to point, status
and teardown. Its transport is in `transport` (sockets, the same-host
shm `pipe`), its collectives in `rings`.
"""
from __future__ import annotations
import json
import queue
import socket
import threading
import time

import numpy as np

from .. import hier, shm_reduce
from ..arrays import ReduceOp, divide_avg, row
from ..env import env_flag
from ..errors import CollectiveMismatchError, CollectiveTimeoutError, _Expired
from ..group import ProcessGroup, Timeout
from ..store import HandshakeGate, TCPStore, release_at_exit
from ..watchdog import watchdog
from .rings import RingAlgorithms
from .transport import _HDR, SocketTransport, _mv, kind

_PIECE = 1 << 20           # a stashed message is read this much at a time


class TCPGroup(RingAlgorithms, SocketTransport, ProcessGroup):
    backend = 'tcp'

    def __init__(self, store, rank, size, name='world', timeout=None,
                 ranks=None):
        super().__init__(rank, size, name, ranks, timeout)
        self.store = store
        self._prefix = f"g/{name}/"
        self._incoming = {}     # (channel, peer) -> socket
        self._out = {}          # (channel, peer) -> socket
        self._cond = threading.Condition()
        self._lanes = {}        # lane -> [queue, pending count]
        self._stash = {}        # (src, tag) -> [bytes] read out of order
        self._asked = 0         # last status query answered
        self._wd_store = None
        self._closed = False
        self._async = False
        self._shm_w = self._shm_r = None   # shm rings to right / from left
        self._red = None        # shared-memory reducer, all ranks on a host
        self._hier = None       # two-level all-reduce (ranks on >1 host)
        self.hierarchy = "flat: one rank"
        # seconds this rank blocked waiting for each rank's data (the
        # socket rings and the shared-memory reducer add to it): what
        # straggler detection reads to name the rank the others wait for
        self.peer_wait = [0.0] * size
        if size == 1:
            return
        # listen on the interface that reaches the store
        host = store.sock.getsockname()[0]
        self._lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._lsock.bind((host, 0))
        self._lsock.listen(128)
        port = self._lsock.getsockname()[1]
        # peers authenticate off the accept path: strangers that connect
        # and say nothing cannot hold up a peer's connection
        self._gate = HandshakeGate(self._lsock, store.token, self._accepted,
                                   f"dtorch-tcp-accept-{name}", extra=5)
        store.set(f"{self._prefix}addr/{rank}", f"{host}:{port}")
        self._right = (rank + 1) % size
        self._left = (rank - 1) % size
        deadline = time.monotonic() + self.timeout
        try:
            # which ranks share a host (collectives.hier): same-host
            # shortcuts only between them, even where a shared file could
            # be opened across (namespaces sharing /proc)
            hosts = hier.exchange_hosts(store, self._prefix, rank, size,
                                        self.timeout)
            self._rsock = self._connect('r', self._right, deadline)
            self._lsock_in = self._wait_incoming('r', self._left, deadline)
            self._shm_setup(deadline)
            if hosts[self._right][0] != hosts[rank][0]:
                self._shm_w = None
            if hosts[self._left][0] != hosts[rank][0]:
                self._shm_r = None
        except BaseException as e:
            self._gate.close()
            self._close_sockets()
            if not isinstance(e, _Expired):
                raise
            raise CollectiveTimeoutError(
                f"tcp group {name!r} set-up on rank {rank} (global ranks "
                f"{self.ranks}) timed out after {self.timeout:.1f} s "
                f"waiting for rank(s) {e.missing}: did they start, and can "
                f"they reach this host?", op='init', group=name,
                missing=e.missing or ()) from None
        # all ranks on this host: all_reduce_coalesced (DDP's buckets)
        # goes through one shared file (collectives.shm_reduce); the set-up
        # talks through the store, so that it is not a collective of the group
        one_host = len({h[0] for h in hosts}) == 1
        self._red = shm_reduce.ShmReducer.setup(
            rank, size, self._store_bcast, self._store_all_true,
            enabled=shm_reduce.usable() and one_host
            and env_flag('DTORCH_TCP_SHM', True))
        if self._red is not None:
            self._red.peer_wait = self.peer_wait
        # ranks on several hosts: all_reduce in two levels, or why not
        self._hier, self.hierarchy = hier.setup(self, hosts)
        watchdog.register(self)
        release_at_exit(self)

    def _release_for_exit(self):
        self._closed = True
        self._close_sockets(graceful=True)

    def _store_bcast(self, obj):
        key = f"{self._prefix}shm/offer"
        if self.rank == 0:
            self.store.set(key, json.dumps(
                [obj[0], obj[1].hex() if obj[1] else None]))
        path, cookie = json.loads(self.store.get(key))
        return path, bytes.fromhex(cookie) if cookie else None

    def _store_all_true(self, flag):
        self.store.set(f"{self._prefix}shm/ok/{self.rank}",
                       b'1' if flag else b'0')
        return all(self.store.get(f"{self._prefix}shm/ok/{r}") == b'1'
                   for r in range(self.size))

    # ---- async: one FIFO worker thread per lane keeps issue order
    def _run(self, name, arr, sig, start, async_op, p2p=False):
        self._async = async_op
        return ProcessGroup._run(self, name, arr, sig, start, async_op,
                                 p2p)

    def _launch(self, job, lane):
        """Run job(deadline) now, or on the lane's worker when async or
        when async ops of the lane are still queued."""
        ln = self._lanes.get(lane)
        if not self._async and (ln is None or ln[1] == 0):
            return job
        if ln is None:
            ln = self._lanes[lane] = [queue.Queue(), 0]
            threading.Thread(target=self._lane, args=(ln,), daemon=True,
                             name=f"dtorch-tcp-{lane}").start()
        done, box = threading.Event(), []
        with self._cond:
            ln[1] += 1
        # the job's own deadline: the group timeout from now
        ln[0].put((job, time.monotonic() + self.timeout, done, box))

        def fin(deadline):
            if not done.wait(max(0.0, deadline - time.monotonic())):
                raise _Expired(None)
            if box:
                raise box[0]
        fin.test = done.is_set
        return fin

    def _lane(self, ln):
        while True:
            job, deadline, done, box = ln[0].get()
            try:
                job(deadline)
            except BaseException as e:
                box.append(e)
            with self._cond:
                ln[1] -= 1
            done.set()

    # ---- collectives
    def _start_all_reduce(self, arr, op, deadline):
        seq = self._seq
        if self._hier is not None and arr.dtype != object:
            what = self._pending.get(seq, (0, 'all_reduce'))[1]
            return self._launch(
                lambda dl: self._hier.all_reduce([arr], op, dl, what),
                'coll')
        return self._launch(lambda dl: self._all_reduce(arr, op, dl, seq),
                            'coll')

    def _start_all_reduce_coalesced(self, arrs, op, deadline):
        if self._hier is not None and arrs[0].dtype != object:
            # the arrays themselves, no packing copy
            return self._launch(
                lambda dl: self._hier.all_reduce(arrs, op, dl,
                                                 'all_reduce_coalesced'),
                'coll')
        if self._red is not None and shm_reduce.supports(arrs, op):
            # in the collectives' lane, so issue order is kept
            return self._launch(
                lambda dl: self._red.all_reduce(arrs, op, dl,
                                                self._neighbours_alive),
                'coll')
        return ProcessGroup._start_all_reduce_coalesced(self, arrs, op,
                                                        deadline)

    def _start_all_gather(self, out, inp, deadline):
        seq = self._seq

        def job(dl):
            blocks = [row(out, r).reshape(-1) for r in range(self.size)]
            self._ring_gather(blocks, inp.reshape(-1), dl, seq)
        return self._launch(job, 'coll')

    def _start_reduce_scatter(self, out, inp, op, deadline):
        seq = self._seq

        def job(dl):
            if op is ReduceOp.AVG and out.dtype.kind not in 'fc':
                divide_avg(out, self.size)
            chunks = [np.array(inp[r]).reshape(-1)
                      for r in range(self.size)]
            if self.size > 1:
                self._ring_reduce_scatter(chunks, op, dl, seq, shift=-1)
            out.reshape(-1)[...] = chunks[self.rank]
            if op is ReduceOp.AVG:
                divide_avg(out, self.size)
        return self._launch(job, 'coll')

    def _start_broadcast(self, arr, src, deadline):
        seq = self._seq
        return self._launch(lambda dl: self._broadcast(arr, src, dl, seq),
                            'coll')

    def _start_barrier(self, deadline):
        return self._start_all_reduce(np.zeros(1, np.int32), ReduceOp.SUM,
                                      deadline)

    # ---- point to point
    def _start_send(self, arr, dst, tag, deadline):
        def job(dl):
            s = self._connect('p', dst, dl)
            self._pump(s, [_HDR.pack(tag, arr.nbytes, kind(arr.dtype)),
                           _mv(arr)], dst,
                       None, [], None, dl)
        return self._launch(job, 'send')

    def _start_recv(self, arr, src, tag, deadline):
        def job(dl):
            box = self._stash.get((src, tag))
            if box:
                data = box.pop(0)
                self._check_size(len(data), arr, src, tag)
                _mv(arr)[:] = data
                return
            s = self._wait_incoming('p', src, dl)
            while True:
                hb = bytearray(_HDR.size)
                self._pump(None, [], None, s, [memoryview(hb)], src, dl)
                # the kind is not checked: a recv may view the bytes as
                # another dtype, as the mpi backend allows
                t, nbytes, _ = _HDR.unpack(bytes(hb))
                if nbytes < 0:
                    raise self._fail(src, f"sent a malformed header "
                                     f"({nbytes} bytes)")
                if t == tag:
                    # checked against the buffer before a byte is read
                    self._check_size(nbytes, arr, src, tag)
                    self._pump(None, [], None, s, [_mv(arr)], src, dl)
                    return
                # a message with another tag: keep it for its recv. Its
                # size is the sender's claim, so memory grows with the
                # bytes that really arrive, never with the claim
                other = bytearray()
                while len(other) < nbytes:
                    piece = bytearray(min(_PIECE, nbytes - len(other)))
                    self._pump(None, [], None, s, [memoryview(piece)], src,
                               dl)
                    other += piece
                self._stash.setdefault((src, t), []).append(bytes(other))
        return self._launch(job, 'recv')

    def _check_size(self, nbytes, arr, src, tag):
        if nbytes != arr.nbytes:
            raise CollectiveMismatchError(
                f"recv on rank {self.rank}: rank {src} sent {nbytes} bytes "
                f"with tag {tag} but the buffer {list(arr.shape)} "
                f"{arr.dtype} holds {arr.nbytes}", rank=src)

    # ---- groups, status, teardown
    def _new_group(self, sub, global_ranks, me, name, timeout):
        if me is None:
            return None
        return TCPGroup(self.store, me, len(sub), name, timeout,
                        global_ranks)

    def _store_for_watchdog(self):
        if self._wd_store is None:
            self._wd_store = self.store.clone()
        return self._wd_store

    def _answer_queries(self):
        st = self._store_for_watchdog()
        asked = st.try_get(f"{self._prefix}ask")
        if asked is not None and int(asked) > self._asked:
            self._asked = int(asked)
            st.set(f"{self._prefix}status/{self.rank}",
                   json.dumps([self._asked, self.status()]))

    _tick = 0

    def _watchdog_tick(self):
        # every 4th tick (0.2 s): one store round trip per rank
        self._tick += 1
        if self._closed or self._tick % 4:
            return
        try:
            self._answer_queries()
        except Exception:
            self._closed = True   # the store (rank 0) is gone

    def _peer_statuses(self, grace):
        res = {self.rank: self.status()}
        st = self.store.clone()
        try:
            ask = st.add(f"{self._prefix}ask", 1)
            end = time.monotonic() + grace
            while len(res) < self.size and time.monotonic() < end:
                for r in range(self.size):
                    if r in res:
                        continue
                    v = st.try_get(f"{self._prefix}status/{r}")
                    if v is not None:
                        n, status = json.loads(v)
                        if n >= ask:
                            res[r] = tuple(status)
                time.sleep(0.02)
        finally:
            st.close()
        return res

    def destroy(self):
        self._closed = True
        watchdog.unregister(self)
        self._close_sockets(graceful=True)
        if self._wd_store is not None:
            self._wd_store.close()
        if self.name == 'world':
            # done with the store: rank 0, which serves it, may now exit
            # (collectives.store waits at exit for open connections)
            self.store._close_client()
        self._shm_w = self._shm_r = None   # the mappings go with them
        if self._red is not None:
            self._red.close()
            self._red = None
        if self._hier is not None:
            self._hier.close()
            self._hier = None
        if self.size > 1:
            self._gate.close()
        ProcessGroup.destroy(self)


def tcp_group(rank: int, world_size: int, master_addr: str = '127.0.0.1',
              master_port: int = 29500, token: str | None = None,
              timeout: Timeout = None,
              store: TCPStore | None = None) -> TCPGroup:
    """Rendezvous at master_addr:master_port (rank 0 serves the store,
    unless DTORCH_STORE_HOSTED=1: dtorch-launch --elastic serves it from an
    agent process, collectives.elastic_store) and return the world
    TCPGroup."""
    from ..group import as_seconds
    from ..store import TCPStore
    timeout = as_seconds(timeout)
    if store is None:
        store = TCPStore(master_addr, master_port, token,
                         is_server=(rank == 0
                                    and not env_flag('DTORCH_STORE_HOSTED',
                                                     False)),
                         timeout=timeout)
    return TCPGroup(store, rank, world_size, 'world', timeout)
