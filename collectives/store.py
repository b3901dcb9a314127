"""Rendezvous key-value store over TCP, served by rank 0.

The server binds only to the address it is given (MASTER_ADDR; loopback in
tests) and every connection must prove it knows the job's secret token
(DTORCH_RDZV_TOKEN) before any request: the server sends a random nonce and
the client answers HMAC-SHA256(token, nonce), so the token never crosses the
wire. A wrong token is refused with RendezvousAuthError on the client.

Frames are length-prefixed bytes, never pickles: a store must not execute
what a stranger sends it, and their lengths are capped (MAX_KEY, MAX_VALUE)
so that a frame's claimed length cannot make the server allocate memory.

Strangers: a connection is only a file descriptor until it proves the
token. New connections wait in a `HandshakeGate`, one thread for all of
them, at most DTORCH_RDZV_MAX_PENDING (64) at a time (a new one evicts the
oldest) and for at most DTORCH_RDZV_HANDSHAKE_TIMEOUT (5) seconds each; only
an authenticated connection gets a thread. So idle connections cannot
exhaust the rank's threads or descriptors, and an accept() that fails
(EMFILE: the process is out of descriptors) pauses the gate briefly instead
of ending it. The tcp backend's data-plane listeners use the same gate.
"""
from __future__ import annotations
import atexit
import errno
import hashlib
import hmac
import os
import select
import socket
import struct
import sys
import threading
import time
import weakref

from .env import env_number
from .errors import CollectiveError, CollectiveTimeoutError

_OK, _NO = b'OK', b'NO'
MAX_CMD = 16
MAX_KEY = 64 * 1024
MAX_VALUE = 256 * 1024 * 1024
# accept() errors that say "no resources now", not "the socket is gone"
_SCARCE = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


class RendezvousError(CollectiveError):
    """The rendezvous store could not be reached or used."""


class RendezvousAuthError(RendezvousError):
    """The store refused this process's token."""


def _recv_exact(sock, n):
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ConnectionError("connection closed by peer")
        got += k
    return bytes(buf)


class FrameTooLarge(ConnectionError):
    """A frame claims more bytes than the protocol allows."""


def _send_frame(sock, *parts):
    sock.sendall(b''.join(struct.pack('<Q', len(p)) + p for p in parts))


def _recv_frame(sock, limits):
    """One part per entry of `limits` (the most bytes each may have); a
    longer claim raises FrameTooLarge before anything is allocated."""
    out = []
    for cap in limits:
        (n,) = struct.unpack('<Q', _recv_exact(sock, 8))
        if n > cap:
            raise FrameTooLarge(f"a frame part claims {n} bytes; the "
                                f"limit is {cap}")
        out.append(_recv_exact(sock, n))
    return out


def token_digest(token, nonce):
    return hmac.new(token, nonce, hashlib.sha256).digest()


def server_handshake(sock, token):
    """Challenge a new connection; True if it knows the token."""
    nonce = os.urandom(16)
    sock.sendall(nonce)
    answer = _recv_exact(sock, 32)
    ok = hmac.compare_digest(answer, token_digest(token, nonce))
    sock.sendall(_OK if ok else _NO)
    return ok


def client_handshake(sock, token, where):
    nonce = _recv_exact(sock, 16)
    sock.sendall(token_digest(token, nonce))
    if _recv_exact(sock, 2) != _OK:
        raise RendezvousAuthError(
            f"{where} refused the connection: wrong rendezvous token "
            f"(DTORCH_RDZV_TOKEN must be the same secret on every rank of "
            f"the job)")


class _Pending:
    __slots__ = ('sock', 'nonce', 'buf', 'need', 'authed', 'deadline')

    def __init__(self, sock, nonce, deadline):
        self.sock, self.nonce, self.deadline = sock, nonce, deadline
        self.buf, self.need, self.authed = bytearray(), 32, False


