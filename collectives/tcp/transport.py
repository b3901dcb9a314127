"""The tcp backend's transport: connections between ranks and the loops that
move bytes (and ring messages) over them.

Ranks meet through the `TCPStore` on rank 0, then each rank listens on the
interface that reaches MASTER_ADDR and connects an *outgoing* socket to its
right neighbour (the ring) and, lazily, to any peer it sends to (p2p).
Incoming sockets are accepted and authenticated (the store's HMAC
challenge) by a `HandshakeGate`, off the path of the peers' connections:
idle strangers are capped and timed out and cannot hold up a peer. Sends
and receives use separate sockets, so neither side waits for the other to
connect first and p2p traffic never mixes with ring traffic.

Each message carries a 32-byte header (sequence number, byte count, and
what the bytes are: the reduction and the dtype) so a rank that called a
different collective, or the same one with another dtype or op, is
caught, not misread.
Sockets are non-blocking; one loop sends and receives at once (sendmsg /
recvmsg_into on memoryviews) so big transfers cannot deadlock on full
buffers. A peer that dies closes its sockets: survivors raise
RankFailureError and close theirs, so the failure travels round the ring.
"""
import functools
import select
import socket
import struct
import time

import numpy as np

from .. import shm
from ..arrays import describe
from ..env import env_flag
from ..errors import (CollectiveMismatchError, CollectiveTimeoutError,
                      RankFailureError, _Expired)
from ..store import connect_authenticated
from .pipe import ShmPipe

SHM_MIN = 64 * 1024        # messages this big take the shm path
SHM_SLOT = 256 * 1024      # bytes per slot: a token per 256 KiB is cheap
SHM_SLOTS = 8              # 2 MiB ring: both ends stay in L2/L3
_HDR = struct.Struct('<qq16s')    # tag, byte count, kind()
# shm offer: path, cookie, slots, slot bytes (empty path: no offer)
_OFFER = struct.Struct('<96s16sII')
_POLLIN, _POLLOUT = select.POLLIN, select.POLLOUT


@functools.lru_cache(maxsize=256)
def kind(dtype, op=None):
    """A header's 16-byte description of a message: the reduction applied
    to it (none for a copy) and its dtype's name. Cached: it is asked once
    per collective (uncached it cost 1.8 us, 3% of a small all_reduce)."""
    return f"{op or ''}:{np.dtype(dtype).name}".encode()[:16].ljust(16,
                                                                    b'\0')


def _kind_text(k):
    op, _, dt = bytes(k).rstrip(b'\0').decode(errors='replace') \
        .partition(':')
    return f"{dt}" + (f" (op {op})" if op else "")


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


