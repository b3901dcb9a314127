"""DataLoader.state_dict / load_state_dict (issue 16; torchdata's
StatefulDataLoader is the reference): a resumed run sees exactly the
batches the uninterrupted run would have seen, with 0, 1 and 2 workers,
persistent or not, and the state is a plain nested dict."""
import random
import warnings

import numpy as np
import pytest

import dtorch
from dtorch.utils.data import (DataLoader, Dataset, DistributedSampler,
                               IterableDataset, RandomSampler,
                               SubsetRandomSampler, WeightedRandomSampler)


class _Augmented(Dataset):
    """A random transform from all three RNGs a worker seeds."""

    def __init__(self, n=37):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        noise = (np.random.rand(2) + random.random()
                 + dtorch.rand(2).numpy().astype(np.float64))
        return np.float64(i) * 100 + noise


def _restart():
    """What a restarted program does before building its loader."""
    dtorch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)


def _collect(loader, it=None, limit=None):
    out = []
    it = iter(loader) if it is None else it
    for b in it:
        out.append(b.numpy().copy() if hasattr(b, "numpy") else b)
        if limit is not None and len(out) == limit:
            break
    return out


def _resume_matches(make, stop, transform_in_main=False):
    _restart()
    full = _collect(make())
    _restart()
    loader = make()
    it = iter(loader)
    head = _collect(loader, it, limit=stop) if stop else []
    state = loader.state_dict()
    del it
    _plain_check(state)
    _restart()
    np.random.seed(123)          # anything the main process drew since
    again = make()
    again.load_state_dict(state)
    tail = _collect(again)
    got = head + tail
    assert len(got) == len(full)
    for a, b in zip(got, full):
        if transform_in_main:        # the script's own RNG: ids only
            a, b = np.floor(a / 100), np.floor(b / 100)
        assert np.array_equal(a, b)
    return full


def _plain_check(obj):
    """ints, floats, bools, strings, None, lists, dicts and arrays only."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            assert isinstance(k, str)
            _plain_check(v)
    elif isinstance(obj, list):
        for v in obj:
            _plain_check(v)
    elif isinstance(obj, np.ndarray):
        assert obj.dtype == np.int64, obj.dtype   # carried by checkpoints
    else:
        assert obj is None or isinstance(
            obj, (int, float, bool, str)), type(obj)


@pytest.mark.parametrize("nw,persistent", [(0, False), (1, False),
                                           (2, False), (1, True), (2, True)])
@pytest.mark.parametrize("stop", [0, 1, 3, 9])
def test_map_style_resume_is_bitwise(nw, stop, persistent):
    full = _resume_matches(
        lambda: DataLoader(_Augmented(), batch_size=4, shuffle=True,
                           num_workers=nw, persistent_workers=persistent,
                           generator=dtorch.Generator().manual_seed(7)),
        stop, transform_in_main=nw == 0)
    assert len(full) == 10


@pytest.mark.parametrize("sampler", ["random", "random_nogen", "subset",
                                     "weighted"])
def test_generator_samplers_resume(sampler):
    def make():
        ds = _Augmented(23)
        s = {"random": lambda: RandomSampler(
                 ds, generator=dtorch.Generator().manual_seed(1)),
             "random_nogen": lambda: RandomSampler(ds),
             "subset": lambda: SubsetRandomSampler(list(range(0, 23, 2))),
             "weighted": lambda: WeightedRandomSampler(
                 [1.0] * 20 + [5.0] * 3, 30)}[sampler]()
        return DataLoader(ds, batch_size=3, sampler=s, num_workers=2,
                          drop_last=True)
    _resume_matches(make, 2)


def test_second_epoch_and_finished_state():
    loader = DataLoader(_Augmented(9), batch_size=4, shuffle=True,
                        num_workers=1)
    _collect(loader)
    done = loader.state_dict()
    assert done["_iterator_finished"] is True
    loader.load_state_dict(done)           # a finished epoch: a new one
    assert len(_collect(loader)) == 3
    with pytest.raises(ValueError, match="not a DataLoader state_dict"):
        loader.load_state_dict({"epoch": 1})


def test_state_of_fresh_loader_and_after_the_iterator_is_gone():
    loader = DataLoader(_Augmented(9), batch_size=2, num_workers=1)
    assert loader.state_dict()["_iterator_finished"] is True
    it = iter(loader)
    next(it)
    next(it)
    del it                                  # workers go, the state stays
    state = loader.state_dict()
    assert state["_num_yielded"] == 2 and not state["_iterator_finished"]
    loader.load_state_dict(state)
    assert len(_collect(loader)) == 3


class _Stream(IterableDataset):
    """Each worker yields its own uneven share; no state_dict (resumed by
    fast-forward)."""

    def __init__(self, n=23):
        self.n = n

    def __iter__(self):
        from dtorch.utils.data import get_worker_info
        info = get_worker_info()
        wid, nw = (0, 1) if info is None else (info.id, info.num_workers)
        # worker 0 gets more: the others end first
        for i in range(self.n):
            owner = i % (nw + 1)
            if (0 if owner == nw else owner) == wid:
                yield np.float64(i) * 100 + np.random.rand()

    def __len__(self):
        return self.n


@pytest.mark.parametrize("nw", [0, 1, 2])
@pytest.mark.parametrize("stop", [0, 2, 5])
def test_iterable_without_state_dict_resumes_by_fast_forward(nw, stop):
    _resume_matches(lambda: DataLoader(_Stream(), batch_size=2,
                                       num_workers=nw),
                    stop, transform_in_main=nw == 0)


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_iterable_interleaving_matches_torch():
    """Workers that run out at different times: the batch order is
    PyTorch's round-robin over the workers still running."""
    torch = pytest.importorskip("torch")

    class T(torch.utils.data.IterableDataset):
        def __iter__(self):
            info = torch.utils.data.get_worker_info()
            wid = info.id
            for i in range(3 + 4 * wid):
                yield wid * 100 + i

    class D(IterableDataset):
        def __iter__(self):
            from dtorch.utils.data import get_worker_info
            wid = get_worker_info().id
            for i in range(3 + 4 * wid):
                yield wid * 100 + i

    ref = [b.tolist() for b in torch.utils.data.DataLoader(
        T(), batch_size=2, num_workers=3)]
    got = [b.tolist() for b in DataLoader(D(), batch_size=2, num_workers=3)]
    assert got == ref
    # and a resume in the middle of the uneven tail continues it exactly
    loader = DataLoader(D(), batch_size=2, num_workers=3)
    it = iter(loader)
    head = [next(it).tolist() for _ in range(7)]
    state = loader.state_dict()
    del it
    again = DataLoader(D(), batch_size=2, num_workers=3)
    again.load_state_dict(state)
    assert head + [b.tolist() for b in again] == ref


