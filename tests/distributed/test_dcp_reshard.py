"""Resharding on load: a checkpoint written on N ranks loads on M, for
every pair of 1..4 (row, column and uneven flat shards - an empty one
included - replicated tensors, values), and tensor-parallel layouts change
(TP=2 -> TP=1, DP x TP, and back) with the optimizer's state. Ranks are
threads (spawn_threads); test_dcp_mpi.py repeats a pair under mpiexec."""
import os

import numpy as np
import pytest

import dtorch
import dtorch.distributed as dist
import dtorch.distributed.checkpoint as dcp
from dtorch import nn
from dtorch.distributed.checkpoint.state_dict import (get_state_dict,
                                                      set_state_dict)
from dtorch.nn.parallel import tensor_parallel as tp
from helpers import train_steps

if "OMPI_COMM_WORLD_SIZE" in os.environ or "PMI_SIZE" in os.environ:
    pytest.skip("single-process tests; not run under mpiexec",
                allow_module_level=True)

F64 = dtorch.float64
ROWS = np.arange(60.0).reshape(12, 5)
COLS = np.arange(48.0).reshape(4, 12) * -1
FLAT = np.arange(10.0) + 0.5
TINY = np.arange(5, dtype=np.int64)
BIAS = np.array([3.0, 1.0, 4.0])