class HandshakeGate:
    """Accepts connections on `lsock` and authenticates them in one
    thread, without blocking on any of them: a connection gets the nonce,
    must answer HMAC(token, nonce) and then send `extra` bytes, all within
    `timeout` seconds, or it is closed. At most `max_pending` connections
    wait at once (a new one evicts the oldest). `on_ready(sock, extra)`
    gets each authenticated (blocking) socket; it must not block.

    Why: a thread and a 30 s wait per connection let ~1000 idle strangers
    take every descriptor of the rank (and a failed accept() ended the
    loop for good)."""

    def __init__(self, lsock, token, on_ready, name, extra=0,
                 max_pending=None, timeout=None):
        self.lsock, self.token, self.on_ready = lsock, token, on_ready
        self.extra = extra
        self.max_pending = max_pending or env_number(
            'DTORCH_RDZV_MAX_PENDING', 64, int)
        self.timeout = timeout or env_number(
            'DTORCH_RDZV_HANDSHAKE_TIMEOUT', 5.0)
        self.pending = {}          # fd -> _Pending, oldest first
        self.closed = False
        self.refused = 0           # connections dropped (cap, deadline)
        self.accept_errors = 0     # accept() failures survived
        self._paused_until = 0.0   # accept() again from then on
        lsock.setblocking(False)
        self.thread = threading.Thread(target=self._loop, daemon=True,
                                       name=name)
        self.thread.start()

    def close(self):
        """Stop listening now (the port is free at once); the loop drops
        the strangers still waiting within a quarter of a second."""
        self.closed = True
        try:
            self.lsock.close()
        except OSError:
            pass

    # ---- the loop
    def _loop(self):
        try:
            while not self.closed:
                try:
                    self._round()
                except Exception as e:   # never let the listener die
                    if self.closed:
                        return
                    print(f"dtorch {self.thread.name}: {e!r}",
                          file=sys.stderr)
                    time.sleep(0.05)
        finally:
            for p in list(self.pending.values()):
                self._drop(p)
            try:
                self.lsock.close()
            except OSError:
                pass

    def _round(self):
        """One poll of the listener and the waiting connections."""
        now = time.monotonic()
        poller = select.poll()
        listening = now >= self._paused_until
        if listening:
            try:
                poller.register(self.lsock, select.POLLIN)
            except (OSError, ValueError):   # closed meanwhile
                self.closed = True
                return
        for fd in self.pending:
            poller.register(fd, select.POLLIN)
        wait = 0.25 if listening else min(0.25, self._paused_until - now)
        if self.pending:
            first = min(p.deadline for p in self.pending.values())
            wait = min(wait, max(0.0, first - now))
        try:
            events = poller.poll(wait * 1000)
        except OSError:
            events = []
        for fd, _ in events:
            if fd == self.lsock.fileno() or fd < 0:
                if not self._accept():
                    # out of descriptors (or the like): shed the oldest
                    # stranger and try again shortly
                    self._evict_oldest()
                    self._paused_until = time.monotonic() + 0.05
            elif fd in self.pending:
                self._advance(self.pending[fd])
        # after reading: an answer that arrived in time while this thread
        # was not scheduled (a loaded machine) is not dropped unread
        self._expire(time.monotonic())

    def _accept(self):
        """Accept what is waiting; False when accept() ran out of
        resources (the caller backs off), True otherwise."""
        while True:
            try:
                s, _ = self.lsock.accept()
            except BlockingIOError:
                return True
            except OSError as e:
                if self.closed or e.errno == errno.EBADF:
                    self.closed = True
                    return True
                self.accept_errors += 1
                # ECONNABORTED and the like concern one connection only
                return e.errno not in _SCARCE
            if len(self.pending) >= self.max_pending:
                self._evict_oldest()
            nonce = os.urandom(16)
            try:
                s.setblocking(False)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                s.send(nonce)     # 16 bytes into an empty send buffer
            except OSError:
                s.close()
                continue
            p = _Pending(s, nonce, time.monotonic() + self.timeout)
            self.pending[s.fileno()] = p

    def _advance(self, p):
        try:
            chunk = p.sock.recv(p.need - len(p.buf))
        except BlockingIOError:
            return
        except OSError:
            return self._drop(p)
        if not chunk:
            return self._drop(p)
        p.buf += chunk
        if len(p.buf) < p.need:
            return
        if not p.authed:
            ok = hmac.compare_digest(bytes(p.buf),
                                     token_digest(self.token, p.nonce))
            try:
                p.sock.send(_OK if ok else _NO)
            except OSError:
                ok = False
            if not ok:
                return self._drop(p)
            p.authed, p.buf, p.need = True, bytearray(), self.extra
            if self.extra:
                # the peer proved the token and was told OK: it sends the
                # extra bytes at once and counts the connection as made, so
                # they get a full timeout of their own (dropping it now
                # would leave both ends waiting for the collective timeout)
                p.deadline = time.monotonic() + self.timeout
                return
        del self.pending[p.sock.fileno()]
        try:
            p.sock.setblocking(True)
            self.on_ready(p.sock, bytes(p.buf))
        except Exception:
            p.sock.close()

    def _expire(self, now):
        for p in [p for p in self.pending.values() if p.deadline <= now]:
            self._drop(p)

    def _evict_oldest(self):
        if self.pending:
            self._drop(next(iter(self.pending.values())))

    def _drop(self, p):
        self.pending.pop(p.sock.fileno(), None)
        self.refused += 1
        try:
            p.sock.close()
        except OSError:
            pass


