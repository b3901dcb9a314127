"""dcp under mpiexec (-n 2 and -n 3): a checkpoint written by the world
loads on every smaller group and the other way round (resharding over
the MPI backend), and async_save's background thread writes while the
training thread runs its own collectives on the world."""
import shutil
import tempfile

import numpy as np
import pytest

import dtorch
import dtorch.distributed as dist
import dtorch.distributed.checkpoint as dcp

ROWS = np.arange(72.0).reshape(12, 6)


def _shared_dir(dist):
    path = [tempfile.mkdtemp(prefix="dcp-mpi-") if dist.get_rank() == 0
            else None]
    dist.broadcast_object_list(path, src=0)
    return path[0]


def _rows(world, rank, zero=False):
    k = 12 // world
    part = ROWS[rank * k:(rank + 1) * k]
    part = np.zeros_like(part) if zero else part.copy()
    return dcp.shard_of(dtorch.from_numpy(part), ROWS.shape, (rank * k, 0))


def _groups(dist, sizes):
    """{m: group of global ranks 0..m-1 (None on the others)} - new_group
    is collective over the world, so every rank makes every group."""
    out = {}
    for m in sizes:
        g = dist.new_group(list(range(m)))
        out[m] = None if g is dist.GroupMember.NON_GROUP_MEMBER else g
    return out


@pytest.mark.mpi(min_size=2)
def test_world_to_every_smaller_group_and_back(mpi_world):
    dist = mpi_world
    n, rank = dist.get_world_size(), dist.get_rank()
    root = _shared_dir(dist)
    try:
        groups = _groups(dist, range(1, n + 1))
        dcp.save({"rows": _rows(n, rank), "epoch": 3},
                 checkpoint_id=f"{root}/world")
        for m, g in groups.items():
            if g is None:
                continue
            st = {"rows": _rows(m, g.rank, zero=True), "epoch": 0}
            dcp.load(st, checkpoint_id=f"{root}/world", process_group=g)
            assert np.array_equal(st["rows"].numpy(),
                                  _rows(m, g.rank).numpy()), (m, rank)
            assert st["epoch"] == 3
        # written by a smaller group, read by the world
        for m, g in groups.items():
            if g is not None:
                dcp.save({"rows": _rows(m, g.rank)},
                         checkpoint_id=f"{root}/g{m}", process_group=g)
        dist.barrier()
        for m in groups:
            st = {"rows": _rows(n, rank, zero=True)}
            dcp.load(st, checkpoint_id=f"{root}/g{m}")
            assert np.array_equal(st["rows"].numpy(),
                                  _rows(n, rank).numpy()), (m, rank)
    finally:
        dist.barrier()
        if rank == 0:
            shutil.rmtree(root, ignore_errors=True)


@pytest.mark.mpi(min_size=2)
def test_async_save_next_to_training_collectives(mpi_world):
    dist = mpi_world
    n, rank = dist.get_world_size(), dist.get_rank()
    root = _shared_dir(dist)
    try:
        w = dtorch.full((1 << 14,), float(rank))
        futs = []
        for step in range(3):
            futs.append(dcp.async_save({"w": w, "step": step},
                                       checkpoint_id=f"{root}/s{step}"))
            g = dtorch.ones(256) * (rank + 1)
            dist.all_reduce(g)          # training's collective meanwhile
            assert g[0].item() == n * (n + 1) / 2
            w += 1
        for f in futs:
            f.result(timeout=120)
        for step in range(3):
            st = {"w": dtorch.zeros(1 << 14), "step": -1}
            dcp.load(st, checkpoint_id=f"{root}/s{step}")
            assert st["w"][0].item() == rank + step and st["step"] == step
    finally:
        dist.barrier()
        if rank == 0:
            shutil.rmtree(root, ignore_errors=True)
