"""Strangers and bad frames against the tcp backend's listeners (issue 21
items 6-8, 11): idle connections to the rendezvous store and to a rank's
data-plane listener are capped and timed out, an accept() that fails for
lack of descriptors does not stop the listener, frames that claim more
bytes than the protocol allows are refused before any allocation, and a
ring message from another collective is reported by op, shape and dtype.
Everything binds to 127.0.0.1; ranks are threads of this process."""
import errno
import os
import resource
import socket
import struct
import sys
import threading
import time

import numpy as np
import pytest

import collectives  # noqa: E402
from collectives import store as S  # noqa: E402
from collectives.tcp import tcp_group  # noqa: E402
from helpers import free_port  # noqa: E402

pytestmark = pytest.mark.timeout(120)

if 'OMPI_COMM_WORLD_SIZE' in os.environ or 'PMI_SIZE' in os.environ:
    pytest.skip("single-process tests; not run under mpiexec",
                allow_module_level=True)

TOKEN = 'dos-test-token'


def open_fds():
    return len(os.listdir('/proc/self/fd'))


def idle_connections(port, n):
    """n connections that never answer the handshake."""
    socks = []
    for _ in range(n):
        s = socket.create_connection(('127.0.0.1', port), timeout=5)
        socks.append(s)
    return socks


def reached_server(s, timeout=20):
    """Wait until the server has accepted s: its nonce arrives, or it
    closes s (evicted); a connection only in the backlog gets neither."""
    s.settimeout(timeout)
    got = b''
    try:
        while len(got) < 16:
            b = s.recv(16 - len(got))
            if not b:
                return True
            got += b
    except OSError:
        return isinstance(sys.exc_info()[1], ConnectionError)
    return True


def closed_by_peer(s, timeout):
    """True when the other end closes s within timeout (the nonce may
    come first)."""
    s.settimeout(timeout)
    try:
        while True:
            b = s.recv(64)
            if not b:
                return True
    except socket.timeout:
        return False
    except OSError:       # reset: closed too
        return True


@pytest.fixture
def server(monkeypatch):
    monkeypatch.setenv('DTORCH_RDZV_MAX_PENDING', '8')
    st = collectives.TCPStore('127.0.0.1', 0, TOKEN,
                              is_server=True, timeout=20)
    yield st
    st.close()


# ---- the rendezvous store (item 6)

def test_store_idle_connections_are_capped_and_cost_no_threads(server):
    fds, threads = open_fds(), threading.active_count()
    socks = idle_connections(server.port, 100)
    try:
        assert all(reached_server(s) for s in socks)
        # the server drops the oldest strangers as new ones come: it holds
        # at most the cap (8) of them, and no thread for any
        assert open_fds() - fds <= 100 + 8, \
            f"{open_fds() - fds} descriptors for 100 idle connections"
        assert threading.active_count() <= threads + 1
        assert len(server.server.gate.pending) <= 8
        # a member of the job still gets in, and is served
        c = collectives.TCPStore('127.0.0.1', server.port, TOKEN,
                                 timeout=20)
        c.set('k', b'v')
        assert server.get('k') == b'v' and c.add('n', 5) == 5
        c.close()
    finally:
        for s in socks:
            s.close()


def test_store_drops_a_silent_connection_after_the_handshake_deadline(
        monkeypatch):
    monkeypatch.setenv('DTORCH_RDZV_HANDSHAKE_TIMEOUT', '0.5')
    st = collectives.TCPStore('127.0.0.1', 0, TOKEN,
                              is_server=True, timeout=20)
    try:
        s = socket.create_connection(('127.0.0.1', st.port), timeout=5)
        t = time.monotonic()
        assert closed_by_peer(s, 15)
        assert time.monotonic() - t < 15       # not the old 30 s
        s.close()
        assert st.add('still-serving') == 1
    finally:
        st.close()


def test_store_keeps_accepting_after_emfile(server, monkeypatch):
    lsock = server.server.sock
    real = socket.socket.accept
    fails = [5]

    def accept(self):
        if self is lsock and fails[0]:
            fails[0] -= 1
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return real(self)
    monkeypatch.setattr(socket.socket, 'accept', accept)
    # (an accept() already in progress when the patch came may take the
    # first client without an error: the later ones prove the point)
    for i in range(3):
        c = collectives.TCPStore('127.0.0.1', server.port, TOKEN,
                                 timeout=15)
        c.set(f'after/{i}', b'emfile')
        assert server.get(f'after/{i}') == b'emfile'
        c.close()
    assert fails[0] == 0


# ---- frame sizes (item 8)

def _authenticated(port):
    s = socket.create_connection(('127.0.0.1', port), timeout=10)
    S.client_handshake(s, TOKEN.encode(), 'test')
    return s


