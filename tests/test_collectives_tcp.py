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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import collectives  # noqa: E402
import collectives_helpers as H  # noqa: E402

# a hang is a bug here: fail it instead of stalling the suite
pytestmark = pytest.mark.timeout(90)

# Single-process tests: under mpiexec every rank would run them again
# (pytest-mpi 0.6 ignores --only-mpi when --with-mpi is also given).
if 'OMPI_COMM_WORLD_SIZE' in os.environ or 'PMI_SIZE' in os.environ:
    pytest.skip("single-process tests; not run under mpiexec",
                allow_module_level=True)

HELPER = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                      'collectives_helpers.py')


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def run_ranks(mode, world, timeout=60, env=None):
    """Start `world` helper processes; return their parsed JSON lines."""
    port, token = free_port(), os.urandom(8).hex()
    e = dict(os.environ, OMP_NUM_THREADS='1', **(env or {}))
    procs = [subprocess.Popen(
        [sys.executable, HELPER, mode, str(r), str(world), str(port), token],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e)
        for r in range(world)]
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            lines = [ln for ln in out.splitlines() if ln.startswith('{')]
            outs.append((json.loads(lines[-1]) if lines else None, err,
                         p.returncode))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return outs


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
    assert time.monotonic() - t < 20      # not the 30 s timeout
    assert outs[1][2] == 3                # the rank that crashed
    for rank in (0, 2):
        res = outs[rank][0]
        assert res and res['type'] == 'RankFailureError', outs[rank]
        assert 'closed' in res['error'] or 'broke' in res['error']


def test_tcp_skipped_collective_times_out_with_report():
    outs = run_ranks('skip', 3, timeout=40, env={'TEST_TIMEOUT': '1.5'})
    for rank in (0, 1):
        res = outs[rank][0]
        assert res and res['error'], outs[rank]
        assert res['missing'] == [2]
        msg = res['error']
        assert "all_reduce #2 [1024] float32 on group 'world'" in msg
        assert f"rank {1 - rank} is in all_reduce #2" in msg
        assert "rank 2 is not in a collective (last: all_reduce #1" in msg


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
    g = tcp_group(0, 1, '127.0.0.1', free_port(), 'tok', timeout=5)
    x = np.ones(3)
    g.all_reduce(x)
    g.barrier()
    assert x.tolist() == [1, 1, 1]
    g.destroy()
    g.store.close()
