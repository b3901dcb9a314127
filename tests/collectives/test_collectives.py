"""collectives/ in one process: the threads backend runs the shared test
body with 1-4 ranks; timeouts, desync reports, debug mode, failures,
fusion, environment discovery."""
import os
import sys
import time

import numpy as np
import pytest

import collectives  # noqa: E402
import collectives_helpers as H  # noqa: E402

# a hang is a bug here: fail it instead of stalling the suite
pytestmark = pytest.mark.timeout(90)

# Single-process tests: under mpiexec every rank would run them again
# (pytest-mpi 0.6 ignores --only-mpi when --with-mpi is also given).
if 'OMPI_COMM_WORLD_SIZE' in os.environ or 'PMI_SIZE' in os.environ:
    pytest.skip("single-process tests; not run under mpiexec",
                allow_module_level=True)
from collectives import (CollectiveMismatchError,  # noqa: E402
                         CollectiveTimeoutError, spawn_threads)
from helpers import mpi_env  # noqa: E402


@pytest.mark.parametrize('world_size', [1, 2, 3, 4])
@pytest.mark.parametrize('case', sorted(H.CASES))
def test_threads_case(case, world_size):
    spawn_threads(H.CASES[case], world_size, timeout=20)


def test_threads_debug_mode_runs_cases(monkeypatch):
    monkeypatch.setenv('DTORCH_DISTRIBUTED_DEBUG', 'DETAIL')
    res = spawn_threads(H.run_cases, 3, timeout=20)
    assert all(v == 'ok' for r in res for v in r.values()), res


def _skip_last(g):
    g.all_reduce(np.ones(4))
    if g.rank == g.size - 1:
        time.sleep(g.timeout + 0.6)   # never calls the second all_reduce
        return
    g.all_reduce(np.ones(1024, np.float32))


def test_timeout_names_op_group_and_missing_rank():
    def run(timeout):
        t = time.monotonic()
        with pytest.raises(CollectiveTimeoutError) as ei:
            spawn_threads(_skip_last, 3, timeout=timeout)
        assert time.monotonic() - t < 5 + 3 * timeout
        return ei.value, set(ei.value.missing) - {2}
    e = H.until_no_live_rank_is_late(run, (0.4, 2.0, 8.0))
    msg = str(e)
    assert e.op == 'all_reduce' and e.group == 'world' and e.seq == 2
    assert e.missing == [2]
    assert "ranks that did not arrive: [2]" in msg
    # the desync report: where each rank is
    assert "rank 0 is in all_reduce #2 [1024] float32" in msg
    assert "rank 1 is in all_reduce #2 [1024] float32" in msg
    assert "rank 2 is not in a collective (last: all_reduce #1 [4] " \
        "float64)" in msg
    assert "raised in thread rank" in ''.join(getattr(e, '__notes__', []))


def _desync(g):
    g.all_reduce(np.ones(3))
    if g.rank == 0:
        g.broadcast(np.ones(10, np.int64), src=0)
    else:
        g.all_reduce(np.ones(1024, np.float32))


def test_different_collectives_are_reported():
    with pytest.raises(CollectiveMismatchError) as ei:
        spawn_threads(_desync, 2, timeout=5)
    msg = str(ei.value)
    assert 'broadcast' in msg and 'all_reduce' in msg and '#2' in msg


def _mismatch(g):
    g.all_reduce(np.ones(4, np.float32))
    n = 5 if g.rank == 2 else 4
    g.all_reduce(np.ones(n, np.float32))


def test_debug_mode_names_first_mismatching_rank(monkeypatch):
    monkeypatch.setenv('DTORCH_DISTRIBUTED_DEBUG', 'DETAIL')
    with pytest.raises(CollectiveMismatchError) as ei:
        spawn_threads(_mismatch, 3, timeout=5)
    msg = str(ei.value)
    assert ei.value.rank == 2
    assert "rank 2 calls all_reduce [5] float32" in msg
    assert "rank 0 calls all_reduce [4] float32" in msg


def _one_fails(g):
    if g.rank == 1:
        raise KeyError('boom')
    g.all_reduce(np.ones(3))


def test_failure_in_one_thread_unblocks_the_others():
    t = time.monotonic()
    with pytest.raises(KeyError) as ei:
        spawn_threads(_one_fails, 3, timeout=60)
    assert time.monotonic() - t < 5
    assert 'rank 1' in ''.join(ei.value.__notes__)


