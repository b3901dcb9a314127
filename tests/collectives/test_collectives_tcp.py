"""The tcp backend with real processes on 127.0.0.1: the shared test body
with 2 and 3 ranks, a rank that dies, a rank that skips a collective, and
a store client with the wrong token. Only pids started here are killed."""
import json
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

_TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# tests/ (the shared helpers) and the checkout above it: run as a script
# under an editable install, a rank would otherwise import tests/collectives
# and tests/launch (namespace directories) as the packages of those names
sys.path[:0] = [_TESTS, os.path.dirname(_TESTS)]
import collectives  # noqa: E402
import collectives_helpers as H  # noqa: E402
from collectives.tcp import pipe as P  # noqa: E402
from collectives_helpers import run_ranks  # noqa: E402
from helpers import free_port  # noqa: E402

# a hang is a bug here: fail it instead of stalling the suite
pytestmark = pytest.mark.timeout(90)

# Single-process tests: under mpiexec every rank would run them again
# (pytest-mpi 0.6 ignores --only-mpi when --with-mpi is also given).
if 'OMPI_COMM_WORLD_SIZE' in os.environ or 'PMI_SIZE' in os.environ:
    pytest.skip("single-process tests; not run under mpiexec",
                allow_module_level=True)

@pytest.fixture(scope='module', params=[2, 3])
def tcp_results(request):
    return request.param, run_ranks('cases', request.param)


@pytest.mark.parametrize('case', sorted(H.CASES))
def test_tcp_case(tcp_results, case):
    world, outs = tcp_results
    for rank, (res, err, _) in enumerate(outs):
        assert res is not None, f"rank {rank} printed nothing:\n{err}"
        assert res.get(case) == 'ok', \
            f"world {world} rank {rank}: {res.get(case)}\n{err[-2000:]}"


def test_tcp_dead_rank_makes_survivors_raise():
    t = time.monotonic()
    outs = run_ranks('die', 3, timeout=40, env={'TEST_TIMEOUT': '30'})
    # not the 30 s timeout (which starts after the ranks' start-up, so it
    # would make this at least 30 s; no tighter wall-clock bound, which
    # would flake on a loaded machine)
    assert time.monotonic() - t < 30
    assert outs[1][2] == 3                # the rank that crashed
    for rank in (0, 2):
        res = outs[rank][0]
        assert res and res['type'] == 'RankFailureError', outs[rank]
        assert 'closed' in res['error'] or 'broke' in res['error']
        # no launcher says who exited first: rank 0 sees rank 2 give up
        # (close its sockets) and must still blame rank 1, not rank 2
        assert res['rank'] == 1, res['error']
        assert "rank 1 (global 1" in res['error'], res['error']


def _late_live_ranks(outs, skipper):
    return {m for res, _, _ in outs if res and res.get('missing')
            for m in res['missing']} - {skipper}


def test_tcp_skipped_collective_times_out_with_report():
    def run(t):
        outs = run_ranks('skip', 3, timeout=40 + 2 * t,
                         env={'TEST_TIMEOUT': str(t)})
        return outs, _late_live_ranks(outs, 2)
    outs = H.until_no_live_rank_is_late(run)
    for rank in (0, 1):
        res = outs[rank][0]
        assert res and res['error'], outs[rank]
        assert res['missing'] == [2]
        msg = res['error']
        assert "all_reduce #2 [1024] float32 on group 'world'" in msg
        assert f"rank {1 - rank} is in all_reduce #2" in msg
        assert "rank 2 is not in a collective (last: all_reduce #1" in msg


def test_job_that_finishes_finishes_on_every_rank():
    """Rank 0 serves the store and can finish first (the only collective
    is an empty broadcast) while rank 1 still ends its set-up through the
    store, here slowed as on a loaded machine. On main rank 1 died with
    'lost the rendezvous store ... did rank 0 exit?' in 5 of 5 runs; rank
    0 now waits at exit for the other ranks' store connections."""
    for run in range(5):
        outs = run_ranks('empty_bcast', 2, timeout=60)
        for rank, (res, err, rc) in enumerate(outs):
            assert rc == 0 and res == {'ok': True}, \
                f"run {run} rank {rank} (rc {rc}):\n{err[-1500:]}"