def test_worker_count_change_refused_for_stateless_iterable():
    loader = DataLoader(_Stream(), batch_size=2, num_workers=2)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    del it
    other = DataLoader(_Stream(), batch_size=2, num_workers=1)
    other.load_state_dict(state)
    with pytest.raises(ValueError, match="cannot re-split"):
        iter(other)


def test_map_style_on_another_worker_count_keeps_the_order():
    def make(nw):
        return DataLoader(list(range(30)), batch_size=4, shuffle=True,
                          num_workers=nw,
                          generator=dtorch.Generator().manual_seed(2))
    full = [b.tolist() for b in make(2)]
    loader = make(2)
    it = iter(loader)
    head = [next(it).tolist() for _ in range(3)]
    state = loader.state_dict()
    del it
    again = make(1)
    again.load_state_dict(state)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        tail = [b.tolist() for b in again]
    assert head + tail == full


@pytest.mark.parametrize("nw", [0, 2])
def test_distributed_sampler_resume_on_another_world_size(nw):
    """Two ranks consume 3 batches each; three ranks finish the epoch:
    every sample once."""
    data = list(range(50))
    seen = []
    state = None
    for r in range(2):
        s = DistributedSampler(data, num_replicas=2, rank=r, seed=3)
        s.set_epoch(1)
        loader = DataLoader(data, batch_size=4, sampler=s, num_workers=nw)
        it = iter(loader)
        for _ in range(3):
            seen += next(it).tolist()
        state = loader.state_dict()
        del it
    for r in range(3):
        s = DistributedSampler(data, num_replicas=3, rank=r, seed=3)
        loader = DataLoader(data, batch_size=4, sampler=s, num_workers=nw)
        loader.load_state_dict(state)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            seen += [v for b in loader for v in b.tolist()]
    assert sorted(set(seen)) == data
    assert len(seen) - len(data) <= 2          # the new padding only


def test_prefetch_factor_zero_is_an_error():
    with pytest.raises(ValueError, match="prefetch_factor must be greater "
                                         "than 0"):
        DataLoader(list(range(4)), num_workers=1, prefetch_factor=0)


