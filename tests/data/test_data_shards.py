"""Datasets larger than memory (issue 16): ShardedIterableDataset split over
ranks x workers (each sample once per epoch, uneven shards, equal counts
per rank), seeded shuffling, exact resumption, and the memory-mapped token
and array datasets."""
import collections
import os
import warnings

import numpy as np
import pytest

import dtorch
import dtorch.distributed as dist
from dtorch.utils.data import (DataLoader, MemmapArrayDataset,
                               MemmapTokenDataset, ShardedIterableDataset)

SIZES = [7, 3, 11, 5, 1, 0, 9]          # uneven, one empty shard
N = sum(SIZES)


@pytest.fixture
def shards(tmp_path):
    """Shard i holds the global sample ids of its rows (and a second
    field, id * 10, for tuple shards)."""
    paths, start = [], 0
    for i, n in enumerate(SIZES):
        ids = np.arange(start, start + n, dtype=np.int64)
        p, q = tmp_path / f"x{i}.npy", tmp_path / f"y{i}.npy"
        np.save(p, ids)
        np.save(q, ids * 10)
        paths.append((str(p), str(q)))
        start += n
    return paths


def _ids(batches):
    return [int(v) for b in batches for v in b.reshape(-1).tolist()]


def _rank_run(paths, rank, world, nw, bs=4, **kw):
    ds = ShardedIterableDataset([p for p, _ in paths], rank=rank,
                                world_size=world, **kw)
    batches = list(DataLoader(ds, batch_size=bs, num_workers=nw))
    return batches, ds


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("nw", [0, 1, 2])
@pytest.mark.parametrize("drop_last", [False, True])
def test_each_sample_once_over_ranks_and_workers(shards, world, nw,
                                                 drop_last):
    seen = collections.Counter()
    nbatches, counts = set(), set()
    for r in range(world):
        batches, ds = _rank_run(shards, r, world, nw, shuffle=True,
                                buffer_size=3, seed=5, drop_last=drop_last)
        ids = _ids(batches)
        assert len(ids) == len(ds)       # __len__ is what the rank yields
        seen.update(ids)
        nbatches.add(len(batches))
        counts.add(len(ids))
    # every rank yields as many samples and batches: no rank runs out first
    assert len(nbatches) == 1 and len(counts) == 1
    per_rank = N // world if drop_last else -(-N // world)
    assert counts == {per_rank}
    if drop_last:
        assert max(seen.values()) == 1 and sum(seen.values()) == \
            per_rank * world
    else:
        assert set(seen) == set(range(N))
        # only the padding repeats samples, each at most once more
        assert sum(seen.values()) - N == per_rank * world - N
        assert max(seen.values()) <= 2


def test_tuple_shards_and_transform(shards):
    ds = ShardedIterableDataset(shards, transform=lambda s: (s[0], s[1] + 1))
    xs, ys = [], []
    for x, y in DataLoader(ds, batch_size=5, num_workers=2):
        xs += x.tolist()
        ys += y.tolist()
    assert sorted(xs) == list(range(N))
    assert all(y == 10 * x + 1 for x, y in zip(xs, ys))


def test_shuffle_is_seeded_and_changes_with_the_epoch(shards):
    def order(seed, epoch, **kw):
        ds = ShardedIterableDataset([p for p, _ in shards], seed=seed, **kw)
        ds.set_epoch(epoch)
        return _ids(DataLoader(ds, batch_size=4))
    plain = order(0, 0)
    assert plain == list(range(N))
    a = order(1, 0, shuffle=True, buffer_size=4)
    assert sorted(a) == plain and a != plain
    assert order(1, 0, shuffle=True, buffer_size=4) == a
    assert order(1, 1, shuffle=True, buffer_size=4) != a
    assert order(2, 0, shuffle=True, buffer_size=4) != a
    # buffer_size=1: the shard order is shuffled, rows stay in order
    b = order(1, 0, shuffle=True, buffer_size=1)
    runs = [b[0]]                        # where each run of +1 steps starts
    for prev, v in zip(b, b[1:]):
        if v != prev + 1:
            runs.append(v)
    starts = np.cumsum([0] + SIZES[:-1])
    assert set(runs) <= {int(s) for s, n in zip(starts, SIZES) if n}