# The store lives in rank 0's process, and the other ranks still talk to
# it after rank 0 is done with a group: the tail of a group's set-up, a
# watchdog tick. So rank 0 does not take it away at exit while another
# rank is connected: an atexit handler closes this process's own client
# connections, then waits (up to each store's timeout, at most
# _EXIT_WAIT_MAX s) until every other rank has closed its connection:
# by exiting, or by destroy_process_group. A rank that died closed its
# connections with it, so only live ranks are waited for. Groups close
# their data sockets first (release_at_exit), as the exit would: a rank
# blocked in a collective with this one fails at once (rank 0 crashed)
# instead of holding the wait.
_EXIT_WAIT_MAX = 60.0
_servers = weakref.WeakSet()
_clients = weakref.WeakSet()
_releasers = weakref.WeakSet()
_atexit_registered = []


def release_at_exit(obj):
    """Call ``obj._release_for_exit()`` at exit, before rank 0 waits for
    the other ranks' store connections. Every rank: the others' groups
    must also let their neighbours finish (tcp's `_settle_pipe`)."""
    _releasers.add(obj)
    _register_exit()


def _register_exit():
    if not _atexit_registered:
        _atexit_registered.append(atexit.register(_drain_at_exit))


def _close_clients(port=None):
    for c in list(_clients):
        if port is None or c.port == port:
            c._close_client()


def _drain_at_exit():
    for obj in list(_releasers):
        obj._release_for_exit()
    _close_clients()
    for srv in list(_servers):
        srv.drain(min(srv.timeout, _EXIT_WAIT_MAX))


