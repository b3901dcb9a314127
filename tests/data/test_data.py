"""utils.data: datasets, samplers, collation and the DataLoader, with and
without worker processes."""
import collections
import gc
import os
import time

import numpy as np
import pytest

import dtorch
from dtorch.utils.data import (BatchSampler, ConcatDataset, DataLoader,
                               Dataset, IterableDataset, RandomSampler,
                               SequentialSampler, Subset,
                               SubsetRandomSampler, TensorDataset,
                               default_collate, get_worker_info,
                               random_split)


def _children():
    """Live (non-zombie) and zombie child pids of this process."""
    kids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid():
            kids.append((int(pid), fields[0]))
    return kids


def _wait_no_children(before, timeout=30.0):
    # returns as soon as they are gone; a worker's exit under load > 10
    # took more than 5 s
    deadline = time.time() + timeout
    while time.time() < deadline:
        extra = [k for k in _children() if k[0] not in before]
        if not extra:
            return []
        time.sleep(0.05)
    return extra


@pytest.fixture
def no_leaks():
    before = {pid for pid, _ in _children()}
    yield
    gc.collect()
    assert _wait_no_children(before) == []


def _ds(n=10):
    x = dtorch.arange(n * 2.0).reshape(n, 2)
    return TensorDataset(x, dtorch.arange(n))


def _as_lists(loader):
    return [[t.tolist() if isinstance(t, dtorch.Tensor) else t for t in b]
            for b in loader]


# ------------------------------------------------------------ datasets --

def test_tensor_dataset():
    ds = _ds(4)
    assert len(ds) == 4
    x, y = ds[2]
    assert x.tolist() == [4.0, 5.0] and y.item() == 2
    with pytest.raises(AssertionError, match="Size mismatch"):
        TensorDataset(dtorch.zeros(3), dtorch.zeros(4))


def test_concat_and_subset():
    a, b = _ds(3), _ds(4)
    c = ConcatDataset([a, b])
    assert len(c) == 7 and c.cumulative_sizes == [3, 7]
    assert c[3][1].item() == 0 and c[-1][1].item() == 3
    assert len(a + b) == 7
    s = Subset(c, [6, 0])
    assert len(s) == 2 and s[0][1].item() == 3


def test_random_split():
    g = dtorch.Generator().manual_seed(0)
    parts = random_split(range(10), [3, 7], generator=g)
    assert [len(p) for p in parts] == [3, 7]
    assert sorted(parts[0].indices + parts[1].indices) == list(range(10))
    parts = random_split(range(11), [0.5, 0.3, 0.2],
                         generator=dtorch.Generator().manual_seed(0))
    assert [len(p) for p in parts] == [6, 3, 2]     # remainder round-robin
    again = random_split(range(11), [0.5, 0.3, 0.2],
                         generator=dtorch.Generator().manual_seed(0))
    assert [p.indices for p in parts] == [p.indices for p in again]
    with pytest.raises(ValueError, match="Sum of input lengths"):
        random_split(range(10), [3, 3])


# ------------------------------------------------------------ samplers --

def test_samplers():
    assert list(SequentialSampler(range(4))) == [0, 1, 2, 3]
    g = dtorch.Generator().manual_seed(1)
    perm = list(RandomSampler(range(6), generator=g))
    assert sorted(perm) == list(range(6))
    draws = list(RandomSampler(range(3), replacement=True, num_samples=40,
                               generator=g))
    assert len(draws) == 40 and set(draws) <= {0, 1, 2}
    more = list(RandomSampler(range(4), num_samples=10, generator=g))
    assert len(more) == 10 and sorted(more[:4]) == [0, 1, 2, 3]
    sub = list(SubsetRandomSampler([10, 20, 30], generator=g))
    assert sorted(sub) == [10, 20, 30]
    with pytest.raises(ValueError, match="num_samples should be a positive"):
        RandomSampler(range(3), num_samples=0)
    with pytest.raises(TypeError, match="replacement should be a boolean"):
        RandomSampler(range(3), replacement=1)


def test_random_sampler_follows_manual_seed():
    dtorch.manual_seed(3)
    a = list(RandomSampler(range(20)))
    dtorch.manual_seed(3)
    assert list(RandomSampler(range(20))) == a


