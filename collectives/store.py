"""Rendezvous key-value store over TCP, served by rank 0.

The server binds only to the address it is given (MASTER_ADDR; loopback in
tests) and every connection must prove it knows the job's secret token
(DTORCH_RDZV_TOKEN) before any request: the server sends a random nonce and
the client answers HMAC-SHA256(token, nonce), so the token never crosses the
wire. A wrong token is refused with RendezvousAuthError on the client.

Frames are length-prefixed bytes, never pickles: a store must not execute
what a stranger sends it.
"""
import hashlib
import hmac
import os
import socket
import struct
import threading
import time

from .base import CollectiveError, CollectiveTimeoutError

_OK, _NO = b'OK', b'NO'


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


def _send_frame(sock, *parts):
    sock.sendall(b''.join(struct.pack('<Q', len(p)) + p for p in parts))


def _recv_frame(sock, nparts):
    out = []
    for _ in range(nparts):
        (n,) = struct.unpack('<Q', _recv_exact(sock, 8))
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


class _Server:
    def __init__(self, host, port, token):
        self.token = token
        self.data = {}
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
        threading.Thread(target=self._accept, daemon=True,
                         name='dtorch-store-server').start()

    def _accept(self):
        while not self.closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,),
                             daemon=True).start()

    def _serve(self, conn):
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.settimeout(30)
            if not server_handshake(conn, self.token):
                return
            conn.settimeout(None)
            while True:
                cmd, key, val = _recv_frame(conn, 3)
                _send_frame(conn, *self._do(cmd, key.decode(), val))
        except (OSError, ConnectionError, struct.error):
            pass
        finally:
            conn.close()

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
        try:
            self.sock.close()
        except OSError:
            pass


class TCPStore:
    """Client (and, with is_server=True, the server) of the store.

        store = TCPStore('127.0.0.1', 29500, token, is_server=(rank == 0))
        store.set('k', b'v'); store.get('k') -> b'v'

    Thread-safe: requests of one client are serialised by a lock.
    """

    def __init__(self, host, port, token, is_server=False, timeout=300.0):
        if not token:
            raise RendezvousError(
                "the tcp rendezvous needs a per-job secret token: set "
                "DTORCH_RDZV_TOKEN to the same random string on every rank "
                "(dtorch-launch does this for you)")
        self.host, self.token = host, _as_bytes(token)
        self.timeout = timeout
        self.server = _Server(host, port, self.token) if is_server else None
        self.port = self.server.port if self.server else int(port)
        self.lock = threading.Lock()
        self.sock = self._connect()

    def _connect(self):
        where = f"rendezvous store at {self.host}:{self.port}"
        end = time.monotonic() + self.timeout
        delay = 0.01
        while True:
            try:
                s = socket.create_connection((self.host, self.port),
                                             timeout=10)
                break
            except OSError as e:
                # rank 0 may not be listening yet: retry until the timeout
                if time.monotonic() + delay > end:
                    raise CollectiveTimeoutError(
                        f"could not reach the {where} within "
                        f"{self.timeout:.0f} s ({e}); is rank 0 running and "
                        f"MASTER_ADDR/MASTER_PORT right?", op='rendezvous'
                    ) from e
                time.sleep(delay)
                delay = min(delay * 2, 0.5)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            client_handshake(s, self.token, where)
        except (ConnectionError, OSError) as e:
            s.close()
            raise RendezvousError(f"handshake with the {where} failed: "
                                  f"{e}") from e
        except RendezvousAuthError:
            s.close()
            raise
        s.settimeout(None)
        return s

    def clone(self):
        """Another connection to the same server (for another thread)."""
        c = object.__new__(TCPStore)
        c.host, c.token, c.timeout = self.host, self.token, self.timeout
        c.server, c.port, c.lock = None, self.port, threading.Lock()
        c.sock = c._connect()
        return c

    def _request(self, cmd, key, val=b''):
        with self.lock:
            try:
                _send_frame(self.sock, cmd, key.encode(), val)
                status, payload = _recv_frame(self.sock, 2)
            except (OSError, ConnectionError) as e:
                raise RendezvousError(
                    f"lost the rendezvous store at {self.host}:{self.port} "
                    f"({e}): did rank 0 exit?") from e
        return status, payload

    def set(self, key, value):
        self._request(b'set', key, _as_bytes(value))

    def get(self, key, timeout=None):
        """The value of key, waiting up to timeout for it to be set."""
        wait = self.timeout if timeout is None else timeout
        status, val = self._request(b'get', key, struct.pack('<d', wait))
        if status == b'timeout':
            raise CollectiveTimeoutError(
                f"rendezvous key {key!r} was not set within {wait:.1f} s: "
                f"a rank did not arrive", op='rendezvous')
        return val

    def try_get(self, key):
        status, val = self._request(b'get', key, struct.pack('<d', 0.0))
        return val if status == b'ok' else None

    def add(self, key, amount=1):
        return int(self._request(b'add', key, struct.pack('<q', amount))[1])

    def delete(self, key):
        return self._request(b'delete', key)[1] == b'1'

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass
        if self.server is not None:
            self.server.close()


def _as_bytes(v):
    return v.encode() if isinstance(v, str) else bytes(v)
