"""dtorch.distributed (the tensor facade): one body per collective, run on
the threads backend with 1-4 ranks in this process, and on MPI under
``mpiexec -n 2`` / ``-n 3`` (tests marked mpi)."""
import numpy as np
import pytest

import dtorch
import dtorch.distributed as dist


def body_all_reduce(rank, ws):
    t = dtorch.arange(4, dtype=dtorch.float32) + rank
    dist.all_reduce(t)
    expect = np.arange(4) * ws + sum(range(ws))
    np.testing.assert_allclose(t.numpy(), expect)
    m = dtorch.tensor([float(rank)])
    dist.all_reduce(m, op=dist.ReduceOp.MAX)
    assert m.item() == ws - 1
    a = dtorch.tensor([float(rank)])
    dist.all_reduce(a, op=dist.ReduceOp.AVG)
    assert a.item() == pytest.approx((ws - 1) / 2)
    w = dist.all_reduce(dtorch.ones(2), async_op=True)
    w.wait()


def body_broadcast_gather(rank, ws):
    t = dtorch.full((3,), float(rank))
    dist.broadcast(t, src=ws - 1)
    assert t.tolist() == [ws - 1] * 3
    outs = [dtorch.zeros(2, dtype=dtorch.int64) for _ in range(ws)]
    dist.all_gather(outs, dtorch.tensor([rank, rank * 10]))
    assert [o.tolist() for o in outs] == [[r, r * 10] for r in range(ws)]
    big = dtorch.zeros(ws, 2)
    dist.all_gather_into_tensor(big, dtorch.full((2,), float(rank)))
    assert big[:, 0].tolist() == list(range(ws))
    gl = [dtorch.zeros(1) for _ in range(ws)] if rank == 0 else None
    dist.gather(dtorch.tensor([rank + 0.5]), gl, dst=0)
    if rank == 0:
        assert [g.item() for g in gl] == [r + 0.5 for r in range(ws)]
    out = dtorch.zeros(1)
    sl = [dtorch.tensor([10.0 * r]) for r in range(ws)] if rank == 0 \
        else None
    dist.scatter(out, sl, src=0)
    assert out.item() == 10.0 * rank
    red = dtorch.ones(2)
    dist.reduce(red, dst=0)
    if rank == 0:
        assert red.tolist() == [ws, ws]


def body_reduce_scatter_all_to_all(rank, ws):
    out = dtorch.zeros(2)
    inp = dtorch.arange(2 * ws, dtype=dtorch.float32)
    dist.reduce_scatter_tensor(out, inp)
    assert out.tolist() == [ws * (2 * rank), ws * (2 * rank + 1)]
    out2 = dtorch.zeros(1)
    dist.reduce_scatter(out2, [dtorch.tensor([float(r + rank)])
                               for r in range(ws)])
    assert out2.item() == sum(rank + r for r in range(ws))
    outs = [dtorch.zeros(1) for _ in range(ws)]
    dist.all_to_all(outs, [dtorch.tensor([100.0 * rank + r])
                           for r in range(ws)])
    assert [o.item() for o in outs] == [100.0 * r + rank for r in range(ws)]
    dist.barrier()


def body_objects_p2p(rank, ws):
    objs = [None] * ws
    dist.all_gather_object(objs, {"rank": rank})
    assert objs == [{"rank": r} for r in range(ws)]
    lst = [rank, "x"] if rank == 0 else [None, None]
    dist.broadcast_object_list(lst, src=0)
    assert lst == [0, "x"]
    if ws >= 2:
        buf = dtorch.zeros(3)
        if rank == 0:
            dist.send(dtorch.tensor([1.0, 2.0, 3.0]), dst=1)
        elif rank == 1:
            assert dist.recv(buf, src=0) == 0
            assert buf.tolist() == [1, 2, 3]


def body_bad_input(rank, ws):
    with pytest.raises(ValueError, match="contiguous"):
        dist.all_reduce(dtorch.ones(2, 3).t())
    with pytest.raises(TypeError, match="dtorch.Tensor"):
        dist.all_reduce(np.ones(2))
    with pytest.raises(ValueError, match="tensor_list has"):
        dist.all_gather([dtorch.zeros(1)] * (ws + 1), dtorch.zeros(1))


BODIES = [body_all_reduce, body_broadcast_gather,
          body_reduce_scatter_all_to_all, body_objects_p2p, body_bad_input]


@pytest.mark.parametrize("ws", [1, 2, 3, 4])
@pytest.mark.parametrize("body", BODIES, ids=[b.__name__ for b in BODIES])
def test_threads(body, ws):
    dist.spawn_threads(body, ws, timeout=20)


def test_world_size_one_without_launcher(monkeypatch):
    for v in ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"):
        monkeypatch.delenv(v, raising=False)
    assert not dist.is_initialized()
    # as torch: no rank before init_process_group (issue 25 item 21)
    for query in (dist.get_rank, dist.get_world_size):
        with pytest.raises(ValueError, match="has not been initialized"):
            query()
    dist.init_process_group()
    assert dist.get_rank() == 0 and dist.get_world_size() == 1
    try:
        t = dtorch.ones(2)
        dist.all_reduce(t)
        assert t.tolist() == [1, 1]
        with pytest.raises(RuntimeError, match="twice"):
            dist.init_process_group()
    finally:
        dist.destroy_process_group()
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="has not been initialized"):
        dist.all_reduce(dtorch.ones(1))


def test_backend_from_launcher_environment(monkeypatch):
    for v in ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("DTORCH_BACKEND", "bogus")
    with pytest.raises(ValueError, match="Invalid backend: 'bogus'"):
        dist.init_process_group()
    monkeypatch.setenv("DTORCH_BACKEND", "auto")
    dist.init_process_group()
    try:
        assert dist.get_backend() == "threads"    # one rank, no launcher
    finally:
        dist.destroy_process_group()


def test_subgroup_threads():
    def body(rank, ws):
        g = dist.new_group([1, 2])
        if rank in (1, 2):
            t = dtorch.tensor([float(rank)])
            dist.all_reduce(t, group=g)
            assert t.item() == 3
            dist.broadcast(t, src=2, group=g)
            assert dist.get_rank(g) == rank - 1
        else:
            assert g is dist.GroupMember.NON_GROUP_MEMBER
    dist.spawn_threads(body, 3, timeout=20)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("body", BODIES, ids=[b.__name__ for b in BODIES])
def test_mpi(body, mpi_world):
    body(dist.get_rank(), dist.get_world_size())


def test_all_reduce_coalesced_tensors_in_place():
    def body(rank, ws):
        ts = [dtorch.full((3,), float(rank + 1)),
              dtorch.full((2, 2), float(rank + 1))]
        ids = [id(t) for t in ts]
        dist.all_reduce_coalesced(ts, dist.ReduceOp.AVG)
        return [id(t) for t in ts] == ids, [t.tolist() for t in ts]
    for same, vals in dist.spawn_threads(body, 3, timeout=30):
        assert same
        assert vals == [[2.0] * 3, [[2.0, 2.0], [2.0, 2.0]]]