def test_store_refuses_wrong_token():
    port = free_port()
    server = collectives.TCPStore('127.0.0.1', port, 'right-token',
                                  is_server=True, timeout=5)
    try:
        server.set('k', b'v')
        assert collectives.TCPStore('127.0.0.1', port, 'right-token',
                                    timeout=5).get('k') == b'v'
        with pytest.raises(collectives.RendezvousAuthError,
                           match='wrong rendezvous token'):
            collectives.TCPStore('127.0.0.1', port, 'guess', timeout=5)
        with pytest.raises(collectives.RendezvousError,
                           match='DTORCH_RDZV_TOKEN'):
            collectives.TCPStore('127.0.0.1', port, None, timeout=5)
        # the server binds to the given address only
        assert server.server.sock.getsockname()[0] == '127.0.0.1'
        assert server.add('n', 2) == 2 and server.add('n') == 3
        with pytest.raises(collectives.CollectiveTimeoutError):
            server.get('missing', timeout=0.1)
    finally:
        server.close()


def test_tcp_world_of_one_in_process():
    from collectives.tcp import tcp_group
    g = tcp_group(0, 1, '127.0.0.1', 0, 'tok', timeout=5)  # it picks
    x = np.ones(3)
    g.all_reduce(x)
    g.barrier()
    assert x.tolist() == [1, 1, 1]
    g.destroy()
    g.store.close()


# ---- the same-host shared-memory path (big messages)

def _shm_cases(g):
    """Big messages through every ring op, with exact expected values.
    Chunks bigger than the 2 MiB ring make it wrap; odd lengths leave
    chunks just under and over SHM_MIN, so one direction of a step can
    be inline while the other is in shm."""
    r, n = g.rank, g.size
    tri = n * (n - 1) / 2
    for m in (1_500_001, 32_767, 49_151, 100_000):
        base = np.arange(m, dtype=np.float64) % 1000
        x = base + r
        g.all_reduce(x)
        np.testing.assert_array_equal(x, base * n + tri)
        x = base + r
        g.all_reduce(x, 'max')
        np.testing.assert_array_equal(x, base + n - 1)
        y = (np.arange(m) % 7 + r).astype(np.int32)
        g.all_reduce(y)
        np.testing.assert_array_equal(y, (np.arange(m) % 7) * n + tri)
    z = np.full(3_000_001, r + 1, np.float32)
    g.all_reduce(z, 'avg')
    np.testing.assert_allclose(z, (n + 1) / 2)
    # all_gather of 1.2 MB blocks
    blk = np.arange(300_001, dtype=np.float32) + r
    out = np.zeros((n, blk.size), np.float32)
    g.all_gather(out, blk)
    for q in range(n):
        np.testing.assert_array_equal(out[q], blk - r + q)
    # reduce_scatter: rank q's input row p is p * 10 + q
    inp = np.empty((n, 700_001), np.float64)
    for p in range(n):
        inp[p] = p * 10 + r
    res = np.zeros(700_001, np.float64)
    g.reduce_scatter(res, inp)
    np.testing.assert_array_equal(res, r * 10 * n + tri)
    # broadcast 5 MiB from the last rank
    b = np.full(5 << 20, r, np.uint8)
    g.broadcast(b, src=n - 1)
    assert (b == n - 1).all()
    # async then sync, in issue order
    a1 = np.ones(2_000_000, np.float32) * (r + 1)
    a2 = np.ones(2_000_000, np.float32)
    w = g.all_reduce(a1, async_op=True)
    g.all_reduce(a2)
    w.wait()
    assert (a1 == (n + 1) * n / 2).all() and (a2 == n).all()
    # coalesced (the shared-memory reducer when every rank has shm): an
    # async one queued before a sync one keeps the order
    c1 = [np.full(3, r + 1.0), np.full(300_000, r + 1.0)]
    c2 = [np.ones(5, np.float32)]
    w = g.all_reduce_coalesced(c1, 'avg', async_op=True)
    g.all_reduce_coalesced(c2)
    w.wait()
    assert all((c == (n + 1) / 2).all() for c in c1) and (c2[0] == n).all()