def test_store_refuses_oversized_frames_before_allocating(server,
                                                          monkeypatch):
    monkeypatch.setattr(S, 'MAX_VALUE', 4096)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for claim in (4097, 1 << 31):
        s = _authenticated(server.port)
        s.sendall(struct.pack('<Q', 3) + b'set' + struct.pack('<Q', 1)
                  + b'k' + struct.pack('<Q', claim) + b'xx')
        assert closed_by_peer(s, 10), claim
        s.close()
    s = _authenticated(server.port)    # a huge key claim, same
    s.sendall(struct.pack('<Q', 3) + b'get' + struct.pack('<Q', 1 << 40))
    assert closed_by_peer(s, 10)
    s.close()
    grew_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
               - peak) / 1024
    assert grew_mb < 256, f"peak memory grew by {grew_mb:.0f} MB"
    # the client says so before sending
    with pytest.raises(ValueError, match='limit 4096'):
        server.set('big', b'x' * 4097)
    server.set('fits', b'x' * 4096)
    assert len(server.get('fits')) == 4096


# ---- a rank's data-plane listener (items 7, 8, 11)

def two_ranks(timeout=20, **kw):
    port, groups, errs = free_port(), {}, []

    def rank(r):
        try:
            groups[r] = tcp_group(r, 2, '127.0.0.1', port, TOKEN,
                                  timeout=timeout)
        except BaseException as e:
            errs.append(e)
    ts = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    [t.start() for t in ts]
    [t.join(60) for t in ts]
    if errs:
        raise errs[0]
    return groups


def destroy(groups):
    for g in groups.values():
        g.destroy()
    groups[0].store.close()


def in_threads(*fns):
    """Run fns concurrently; return their results or exceptions."""
    out = [None] * len(fns)

    def run(i):
        try:
            out[i] = fns[i]()
        except BaseException as e:
            out[i] = e
    ts = [threading.Thread(target=run, args=(i,)) for i in range(len(fns))]
    [t.start() for t in ts]
    [t.join(100) for t in ts]
    return out


def listener_port(g, r):
    return int(g.store.get(f"g/{g.name}/addr/{r}").decode().rsplit(':')[1])


def test_idle_strangers_do_not_hold_up_a_peer_connection():
    groups = two_ranks(timeout=20)
    socks = []
    try:
        socks = idle_connections(listener_port(groups[0], 1), 3)
        t = time.monotonic()
        got = np.zeros(4, np.float32)
        res = in_threads(
            lambda: groups[0].send(np.arange(4, dtype=np.float32), 1),
            lambda: groups[1].recv(got, 0))
        assert res == [None, None], res
        assert got.tolist() == [0, 1, 2, 3]
        # the old listener spent 30 s on each stranger's handshake
        assert time.monotonic() - t < 15
    finally:
        for s in socks:
            s.close()
        destroy(groups)


def test_refusing_peer_is_a_failure_naming_the_rank_and_host():
    """A peer that published its address (after listen()) and now refuses
    connections is gone: the first connection to it fails at once with
    RankFailureError, not after the timeout as if it were starting up
    (a node that died before the first send to it hung its peers)."""
    groups = two_ranks(timeout=60)
    try:
        groups[1]._lsock.close()      # rank 1 stops listening
        with pytest.raises(collectives.RankFailureError) as ei:
            groups[0].send(np.ones(3), 1)
        msg = str(ei.value)
        assert ei.value.rank == 1, msg
        assert 'connection with rank 1 (global 1, host 127.0.0.1)' in msg
        assert 'could not be opened' in msg and 'refused' in msg
    finally:
        destroy(groups)


def test_stashed_message_memory_follows_the_bytes_not_the_claim():
    """A header claiming 2^31 bytes for another tag, then a close: the
    receiver raises RankFailureError and never allocates the claim."""
    groups = two_ranks(timeout=20)
    try:
        port = listener_port(groups[0], 1)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        s = _authenticated(port)
        s.sendall(struct.pack('<ci', b'p', 0) +
                  struct.pack('<qq', 99, 1 << 31) + b'x' * 1000)
        box = []
        th = threading.Thread(target=lambda: box.append(in_threads(
            lambda: groups[1].recv(np.zeros(2), 0, tag=0))[0]))
        th.start()
        time.sleep(0.5)
        s.close()
        th.join(30)
        assert isinstance(box[0], collectives.RankFailureError), box
        grew_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                   - peak) / 1024
        assert grew_mb < 256, f"peak memory grew by {grew_mb:.0f} MB"
    finally:
        destroy(groups)


def test_ring_mismatch_names_ops_shapes_and_dtypes():
    groups = two_ranks(timeout=20)
    try:
        res = in_threads(
            lambda: groups[0].all_reduce(np.ones(1024, np.float32)),
            lambda: groups[1].all_reduce(np.ones(2048, np.float32)))
        errs = [e for e in res if isinstance(e, collectives.CollectiveError)]
        assert len(errs) == 2, res
        mism = [e for e in errs
                if isinstance(e, collectives.CollectiveMismatchError)]
        assert mism, res
        msg = str(mism[0])
        assert "all_reduce #1" in msg
        assert "[1024] float32" in msg and "[2048] float32" in msg, msg
        assert "expects #" not in msg   # no internal message numbers
    finally:
        destroy(groups)
