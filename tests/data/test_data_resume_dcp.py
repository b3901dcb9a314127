"""A DataLoader's state through ``dtorch.distributed.checkpoint``: dcp
loads into the template the script passes (a fresh loader, or its
``state_dict()``), so a fresh loader's state must have every key a
mid-epoch one has; the resumed loader then continues exactly as the
uninterrupted one, on 1 and 2 thread ranks, with and without workers.
A state that lacks keys is refused with their names."""
import json
import os

import numpy as np
import pytest

import dtorch
import dtorch.distributed as dist
import dtorch.distributed.checkpoint as dcp
from dtorch.utils.data import (DataLoader, DistributedSampler,
                               IterableDataset, TensorDataset)

_N, _BS, _EPOCHS = 12, 2, 2


def _make(rank, kind, nw=0):
    # rank threads share the default generator: every draw here is from
    # the loader's own generator, so their order does not matter
    g = dtorch.Generator().manual_seed(7 + rank)
    ds = TensorDataset(dtorch.arange(_N, dtype=dtorch.float64))
    if kind == "distributed":
        sampler = DistributedSampler(ds, shuffle=True, seed=3)
        return g, sampler, DataLoader(ds, batch_size=_BS, sampler=sampler,
                                      generator=g, num_workers=nw)
    return g, None, DataLoader(ds, batch_size=_BS, shuffle=True,
                               generator=g, num_workers=nw)


def _epochs(loader, sampler, first, out, stop=None):
    for epoch in range(first, _EPOCHS):
        if sampler is not None:
            sampler.set_epoch(epoch)
        for k, (x,) in enumerate(loader):
            out.append(x.numpy().tolist())
            if stop == (epoch, k + 1):
                return
        if stop == (epoch, None):
            return


def _run(path, rank, kind, stop, nw=0, no_dist=False):
    g, sampler, loader = _make(rank, kind, nw)
    full = []
    _epochs(loader, sampler, 0, full)
    end = dict(g.get_state())

    g, sampler, loader = _make(rank, kind, nw)
    got = []
    _epochs(loader, sampler, 0, got, stop)
    # the loader as a Stateful, and its state as a plain dict
    dcp.save({"loader": loader, "as_dict": loader.state_dict()},
             checkpoint_id=path, no_dist=no_dist)
    del loader, sampler, g

    g, sampler, loader = _make(rank, kind, nw)
    g2, sampler2, loader2 = _make(rank, kind, nw)
    st = {"loader": loader, "as_dict": loader2.state_dict()}
    dcp.load(st, checkpoint_id=path, no_dist=no_dist)
    loader2.load_state_dict(st["as_dict"])
    first = stop[0] + (stop[1] is None)
    got2 = list(got)
    _epochs(loader, sampler, first, got)
    _epochs(loader2, sampler2, first, got2)
    return (got == full, got2 == full, dict(g.get_state()) == end,
            dict(g2.get_state()) == end, len(full))


@pytest.mark.parametrize("stop", [(0, 2), (0, None)])
@pytest.mark.parametrize("world", [1, 2])
def test_dcp_resume_into_fresh_loaders_on_thread_ranks(tmp_path, world,
                                                       stop):
    path = str(tmp_path / "ck")
    res = dist.spawn_threads(
        lambda r, w: _run(path, r, "distributed", stop), world, timeout=60)
    per_rank = _N // world // _BS * _EPOCHS
    assert res == [(True, True, True, True, per_rank)] * world
    meta = json.load(open(os.path.join(path, ".metadata")))
    keys = sorted(k for k in meta["state_dict_metadata"]
                  if k.startswith("loader."))
    assert keys == sorted("loader." + k for k in
                          dtorch.utils.data.DataLoader(range(3))
                          .state_dict())


