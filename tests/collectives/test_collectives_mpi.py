"""The mpi backend under `mpiexec -n 2` / `-n 3` (pytest-mpi): the shared
test body with blocking and polling groups, a poll-mode timeout with its
desync report, debug mode and the launcher world-size check.

mpi4py is imported inside the fixtures so that the single-process phase
(`pytest -m "not mpi"`) never initialises MPI."""
import time

import numpy as np
import pytest

import collectives_helpers as H
from collectives import (CollectiveError,
                         CollectiveMismatchError, CollectiveTimeoutError)

_groups = {}


def group(wait):
    if wait not in _groups:
        from collectives.mpi import MPIGroup
        _groups[wait] = MPIGroup(wait=wait, timeout=30,
                                 name=f"test-{wait}")
    return _groups[wait]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize('wait', ['blocking', 'poll'])
@pytest.mark.parametrize('case', sorted(H.CASES))
def test_mpi_case(case, wait):
    H.CASES[case](group(wait))


@pytest.mark.mpi(min_size=2)
def test_mpi_world_group_and_size_check(monkeypatch):
    from collectives.mpi import world_group
    g = world_group(timeout=10)
    assert g.size >= 2 and g.backend == 'mpi'
    monkeypatch.setenv('SLURM_NTASKS', str(g.size + 5))
    with pytest.raises(CollectiveError, match='--mpi=pmix'):
        world_group()


def skip_on_last_rank(g, call):
    """The last rank does not call (it waits where the others' watchdogs
    can see it); the others must raise a timeout within a few seconds.
    Returns their error, None on the last rank."""
    if g.rank == g.size - 1:
        time.sleep(2.5)
        return None
    t = time.monotonic()
    with pytest.raises(CollectiveTimeoutError) as ei:
        call()
    assert time.monotonic() - t < 6
    return ei.value


@pytest.mark.mpi(min_size=2)
def test_mpi_poll_timeout_reports_every_rank():
    from collectives.mpi import MPIGroup
    g = MPIGroup(wait='poll', timeout=1.0, name='skip')
    last = g.size - 1
    g.all_reduce(np.ones(4))
    err = skip_on_last_rank(
        g, lambda: g.all_reduce(np.ones(1024, np.float32)))
    # join the abandoned all_reduce so that MPI can finish cleanly (a
    # nonblocking collective only matches a nonblocking one)
    if g.rank == last:
        send = np.ones(1024, np.float32)
        recv = np.empty(1024, np.float32)
        g.comm.Iallreduce(send, recv).Wait()
    else:
        for reqs, _ in g._orphans:
            for r in reqs:
                r.Wait()
    group('blocking').barrier()
    if err is None:
        return
    msg = str(err)
    assert err.missing == [last], msg
    assert "all_reduce #2 [1024] float32 on group 'skip'" in msg
    assert f"rank {last} is not in a collective (last: all_reduce #1" in msg
    others = [r for r in range(g.size) if r != last]
    for r in others:
        assert f"rank {r} is in all_reduce #2 [1024] float32" in msg


@pytest.mark.mpi(min_size=2)
def test_mpi_shared_memory_all_reduce_and_its_timeout():
    """Ranks on one host reduce coalesced lists through shared memory; a
    rank that does not come is named in a timeout raised in the others
    (not an abort: nobody is stuck inside MPI)."""
    from collectives import shm_reduce
    from collectives.mpi import MPIGroup
    g = MPIGroup(timeout=1.0, name='shm-skip')
    if not shm_reduce.usable():
        assert g._shm is None
        return
    assert g._shm is not None          # mpiexec -n k on this one host
    calls = []
    orig = g._shm.all_reduce
    g._shm.all_reduce = lambda *a: (calls.append(1), orig(*a))
    xs = [np.full(n, g.rank + 1.0, np.float32) for n in (3, 300_000)]
    g.all_reduce_coalesced(xs, 'avg')
    assert calls and all((x == (g.size + 1) / 2).all() for x in xs)
    g.all_reduce(xs[1])                # plain all_reduce: MPI
    assert len(calls) == 1 and (xs[1] == g.size * (g.size + 1) / 2).all()
    last = g.size - 1
    err = skip_on_last_rank(
        g, lambda: g.all_reduce_coalesced([np.ones(1000, np.float32)]))
    group('blocking').barrier()
    g.destroy()
    if err is not None:
        assert err.missing == [last], str(err)
        assert "on group 'shm-skip'" in str(err)


@pytest.mark.mpi(min_size=2)
def test_mpi_debug_mode_mismatch(monkeypatch):
    monkeypatch.setenv('DTORCH_DISTRIBUTED_DEBUG', 'DETAIL')
    from collectives.mpi import MPIGroup
    g = MPIGroup(timeout=10, name='debug')
    g.all_reduce(np.ones(3))    # agreeing ranks pass the check
    n = 7 if g.rank == 1 else 6
    with pytest.raises(CollectiveMismatchError) as ei:
        g.all_reduce(np.ones(n, np.float32))
    assert ei.value.rank == 1
    assert 'rank 1 calls all_reduce [7] float32' in str(ei.value)
    group('blocking').barrier()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize('wait', ['blocking', 'poll'])
def test_mpi_shape_mismatch_names_op_shapes_and_ranks(wait):
    """In a group of world ranks 0 and 1, rank 1 gathers 8 values and
    rank 0 4: MPI reports a truncated message on a rank (MPI_ERR_TRUNCATE,
    or MPI_ERR_IN_STATUS for a nonblocking call), which raises
    CollectiveMismatchError naming the op and both ranks' shapes. (With
    more ranks a mismatched blocking collective can also leave a rank
    stuck inside MPI: the watchdog's timeout abort covers that.) Then a
    recv into a buffer smaller than the message, the same way."""
    from mpi4py import MPI
    from collectives.mpi import MPIGroup
    w = MPI.COMM_WORLD
    sub = w.Split(0 if w.Get_rank() < 2 else MPI.UNDEFINED, w.Get_rank())
    res = None
    if w.Get_rank() < 2:
        res = []
        g = MPIGroup(sub, wait=wait, timeout=10, name=f'mismatch-{wait}')
        n = 8 if g.rank == 1 else 4
        try:
            g.all_gather(np.zeros((g.size, n)), np.ones(n))
        except CollectiveError as e:
            res.append((type(e).__name__, str(e)))
            with pytest.raises(CollectiveError, match='unusable'):
                g.barrier()
        g2 = MPIGroup(sub, wait=wait, timeout=10, name=f'p2p-{wait}')
        try:
            if g2.rank == 0:
                g2.send(np.ones(8), 1)
            else:
                g2.recv(np.ones(4), 0)
        except CollectiveError as e:
            res.append((type(e).__name__, str(e)))
        # status queries are answered while waiting here
        results = group('blocking').all_gather_object(res)
    else:
        results = group('blocking').all_gather_object(None)
    errs = [e for r in results[:2] for e in r]
    assert any('all_gather' in m for _, m in errs), errs
    assert any('recv' in m for _, m in errs), errs
    for name, msg in errs:
        assert name == 'CollectiveMismatchError', msg
        assert 'MPI_ERR' in msg, msg
        if 'all_gather' in msg:
            assert "all_gather #1 [4] float64 on group 'mismatch-" in msg
            assert 'rank 1 is not in a collective (last: all_gather #1 ' \
                '[8] float64)' in msg, msg
        else:
            assert "recv [4] float64 on group 'p2p-" in msg, msg
            assert 'failed on rank 1' in msg, msg