def _shm_main(argv):
    import json
    mode, rank, world, port, token = argv[:5]
    g = collectives.init('tcp', int(rank), int(world), timeout=20,
                         master_addr='127.0.0.1', master_port=int(port),
                         token=token)
    res = {'w': g._shm_w is not None, 'r': g._shm_r is not None,
           'red': g._red is not None}
    if mode == 'shm':
        try:
            _shm_cases(g)
            res['ok'] = 'ok'
        except Exception:
            import traceback
            res['ok'] = traceback.format_exc()
        print(json.dumps(res), flush=True)
        g.barrier()
    elif mode in ('shmdie', 'reddie'):
        g.all_reduce(np.ones(1 << 20, np.float32))
        if g.rank == 1:
            os._exit(3)     # mid-job crash: the kernel closes its sockets
        t0 = time.monotonic()
        try:
            for _ in range(50):
                if mode == 'shmdie':
                    g.all_reduce(np.ones(4 << 20, np.float32))
                else:   # waits in the shared-memory reducer
                    g.all_reduce_coalesced([np.ones(1000, np.float32)])
            res['error'] = None
        except collectives.RankFailureError as e:
            res['error'], res['type'] = str(e), 'RankFailureError'
        res['waited'] = time.monotonic() - t0
        print(json.dumps(res), flush=True)
    sys.stdout.flush()
    os._exit(0)


@pytest.mark.parametrize('world,off', [(2, ()), (3, ()), (3, (1,)),
                                       (2, (0, 1))])
def test_tcp_shm_big_messages(world, off):
    """Every ring op with big buffers, shm on, off, and off on one rank
    only (its two links fall back to the socket, the third keeps shm)."""
    outs = run_ranks('shm', world, script=os.path.abspath(__file__),
                     rank_env={r: {'DTORCH_TCP_SHM': '0'} for r in off})
    for rank, (res, err, _) in enumerate(outs):
        assert res is not None, f"rank {rank} printed nothing:\n{err}"
        assert res['ok'] == 'ok', f"rank {rank}: {res['ok']}\n{err}"
        right, left = (rank + 1) % world, (rank - 1) % world
        assert res['w'] == (rank not in off and right not in off)
        assert res['r'] == (rank not in off and left not in off)
        assert res['red'] == (not off)     # every rank must have shm


@pytest.mark.parametrize('mode', ['shmdie', 'reddie'])
def test_tcp_shm_dead_rank_mid_transfer(mode):
    outs = run_ranks(mode, 3, timeout=40,
                     script=os.path.abspath(__file__))
    # rank 1 crashes right after its first all_reduce; a failure before
    # that (set-up, the all_reduce) shows in its stderr
    assert outs[1][2] == 3, f"rank 1 exited {outs[1][2]}:\n{outs[1][1]}"
    for rank in (0, 2):
        res = outs[rank][0]
        assert res and res['w'] and res['r'], outs[rank]
        assert res.get('type') == 'RankFailureError', outs[rank]
        assert 'closed' in res['error'] or 'broke' in res['error']
        # they learn of the crash from the closed sockets, not from the
        # group's 20 s collective timeout (which would take >= 20 s; timed
        # inside the rank, so that start-up under load does not count)
        assert res['waited'] < 20, res


def test_run_ranks_survives_a_taken_port():
    """The flake of test_tcp_shm_dead_rank_mid_transfer: between
    free_port() and rank 0's bind, another job's store took the port; rank
    0 could not bind and rank 1 exited 1 on the stranger's 'wrong token'.
    The launch now retries on a fresh port."""
    port = free_port()
    stranger = collectives.TCPStore('127.0.0.1', port, 'another-job',
                                    is_server=True, timeout=5)
    try:
        outs = run_ranks('shmdie', 3, timeout=40, port=port,
                         script=os.path.abspath(__file__))
    finally:
        stranger.close()
    assert outs[1][2] == 3, f"rank 1 exited {outs[1][2]}:\n{outs[1][1]}"
    for rank in (0, 2):
        assert outs[rank][0] and outs[rank][0]['type'] == \
            'RankFailureError', outs[rank]


