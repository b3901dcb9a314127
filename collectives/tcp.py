"""`tcp` backend: ring collectives over sockets, for jobs without MPI.

Ranks meet through the `TCPStore` on rank 0, then each rank listens on the
interface that reaches MASTER_ADDR and connects an *outgoing* socket to its
right neighbour (the ring) and, lazily, to any peer it sends to (p2p).
Incoming sockets are accepted and authenticated (the store's HMAC
challenge) by a `HandshakeGate`, off the path of the peers' connections:
idle strangers are capped and timed out and cannot hold up a peer. Sends
and receives use separate sockets, so neither side waits for the other to
connect first and p2p traffic never mixes with ring traffic.

All-reduce: below SMALL bytes, an all-gather of whole buffers followed by a
reduction in rank order (n-1 messages instead of 2(n-1)); above, the classic
ring reduce-scatter + all-gather in n chunks. Both give bitwise equal results
on every rank. Each message carries a 16-byte header (sequence number, byte
count) so a rank that called a different collective is caught, not misread.
Sockets are non-blocking; one loop sends and receives at once (sendmsg /
recvmsg_into on memoryviews) so big transfers cannot deadlock on full
buffers. A peer that dies closes its sockets: survivors raise
RankFailureError and close theirs, so the failure travels round the ring.

Same-host fast path: loopback TCP copies every byte twice through the
kernel and tops out near 2 GB/s each way on a small machine, under half of
MPI's shared memory. So at setup each rank offers its right neighbour a
ring of slots in an anonymous shared file (`shm.anonymous_file`: no name
in /dev/shm, so a rank killed at any moment leaves nothing behind; its
/proc path is sent over the authenticated socket and the descriptor
closed as soon as the neighbour has answered); a neighbour that can open
it and finds the random cookie inside shares the host. Messages of
SHM_MIN bytes or more on such a link keep their header on the socket, but
the payload goes slot by slot through the file:
one token byte on the socket says "slot filled", one byte back on the same
connection says "slot free". The reader reduces straight out of the slot,
which is still in cache. Control stays on the socket, so a dead peer is
still seen as a closed connection. DTORCH_TCP_SHM=0 turns it off.
"""
import json
import mmap
import os
import queue
import select
import socket
import struct
import threading
import time

import numpy as np

from .arrays import (describe, divide_avg, get_array_module, reduce_into,
                     ReduceOp, row)
from .errors import (CollectiveMismatchError, CollectiveTimeoutError, _Expired,
                     RankFailureError)
from .group import ProcessGroup
from .watchdog import watchdog
from . import shm
from .store import HandshakeGate, connect_authenticated

SMALL = 64 * 1024
SHM_MIN = 64 * 1024        # messages this big take the shm path
SHM_SLOT = 256 * 1024      # bytes per slot: a token per 256 KiB is cheap
SHM_SLOTS = 8              # 2 MiB ring: both ends stay in L2/L3
_HDR = struct.Struct('<qq')
_PIECE = 1 << 20           # a stashed message is read this much at a time
# shm offer: path, cookie, slots, slot bytes (empty path: no offer)
_OFFER = struct.Struct('<96s16sII')
_POLLIN, _POLLOUT = select.POLLIN, select.POLLOUT
_UFUNC = {ReduceOp.SUM: np.add, ReduceOp.AVG: np.add,
          ReduceOp.MAX: np.maximum, ReduceOp.MIN: np.minimum,
          ReduceOp.PRODUCT: np.multiply}


def _mv(arr):
    """A flat byte memoryview of a contiguous array, whatever its dtype."""
    return memoryview(arr.reshape(-1).view(np.uint8))


def _nonempty(bufs):
    """The buffers with bytes in them: a 0-byte buffer (an empty array's
    payload) never completes a send or a receive, so a loop that waits
    for it to would wait for the timeout."""
    return [b for b in bufs if len(b)]


def _advance(bufs, n):
    while n:
        b = bufs[0]
        if n >= len(b):
            n -= len(b)
            bufs.pop(0)
        else:
            bufs[0] = b[n:]
            n = 0