def test_persistent_workers_resume_after_an_abandoned_epoch():
    """Epoch 1 is left early (its prefetched batches still moved the
    workers' RNG); a state saved in epoch 2 restores the RNG they really
    had, not the one after their last batch handed out."""
    def make():
        return DataLoader(_Augmented(40), batch_size=2, shuffle=True,
                          num_workers=2, persistent_workers=True,
                          generator=dtorch.Generator().manual_seed(5))

    def epoch1(loader):
        it = iter(loader)
        for _ in range(3):
            next(it)
        del it
    _restart()
    loader = make()
    epoch1(loader)
    full = _collect(loader)
    _restart()
    loader = make()
    epoch1(loader)
    it = iter(loader)
    head = _collect(loader, it, limit=1)
    state = loader.state_dict()
    del it, loader
    again = make()
    again.load_state_dict(state)
    tail = _collect(again)
    assert all(np.array_equal(a, b) for a, b in zip(head + tail, full))
    assert len(head + tail) == len(full) == 20


# a state taken after an epoch ended restores the next epoch (issue 25)
_EPOCH_END = {
    "shuffle_gen": lambda: DataLoader(
        _Augmented(11), batch_size=4, shuffle=True, num_workers=0,
        generator=dtorch.Generator().manual_seed(5)),
    "shuffle_gen_workers": lambda: DataLoader(
        _Augmented(11), batch_size=4, shuffle=True, num_workers=1,
        generator=dtorch.Generator().manual_seed(5)),
    # persistent workers keep their base seed and RNG streams across passes
    "shuffle_gen_persistent_workers": lambda: DataLoader(
        _Augmented(11), batch_size=4, shuffle=True, num_workers=1,
        persistent_workers=True,
        generator=dtorch.Generator().manual_seed(5)),
    "random_nogen": lambda: DataLoader(
        _Augmented(11), batch_size=4, sampler=RandomSampler(range(11))),
    "subset_own_gen": lambda: DataLoader(
        _Augmented(11), batch_size=4, sampler=SubsetRandomSampler(
            list(range(0, 11, 2)), generator=dtorch.Generator().manual_seed(
                2))),
    # 12 samples: a mid-epoch resume re-partitions, so padding may differ
    "distributed": lambda: DataLoader(
        _Augmented(12), batch_size=2, sampler=DistributedSampler(
            range(12), num_replicas=2, rank=1, seed=4)),
}


def _ids(batches):
    return [np.floor(b / 100).tolist() for b in batches]


@pytest.mark.parametrize("case", sorted(_EPOCH_END))
@pytest.mark.parametrize("set_epoch", [False, True])
def test_state_after_an_epoch_restores_the_next_epoch(case, set_epoch):
    """Three epochs uninterrupted; the state saved after epoch 1 (and
    also mid-epoch 2: unchanged) loaded into a fresh loader in a fresh
    program gives epochs 2 and 3 again: the sampler's generator (or its
    seed), DistributedSampler's epoch, the workers' base seed."""
    make = _EPOCH_END[case]

    def epoch(loader, e, limit=None, it=None):
        if set_epoch and hasattr(loader.sampler, "set_epoch"):
            loader.sampler.set_epoch(e)
        return _collect(loader, it, limit)

    _restart()
    loader = make()
    first = epoch(loader, 0)
    state = loader.state_dict()                   # after epoch 1 ended
    assert state["_iterator_finished"] is True
    full = [first, epoch(loader, 1), epoch(loader, 2)]
    assert _ids(full[1]) != _ids(full[0]) or not set_epoch and \
        case == "distributed"             # no set_epoch: the same order
    _restart()
    np.random.seed(99)
    dtorch.manual_seed(99)                    # the program drew since
    again = make()
    again.load_state_dict(state)
    got = [epoch(again, 1), epoch(again, 2)]
    # values where workers seed the transforms, else the sample ids (the
    # main process's RNG is the script's to restore)
    same = (lambda a, b: len(a) == len(b) and all(
        np.array_equal(x, y) for x, y in zip(a, b))) if "workers" in case \
        else (lambda a, b: _ids(a) == _ids(b))
    assert same(got[0], full[1])
    if case != "random_nogen":      # else epoch 3 draws from the script's
        assert same(got[1], full[2])     # default stream, reseeded here
    # mid-epoch states stay right: one batch into epoch 2
    _restart()
    loader = make()
    epoch(loader, 0)
    it = iter(loader) if not set_epoch or not hasattr(
        loader.sampler, "set_epoch") else None
    if it is None:
        loader.sampler.set_epoch(1)
        it = iter(loader)
    head = _collect(loader, it, limit=1)
    mid = loader.state_dict()
    del it
    _restart()
    again = make()
    again.load_state_dict(mid)
    assert same(head + _collect(again), full[1])