class SocketTransport:
    """Connections and byte loops of a TCPGroup (a mixin: the group holds
    the sockets, the store and the shm rings this code uses)."""

    _peer_hosts = None   # group rank -> its address, for failure messages

    def _shm_setup(self, deadline):
        """Offer the right neighbour a shm ring and answer the left one's
        offer. Trying is the test: ranks on other hosts (or in another
        pid namespace) cannot open the file and keep the socket."""
        on = env_flag('DTORCH_TCP_SHM', True) and shm.anonymous_ok()
        mine, offer = None, _OFFER.pack(b'', b'', 0, 0)
        if on:
            try:
                mine, cookie = ShmPipe.create(SHM_SLOTS, SHM_SLOT)
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
                self._shm_r = ShmPipe.attach(path, cookie, k, slot)
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
        try:
            self._note_host(peer, s.getpeername()[0])
        except OSError:
            pass
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
            self._note_host(peer, host)
            # the peer listened before publishing addr: a refusal means
            # it is gone, not starting (else: wait for the timeout)
            s = connect_authenticated(
                host, port, self.store.token, deadline,
                f"rank {peer} (global {self.ranks[peer]}) of group "
                f"{self.name!r} at {addr}", listening=True)
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

    def _note_host(self, peer, host):
        """Remember the peer's address: with ranks on many hosts, a
        failure report must say which host to look at."""
        if self._peer_hosts is None:
            self._peer_hosts = {}
        self._peer_hosts[peer] = host

    # ---- moving bytes
    def _fail(self, peer, what):
        host = (self._peer_hosts or {}).get(peer)
        where = f", host {host}" if host else ""
        culprit, chain = self._culprit(peer)
        if chain:
            why = (f"rank {' then rank '.join(map(str, chain))} gave up "
                   f"after rank {culprit} (global {self.ranks[culprit]}) "
                   f"failed: that rank died or gave up first")
        else:
            why = "that rank died or gave up"
        err = RankFailureError(
            f"connection with rank {peer} (global {self.ranks[peer]}"
            f"{where}) of "
            f"group {self.name!r} {what} on rank {self.rank}: {why}; "
            f"closing this rank's sockets too", rank=culprit)
        self._broken = err
        self._report_failure(culprit)
        self._close_sockets()
        return err

    # A rank that gives up closes its sockets, so its other neighbour sees
    # it close too and, with no launcher to say who exited first, would
    # blame it. So before closing, a rank records in the store whom it
    # blames, and a rank that sees a peer close follows those records to
    # the rank that left none: the one that failed first. Short timeouts:
    # the store's host may be the rank that died.
    _REPORT_TIMEOUT = 1.0

    def _report_failure(self, culprit):
        try:
            st = self.store.clone(timeout=self._REPORT_TIMEOUT)
            try:
                st.set(f"{self._prefix}gave-up/{self.rank}", str(culprit))
            finally:
                st.close()
        except Exception:      # the store is gone: nobody can ask anyway
            pass

    def _culprit(self, peer):
        """(the rank to blame, the ranks that gave up on the way)."""
        chain, r = [], peer
        try:
            st = self.store.clone(timeout=self._REPORT_TIMEOUT)
        except Exception:
            return peer, chain
        try:
            while True:
                v = st.try_get(f"{self._prefix}gave-up/{r}")
                nxt = None if v is None else int(v)
                if nxt is None or nxt == self.rank or nxt in chain + [r]:
                    return r, chain
                chain.append(r)
                r = nxt
        except Exception:
            return r, chain
        finally:
            st.close()

    def _xfer(self, out_bufs, in_bufs, deadline, expect=None, origin=None):
        """Send out_bufs on the right socket while receiving in_bufs from
        the left one. expect = (tag, nbytes, kind) to check in the header that
        in_bufs[0] receives; origin: the rank a wait for it is charged to."""
        so, si = self._rsock, self._lsock_in
        return self._pump(so, out_bufs, self._right, si, in_bufs,
                          self._left, deadline, expect, origin)

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
              expect=None, origin=None):
        """Move out_bufs to pout and in_bufs from pin; the time blocked
        while bytes are due from pin goes to ``peer_wait[origin]`` (the
        rank whose data they are; pin by default)."""
        origin = pin if origin is None else origin
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
                    if hdr is not None and got < _HDR.size <= got + n:
                        self._check_header(hdr, expect, pin)
                    got += n
                    _advance(in_bufs, n)
                    moved = True
            if moved:
                continue
            self._wait(deadline, so, _POLLOUT if out_bufs else 0,
                       si, _POLLIN if in_bufs else 0,
                       origin if in_bufs else None)

    def _wait(self, deadline, so, out_ev, si, in_ev, peer):
        """Block in poll (at most 0.5 s) for the events ``out_ev`` on the
        outgoing socket and ``in_ev`` on the incoming one; past the
        deadline raise _Expired(None): the neighbour may only be waiting on
        its own, the statuses of all ranks say who is really missing. With
        ``peer`` (its data is due) the time goes to peer_wait[peer]:
        straggler detection names the rank the others wait for. A
        perf_counter pair per blocking wait, none when the bytes are
        already there."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise _Expired(None)
        poller = select.poll()
        if out_ev:
            poller.register(so, out_ev)
        if in_ev:
            poller.register(si, in_ev)
        if peer is None:
            poller.poll(min(left, 0.5) * 1000)
            return
        t0 = time.perf_counter()
        poller.poll(min(left, 0.5) * 1000)
        self.peer_wait[peer] += time.perf_counter() - t0

    def _check_header(self, hdr, expect, peer):
        got = _HDR.unpack(bytes(hdr))
        if got != expect:
            err = self._mismatch(peer, expect, *got)
            self._broken = err
            self._close_sockets()   # the streams are out of step for good
            raise err

    def _mismatch(self, peer, expect, tag, nbytes, what):
        """The error for a ring message that is not the one expected. A
        message tag is seq * 4096 + step, so tag // 4096 is the sender's
        collective number; what each rank is calling (op, shape, dtype)
        comes from the ranks' own status reports, as in a timeout."""
        seq = expect[0] // 4096
        rec = self._pending.get(seq) or (seq, '?', None)
        if (tag, nbytes) == expect[:2]:
            # the same collective and byte count: only the header's kind
            # tells them apart (int32 against float32 would be garbage)
            return CollectiveMismatchError(
                f"collective mismatch on group {self.name!r} (backend tcp, "
                f"global ranks {self.ranks}) in {rec[1]} #{seq}: rank "
                f"{self.rank} has {_kind_text(expect[2])}, rank {peer} sent "
                f"{_kind_text(what)} ({nbytes} bytes on both): every rank "
                f"must pass the same dtype and op", rank=peer)
        where = self._where_ranks_are(self._report_statuses())
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
              op=None, what=None, origin=None):
        """One ring step with headers: send_arr right, recv_arr <- left
        (or recv_arr <- op(recv_arr, what came) with a ufunc op). ``what``:
        the headers' kind() (the collective's dtype and op), the same on
        both sides. Each direction takes its shm ring when it has one and
        the message is big enough, else the payload follows the header on
        the socket. ``origin``: the rank whose data recv_arr waits for (a
        wait is charged to it in peer_wait; the left neighbour if None)."""
        in_tag = tag if in_tag is None else in_tag
        if what is None:
            what = kind((send_arr if send_arr is not None
                         else recv_arr).dtype)
        w = self._shm_w if (send_arr is not None
                            and send_arr.nbytes >= SHM_MIN) else None
        rd = self._shm_r if (recv_arr is not None
                             and recv_arr.nbytes >= SHM_MIN) else None
        if w is not None or rd is not None:
            return self._shm_step(send_arr, w, recv_arr, rd, deadline,
                                  tag, in_tag, op, what, origin)
        out = [] if send_arr is None else [
            _HDR.pack(tag, send_arr.nbytes, what), _mv(send_arr)]
        hb = bytearray(_HDR.size)
        tmp = recv_arr if (op is None or recv_arr is None) \
            else np.empty_like(recv_arr)
        inn = [] if recv_arr is None else [memoryview(hb), _mv(tmp)]
        exp = None if recv_arr is None else (in_tag, recv_arr.nbytes, what)
        self._xfer(out, inn, deadline, exp, origin)
        if tmp is not recv_arr:
            op(recv_arr, tmp, out=recv_arr)

    def _shm_step(self, send_arr, w, recv_arr, rd, deadline, tag, in_tag,
                  op, what, origin=None):
        """_step where w (out) and/or rd (in) is a shm ring; a None ring
        with an array means that direction is inline on the socket."""
        so, si = self._rsock, self._lsock_in
        oq, src, opos = [], None, 0          # socket bytes, shm payload
        if send_arr is not None:
            oq.append(memoryview(_HDR.pack(tag, send_arr.nbytes, what)))
            if w is None and send_arr.nbytes:
                oq.append(_mv(send_arr))
            else:
                src = send_arr.reshape(-1).view(np.uint8)
        iq, got, tmp = [], 0, None
        nin = ipos = acks = 0
        if recv_arr is not None:
            hb = bytearray(_HDR.size)
            iq.append(memoryview(hb))
            nin = recv_arr.nbytes
            dst = recv_arr.reshape(-1)
            if rd is None:
                tmp = dst if op is None else np.empty_like(dst)
                if nin:
                    iq.append(_mv(tmp))
            toks = bytearray(64)
        while True:
            moved = False
            if src is not None and opos < src.size:
                if w.full():
                    w.acked += self._take_acks(so)
                opos, filled = w.fill(src, opos)
                if filled:
                    oq.append(memoryview(b'\x01' * filled))
                    moved = True
            if oq and self._send_some(so, oq, self._right):
                moved = True
            if iq:
                n = self._recv_some(si, iq, self._left)
                if n:
                    if got < _HDR.size <= got + n:
                        self._check_header(hb, (in_tag, nin, what),
                                           self._left)
                    got += n
                    _advance(iq, n)
                    moved = True
            elif rd is not None and ipos < nin:
                # the header is in: drain the slots the tokens announce,
                # never reading past this message's tokens
                n = self._recv_tokens(si, toks, -(-(nin - ipos) // rd.slot))
                if n:
                    ipos = rd.drain(n, dst, ipos, op)
                    acks += n
                    moved = True
            if acks:
                acks -= self._send_acks(si, acks)
            starved = src is not None and opos < src.size
            inwait = bool(iq) or (rd is not None and ipos < nin)
            if not (oq or starved or inwait or acks):
                break
            if moved:
                continue
            self._wait(deadline,
                       so, (_POLLOUT if oq else 0) | (_POLLIN if starved
                                                      else 0),
                       si, (_POLLIN if inwait else 0) | (_POLLOUT if acks
                                                         else 0),
                       (self._left if origin is None else origin)
                       if inwait else None)
        if tmp is not None and tmp is not dst:
            op(dst, tmp, out=dst)

    def _take_acks(self, so):
        """Slots the right neighbour gave back (ack bytes) now, or 0."""
        try:
            b = so.recv(4096)
        except BlockingIOError:
            return 0
        except OSError as e:
            raise self._fail(self._right, f"broke ({e})") from None
        if b == b'':
            raise self._fail(self._right, "was closed")
        return len(b)

    def _recv_tokens(self, si, toks, most):
        """Slot tokens from the left neighbour now (at most `most`, so no
        byte of the next message is read), or 0."""
        try:
            n = si.recv_into(toks, min(most, len(toks)))
        except BlockingIOError:
            return 0
        except OSError as e:
            raise self._fail(self._left, f"broke ({e})") from None
        if n == 0:
            raise self._fail(self._left, "was closed")
        return n

    def _send_acks(self, si, acks):
        """Give `acks` slots back to the left neighbour: how many went."""
        try:
            return si.send(b'\x01' * acks)
        except BlockingIOError:
            return 0
        except OSError as e:
            raise self._fail(self._left, f"broke ({e})") from None

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

    # A socket closed with unread bytes in its receive queue is reset
    # (RST), not closed (FIN), and the peer's next send fails "Connection
    # reset by peer". A shm-pipe writer's step ends once its slots are
    # filled, before the reader has drained them: the reader's acks come
    # afterwards, and the writer reads them only when its pipe is next
    # full. So a rank that finished its last collective and closed at once
    # reset a neighbour still draining that collective's slots. A clean
    # teardown first takes those acks: only the neighbour's remaining
    # part of the last ring step is waited for (a dead one closes: EOF).
    _SETTLE_MAX = 10.0

    def _settle_pipe(self):
        w, so = self._shm_w, getattr(self, '_rsock', None)
        if w is None or so is None or self._broken is not None:
            return
        end = time.monotonic() + min(self.timeout, self._SETTLE_MAX)
        while w.acked < w.seq:
            left = end - time.monotonic()
            if left <= 0:
                return
            try:
                select.select([so], [], [], left)
                b = so.recv(4096)
            except BlockingIOError:
                continue
            except (OSError, ValueError):   # reset, or closed here
                return
            if not b:
                return
            w.acked += len(b)

    def _close_sockets(self, graceful=False):
        """Close every data socket; ``graceful`` (a teardown, not a
        failure): first wait for what the ring neighbour still owes
        (`_settle_pipe`)."""
        if graceful:
            self._settle_pipe()
        socks = list(self._out.values()) + list(self._incoming.values())
        for s in socks:
            try:
                s.close()
            except OSError:
                pass