def test_gate_keeps_a_peer_that_passed_the_token():
    """A data-plane peer that proved the token near the end of the
    handshake timeout (a loaded machine) and then sends its channel bytes
    is kept: it was told OK and counts itself connected, so dropping it
    left both ranks waiting for the collective timeout."""
    import threading
    from collectives import store as S
    lsock = socket.socket()
    lsock.bind(('127.0.0.1', 0))
    lsock.listen(8)
    got, ready = [], threading.Event()

    def on_ready(sock, extra):
        got.append(extra)
        sock.close()
        ready.set()
    gate = S.HandshakeGate(lsock, b'tok', on_ready, 'test-gate', extra=5,
                           timeout=4.0)
    try:
        c = socket.create_connection(lsock.getsockname(), timeout=10)
        nonce = S._recv_exact(c, 16)
        time.sleep(1.5)                    # into the 4 s handshake
        c.sendall(S.token_digest(b'tok', nonce))
        assert S._recv_exact(c, 2) == b'OK'
        # past the first deadline (connect + 4 s), a second before the one
        # the OK renewed (OK + 4 s): the old 2 s / 2 s version raced it
        time.sleep(3.0)
        c.sendall(b'r\x01\x00\x00\x00')
        assert ready.wait(10), "the gate dropped an authenticated peer"
        assert got == [b'r\x01\x00\x00\x00']
        c.close()
        # a stranger that never answers is still dropped in time
        s2 = socket.create_connection(lsock.getsockname(), timeout=10)
        S._recv_exact(s2, 16)
        s2.settimeout(10)
        assert s2.recv(1) == b''           # closed by the gate
        s2.close()
    finally:
        gate.close()


def test_tcp_shm_ring_unlinked_and_attach_refusals():
    """Ranks as threads of one process: the rings are set up in files
    without a name (nothing in /dev/shm), their creators' descriptors are
    closed at once, and attach refuses anything but the real file with
    its cookie."""
    import glob
    import threading
    from collectives import shm
    from collectives.tcp import tcp_group
    if not shm.anonymous_ok():
        pytest.skip("no memfd_create or /proc")
    before = set(glob.glob('/dev/shm/*'))
    port, groups = free_port(), {}

    def rank(r):
        groups[r] = tcp_group(r, 2, '127.0.0.1', port, 'tok', timeout=10)
    ts = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    [t.start() for t in ts]
    [t.join(15) for t in ts]
    try:
        for g in groups.values():
            assert g._shm_w is not None and g._shm_r is not None
            assert g._shm_w.fd is None          # released after set-up
        assert not any('dtorch' in f
                       for f in set(glob.glob('/dev/shm/*')) - before)
        ring, cookie = P.ShmPipe.create(2, 4096)
        try:
            assert ring.path.startswith(f'/proc/{os.getpid()}/fd/')
            assert P.ShmPipe.attach(ring.path, cookie, 2, 4096) is not None
            assert P.ShmPipe.attach(ring.path, b'x' * 16, 2, 4096) is None
            assert P.ShmPipe.attach(ring.path, cookie, 4, 4096) is None
            assert P.ShmPipe.attach('/etc/passwd', cookie, 2, 4096) is None
            assert P.ShmPipe.attach('/dev/shm/dtorch-tcp-none', cookie,
                                 2, 4096) is None
            assert P.ShmPipe.attach('/proc/self/fd/0', cookie, 2,
                                 4096) is None
            with open('/dev/null', 'rb') as f:   # a /proc path, not a ring
                assert P.ShmPipe.attach(f'/proc/{os.getpid()}/fd/'
                                     f'{f.fileno()}', cookie, 2,
                                     4096) is None
        finally:
            ring.release()
        assert ring.fd is None
    finally:
        for g in groups.values():
            g.destroy()
        groups[0].store.close()


if __name__ == '__main__':
    _shm_main(sys.argv[1:])


@pytest.mark.parametrize("n,ops", [
    (16, ('sum', 'sum')),               # small: all-gather path
    (100_000, ('sum', 'sum')),          # ring reduce-scatter, shm rings
    (16, ('sum', 'max')),
    (100_000, ('sum', 'max'))])