def test_persistent_workers_follow_set_epoch(shards):
    ds = ShardedIterableDataset([p for p, _ in shards], shuffle=True,
                                buffer_size=2, seed=3)
    loader = DataLoader(ds, batch_size=4, num_workers=2,
                        persistent_workers=True)
    epochs = []
    for e in range(2):
        ds.set_epoch(e)
        epochs.append(_ids(loader))
    fresh = []
    for e in range(2):
        ds.set_epoch(e)
        fresh.append(_ids(DataLoader(ds, batch_size=4, num_workers=2)))
    assert epochs == fresh and epochs[0] != epochs[1]


def _threads_rank(paths, nw):
    def fn(rank, world):
        ds = ShardedIterableDataset([p for p, _ in paths], shuffle=True,
                                    buffer_size=3, seed=1)
        assert (ds.rank, ds.world_size) == (rank, world)
        ids, steps = [], 0
        for b in DataLoader(ds, batch_size=3, num_workers=nw):
            ids += b.tolist()
            # a collective per step: a rank with fewer batches would hang
            t = dtorch.ones(1)
            dist.all_reduce(t)
            assert t.item() == world
            steps += 1
        return ids, steps
    return fn


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("nw", [0, 2])
def test_threads_backend_each_sample_once(shards, world, nw):
    res = dist.spawn_threads(_threads_rank(shards, nw), world, timeout=60)
    ids = collections.Counter(i for r, _ in res for i in r)
    assert set(ids) == set(range(N))
    assert len({s for _, s in res}) == 1
    assert sum(ids.values()) == world * -(-N // world)


@pytest.mark.mpi(min_size=2)
def test_mpi_each_sample_once_with_workers(mpi_world, tmp_path_factory):
    """Under mpiexec -n 2 or 3: real processes, two workers each."""
    world, rank = dist.get_world_size(), dist.get_rank()
    where = [str(tmp_path_factory.mktemp("shards"))] if rank == 0 else [None]
    dist.broadcast_object_list(where, src=0)
    paths = []
    start = 0
    for i, n in enumerate(SIZES):
        p = os.path.join(where[0], f"m{i}.npy")
        if rank == 0:
            np.save(p, np.arange(start, start + n))
        paths.append(p)
        start += n
    dist.barrier()
    ds = ShardedIterableDataset(paths, shuffle=True, buffer_size=3, seed=2)
    ids, steps = [], 0
    for b in DataLoader(ds, batch_size=3, num_workers=2):
        ids += b.tolist()
        t = dtorch.ones(1)
        dist.all_reduce(t)
        steps += 1
    everyone = [None] * world
    dist.all_gather_object(everyone, (ids, steps))
    seen = collections.Counter(i for r, _ in everyone for i in r)
    assert set(seen) == set(range(N))
    assert len({s for _, s in everyone}) == 1
    assert sum(seen.values()) == world * -(-N // world)


# ------------------------------------------------------------ resume ----
def _noisy(sample):
    # randomness drawn in the worker: resumption must restore its RNG
    return sample * 1000 + np.random.randint(0, 1000)


@pytest.mark.parametrize("nw", [0, 1, 2])
@pytest.mark.parametrize("stop", [0, 1, 4])
def test_resume_mid_epoch_is_exact(shards, nw, stop):
    def make():
        ds = ShardedIterableDataset([p for p, _ in shards], shuffle=True,
                                    buffer_size=3, seed=4, transform=_noisy)
        ds.set_epoch(2)
        return DataLoader(ds, batch_size=2, num_workers=nw)
    def seed():                 # each run is the same program from the start
        np.random.seed(0)
        dtorch.manual_seed(0)
    seed()
    full = [b.tolist() for b in make()]
    seed()
    loader = make()
    it = iter(loader)
    head = [next(it).tolist() for _ in range(stop)]
    state = loader.state_dict()
    del it
    seed()
    again = make()
    again.load_state_dict(state)
    tail = [b.tolist() for b in again]
    if nw == 0:     # the main process's RNG is the script's: compare ids
        full = [[v // 1000 for v in b] for b in full]
        head = [[v // 1000 for v in b] for b in head]
        tail = [[v // 1000 for v in b] for b in tail]
    assert head + tail == full


@pytest.mark.parametrize("old,new", [((2, 2), (3, 1)), ((3, 1), (2, 2)),
                                     ((2, 0), (1, 2)), ((4, 2), (2, 0))])
def test_resume_on_another_world_size_covers_the_rest(shards, old, new):
    (w0, nw0), (w1, nw1) = old, new
    seen = collections.Counter()
    state = None
    for r in range(w0):
        ds = ShardedIterableDataset([p for p, _ in shards], shuffle=True,
                                    buffer_size=3, seed=6, rank=r,
                                    world_size=w0)
        loader = DataLoader(ds, batch_size=2, num_workers=nw0)
        it = iter(loader)
        for _ in range(3):
            seen.update(next(it).tolist())
        state = loader.state_dict()      # every rank's is the same
        del it
        _check_plain(state)
    first = sum(seen.values())
    counts = set()
    for r in range(w1):
        ds = ShardedIterableDataset([p for p, _ in shards], shuffle=True,
                                    buffer_size=3, seed=6, rank=r,
                                    world_size=w1)
        loader = DataLoader(ds, batch_size=2, num_workers=nw1)
        loader.load_state_dict(state)
        with warnings.catch_warnings():
            # the workers' RNG starts afresh on another worker count
            warnings.simplefilter("ignore")
            ids = _ids(loader)
        counts.add(len(ids))
        seen.update(ids)
    assert set(seen) == set(range(N))
    assert len(counts) == 1                # still equal per rank
    # N = 36 divides evenly over w0 ranks: repeats come only from the
    # padding of the rest over the new ranks
    assert first == 6 * w0
    assert sum(seen.values()) - N == -(-(N - first) // w1) * w1 - (N - first)


def _check_plain(obj):
    """What a checkpoint carries: dicts, lists, scalars, int64 arrays."""
    if isinstance(obj, dict):
        for v in obj.values():
            _check_plain(v)
    elif isinstance(obj, list):
        for v in obj:
            _check_plain(v)
    elif isinstance(obj, np.ndarray):
        assert obj.dtype == np.int64
    else:
        assert obj is None or type(obj) in (int, float, bool, str), obj


def test_state_of_another_shard_set_is_refused(shards, tmp_path):
    ds = ShardedIterableDataset([p for p, _ in shards])
    loader = DataLoader(ds, batch_size=2)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    np.save(tmp_path / "other.npy", np.arange(3))
    other = DataLoader(ShardedIterableDataset([str(tmp_path / "other.npy")]),
                       batch_size=2)
    other.load_state_dict(state)
    with pytest.raises(ValueError, match="state is for 36 samples"):
        list(other)


# --------------------------------------------------------- bad input ----
def test_empty_shard_list_fails_at_construction():
    with pytest.raises(ValueError, match="shard list is empty"):
        ShardedIterableDataset([], rank=1, world_size=2)
    with pytest.raises(TypeError, match="list of paths"):
        ShardedIterableDataset("one.npy")


def test_missing_and_truncated_shards_name_file_and_rank(shards, tmp_path):
    missing = str(tmp_path / "nope.npy")
    with pytest.raises(FileNotFoundError,
                       match=r"shard '.*nope\.npy' \(rank 1\) does not exist"):
        ShardedIterableDataset([shards[0][0], missing], rank=1, world_size=2)
    bad = tmp_path / "cut.npy"
    np.save(bad, np.arange(100))
    with open(bad, "r+b") as f:
        f.truncate(os.path.getsize(bad) - 16)
    with pytest.raises(ValueError,
                       match=r"shard '.*cut\.npy' \(rank 0\) is truncated"):
        ShardedIterableDataset([str(bad)])
    with pytest.raises(ValueError, match="different row counts"):
        ShardedIterableDataset([(shards[0][0], shards[1][1])])


def test_shard_removed_after_construction_is_named_by_the_worker(tmp_path):
    a, b = tmp_path / "a.npy", tmp_path / "b.npy"
    np.save(a, np.arange(4))
    np.save(b, np.arange(4, 8))
    ds = ShardedIterableDataset([str(a), str(b)], rank=0, world_size=1)
    os.remove(b)
    with pytest.raises(FileNotFoundError,
                       match=r"b\.npy' \(rank 0\) does not exist"):
        list(DataLoader(ds, batch_size=2, num_workers=1))


# ------------------------------------------------------- memory maps ----
@pytest.mark.parametrize("dtype", ["uint16", "uint32"])
@pytest.mark.parametrize("stride", [None, 1, 3])
def test_token_windows_equal_slices_of_the_file(tmp_path, dtype, stride):
    rng = np.random.default_rng(0)
    hi = 60000 if dtype == "uint16" else 2 ** 31
    tokens = rng.integers(0, hi, 103).astype(dtype)
    path = tmp_path / "train.bin"
    tokens.tofile(path)
    ds = MemmapTokenDataset(path, block_size=8, dtype=dtype, stride=stride)
    assert isinstance(ds.tokens, np.memmap)      # mapped, not read in
    step = 8 if stride is None else stride
    assert len(ds) == (103 - 9) // step + 1
    for i in range(len(ds)):
        x, y = ds[i]
        s = i * step
        assert x.dtype == np.int64
        assert x.tolist() == tokens[s:s + 8].tolist()
        assert y.tolist() == tokens[s + 1:s + 9].tolist()
    got = ds.__getitems__([3, 0, len(ds) - 1])
    for (x, y), i in zip(got, [3, 0, len(ds) - 1]):
        assert x.tolist() == ds[i][0].tolist()
        assert y.tolist() == ds[i][1].tolist()
    # through workers, shuffled: every batch row is a slice of the file
    g = dtorch.Generator().manual_seed(0)
    for x, y in DataLoader(ds, batch_size=4, shuffle=True, num_workers=2,
                           generator=g):
        for row_x, row_y in zip(x.tolist(), y.tolist()):
            s = next(i * step for i in range(len(ds))
                     if tokens[i * step:i * step + 8].tolist() == row_x)
            assert row_y == tokens[s + 1:s + 9].tolist()
    with pytest.raises(IndexError):
        ds[len(ds)]


def test_token_file_errors(tmp_path):
    p = tmp_path / "t.bin"
    np.arange(11, dtype=np.uint16).tofile(p)
    with open(p, "ab") as f:
        f.write(b"\x01")                   # half a token
    with pytest.raises(ValueError, match=r"t\.bin' \(rank 0\) is truncated"):
        MemmapTokenDataset(p, block_size=4)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        MemmapTokenDataset(tmp_path / "none.bin", block_size=4)
    np.arange(4, dtype=np.uint32).tofile(p)
    with pytest.raises(ValueError, match="fewer than block_size"):
        MemmapTokenDataset(p, block_size=4, dtype="uint32")
    with pytest.raises(TypeError, match="integer type"):
        MemmapTokenDataset(p, block_size=1, dtype="float32")


def test_memmap_array_dataset(tmp_path):
    x = np.arange(60, dtype=np.float32).reshape(20, 3)
    y = np.arange(20) % 4
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    ds = MemmapArrayDataset(tmp_path / "x.npy", tmp_path / "y.npy")
    assert len(ds) == 20
    assert all(isinstance(a, np.memmap) for a in ds.arrays)
    assert ds[5][0].tolist() == x[5].tolist() and ds[-1][1] == y[-1]
    xs, ys = [], []
    for xb, yb in DataLoader(ds, batch_size=6, num_workers=2):
        xs.append(xb.numpy())
        ys.append(yb.numpy())
    assert np.array_equal(np.concatenate(xs), x)
    assert np.array_equal(np.concatenate(ys), y)
    single = MemmapArrayDataset(tmp_path / "x.npy")
    assert single[2].tolist() == x[2].tolist()
    np.save(tmp_path / "z.npy", np.arange(3))
    with pytest.raises(ValueError, match="different row counts"):
        MemmapArrayDataset(tmp_path / "x.npy", tmp_path / "z.npy")
    with pytest.raises(IndexError):
        ds[20]