def test_batch_sampler():
    bs = BatchSampler(SequentialSampler(range(5)), 2, drop_last=False)
    assert list(bs) == [[0, 1], [2, 3], [4]] and len(bs) == 3
    bs = BatchSampler(SequentialSampler(range(5)), 2, drop_last=True)
    assert list(bs) == [[0, 1], [2, 3]] and len(bs) == 2
    with pytest.raises(ValueError, match="batch_size should be a positive"):
        BatchSampler(range(3), 0, False)
    with pytest.raises(ValueError, match="drop_last should be a boolean"):
        BatchSampler(range(3), 1, 0)


# ------------------------------------------------------------- collate --

def test_default_collate():
    Point = collections.namedtuple("Point", "x y")
    batch = [{"a": np.ones(2, np.float32), "b": 1, "c": 0.5, "s": "u",
              "t": (dtorch.zeros(3), [1, 2]), "p": Point(1, 2.0)}
             for _ in range(4)]
    out = default_collate(batch)
    assert out["a"].shape == (4, 2) and out["a"].dtype == dtorch.float32
    assert out["b"].dtype == dtorch.int64 and out["b"].tolist() == [1] * 4
    assert out["c"].dtype == dtorch.float64
    assert out["s"] == ["u"] * 4
    assert isinstance(out["t"], list) and out["t"][0].shape == (4, 3)
    assert out["t"][1][1].tolist() == [2] * 4
    assert isinstance(out["p"], Point) and out["p"].y.dtype == dtorch.float64
    assert default_collate([True, False]).dtype == dtorch.bool
    with pytest.raises(RuntimeError, match="equal size"):
        default_collate([[1, 2], [1]])
    with pytest.raises(TypeError, match="default_collate: batch must"):
        default_collate([object()])


# ---------------------------------------------------------- DataLoader --

def test_loader_basics():
    loader = DataLoader(_ds(10), batch_size=4)
    batches = list(loader)
    assert len(loader) == 3 and len(batches) == 3
    assert batches[0][0].shape == (4, 2) and batches[-1][1].tolist() == [8, 9]
    assert len(DataLoader(_ds(10), batch_size=4, drop_last=True)) == 2
    # batch_size=None: samples unbatched, arrays converted to tensors
    items = list(DataLoader([np.zeros(2), np.ones(2)], batch_size=None))
    assert isinstance(items[0], dtorch.Tensor) and items[1].tolist() == [1, 1]
    custom = DataLoader(_ds(4), batch_size=2, collate_fn=lambda b: len(b))
    assert list(custom) == [2, 2]
    bs = BatchSampler(SequentialSampler(range(5)), 3, False)
    assert [b[1].tolist() for b in DataLoader(_ds(5), batch_sampler=bs)] \
        == [[0, 1, 2], [3, 4]]


def test_loader_option_errors():
    ds = _ds(4)
    with pytest.raises(ValueError, match="mutually exclusive with shuffle"):
        DataLoader(ds, sampler=SequentialSampler(ds), shuffle=True)
    with pytest.raises(ValueError, match="batch_sampler option is mutually"):
        DataLoader(ds, batch_sampler=[[0]], batch_size=2)
    with pytest.raises(ValueError, match="num_workers option should be"):
        DataLoader(ds, num_workers=-1)
    with pytest.raises(ValueError, match="persistent_workers option needs"):
        DataLoader(ds, persistent_workers=True)
    with pytest.raises(ValueError, match="prefetch_factor option could"):
        DataLoader(ds, prefetch_factor=2)


def test_shuffle_is_reproducible_with_generator():
    def run():
        g = dtorch.Generator().manual_seed(7)
        return _as_lists(DataLoader(_ds(12), batch_size=5, shuffle=True,
                                    generator=g))
    a = run()
    assert a == run()
    assert sorted(sum((b[1] for b in a), [])) == list(range(12))


class Seeded(Dataset):
    """Each sample carries a random number drawn in the process that
    fetched it, and the worker id."""

    def __len__(self):
        return 12

    def __getitem__(self, i):
        info = get_worker_info()
        wid = -1 if info is None else info.id
        return i, dtorch.rand(1).item(), wid


def test_workers_yield_the_same_batches(no_leaks):
    def run(workers):
        g = dtorch.Generator().manual_seed(0)
        return _as_lists(DataLoader(_ds(23), batch_size=4, shuffle=True,
                                    generator=g, num_workers=workers))
    want = run(0)
    assert run(2) == want
    assert run(3) == want