def test_all_reduce_with_other_dtype_or_op_same_bytes_raises(n, ops):
    """float32 on rank 0, int32 on rank 1 (or SUM against MAX): the same
    byte count, so only the frames' dtype/op tells them apart. Without
    DTORCH_DISTRIBUTED_DEBUG this returned garbage; now every rank raises
    naming both dtypes (ops) and the rank."""
    import threading
    from collectives.errors import CollectiveMismatchError
    from collectives.tcp import tcp_group
    port, out = free_port(), {}
    dtypes = (np.float32, np.int32) if ops[0] == ops[1] else (np.float32,) * 2

    def rank(r):
        g = tcp_group(r, 2, '127.0.0.1', port, 'tok', timeout=10)
        try:
            g.all_reduce(np.ones(n, dtypes[r]), op=ops[r])
            out[r] = None
        except CollectiveMismatchError as e:
            out[r] = str(e)
        finally:
            g.destroy()
    ts = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    [t.start() for t in ts]
    [t.join(30) for t in ts]
    for r in range(2):
        msg = out.get(r)
        assert msg is not None, f"rank {r} did not raise"
        assert f"rank {r} has" in msg and f"rank {1 - r} sent" in msg, msg
        if ops[0] == ops[1]:
            assert "float32" in msg and "int32" in msg, msg
        else:
            assert "op sum" in msg and "op max" in msg, msg


def test_closed_peer_that_gave_up_is_not_blamed():
    """The blame of a closed connection follows the store's records of
    who gave up on whom to the rank that left none (deterministic form of
    the dead-rank test above; on main rank 0 blamed rank 2, the rank that
    gave up after rank 1 died, in 3 of 4 runs)."""
    from collectives.store import TCPStore
    from collectives.tcp.transport import SocketTransport

    class Ring(SocketTransport):
        name, ranks, _prefix, _broken = 'world', [0, 1, 2, 3], 'g/world/', None

        def __init__(self, rank, store):
            self.rank, self.store = rank, store

        def _close_sockets(self):
            pass

    store = TCPStore('127.0.0.1', free_port(), 'tok', is_server=True,
                     timeout=5)
    try:
        a, b, c = Ring(0, store), Ring(3, store), Ring(2, store)
        # rank 1 died: rank 2 saw it close and gave up, then rank 3 did
        e2 = c._fail(1, "was closed")
        assert e2.rank == 1 and "that rank died or gave up;" in str(e2)
        e3 = b._fail(2, "was closed")
        assert e3.rank == 1 and "rank 2 gave up after rank 1" in str(e3)
        e0 = a._fail(3, "broke (reset)")
        assert e0.rank == 1 and "rank 3 gave up after rank 1 (global 1)" \
            in str(e0), str(e0)
        # records a hop at a time (rank 3 blamed rank 2) are followed too
        store.set('g/world/gave-up/3', '2')
        e0 = Ring(0, store)._fail(3, "was closed")
        assert e0.rank == 1 and "rank 3 then rank 2 gave up after rank 1" \
            in str(e0), str(e0)
        # a store that is gone: the peer is blamed, at once
        store.close()
        t = time.monotonic()
        assert Ring(0, store)._fail(3, "was closed").rank == 3
        assert time.monotonic() - t < 3
    finally:
        store.close()


@pytest.mark.parametrize('mode,shm,slow', [
    ('rs_exit', '1', 1), ('ag_exit', '1', 1), ('rs_exit', '1', 0),
    ('rs_exit', '0', 1)])
def test_job_that_finishes_closes_data_plane_cleanly(mode, shm, slow):
    """A rank that finished its last collective exits (no barrier) while
    its ring neighbour (rank ``slow``) still drains the last shm-pipe
    slots and sends their acks back. On main the exit closed the socket
    with those acks unread, the kernel reset the connection, and the
    neighbour died with 'Connection reset by peer' (5 of 5 runs each of
    reduce_scatter and all_gather; 3 of 3 with rank 1 exiting first,
    whose exit did not even run the teardown); the socket-only path
    (DTORCH_TCP_SHM=0) has no acks."""
    for run in range(5 if shm == '1' else 2):
        outs = run_ranks(mode, 2, timeout=60, env={'DTORCH_TCP_SHM': shm},
                         rank_env={slow: {'TEST_SLOW_DRAIN': '0.02'}})
        for rank, (res, err, rc) in enumerate(outs):
            assert rc == 0 and res == {'ok': True}, \
                f"run {run} rank {rank} (rc {rc}):\n{err[-1500:]}"