def _flat_box(n, world, rank):
    """ZeRO-style: chunks of ceil(n / world), the last ones short or
    empty."""
    k = -(-n // world)
    lo = min(rank * k, n)
    return lo, min(lo + k, n)


def _state(world, rank, fill=None):
    """This rank's shards of the global tensors (or zeros of their
    shapes with fill=0)."""
    def cut(a, lo, hi, dim):
        idx = [slice(None)] * a.ndim
        idx[dim] = slice(lo, hi)
        part = a[tuple(idx)]
        part = np.zeros_like(part) if fill is not None else part.copy()
        off = [0] * a.ndim
        off[dim] = lo
        return dcp.shard_of(dtorch.from_numpy(part), a.shape, off)
    r = ROWS.shape[0] // world
    c = COLS.shape[1] // world
    return {
        "rows": cut(ROWS, rank * r, (rank + 1) * r, 0),
        "cols": cut(COLS, rank * c, (rank + 1) * c, 1),
        "flat": cut(FLAT, *_flat_box(FLAT.size, world, rank), 0),
        "tiny": cut(TINY, *_flat_box(TINY.size, world, rank), 0),
        "bias": dtorch.from_numpy(BIAS * (0 if fill is not None else 1)),
        "meta": {"epoch": 7 if fill is None else 0, "name": "run"},
    }


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("m", [1, 2, 3, 4])
def test_reshard_n_to_m(tmp_path, n, m):
    path = str(tmp_path / "c")
    dist.spawn_threads(lambda r, w: dcp.save(_state(w, r),
                                             checkpoint_id=path), n,
                       timeout=60)
    files = sorted(f for f in os.listdir(path) if f.endswith("tensors"))
    assert files == [f"__{r}_0.safetensors" for r in range(n)]

    def load(rank, world):
        st = _state(world, rank, fill=0)
        dcp.load(st, checkpoint_id=path)
        want = _state(world, rank)
        for k in ("rows", "cols", "flat", "tiny", "bias"):
            assert st[k].dtype == want[k].dtype
            assert np.array_equal(st[k].numpy(), want[k].numpy()), \
                f"{n}->{m} rank {rank} {k}"
        assert st["meta"] == {"epoch": 7, "name": "run"}
        return True
    assert all(dist.spawn_threads(load, m, timeout=60))


def test_shard_of_checks_the_box():
    with pytest.raises(ValueError, match="does not fit"):
        dcp.shard_of(dtorch.zeros(3, 2), (4, 2), (2, 0))


def test_shards_that_do_not_tile_are_refused(tmp_path):
    path = str(tmp_path / "c")

    def body(rank, world):
        t = dcp.shard_of(dtorch.ones(2), (6,), (rank * 2,))   # 4 of 6
        with pytest.raises(dcp.CheckpointException, match="cover 4 of"):
            dcp.save({"t": t}, checkpoint_id=path)
        return True
    assert all(dist.spawn_threads(body, 2, timeout=60))
    assert not os.path.exists(path)


# -------------------------------------------------- tensor parallel --

def _make_full(seed):
    dtorch.manual_seed(seed)
    return nn.Linear(6, 8).to(F64), nn.Linear(8, 4).to(F64)


# made here, not in the rank threads: they share the default generator,
# and the order of their draws would be the scheduler's
_FULL = {seed: _make_full(seed) for seed in (1, 2)}


def _full_layers(seed):
    return _FULL[seed]


def _tp_model(tp_size, seed):
    """A Column -> Row MLP cut from full layers made with ``seed``, on this
    rank's TP group (DP replicas: the other groups)."""
    l1, l2 = _full_layers(seed)
    _, g = tp.make_dp_tp_groups(tp_size)
    return nn.Sequential(
        tp.ColumnParallelLinear.from_linear(l1, g, gather_output=False),
        nn.Tanh(),
        tp.RowParallelLinear.from_linear(l2, g, input_is_parallel=True))


X = np.linspace(-1, 1, 30).reshape(5, 6)


def _save_tp(path, world, tp_size):
    """Train a few Adam steps (same batch on every DP replica, so they
    stay equal) and save; returns the full model and optimizer state."""
    def body(rank, n):
        m = _tp_model(tp_size, seed=1)
        opt = dtorch.optim.Adam(m.parameters(), lr=0.05)
        for _ in range(3):
            opt.zero_grad()
            m(dtorch.from_numpy(X)).pow(2).sum().backward()
            opt.step()
        msd, osd = get_state_dict(m, opt)
        dcp.save({"model": msd, "optim": osd, "step": 3},
                 checkpoint_id=path)
        full = {k: v.numpy().copy()
                for k, v in tp.gather_state_dict(m).items()}
        fo = tp.gather_optimizer_state_dict(m, opt)["state"]
        for i, st in fo.items():
            for k, v in st.items():
                full[f"opt{i}.{k}"] = v.numpy().copy()
        return full
    return dist.spawn_threads(body, world, timeout=60)[0]


def _load_tp(path, world, tp_size, want):
    def body(rank, n):
        m = _tp_model(tp_size, seed=2)            # other values
        opt = dtorch.optim.Adam(m.parameters(), lr=0.05)
        msd, osd = get_state_dict(m, opt)
        st = {"model": msd, "optim": osd, "step": 0}
        dcp.load(st, checkpoint_id=path)
        set_state_dict(m, opt, model_state_dict=msd, optim_state_dict=osd)
        got = {k: v.numpy() for k, v in tp.gather_state_dict(m).items()}
        for i, s in tp.gather_optimizer_state_dict(m, opt)["state"].items():
            for k, v in s.items():
                got[f"opt{i}.{k}"] = v.numpy()
        assert got.keys() == want.keys()
        for k in want:
            assert got[k].tobytes() == want[k].tobytes(), \
                f"rank {rank} (TP {tp_size} of {world}): {k}"
        assert st["step"] == 3
        return True
    assert all(dist.spawn_threads(body, world, timeout=60))


@pytest.mark.parametrize("src,dst", [
    ((2, 2), (1, 1)),      # TP=2 -> one process
    ((2, 2), (2, 1)),      # TP=2 -> DP=2, TP=1
    ((2, 2), (4, 2)),      # TP=2 -> DP=2 x TP=2
    ((2, 1), (2, 2)),      # DP=2 -> TP=2
    ((4, 2), (2, 2)),      # DP=2 x TP=2 -> TP=2
    ((1, 1), (4, 4)),      # one process -> TP=4
])
def test_tensor_parallel_layout_changes_with_optimizer_state(tmp_path, src,
                                                             dst):
    path = str(tmp_path / "c")
    want = _save_tp(path, *src)
    _load_tp(path, *dst, want)


def test_tp_shards_are_written_by_their_owners_once(tmp_path):
    """DP=2 x TP=2: each TP shard is written once (by the lowest DP
    replica); ranks 2 and 3 hold only copies and write nothing."""
    path = str(tmp_path / "c")
    _save_tp(path, 4, 2)
    files = sorted(f for f in os.listdir(path) if f.endswith("tensors"))
    assert files == ["__0_0.safetensors", "__1_0.safetensors"]
    meta = dcp.FileSystemReader(path).read_metadata()
    w = meta.state_dict_metadata["model.0.weight"]
    assert w.size == [8, 6]
    assert sorted((c.offsets, c.sizes) for c in w.chunks) == [
        ([0, 0], [4, 6]), ([4, 0], [4, 6])]
    assert meta.raw["layout"]["sharded"]["model.2.weight"] == [[0, 0],
                                                               [0, 4]]


def test_per_rank_values_on_another_world_size(tmp_path):
    """Values that differed between the saving ranks (RNG states): a rank
    of the saving world gets its own; a rank beyond it gets the lowest
    saving rank's, with a warning naming the keys."""
    path = str(tmp_path / "c")
    dist.spawn_threads(lambda r, w: dcp.save(
        {"own": dtorch.full((2,), float(r)), "r": r, "same": 5},
        checkpoint_id=path), 2, timeout=60)

    def load(rank, world):
        st = {"own": dtorch.zeros(2), "r": -1, "same": 0}
        dcp.load(st, checkpoint_id=path)
        return st["own"].numpy().tolist(), st["r"], st["same"]

    # (warnings are process-wide: caught here, around all the threads)
    with pytest.warns(UserWarning) as rec:
        res = dist.spawn_threads(load, 3, timeout=60)
    assert res == [([0.0, 0.0], 0, 5), ([1.0, 1.0], 1, 5),
                   ([0.0, 0.0], 0, 5)]
    msgs = [str(x.message) for x in rec]
    assert len(msgs) == 1 and "rank 2" in msgs[0] and "'own'" in msgs[0] \
        and "'r'" in msgs[0] and "2-rank world" in msgs[0], msgs


def test_format_utils_round_trip(tmp_path):
    """dcp_to_torch_save assembles a 3-rank checkpoint offline into one
    dtorch.save file; torch_save_to_dcp turns a file into a checkpoint
    that loads on 2 ranks. A dtorch.save file at the checkpoint's path is
    replaced by the directory."""
    path = str(tmp_path / "c")
    dtorch.save({"old": dtorch.ones(1)}, path)       # a file there first
    dist.spawn_threads(lambda r, w: dcp.save(_state(w, r),
                                             checkpoint_id=path), 3,
                       timeout=60)
    assert os.path.isdir(path)
    assert not [n for n in os.listdir(tmp_path) if n != "c"]
    from dtorch.distributed.checkpoint.format_utils import (
        dcp_to_torch_save, torch_save_to_dcp)
    dcp_to_torch_save(path, str(tmp_path / "whole.st"))
    whole = dtorch.load(str(tmp_path / "whole.st"))
    assert np.array_equal(whole["rows"].numpy(), ROWS)
    assert np.array_equal(whole["cols"].numpy(), COLS)
    assert np.array_equal(whole["tiny"].numpy(), TINY)
    assert whole["meta"] == {"epoch": 7, "name": "run"}
    torch_save_to_dcp(str(tmp_path / "whole.st"), str(tmp_path / "d"))

    def load(rank, world):
        st = _state(world, rank, fill=0)
        st["meta"] = {"epoch": 0, "name": ""}
        dcp.load(st, checkpoint_id=str(tmp_path / "d"))
        return np.array_equal(st["rows"].numpy(),
                              _state(world, rank)["rows"].numpy()) \
            and st["meta"]["epoch"] == 7
    assert all(dist.spawn_threads(load, 2, timeout=60))


# ------------------------------------------------ sharded optimizer --

_ZERO_NET = _make_full(3)[0]        # Linear(6, 8): 56 elements
ZX = np.linspace(-1, 1, 24).reshape(4, 6)


def _zero_model():
    m = nn.Linear(6, 8).to(F64)
    m.load_state_dict(_ZERO_NET.state_dict())
    return m


def _train(m, opt):
    train_steps(opt, lambda: m(dtorch.from_numpy(ZX)).pow(2).sum(), 3)


def _full_opt_state(m, opt, zero):
    """{name: array} of the parameters and the whole optimizer state."""
    out = {k: v.numpy().copy() for k, v in m.state_dict().items()}
    if zero:
        opt.consolidate_state_dict(to=0)
        if dist.get_rank() != 0:
            return out
    for i, st in opt.state_dict()["state"].items():
        for k, v in st.items():
            out[f"{i}.{k}"] = np.asarray(v.numpy()).copy()
    return out


def _run_opt(world, zero, path, save):
    from dtorch.distributed.optim import ZeroRedundancyOptimizer as ZeRO

    def body(rank, n):
        m = _zero_model()
        opt = ZeRO(m.parameters(), dtorch.optim.Adam, lr=0.05) if zero \
            else dtorch.optim.Adam(m.parameters(), lr=0.05)
        if save:
            _train(m, opt)
            msd, osd = get_state_dict(m, opt)
            dcp.save({"model": msd, "optim": osd}, checkpoint_id=path)
        else:
            msd, osd = get_state_dict(m, opt)
            dcp.load({"model": msd, "optim": osd}, checkpoint_id=path)
            set_state_dict(m, opt, model_state_dict=msd,
                           optim_state_dict=osd)
        return _full_opt_state(m, opt, zero)
    return dist.spawn_threads(body, world, timeout=60)[0]


@pytest.mark.parametrize("src,dst", [
    ((2, True), (3, True)),      # ZeRO on 2 ranks -> ZeRO on 3
    ((3, True), (1, False)),     # ZeRO -> a plain Adam in one process
    ((1, False), (2, True)),     # plain Adam -> ZeRO on 2
])
def test_sharded_optimizer_state_reshards(tmp_path, src, dst):
    """ZeroRedundancyOptimizer's element-wise shards are saved by their
    owners as flat pieces of each parameter's state; they load on
    another world size and into (or from) a plain optimizer's whole
    tensors, bitwise."""
    path = str(tmp_path / "c")
    want = _run_opt(src[0], src[1], path, save=True)
    if src[1]:
        meta = dcp.FileSystemReader(path).read_metadata()
        e = meta.raw["state_dict_metadata"]["optim.state.weight.exp_avg"]
        assert e["size"] == [48] and e["flat_of"] == [8, 6]
        assert len(e["chunks"]) == src[0]
    got = _run_opt(dst[0], dst[1], path, save=False)
    assert got.keys() == want.keys() and "0.exp_avg" in got
    for k in want:
        assert got[k].tobytes() == want[k].tobytes(), k
    # and a flat checkpoint still refuses a tensor of another shape
    if src[1]:
        with pytest.raises(dcp.CheckpointException, match="size mismatch"):
            dcp.load({"optim": {"state": {"weight": {
                "exp_avg": dtorch.zeros(6, 8, dtype=F64)}}}},
                checkpoint_id=path)
