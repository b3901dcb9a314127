"""A rank killed while shared memory is being set up leaves nothing in
/dev/shm (issue 21 item 10): the tcp rings and the same-host reducer (tcp
and mpi) are anonymous files that die with their processes.

Each test starts its own ranks (this file run as a script, or mpiexec),
stops one inside the set-up window - a hook makes it announce the moment
it holds the shared file - kills it by pid, and compares /dev/shm before
and after. Only processes started here are killed."""
import glob
import json
import os
import signal
import subprocess
import sys
import time

import pytest

_TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# tests/ (the shared helpers) and the checkout above it: run as a script
# under an editable install, a rank would otherwise import tests/collectives
# and tests/launch (namespace directories) as the packages of those names
sys.path[:0] = [_TESTS, os.path.dirname(_TESTS)]
from helpers import free_port, mpi_env  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

pytestmark = pytest.mark.timeout(120)

if 'OMPI_COMM_WORLD_SIZE' in os.environ or 'PMI_SIZE' in os.environ:
    if __name__ != '__main__':
        pytest.skip("single-process tests; not run under mpiexec",
                    allow_module_level=True)

MPIEXEC = os.path.join(os.path.dirname(sys.executable), 'mpiexec')


def shm_files():
    return set(glob.glob('/dev/shm/dtorch*'))


# ---- the rank side (this file as a script)

def _hold(what):
    """Say that this rank holds its shared file now, then wait to be
    killed."""
    print(json.dumps({'holding': what, 'pid': os.getpid()}), flush=True)
    time.sleep(60)


def _tcp_rank(mode, rank, world, port, token):
    import collectives
    from collectives import tcp as T
    from collectives.tcp import pipe as P
    hold = os.environ.get('TEST_HOLD') == '1'
    if hold and mode == 'ring':
        create = P.ShmPipe.create.__func__

        def held_create(cls, *a):
            res = create(cls, *a)
            _hold('ring')
            return res
        P.ShmPipe.create = classmethod(held_create)
    if hold and mode == 'reducer':
        bcast = T.TCPGroup._store_bcast

        def held_bcast(self, obj):
            if obj[0] is not None:      # rank 0, with the file made
                _hold('reducer')
            return bcast(self, obj)
        T.TCPGroup._store_bcast = held_bcast
    if hold and mode == 'peer':
        bcast = T.TCPGroup._store_bcast

        def held_bcast(self, obj):
            res = bcast(self, obj)      # rank 0 has made the file
            _hold('peer')
            return res
        T.TCPGroup._store_bcast = held_bcast
    try:
        g = collectives.init('tcp', int(rank), int(world), timeout=float(
            os.environ.get('TEST_TIMEOUT', '20')), master_addr='127.0.0.1',
            master_port=int(port), token=token)
        print(json.dumps({'ready': True}), flush=True)
        g.barrier()
    except Exception as e:
        print(json.dumps({'error': f"{type(e).__name__}: {e}"}),
              flush=True)
    os._exit(0)


def _mpi_rank():
    from collectives import shm_reduce
    setup = shm_reduce.ShmReducer.setup.__func__

    def killed_setup(cls, rank, size, bcast, all_true, *a, **k):
        def bcast_then_die(obj):
            if rank == 0 and obj[0] is not None:
                os.kill(os.getpid(), signal.SIGKILL)  # holding the file
            return bcast(obj)
        return setup(cls, rank, size, bcast_then_die, all_true, *a, **k)
    shm_reduce.ShmReducer.setup = classmethod(killed_setup)
    from collectives.mpi import world_group
    world_group(timeout=20)
    print('set-up survived', flush=True)


# ---- the tests

def _run_tcp(mode, holder, world=2, timeout_s='20'):
    port, token = free_port(), os.urandom(8).hex()
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONPATH=ROOT,
               TEST_TIMEOUT=timeout_s, DTORCH_SHM='1', DTORCH_TCP_SHM='1')
    procs = [subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), 'tcp', mode, str(r),
         str(world), str(port), token], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
        env=dict(env, TEST_HOLD='1' if r == holder else '0'))
        for r in range(world)]
    try:
        line = procs[holder].stdout.readline()
        msg = json.loads(line) if line.startswith('{') else {}
        assert msg.get('holding') == mode, \
            (line, procs[holder].stderr.read() if not line else '')
        procs[holder].kill()              # by pid: a process started here
        procs[holder].wait()
        for p in procs:
            if p is not procs[holder]:
                p.communicate(timeout=60)  # they fail and exit by themselves
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.mark.skipif(not os.path.isdir('/dev/shm'), reason='no /dev/shm')
@pytest.mark.parametrize('mode,holder', [('ring', 0), ('ring', 1),
                                         ('reducer', 0), ('peer', 1)])
def test_tcp_rank_killed_during_shm_setup_leaves_nothing(mode, holder):
    before = shm_files()
    _run_tcp(mode, holder, timeout_s='3' if mode == 'peer' else '20')
    assert shm_files() - before == set()


@pytest.mark.skipif(not os.path.exists(MPIEXEC), reason='no mpiexec')
def test_mpi_rank_killed_during_shm_setup_leaves_nothing():
    from collectives import shm_reduce
    if not shm_reduce.usable():
        pytest.skip("no shared-memory reduction on this machine")
    env = mpi_env(PYTHONPATH=ROOT)
    before = shm_files()
    p = subprocess.Popen([MPIEXEC, '-n', '2', sys.executable,
                          os.path.abspath(__file__), 'mpi'], env=env,
                         cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    try:
        out, _ = p.communicate(timeout=60)
    finally:
        if p.poll() is None:       # only the job this test started
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode != 0 and 'set-up survived' not in out, out
    new = {f for f in shm_files() - before
           if not os.path.basename(f).startswith('sm_segment')}
    assert new == set(), out


if __name__ == '__main__':
    if sys.argv[1] == 'tcp':
        _tcp_rank(*sys.argv[2:7])
    else:
        _mpi_rank()