def test_dcp_resume_shuffled_two_ranks_per_rank_state(tmp_path):
    path = str(tmp_path / "ck")
    res = dist.spawn_threads(
        lambda r, w: _run(path, r, "shuffle", (0, 3)), 2, timeout=60)
    assert res == [(True, True, True, True, _N // _BS * _EPOCHS)] * 2
    sdm = json.load(open(os.path.join(path, ".metadata")))[
        "state_dict_metadata"]
    assert sorted(sdm["loader._base_seed"]["per_rank"]) == ["0", "1"]


@pytest.mark.parametrize("stop", [(0, 3), (1, None)])
def test_dcp_resume_with_workers(tmp_path, stop):
    """Worker RNG snapshots (arrays) travel inside the loader's state."""
    res = _run(str(tmp_path / "ck"), 0, "shuffle", stop, nw=2,
               no_dist=True)
    assert res == (True, True, True, True, _N // _BS * _EPOCHS)


def test_fresh_state_has_every_key_of_a_mid_epoch_one():
    for nw in (0, 2):
        loader = DataLoader(list(range(8)), batch_size=2, num_workers=nw)
        fresh = loader.state_dict()
        it = iter(loader)
        next(it)
        mid = loader.state_dict()
        del it
        assert set(fresh) == set(mid)
        for k in fresh:      # leaves of the same kind, no nesting
            assert not isinstance(fresh[k], (dict, list)), k
            assert not isinstance(mid[k], (dict, list)), k
        again = DataLoader(list(range(8)), batch_size=2, num_workers=nw)
        again.load_state_dict(fresh)
        assert [b.tolist() for b in again] == [[0, 1], [2, 3], [4, 5],
                                               [6, 7]]
        again.load_state_dict(mid)
        assert [b.tolist() for b in again] == [[2, 3], [4, 5], [6, 7]]


def test_state_missing_keys_is_refused_naming_them():
    loader = DataLoader(list(range(8)), batch_size=2)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    del state["_base_seed"], state["_worker_snapshots"]
    with pytest.raises(ValueError, match=r"lacks the keys \['_base_seed', "
                                         r"'_worker_snapshots'\]"):
        loader.load_state_dict(state)
    # the state an older fresh loader gave
    with pytest.raises(ValueError, match="lacks the keys.*'_base_seed'"):
        loader.load_state_dict({"_iterator_finished": True,
                                "_num_yielded": 0})
    with pytest.raises(ValueError, match="not a DataLoader state_dict"):
        loader.load_state_dict({"epoch": 3})
    with pytest.raises(TypeError, match="expected a dict"):
        loader.load_state_dict([("_num_yielded", 1)])
    with pytest.raises(ValueError, match="mid-epoch state.*_base_seed"):
        loader.load_state_dict(dict(loader.state_dict(), _base_seed=None))
    bad = dict(loader.state_dict(), _sampler_state="{not json")
    with pytest.raises(ValueError, match="'_sampler_state' is not a saved"):
        loader.load_state_dict(bad)


class _Counter(IterableDataset):
    """An iterable whose state has what JSON keeps badly: int and tuple
    keys, a float32 array, NumPy scalars, a tensor."""

    def __init__(self):
        self.pos = 0

    def __iter__(self):
        while self.pos < 9:
            self.pos += 1
            yield self.pos - 1

    def state_dict(self):
        return {"pos": np.int64(self.pos), 7: "seven", (1, 2): [np.float32(
            0.5)], "w": np.arange(3, dtype=np.float32) / 3,
                "t": dtorch.tensor([self.pos, -1])}

    def load_state_dict(self, state):
        assert state[7] == "seven" and state[(1, 2)] == [0.5]
        w = state["w"]
        assert w.dtype == np.float32 and np.array_equal(
            w, np.arange(3, dtype=np.float32) / 3)
        assert isinstance(state["t"], dtorch.Tensor)
        assert state["t"].tolist() == [int(state["pos"]), -1]
        self.pos = int(state["pos"])


def test_dataset_state_survives_dcp(tmp_path):
    loader = DataLoader(_Counter(), batch_size=2)
    it = iter(loader)
    assert next(it).tolist() == [0, 1]
    dcp.save({"loader": loader}, checkpoint_id=tmp_path / "ck",
             no_dist=True)
    again = DataLoader(_Counter(), batch_size=2)
    dcp.load({"loader": again}, checkpoint_id=tmp_path / "ck", no_dist=True)
    assert [b.tolist() for b in again] == [[2, 3], [4, 5], [6, 7], [8]]


def test_state_with_an_unsupported_value_names_it():
    class _Odd(_Counter):
        def state_dict(self):
            return {"pos": {1, 2}}
    loader = DataLoader(_Odd(), batch_size=2)
    next(iter(loader))
    with pytest.raises(TypeError, match=r"\['fetcher'\]\['state'\]\['pos'\] "
                                        "is a set"):
        loader.state_dict()