class _Server:
    def __init__(self, host, port, token, timeout=300.0):
        self.token = token
        self.timeout = timeout
        self.data = {}
        self.live = 0               # authenticated connections open
        self.cond = threading.Condition()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind((host, port))
        except OSError as e:
            self.sock.close()
            raise RendezvousError(
                f"rank 0 cannot serve the rendezvous store on {host}:{port}"
                f" ({e}); is MASTER_PORT in use?") from e
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        self.closed = False
        self.gate = HandshakeGate(self.sock, token, self._ready,
                                  'dtorch-store-server')
        _servers.add(self)
        _register_exit()

    def _ready(self, conn, _):
        # authenticated: a member of the job gets its own thread
        with self.cond:
            self.live += 1
        threading.Thread(target=self._serve, args=(conn,),
                         daemon=True).start()

    def _serve(self, conn):
        ties = []      # keys to set when this connection closes
        try:
            conn.settimeout(None)
            while True:
                cmd, key, val = _recv_frame(conn, (MAX_CMD, MAX_KEY,
                                                   MAX_VALUE))
                if cmd == b'tie':
                    ties.append(key.decode())
                    _send_frame(conn, b'ok', b'')
                    continue
                _send_frame(conn, *self._do(cmd, key.decode(), val))
        except (OSError, ConnectionError, struct.error, ValueError):
            pass   # (UnicodeError is a ValueError: a bad key)
        finally:
            conn.close()
            with self.cond:
                for k in ties:
                    self.data[k] = b'closed'
                self.live -= 1
                self.cond.notify_all()

    def drain(self, timeout):
        """Wait up to ``timeout`` s until no client is connected; say so
        on stderr if some still are."""
        end = time.monotonic() + timeout
        with self.cond:
            while self.live > 0 and not self.closed:
                left = end - time.monotonic()
                if left <= 0:
                    print(f"dtorch: rank 0 exits while {self.live} "
                          f"connection(s) to its rendezvous store are still "
                          f"open after {timeout:.0f} s: those ranks did not "
                          f"finish (or call destroy_process_group)",
                          file=sys.stderr, flush=True)
                    return False
                self.cond.wait(left)
        return True

    def _do(self, cmd, key, val):
        with self.cond:
            if cmd == b'set':
                self.data[key] = val
                self.cond.notify_all()
                return b'ok', b''
            if cmd == b'get':
                (wait,) = struct.unpack('<d', val)
                end = time.monotonic() + wait
                while key not in self.data:
                    left = end - time.monotonic()
                    if left <= 0:
                        return b'timeout', b''
                    self.cond.wait(left)
                return b'ok', self.data[key]
            if cmd == b'add':
                (inc,) = struct.unpack('<q', val)
                cur = int(self.data.get(key, b'0')) + inc
                self.data[key] = str(cur).encode()
                self.cond.notify_all()
                return b'ok', self.data[key]
            if cmd == b'delete':
                return b'ok', b'1' if self.data.pop(key, None) else b'0'
        return b'error', b'unknown command ' + cmd

    def close(self):
        self.closed = True
        self.gate.close()


