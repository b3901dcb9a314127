"""Empty and 0-d buffers through every op of the dtorch.distributed facade
(threads backend, 1-3 ranks in this process), and the timeout report when
every rank did arrive. The same ops on collectives' own groups run for
every backend in collectives_helpers (cases empty_tensors and
scalar_tensors: threads, tcp processes, mpiexec -n 2/3)."""
import os

import numpy as np
import pytest

import collectives  # noqa: E402

pytestmark = pytest.mark.timeout(90)

if 'OMPI_COMM_WORLD_SIZE' in os.environ or 'PMI_SIZE' in os.environ:
    pytest.skip("single-process tests; not run under mpiexec",
                allow_module_level=True)


def _facade_body(shape):
    import dtorch
    import dtorch.distributed as dist

    def body(rank, ws):
        full = int(np.prod(shape)) > 0

        def t(v, dtype=dtorch.float32):
            return dtorch.full(shape, float(v), dtype=dtype)
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.MAX,
                   dist.ReduceOp.MIN, dist.ReduceOp.PRODUCT):
            x = t(rank + 1)
            dist.all_reduce(x, op=op)
            assert tuple(x.shape) == shape
        x = t(rank + 1)
        dist.all_reduce(x, async_op=True).wait()
        assert not full or (x.numpy() == ws * (ws + 1) / 2).all()
        b = t(rank)
        dist.broadcast(b, src=ws - 1)
        assert not full or (b.numpy() == ws - 1).all()
        dist.reduce(t(rank), dst=0)
        outs = [t(-1) for _ in range(ws)]
        dist.all_gather(outs, t(rank))
        assert not full or [float(o.numpy()) for o in outs] == \
            list(range(ws))
        big = dtorch.zeros((ws,) + shape if shape else (ws,))
        dist.all_gather_into_tensor(big, t(rank))
        gl = [t(-1) for _ in range(ws)] if rank == 0 else None
        dist.gather(t(rank), gl, dst=0)
        out = t(-1)
        dist.scatter(out, [t(r) for r in range(ws)] if rank == 0 else None,
                     src=0)
        assert not full or (out.numpy() == rank).all()
        rs = t(-1)
        dist.reduce_scatter(rs, [t(rank + 1) for _ in range(ws)])
        assert not full or (rs.numpy() == ws * (ws + 1) / 2).all()
        dist.reduce_scatter_tensor(
            t(-1), dtorch.ones((ws,) + shape if shape else (ws,)))
        a2a = [t(-1) for _ in range(ws)]
        dist.all_to_all(a2a, [t(rank) for _ in range(ws)])
        assert not full or [float(o.numpy()) for o in a2a] == \
            list(range(ws))
        c = [t(rank + 1), dtorch.ones(2), t(rank + 1)]
        dist.all_reduce_coalesced(c)
        assert not full or (c[0].numpy() == ws * (ws + 1) / 2).all()
        dist.barrier()
        if ws > 1:
            right, left = (rank + 1) % ws, (rank - 1) % ws
            dist.send(t(rank), right, tag=1)
            w = dist.isend(t(rank), right, tag=2)
            got1, got2 = t(-1), t(-1)
            dist.recv(got1, left, tag=1)
            dist.irecv(got2, left, tag=2).wait()
            w.wait()
            assert not full or (got1.numpy() == left).all() and \
                (got2.numpy() == left).all()
        dist.barrier()
        return tuple(x.shape)
    return body


@pytest.mark.parametrize('ws', [1, 2, 3])
@pytest.mark.parametrize('shape', [(0,), (3, 0), ()])
def test_facade_every_op_empty_and_scalar(shape, ws):
    import dtorch.distributed as dist
    assert dist.spawn_threads(_facade_body(shape), ws, timeout=20) == \
        [shape] * ws


def test_timeout_report_when_every_rank_arrived():
    """A report with no missing rank must not read 'did not arrive: []'."""
    g = collectives.single_group(timeout=1)
    rec = (1, 'all_reduce', np.zeros(0, np.float32))
    g._pending[1] = rec
    err = g._timeout_error(rec)
    msg = str(err)
    assert 'did not arrive: []' not in msg
    assert 'every rank arrived at all_reduce #1' in msg
    assert err.missing == []
    # a missing rank is still named
    err = g._timeout_error(rec, missing=[3])
    assert 'ranks that did not arrive: [3]' in str(err)


def test_timeout_report_does_not_blame_a_rank_that_went_ahead():
    """A ring neighbour that finished the op and entered the next one (or
    finished it and is idle) has arrived: only the silent ranks are named.
    (Seen in tests/test_two_nodes: a live rank of the surviving node was
    blamed when the other node vanished mid all_reduce.)"""
    g = collectives.single_group(timeout=1)
    rec = (2, 'all_reduce', np.zeros(4, np.float32))
    statuses = {0: (True, 2, 'all_reduce', '[4] float32'),
                1: (True, 3, 'all_reduce', '[4] float32'),     # ahead
                2: None,                                       # silent
                3: (False, 2, 'all_reduce', '[4] float32')}    # done, idle
    g.size = 4
    g._peer_statuses = lambda grace: statuses
    err = g._timeout_error(rec)
    assert err.missing == [2], str(err)
    assert 'ranks that did not arrive: [2]' in str(err)
    # a rank still in an earlier op has not arrived
    statuses[1] = (True, 1, 'broadcast', '[4] float32')
    assert g._timeout_error(rec).missing == [1, 2]


def test_timeout_report_names_a_rank_left_behind_apart():
    """The other side of a vanished node's race: this rank finished #2 and
    waits in #3 while a live rank is still stuck in #2 (fed by the vanished
    ones). That rank has not arrived, but it is not the one to blame: the
    message names the silent ranks and says the other is behind.
    (tests/launch/test_two_nodes.py::test_vanished_node_times_out)"""
    g = collectives.single_group(timeout=1)
    rec = (3, 'all_reduce', np.zeros(4, np.float32))
    statuses = {0: (True, 2, 'all_reduce', '[4] float32'),     # behind
                1: (True, 3, 'all_reduce', '[4] float32'),     # this rank
                2: None, 3: None}                              # vanished
    g.size = 4
    g._peer_statuses = lambda grace: statuses
    err = g._timeout_error(rec, missing=[0, 2, 3])
    assert 'ranks that did not arrive: [2, 3] (ranks [0] are still in an ' \
        'earlier collective of this group' in str(err), str(err)
    assert err.missing == [0, 2, 3]
    # with nobody silent, the ranks behind are the ones named
    statuses[2] = statuses[3] = (True, 2, 'all_reduce', '[4] float32')
    assert 'ranks that did not arrive: [0, 2, 3].' in str(
        g._timeout_error(rec, missing=[0, 2, 3]))