def test_worker_seeds_and_info(no_leaks):
    def run():
        g = dtorch.Generator().manual_seed(5)
        return _as_lists(DataLoader(Seeded(), batch_size=2, num_workers=2,
                                    generator=g))
    a = run()
    assert a == run()                      # seeds from the generator
    assert [b[2] for b in a] == [[0, 0], [1, 1]] * 3   # round-robin
    draws = sum((b[1] for b in a), [])
    assert len(set(draws)) == len(draws)   # workers' streams differ
    seeds = []

    def init(wid):
        seeds.append(wid)
        info = get_worker_info()
        assert info.id == wid and info.num_workers == 2
        assert info.seed == info.seed // 1 and info.dataset is not None
    assert get_worker_info() is None
    list(DataLoader(Seeded(), batch_size=2, num_workers=2,
                    worker_init_fn=init))


class Failing(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 5:
            raise KeyError(f"bad sample {i}")
        return i


def test_worker_exception_has_traceback(no_leaks):
    loader = DataLoader(Failing(), batch_size=2, num_workers=2)
    with pytest.raises(KeyError) as e:
        list(loader)
    msg = str(e.value)
    assert "Caught KeyError in DataLoader worker process 0" in msg
    assert "Traceback (most recent call last)" in msg
    assert "bad sample 5" in msg and "__getitem__" in msg


def test_worker_init_fn_error(no_leaks):
    def init(wid):
        raise ValueError("init failed")
    with pytest.raises(ValueError, match="init failed"):
        list(DataLoader(_ds(4), num_workers=2, worker_init_fn=init))


def test_unpicklable_batch_is_reported(no_leaks):
    loader = DataLoader(_ds(4), batch_size=2, num_workers=1,
                        collate_fn=lambda b: (lambda: b))
    with pytest.raises(Exception, match="DataLoader worker process 0"):
        next(iter(loader))


def test_no_zombies_after_break_and_delete(no_leaks):
    # this process's other children (an earlier test's, in an xdist
    # worker) are not this loader's
    before = {pid for pid, _ in _children()}
    loader = DataLoader(_ds(40), batch_size=2, num_workers=2)
    it = iter(loader)
    next(it)
    pids = [w.pid for w in it._workers]
    assert all(os.path.exists(f"/proc/{p}") for p in pids)
    del it
    gc.collect()
    assert _wait_no_children(before) == []
    for _ in loader:           # exhaustion shuts workers down, too
        pass


def test_persistent_workers(no_leaks):
    loader = DataLoader(_ds(9), batch_size=2, num_workers=2,
                        persistent_workers=True, shuffle=True,
                        generator=dtorch.Generator().manual_seed(0))
    e1 = _as_lists(loader)
    pids = [w.pid for w in loader._iterator._workers]
    it = iter(loader)
    next(it)                   # leave an epoch half done
    e3 = _as_lists(loader)
    assert [w.pid for w in loader._iterator._workers] == pids
    assert len(e1) == len(e3) == 5
    assert sorted(sum((b[1] for b in e3), [])) == list(range(9))
    del loader, it


def test_timeout(no_leaks):
    class Slow(Dataset):
        def __len__(self):
            return 2

        def __getitem__(self, i):
            time.sleep(5)
            return i
    loader = DataLoader(Slow(), num_workers=1, timeout=0.3)
    with pytest.raises(RuntimeError, match="timed out after 0.3 seconds"):
        next(iter(loader))


def test_killed_worker_is_detected(no_leaks):
    class Dies(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            os._exit(3)
    with pytest.raises(RuntimeError, match="exited unexpectedly"):
        list(DataLoader(Dies(), num_workers=1))


class Stream(IterableDataset):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        info = get_worker_info()
        lo, step = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(lo, self.n, step))


def test_iterable_dataset(no_leaks):
    assert [b.tolist() for b in DataLoader(Stream(7), batch_size=3)] == \
        [[0, 1, 2], [3, 4, 5], [6]]
    got = [b.tolist() for b in DataLoader(Stream(7), batch_size=2,
                                          num_workers=2)]
    assert sorted(sum(got, [])) == list(range(7))
    got = [b.tolist() for b in DataLoader(Stream(7), batch_size=2,
                                          num_workers=2, drop_last=True)]
    assert all(len(b) == 2 for b in got)
    with pytest.raises(ValueError, match="expected unspecified shuffle"):
        DataLoader(Stream(3), shuffle=True)