def test_spawn_threads_returns_results_in_rank_order():
    assert spawn_threads(lambda g: g.rank * 10, 4) == [0, 10, 20, 30]


def test_async_wait_timeout():
    def fn(g):
        if g.rank == 0:
            w = g.all_reduce(np.ones(2), async_op=True)
            assert not w.is_completed()
            with pytest.raises(CollectiveTimeoutError):
                w.wait(timeout=0.2)
            return 'timed out'
        time.sleep(0.5)
    assert spawn_threads(fn, 2, timeout=30)[0] == 'timed out'


def test_recv_timeout_names_sender():
    def fn(g):
        if g.rank == 1:
            with pytest.raises(CollectiveTimeoutError) as ei:
                g.recv(np.zeros(2), src=0, tag=5)
            assert 'recv' in str(ei.value) and ei.value.missing == [0]
    spawn_threads(fn, 2, timeout=0.3)


def test_fusion_round_trip():
    rng = np.random.default_rng(0)
    arrs = [rng.standard_normal(s).astype(np.float32)
            for s in [(3, 4), (7,), (), (2, 2, 2)]]
    flat, layout = collectives.pack(arrs)
    assert flat.shape == (12 + 7 + 1 + 8,) and flat.flags.c_contiguous
    back = collectives.unpack(flat, layout)
    for a, b in zip(arrs, back):
        assert a.shape == b.shape and np.array_equal(a, b)
    outs = [np.zeros_like(a) for a in arrs]
    layout.unpack(flat * 2, outs)
    assert np.array_equal(outs[0], arrs[0] * 2)
    with pytest.raises(TypeError, match='float64'):
        collectives.pack([np.ones(2, np.float32), np.ones(2)])
    assert collectives.bucketize(
        [np.ones(10, np.float32)] * 3 + [np.ones(2)], cap_bytes=80) == \
        [[0, 1], [2], [3]]


def test_fusion_with_all_reduce():
    def fn(g):
        grads = [np.full((2, 3), g.rank, np.float32),
                 np.full(5, g.rank, np.float32)]
        flat, layout = collectives.pack(grads)
        g.all_reduce(flat, 'avg')
        layout.unpack(flat, grads)
        return [float(x.ravel()[0]) for x in grads]
    assert spawn_threads(fn, 3)[2] == [1.0, 1.0]


def test_discover_env():
    d = collectives.discover
    assert d({}).world_size == 1 and d({}).launcher == 'none'
    i = d({'RANK': '2', 'WORLD_SIZE': '4', 'LOCAL_RANK': '0',
           'LOCAL_WORLD_SIZE': '2', 'MASTER_ADDR': '10.0.0.1',
           'MASTER_PORT': '1234', 'DTORCH_RDZV_TOKEN': 's'})
    assert (i.rank, i.world_size, i.master_addr, i.master_port, i.token,
            i.launcher) == (2, 4, '10.0.0.1', 1234, 's', 'env')
    i = d({'OMPI_COMM_WORLD_RANK': '1', 'OMPI_COMM_WORLD_SIZE': '3',
           'OMPI_COMM_WORLD_LOCAL_RANK': '1'})
    assert (i.rank, i.world_size, i.local_rank, i.launcher,
            i.under_mpi) == (1, 3, 1, 'mpi', True)
    i = d({'SLURM_PROCID': '5', 'SLURM_NTASKS': '8', 'SLURM_LOCALID': '1',
           'SLURM_NODELIST': 'gpu[03-05,9],cpu1'})
    assert (i.rank, i.world_size, i.local_rank, i.master_addr,
            i.under_mpi) == (5, 8, 1, 'gpu03', False)
    with pytest.raises(ValueError, match='out of range'):
        d({'RANK': '4', 'WORLD_SIZE': '4'})


def test_init_world_of_one_without_launcher(monkeypatch):
    for k in list(os.environ):
        if k.startswith(('OMPI_', 'PMI', 'SLURM_')) or k in (
                'RANK', 'WORLD_SIZE'):
            monkeypatch.delenv(k)
    g = collectives.init()
    assert (g.rank, g.size, g.backend) == (0, 1, 'threads')
    x = np.arange(3.0)
    g.all_reduce(x, 'avg')
    g.broadcast(x)
    assert x.tolist() == [0, 1, 2]
    assert g.all_gather_object('a') == ['a']
    with pytest.raises(ValueError, match='unknown collectives backend'):
        collectives.init('gloo')