class TCPStore:
    """Client (and, with is_server=True, the server) of the store.

        store = TCPStore('127.0.0.1', 29500, token, is_server=(rank == 0))
        store.set('k', b'v'); store.get('k') -> b'v'

    Thread-safe: requests of one client are serialised by a lock.
    """

    def __init__(self, host: str, port: int, token: str | bytes | None,
                 is_server: bool = False, timeout: float = 300.0) -> None:
        if not token:
            raise RendezvousError(
                "the tcp rendezvous needs a per-job secret token: set "
                "DTORCH_RDZV_TOKEN to the same random string on every rank "
                "(dtorch-launch does this for you)")
        self.host, self.token = host, _as_bytes(token)
        self.timeout = timeout
        self.server = _Server(host, port, self.token, timeout) \
            if is_server else None
        self.port = self.server.port if self.server else int(port)
        self.lock = threading.Lock()
        self.sock = self._connect()
        _clients.add(self)

    def _connect(self):
        where = (f"rendezvous store at {self.host}:{self.port} (served by "
                 f"rank 0 at MASTER_ADDR:MASTER_PORT)")
        return connect_authenticated(self.host, self.port, self.token,
                                     time.monotonic() + self.timeout, where)

    def clone(self, timeout: float | None = None) -> TCPStore:
        """Another connection to the same server (for another thread).
        ``timeout``: a short-lived one for a failure path, whose connect
        and every request give up after that many seconds (the server
        may be what failed)."""
        c = object.__new__(TCPStore)
        c.host, c.token, c.timeout = self.host, self.token, self.timeout
        c.server, c.port, c.lock = None, self.port, threading.Lock()
        if timeout is None:
            c.sock = c._connect()
        else:
            c.timeout = timeout
            c.sock = connect_authenticated(
                c.host, c.port, c.token, time.monotonic() + timeout,
                "rendezvous store", listening=True)
            c.sock.settimeout(timeout)
        _clients.add(c)
        return c

    def _request(self, cmd, key, val=b''):
        k = key.encode()
        if len(k) > MAX_KEY or len(val) > MAX_VALUE:
            raise ValueError(
                f"rendezvous store {cmd.decode()} of key {key[:80]!r}: the "
                f"key has {len(k)} bytes (limit {MAX_KEY}) and the value "
                f"{len(val)} (limit {MAX_VALUE}); the store is for small "
                f"coordination data, send tensors through a collective")
        with self.lock:
            try:
                _send_frame(self.sock, cmd, k, val)
                status, payload = _recv_frame(self.sock,
                                              (MAX_CMD, MAX_VALUE))
            except (OSError, ConnectionError) as e:
                raise RendezvousError(
                    f"lost the rendezvous store at {self.host}:{self.port} "
                    f"({e}): did rank 0 exit?") from e
        return status, payload

    def set(self, key: str, value: str | bytes) -> None:
        self._request(b'set', key, _as_bytes(value))

    def get(self, key: str, timeout: float | None = None) -> bytes:
        """The value of key, waiting up to timeout for it to be set."""
        wait = self.timeout if timeout is None else timeout
        status, val = self._request(b'get', key, struct.pack('<d', wait))
        if status == b'timeout':
            raise CollectiveTimeoutError(
                f"rendezvous key {key!r} was not set within {wait:.1f} s: "
                f"a rank did not arrive", op='rendezvous')
        return val

    def try_get(self, key: str) -> bytes | None:
        status, val = self._request(b'get', key, struct.pack('<d', 0.0))
        return val if status == b'ok' else None

    def add(self, key: str, amount: int = 1) -> int:
        return int(self._request(b'add', key, struct.pack('<q', amount))[1])

    def tie(self, key: str) -> None:
        """Have the server set ``key`` (to b'closed') when this
        connection closes: the process exited, was killed, or its host
        went away (what elastic membership reads of a lost node)."""
        self._request(b'tie', key)

    def delete(self, key: str) -> bool:
        return self._request(b'delete', key)[1] == b'1'

    def _close_client(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def close(self) -> None:
        """Close this connection; the server (rank 0) first waits, as at
        exit, for the other ranks to close theirs."""
        self._close_client()
        if self.server is not None:
            _close_clients(self.port)      # this process's other ones
            self.server.drain(min(self.timeout, _EXIT_WAIT_MAX))
            self.server.close()


def connect_authenticated(host, port, token, deadline, where,
                          listening=False):
    """A socket to host:port that passed the token handshake, retrying
    until `deadline` (monotonic) while the server is not listening yet or
    drops the connection (a listener flooded by strangers evicts its
    oldest unauthenticated connections). A wrong token raises
    RendezvousAuthError at once; running out of time raises
    CollectiveTimeoutError (op 'rendezvous') naming `where`.
    ``listening=True``: the server is known to have listened already (it
    published its address after listen()), so a refused connection means
    it is gone: ConnectionRefusedError is raised at once."""
    delay, last = 0.01, None
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise CollectiveTimeoutError(
                f"could not connect to the {where} ({last}); is it "
                f"running, and are the address and port right?",
                op='rendezvous')
        s = None
        try:
            s = socket.create_connection((host, int(port)),
                                         timeout=min(left, 10))
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.settimeout(min(deadline - time.monotonic(), 10))
            client_handshake(s, token, where)
            s.settimeout(None)
            return s
        except RendezvousAuthError:
            s.close()
            raise
        except ConnectionRefusedError as e:
            if s is not None:
                s.close()
            if listening:
                raise
            last = f"{type(e).__name__}: {e}"
        except (OSError, ConnectionError, ValueError) as e:
            # not listening yet, refused, dropped or timed out: again
            if s is not None:
                s.close()
            last = f"{type(e).__name__}: {e}"
        time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 2, 0.5)


def _as_bytes(v):
    return v.encode() if isinstance(v, str) else bytes(v)
