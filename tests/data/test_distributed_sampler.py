"""DistributedSampler: disjoint shards covering the dataset, padding, epoch
reshuffles agreed by all ranks, PyTorch's index lists, mid-epoch resume on
another world size; exact distributed metrics."""
import numpy as np
import pytest

import dtorch
import dtorch.distributed as dist
from dtorch.utils.data import DataLoader, DistributedSampler, TensorDataset


def shards(n, ws, **kw):
    ds = list(range(n))
    return [list(DistributedSampler(ds, ws, r, **kw)) for r in range(ws)]


@pytest.mark.parametrize("n,ws", [(10, 2), (10, 3), (7, 4), (3, 4)])
def test_shards_cover_and_pad(n, ws):
    s = shards(n, ws, shuffle=True, seed=3)
    assert len({len(x) for x in s}) == 1
    assert len(s[0]) == -(-n // ws)
    flat = sum(s, [])
    assert set(flat) == set(range(n))
    assert len(flat) - n == len(flat) - len(set(flat))   # only padding repeats
    if n % ws == 0:
        assert len(flat) == n and len(set(flat)) == n


def test_drop_last_disjoint_and_no_pad_extension():
    s = shards(10, 3, shuffle=True, drop_last=True)
    flat = sum(s, [])
    assert len(flat) == 9 and len(set(flat)) == 9
    s = shards(10, 3, shuffle=False, pad=False)
    assert sorted(sum(s, [])) == list(range(10))
    assert [len(x) for x in s] == [4, 3, 3]


def test_epochs_reshuffle_identically_on_every_rank():
    samplers = [DistributedSampler(list(range(20)), 2, r, seed=5)
                for r in range(2)]
    per_epoch = []
    for epoch in range(3):
        for s in samplers:
            s.set_epoch(epoch)
        a, b = (list(s) for s in samplers)
        assert not set(a) & set(b) and sorted(a + b) == list(range(20))
        per_epoch.append(a + b)
    assert per_epoch[0] != per_epoch[1] != per_epoch[2]
    again = DistributedSampler(list(range(20)), 2, 0, seed=5)
    again.set_epoch(1)
    assert list(again) == per_epoch[1][:10]


def test_same_lists_as_torch_without_shuffle():
    torch = pytest.importorskip("torch")
    from torch.utils.data import DistributedSampler as TDS
    for n, ws, drop in [(10, 3, False), (10, 3, True), (5, 4, False)]:
        for r in range(ws):
            ours = list(DistributedSampler(list(range(n)), ws, r,
                                           shuffle=False, drop_last=drop))
            theirs = list(TDS(list(range(n)), ws, r, shuffle=False,
                              drop_last=drop))
            assert ours == theirs


def test_resume_mid_epoch_on_a_different_world_size():
    n = 23
    old = [DistributedSampler(list(range(n)), 2, r, seed=1) for r in
           range(2)]
    for s in old:
        s.set_epoch(4)
    its = [iter(s) for s in old]
    seen = []
    for _ in range(5):              # each rank consumes 5 samples
        for it in its:
            seen.append(next(it))
    state = old[0].state_dict()
    assert state["consumed"] == 10 and state["epoch"] == 4
    new = [DistributedSampler(list(range(n)), 3, r, seed=99) for r in
           range(3)]
    for s in new:
        s.load_state_dict(state)
    rest = [list(s) for s in new]
    assert len({len(r) for r in rest}) == 1
    flat = sum(rest, [])
    # nothing repeated from before, nothing skipped
    assert set(seen) | set(flat) == set(range(n))
    assert not set(seen) & set(flat)
    # the next epoch starts from the beginning again
    for s in new:
        s.set_epoch(5)
    assert sorted(set(sum([list(s) for s in new], []))) == list(range(n))


def test_dataloader_with_distributed_sampler_loads_only_the_shard():
    ds = TensorDataset(dtorch.arange(12), dtorch.arange(12) * 10)
    got = []
    for r in range(2):
        sampler = DistributedSampler(ds, 2, r, shuffle=False)
        loader = DataLoader(ds, batch_size=2, sampler=sampler,
                            num_workers=2)
        got.append(sum((b[0].tolist() for b in loader), []))
    assert got == [[0, 2, 4, 6, 8, 10], [1, 3, 5, 7, 9, 11]]


def test_sampler_needs_group_or_explicit_ranks():
    with pytest.raises(RuntimeError, match="num_replicas and rank"):
        DistributedSampler(list(range(4)))
    with pytest.raises(ValueError, match="Invalid rank 2"):
        DistributedSampler(list(range(4)), 2, 2)


def test_exact_metrics_with_unpadded_sampler():
    n = 11
    labels = np.arange(n) % 3

    def body(rank, ws):
        s = DistributedSampler(list(range(n)), shuffle=False, pad=False)
        m = dist.metrics.MetricSum()
        for i in s:
            m.update(correct=int(labels[i] == 0), total=1)
        return m.compute()
    for r in dist.spawn_threads(body, 3, timeout=20):
        assert r == {"correct": float((labels == 0).sum()), "total": 11.0}