def test_nccl_imports_without_cupy():
    from collectives import nccl
    if not nccl.is_available():
        with pytest.raises(ImportError, match='CuPy'):
            nccl.NCCLGroup(0, 1, lambda u: u)
        pytest.skip('no CUDA GPU / CuPy: NCCL ops not exercised')
    # with a GPU: a one-rank communicator must work
    import cupy
    g = nccl.NCCLGroup(0, 1, lambda u: u)
    x = cupy.arange(4, dtype=cupy.float32)
    g.all_reduce(x)
    g.broadcast(x, 0)
    assert x.get().tolist() == [0, 1, 2, 3]


def test_timeout_accepts_timedelta():
    import datetime
    g = collectives.single_group(datetime.timedelta(seconds=3))
    assert g.timeout == 3.0


# ---- the mpi backend's job-level guarantees, each in its own mpiexec job
MPIEXEC = os.path.join(os.path.dirname(sys.executable), 'mpiexec')
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))

ABORT_SCRIPTS = {
    # default blocking mode: the watchdog prints the report and aborts
    'timeout': """
import numpy as np, time
from collectives.mpi import world_group
g = world_group(timeout=1.0)
g.all_reduce(np.ones(4))
if g.rank == 1:
    time.sleep(60)
g.all_reduce(np.ones(1024, np.float32))
""",
    # an uncaught exception in one rank takes the job down
    'exception': """
import numpy as np
from collectives.mpi import world_group
g = world_group(timeout=100)
if g.rank == 1:
    raise ValueError('boom')
g.all_reduce(np.ones(8))
""",
    # sys.exit(3) under a plain `mpiexec python` (no -m mpi4py): the
    # excepthook never sees a SystemExit; the exit check does
    'sysexit': """
import sys, numpy as np
from collectives.mpi import world_group
g = world_group(timeout=100)
g.all_reduce(np.ones(4))
if g.rank == 1:
    sys.exit(3)
g.all_reduce(np.ones(8))
""",
}

# ranks that end at different times without anyone waiting: no abort
EARLY_EXIT_OK = """
import sys, time, numpy as np
from collectives.mpi import world_group
g = world_group(timeout=100)
g.all_reduce(np.ones(4))
if g.rank == 1:
    sys.exit(0)
time.sleep(1.0)
print('rank', g.rank, 'finished', flush=True)
"""


def run_mpi_job(script, n=2, timeout=40):
    """(returncode, output, seconds) of `mpiexec -n n python -c script`."""
    import signal
    import subprocess
    env = mpi_env(PYTHONPATH=ROOT)
    t = time.monotonic()
    p = subprocess.Popen([MPIEXEC, '-n', str(n), sys.executable, '-c',
                          script], env=env, cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
    finally:
        if p.poll() is None:       # only the job this test started
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    return p.returncode, out, time.monotonic() - t


@pytest.mark.skipif(not os.path.exists(MPIEXEC), reason='no mpiexec')
@pytest.mark.parametrize('what', sorted(ABORT_SCRIPTS))
def test_mpi_job_aborts_instead_of_hanging(what):
    rc, out, took = run_mpi_job(ABORT_SCRIPTS[what])
    # the collective timeouts are 100 s (1 s for 'timeout'): ending
    # well before says the job was aborted, not timed out
    assert rc != 0 and took < 30, out
    if what == 'sysexit':
        assert rc == 3, (rc, out)      # the code survives (was 1)
        assert 'MPI rank 1 is exiting' in out, out
        assert 'rank 0 waits in all_reduce #2 [8] float64' in out, out
        assert 'last collective' in out and 'all_reduce #1' in out
    if what == 'timeout':
        assert 'CollectiveTimeoutError' in out
        assert 'ranks that did not arrive: [1]' in out
        assert 'rank 1 is not in a collective (last: all_reduce #1' in out
    if what == 'exception':
        assert 'uncaught ValueError on MPI rank 1' in out


@pytest.mark.skipif(not os.path.exists(MPIEXEC), reason='no mpiexec')
def test_mpi_ranks_exiting_at_different_times_is_not_an_error():
    rc, out, _ = run_mpi_job(EARLY_EXIT_OK, n=3)
    assert rc == 0, out
    assert out.count('finished') == 2 and 'aborting' not in out, out