class _Shm:
    """A ring of k slots of `slot` bytes in an anonymous shared file,
    written by one rank and read by its right neighbour. seq counts slots
    filled (writer) or drained (reader); acked counts slots the reader
    gave back."""
    HEAD = 4096    # the cookie's page; keeps the slots page aligned

    def __init__(self, path, mm, k, slot, fd=None):
        self.path, self.mm, self.k, self.slot = path, mm, k, slot
        self.fd = fd   # the creator's descriptor, until release()
        self.arr = np.frombuffer(mm, np.uint8, k * slot, self.HEAD)
        self.seq = self.acked = 0

    @classmethod
    def create(cls, k, slot):
        cookie = os.urandom(16)
        size = cls.HEAD + k * slot
        fd, path = shm.anonymous_file(size, 'tcp')
        try:
            mm = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            raise
        mm[:16] = cookie
        return cls(path, mm, k, slot, fd), cookie

    @classmethod
    def attach(cls, path, cookie, k, slot):
        """The neighbour's ring, or None when this rank cannot see it."""
        size = cls.HEAD + k * slot
        fd = shm.open_anonymous(path, size, writable=False)
        if fd is None:
            return None
        try:
            mm = mmap.mmap(fd, size, prot=mmap.PROT_READ)
        except OSError:
            return None
        finally:
            os.close(fd)
        if mm[:16] != cookie:
            mm.close()
            return None
        return cls(path, mm, k, slot)

    def release(self):
        """Close the creator's descriptor: once the neighbour has opened
        the file (or never will), only the mappings keep it."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class TCPGroup(ProcessGroup):
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
            self._rsock = self._connect('r', self._right, deadline)
            self._lsock_in = self._wait_incoming('r', self._left, deadline)
            self._shm_setup(deadline)
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
        # goes through one shared file (collectives.shm); the set-up talks
        # through the store, so that it is not a collective of the group
        self._red = shm.ShmReducer.setup(
            rank, size, self._store_bcast, self._store_all_true,
            enabled=shm.usable() and os.environ.get('DTORCH_TCP_SHM',
                                                    '1') != '0')
        watchdog.register(self)

    def _shm_setup(self, deadline):
        """Offer the right neighbour a shm ring and answer the left one's
        offer. Trying is the test: ranks on other hosts (or in another
        pid namespace) cannot open the file and keep the socket."""
        on = (os.environ.get('DTORCH_TCP_SHM', '1') != '0'
              and shm.anonymous_ok())
        mine, offer = None, _OFFER.pack(b'', b'', 0, 0)
        if on:
            try:
                mine, cookie = _Shm.create(SHM_SLOTS, SHM_SLOT)
                offer = _OFFER.pack(mine.path.encode(), cookie,
                                    SHM_SLOTS, SHM_SLOT)
            except OSError:
                mine = None
        try:
            theirs = bytearray(_OFFER.size)
            self._pump(self._rsock, [offer], self._right, self._lsock_in,
                       [memoryview(theirs)], self._left, deadline)
            path, cookie, k, slot = _OFFER.unpack(theirs)
            path = path.rstrip(b'\0').decode()
            if on and path:
                self._shm_r = _Shm.attach(path, cookie, k, slot)
            # the answer goes back on the same connection, reversed
            ans = bytearray(1)
            self._pump(self._lsock_in, [bytes([self._shm_r is not None])],
                       self._left, self._rsock, [memoryview(ans)],
                       self._right, deadline)
            if mine is not None and ans[0]:
                self._shm_w = mine
        finally:
            if mine is not None:   # both ends have it open, or never will
                mine.release()

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

    # ---- connections
    def _accepted(self, s, hello):
        """An authenticated peer's connection: channel and group rank."""
        chan, peer = struct.unpack('<ci', hello)
        chan = chan.decode()
        if chan not in ('r', 'p') or not 0 <= peer < self.size \
                or self._closed:
            s.close()
            return
        self._tune(s)
        with self._cond:
            old = self._incoming.get((chan, peer))
            self._incoming[(chan, peer)] = s
            self._cond.notify_all()
        if old is not None:   # the peer reconnected: the old one is dead
            old.close()

    @staticmethod
    def _tune(s):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.setblocking(False)

    def _connect(self, chan, peer, deadline):
        """The outgoing socket to group rank `peer`; _Expired([peer]) when
        it cannot be had by the deadline (the caller's op reports it)."""
        key = (chan, peer)
        s = self._out.get(key)
        if s is not None:
            return s
        left = deadline - time.monotonic()
        try:
            addr = self.store.get(f"{self._prefix}addr/{peer}",
                                  timeout=max(left, 0.01)).decode()
            host, port = addr.rsplit(':', 1)
            s = connect_authenticated(
                host, port, self.store.token, deadline,
                f"rank {peer} (global {self.ranks[peer]}) of group "
                f"{self.name!r} at {addr}")
            s.sendall(struct.pack('<ci', chan.encode(), self.rank))
        except CollectiveTimeoutError:
            raise _Expired([peer]) from None
        except OSError as e:
            raise self._fail(peer, f"could not be opened ({e})") from None
        self._tune(s)
        self._out[key] = s
        return s

    def _wait_incoming(self, chan, peer, deadline):
        with self._cond:
            while (chan, peer) not in self._incoming:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise _Expired([peer])
                self._cond.wait(min(left, 0.5))
            return self._incoming[(chan, peer)]

    # ---- moving bytes
    def _fail(self, peer, what):
        err = RankFailureError(
            f"connection with rank {peer} (global {self.ranks[peer]}) of "
            f"group {self.name!r} {what} on rank {self.rank}: that rank "
            f"died or gave up; closing this rank's sockets too",
            rank=peer)
        self._broken = err
        self._close_sockets()
        return err

    def _xfer(self, out_bufs, in_bufs, deadline, expect=None):
        """Send out_bufs on the right socket while receiving in_bufs from
        the left one. expect = (seq, nbytes) to check in the header that
        in_bufs[0] receives."""
        so, si = self._rsock, self._lsock_in
        return self._pump(so, out_bufs, self._right, si, in_bufs,
                          self._left, deadline, expect)

    def _send_some(self, so, bufs, peer):
        """Send what the socket takes now; True when anything went."""
        try:
            n = so.sendmsg(bufs)
        except BlockingIOError:
            return False
        except OSError as e:
            raise self._fail(peer, f"broke ({e})") from None
        if n:
            _advance(bufs, n)
        return bool(n)

    def _recv_some(self, si, bufs, peer):
        """Bytes that arrived into bufs now (0: none yet; the caller
        advances bufs); a closed socket means the peer is gone."""
        try:
            n = si.recvmsg_into(bufs)[0]
        except BlockingIOError:
            return 0
        except OSError as e:
            raise self._fail(peer, f"broke ({e})") from None
        if n == 0:
            raise self._fail(peer, "was closed")
        return n

    def _pump(self, so, out_bufs, pout, si, in_bufs, pin, deadline,
              expect=None):
        out_bufs, in_bufs = _nonempty(out_bufs), _nonempty(in_bufs)
        hdr = in_bufs[0] if expect is not None else None
        got = 0
        while out_bufs or in_bufs:
            moved = False
            if out_bufs and self._send_some(so, out_bufs, pout):
                moved = True
            if in_bufs:
                n = self._recv_some(si, in_bufs, pin)
                if n:
                    if hdr is not None and got < 16 <= got + n:
                        self._check_header(hdr, expect, pin)
                    got += n
                    _advance(in_bufs, n)
                    moved = True
            if moved:
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                # the neighbour may only be waiting on its own: the
                # statuses of all ranks say who is really missing
                raise _Expired(None)
            poller = select.poll()
            if out_bufs:
                poller.register(so, _POLLOUT)
            if in_bufs:
                poller.register(si, _POLLIN)
            poller.poll(min(left, 0.5) * 1000)

    def _check_header(self, hdr, expect, peer):
        tag, nbytes = _HDR.unpack(bytes(hdr))
        if (tag, nbytes) != expect:
            err = self._mismatch(peer, expect, tag, nbytes)
            self._broken = err
            self._close_sockets()   # the streams are out of step for good
            raise err

    def _mismatch(self, peer, expect, tag, nbytes):
        """The error for a ring message that is not the one expected. A
        message tag is seq * 4096 + step, so tag // 4096 is the sender's
        collective number; what each rank is calling (op, shape, dtype)
        comes from the ranks' own status reports, as in a timeout."""
        seq = expect[0] // 4096
        rec = self._pending.get(seq) or (seq, '?', None)
        try:
            sts = self._peer_statuses(min(2.0, max(0.3, self.timeout / 4)))
        except Exception:    # the report must not mask the mismatch
            sts = {self.rank: self.status()}
        where = '; '.join(self.format_status(r, sts.get(r))
                          for r in range(self.size))
        theirs = (f"{nbytes} bytes of its collective #{tag // 4096}"
                  if nbytes >= 0 else f"a malformed header ({nbytes} "
                  f"bytes)")
        return CollectiveMismatchError(
            f"collective mismatch on group {self.name!r} (backend tcp, "
            f"global ranks {self.ranks}): rank {self.rank} in {rec[1]} "
            f"#{seq} {describe(rec[2])} expected {expect[1]} bytes from "
            f"rank {peer}, which sent {theirs}: the ranks called different"
            f" collectives, shapes or dtypes. Where each rank is: {where}",
            rank=peer)

    def _step(self, send_arr, recv_arr, deadline, tag, in_tag=None,
              op=None):
        """One ring step with headers: send_arr right, recv_arr <- left
        (or recv_arr <- op(recv_arr, what came) with a ufunc op). Each
        direction takes its shm ring when it has one and the message is
        big enough, else the payload follows the header on the socket."""
        in_tag = tag if in_tag is None else in_tag
        w = self._shm_w if (send_arr is not None
                            and send_arr.nbytes >= SHM_MIN) else None
        rd = self._shm_r if (recv_arr is not None
                             and recv_arr.nbytes >= SHM_MIN) else None
        if w is not None or rd is not None:
            return self._shm_step(send_arr, w, recv_arr, rd, deadline,
                                  tag, in_tag, op)
        out = [] if send_arr is None else [
            _HDR.pack(tag, send_arr.nbytes), _mv(send_arr)]
        hb = bytearray(16)
        tmp = recv_arr if (op is None or recv_arr is None) \
            else np.empty_like(recv_arr)
        inn = [] if recv_arr is None else [memoryview(hb), _mv(tmp)]
        exp = None if recv_arr is None else (in_tag, recv_arr.nbytes)
        self._xfer(out, inn, deadline, exp)
        if tmp is not recv_arr:
            op(recv_arr, tmp, out=recv_arr)

    def _shm_step(self, send_arr, w, recv_arr, rd, deadline, tag, in_tag,
                  op):
        """_step where w (out) and/or rd (in) is a shm ring; a None ring
        with an array means that direction is inline on the socket."""
        so, si = self._rsock, self._lsock_in
        oq, src, opos = [], None, 0          # socket bytes, shm payload
        if send_arr is not None:
            oq.append(memoryview(_HDR.pack(tag, send_arr.nbytes)))
            if w is None and send_arr.nbytes:
                oq.append(_mv(send_arr))
            else:
                src = send_arr.reshape(-1).view(np.uint8)
        iq, got, tmp = [], 0, None
        nin = ipos = acks = 0
        if recv_arr is not None:
            hb = bytearray(16)
            iq.append(memoryview(hb))
            nin = recv_arr.nbytes
            dst = recv_arr.reshape(-1)
            dst8 = dst.view(np.uint8)
            if rd is None:
                tmp = dst if op is None else np.empty_like(dst)
                if nin:
                    iq.append(_mv(tmp))
            toks = bytearray(64)
        while True:
            moved = False
            if src is not None and opos < src.size:
                if w.seq - w.acked >= w.k:      # ring full: any acks?
                    try:
                        b = so.recv(4096)
                    except BlockingIOError:
                        b = None
                    except OSError as e:
                        raise self._fail(self._right,
                                         f"broke ({e})") from None
                    if b == b'':
                        raise self._fail(self._right, "was closed")
                    if b:
                        w.acked += len(b)
                filled = 0
                while w.seq - w.acked < w.k and opos < src.size:
                    m = min(w.slot, src.size - opos)
                    at = (w.seq % w.k) * w.slot
                    w.arr[at:at + m] = src[opos:opos + m]
                    opos += m
                    w.seq += 1
                    filled += 1
                if filled:
                    oq.append(memoryview(b'\x01' * filled))
                    moved = True
            if oq and self._send_some(so, oq, self._right):
                moved = True
            if iq:
                n = self._recv_some(si, iq, self._left)
                if n:
                    if got < 16 <= got + n:
                        self._check_header(hb, (in_tag, nin), self._left)
                    got += n
                    _advance(iq, n)
                    moved = True
            elif rd is not None and ipos < nin:
                # the header is in: drain the slots the tokens announce,
                # never reading past this message's tokens
                left = -(-(nin - ipos) // rd.slot)
                try:
                    n = si.recv_into(toks, min(left, len(toks)))
                except BlockingIOError:
                    n = -1
                except OSError as e:
                    raise self._fail(self._left, f"broke ({e})") from None
                if n == 0:
                    raise self._fail(self._left, "was closed")
                for _ in range(max(n, 0)):
                    m = min(rd.slot, nin - ipos)
                    at = (rd.seq % rd.k) * rd.slot
                    piece = rd.arr[at:at + m]
                    if op is None:
                        dst8[ipos:ipos + m] = piece
                    else:
                        d = dst8[ipos:ipos + m].view(dst.dtype)
                        op(d, piece.view(dst.dtype), out=d)
                    ipos += m
                    rd.seq += 1
                    acks += 1
                    moved = True
            if acks:
                try:
                    acks -= si.send(b'\x01' * acks)
                except BlockingIOError:
                    pass
                except OSError as e:
                    raise self._fail(self._left, f"broke ({e})") from None
            starved = src is not None and opos < src.size
            inwait = bool(iq) or (rd is not None and ipos < nin)
            if not (oq or starved or inwait or acks):
                break
            if moved:
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                raise _Expired(None)
            poller = select.poll()
            ev = (_POLLOUT if oq else 0) | (_POLLIN if starved else 0)
            if ev:
                poller.register(so, ev)
            ev = (_POLLIN if inwait else 0) | (_POLLOUT if acks else 0)
            if ev:
                poller.register(si, ev)
            poller.poll(min(left, 0.5) * 1000)
        if tmp is not None and tmp is not dst:
            op(dst, tmp, out=dst)

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
        return self._launch(lambda dl: self._all_reduce(arr, op, dl, seq),
                            'coll')

    def _neighbours_alive(self):
        """Raise RankFailureError if a ring neighbour closed its socket
        (nothing else is due on them during a shared-memory reduction),
        closing ours, so that the failure travels round the ring."""
        for so, peer in ((self._lsock_in, self._left),
                         (self._rsock, self._right)):
            ready, _, _ = select.select([so], [], [], 0)
            if ready:
                try:
                    eof = so.recv(1, socket.MSG_PEEK) == b''
                except OSError:
                    eof = True
                if eof:
                    raise self._fail(peer, "closed")

    def _start_all_reduce_coalesced(self, arrs, op, deadline):
        if self._red is not None and shm.supports(arrs, op):
            # in the collectives' lane, so issue order is kept
            return self._launch(
                lambda dl: self._red.all_reduce(arrs, op, dl,
                                                self._neighbours_alive),
                'coll')
        return ProcessGroup._start_all_reduce_coalesced(self, arrs, op,
                                                        deadline)

    def _all_reduce(self, arr, op, deadline, seq):
        n = self.size
        if op is ReduceOp.AVG and arr.dtype.kind not in 'fc':
            divide_avg(arr, n)   # raises the TypeError
        if n == 1:
            return
        if get_array_module(arr) is not np:   # CuPy: sockets move host memory
            host = arr.get()
            self._all_reduce(host, op, deadline, seq)
            arr.set(host)
            return
        flat = arr.reshape(-1)
        if arr.nbytes <= SMALL or flat.size < n or \
                get_array_module(arr) is not np or flat.dtype.kind == 'b':
            full = np.empty((n,) + flat.shape, flat.dtype)
            self._ring_gather([full[r] for r in range(n)], flat, deadline,
                              seq)
            reduce_into(flat, list(full), op, n)
            return
        bounds = np.linspace(0, flat.size, n + 1).astype(np.int64)
        chunks = [flat[bounds[i]:bounds[i + 1]] for i in range(n)]
        self._ring_reduce_scatter(chunks, op, deadline, seq, shift=0)
        self._ring_all_gather(chunks, deadline, seq, shift=0)
        if op is ReduceOp.AVG:
            divide_avg(arr, n)

    def _ring_reduce_scatter(self, chunks, op, deadline, seq, shift):
        """Afterwards this rank's chunk (rank + 1 + shift) % n holds the
        reduction over all ranks."""
        n, r = self.size, self.rank
        f = _UFUNC[op]
        for s in range(n - 1):
            out = chunks[(r - s + shift) % n]
            dst = chunks[(r - s - 1 + shift) % n]
            self._step(out, dst, deadline, seq * 4096 + s, op=f)

    def _ring_all_gather(self, chunks, deadline, seq, shift):
        """Chunk (rank + 1 + shift) % n is complete here; fill the rest."""
        n, r = self.size, self.rank
        for s in range(n - 1):
            out = chunks[(r + 1 - s + shift) % n]
            dst = chunks[(r - s + shift) % n]
            self._step(out, dst, deadline, seq * 4096 + 2048 + s)

    def _ring_gather(self, blocks, mine, deadline, seq):
        """blocks[r] <- rank r's `mine` (blocks may alias mine)."""
        n, r = self.size, self.rank
        if blocks[r] is not mine:
            blocks[r][...] = mine
        for s in range(n - 1):
            self._step(blocks[(r - s) % n], blocks[(r - s - 1) % n],
                       deadline, seq * 4096 + 1024 + s)

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

    def _broadcast(self, arr, src, deadline, seq):
        """A pipelined chain round the ring, starting at src."""
        n, r = self.size, self.rank
        if n == 1:
            return
        if get_array_module(arr) is not np:   # CuPy: sockets move host memory
            host = arr.get()
            self._broadcast(host, src, deadline, seq)
            arr.set(host)
            return
        flat = arr.reshape(-1).view(np.uint8)
        piece = 1 << 20
        parts = [flat[i:i + piece] for i in range(0, max(flat.size, 1),
                                                  piece)]
        forward = self._right != src
        for k in range(len(parts) + 1):
            out = parts[k - 1] if (k >= 1 and forward and r != src) \
                else None
            if r == src:
                out = parts[k] if k < len(parts) else None
            inn = parts[k] if (k < len(parts) and r != src) else None
            if out is not None or inn is not None:
                base = seq * 4096 + 3072
                self._step(out, inn, deadline,
                           base + k - (r != src), base + k)

    def _start_barrier(self, deadline):
        return self._start_all_reduce(np.zeros(1, np.int32), ReduceOp.SUM,
                                      deadline)

    # ---- point to point
    def _start_send(self, arr, dst, tag, deadline):
        def job(dl):
            s = self._connect('p', dst, dl)
            self._pump(s, [_HDR.pack(tag, arr.nbytes), _mv(arr)], dst,
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
                hb = bytearray(16)
                self._pump(None, [], None, s, [memoryview(hb)], src, dl)
                t, nbytes = _HDR.unpack(bytes(hb))
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

    def _close_sockets(self):
        socks = list(self._out.values()) + list(self._incoming.values())
        for s in socks:
            try:
                s.close()
            except OSError:
                pass

    def destroy(self):
        self._closed = True
        watchdog.unregister(self)
        self._close_sockets()
        self._shm_w = self._shm_r = None   # the mappings go with them
        if self._red is not None:
            self._red.close()
            self._red = None
        if self.size > 1:
            self._gate.close()
        ProcessGroup.destroy(self)


def tcp_group(rank, world_size, master_addr='127.0.0.1', master_port=29500,
              token=None, timeout=None, store=None):
    """Rendezvous at master_addr:master_port (rank 0 serves the store)
    and return the world TCPGroup."""
    from .group import as_seconds
    from .store import TCPStore
    timeout = as_seconds(timeout)
    if store is None:
        store = TCPStore(master_addr, master_port, token,
                         is_server=(rank == 0), timeout=timeout)
    return TCPGroup(store, rank, world_size, 'world', timeout)
