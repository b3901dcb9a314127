"""SyncBatchNorm under ``use_deterministic_algorithms(True)`` (issue 26):
a rank's virtual shards meet at each SyncBatchNorm in lockstep
(nn/parallel/_lockstep.py), which normalises over the global batch with
exact sums; the bits do not depend on the world size, the numbers are
those of normal-mode SyncBatchNorm (itself checked against PyTorch in
test_sync_batchnorm) up to rounding. Whole training runs:
test_determinism_acceptance.py."""
import threading

import numpy as np
import pytest

import dtorch as torch
import dtorch.distributed as dist
import dtorch.nn.functional as F
from dtorch import nn
from dtorch.nn.parallel import DistributedDataParallel as DDP
from dtorch.nn.parallel import _lockstep
from test_determinism_ddp import deterministic


def _cnn(affine=True):
    return nn.SyncBatchNorm.convert_sync_batchnorm(nn.Sequential(
        nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4, affine=affine),
        nn.ReLU(), nn.Flatten(), nn.Linear(4 * 25, 6),
        nn.BatchNorm1d(6, affine=affine), nn.ReLU(),
        nn.Linear(6, 3)))


def _one_step(rank, world, det, dtype=torch.float64, device="cpu",
              affine=True):
    """Gradients and running statistics after one step of a CNN with two
    SyncBatchNorms, global batch 24."""
    torch.use_deterministic_algorithms(det)
    try:
        torch.manual_seed(0)
        model = _cnn(affine).to(device, dtype)
        ddp = DDP(model)
        g = torch.Generator().manual_seed(1)
        x = torch.randn(24, 2, 5, 5, generator=g, dtype=dtype).to(device)
        y = torch.randint(0, 3, (24,), generator=g).to(device)
        F.cross_entropy(ddp(x[rank::world]), y[rank::world]).backward()
        return ([p.grad.cpu().numpy().copy() for p in model.parameters()]
                + [b.cpu().numpy().copy() for b in model.buffers()])
    finally:
        torch.use_deterministic_algorithms(False)


def test_same_bits_on_the_device(device):
    one, two = (dist.spawn_threads(lambda r, n: _one_step(
        r, n, True, torch.float32, device), w)[0] for w in (1, 2))
    assert all(np.array_equal(a, b) for a, b in zip(one, two))


def test_bits_on_1_and_3_ranks_and_numbers_of_normal_sync_batchnorm():
    # (1-4 ranks over 20 steps: test_determinism_acceptance)
    runs = {w: dist.spawn_threads(lambda r, n: _one_step(r, n, True,
                                                         torch.float32), w)
            for w in (1, 3)}
    ref = runs[1][0]
    for w, res in runs.items():
        for got in res:
            assert all(np.array_equal(a, b) for a, b in zip(got, ref)), w
    for affine in (True, False):
        det, normal = (dist.spawn_threads(lambda r, n: _one_step(
            r, n, mode, affine=affine), 2)[0] for mode in (True, False))
        for a, b in zip(det, normal):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
    # the running statistics took one step (not one per shard)
    assert det[-1] == normal[-1] == 1


def _shard_threads():
    return [t for t in threading.enumerate()
            if t.name.startswith("dtorch-shard-")]


def test_eval_mode_needs_no_lockstep_and_errors_reach_the_caller(
        monkeypatch):
    runs = []
    real = _lockstep.Lockstep.run
    monkeypatch.setattr(_lockstep.Lockstep, "run", lambda self, *a: (
        runs.append(self.k), real(self, *a))[1])

    @deterministic
    def body(rank, n):
        ddp = DDP(nn.SyncBatchNorm(3))
        ddp.eval()
        ddp(torch.randn(12 // n, 3))
        assert runs == []
        ddp.train()
        # raised in a shard's thread, re-raised here; no thread stays
        with pytest.raises(ValueError, match="expected 3 channels"):
            ddp(torch.randn(12 // n, 4))
        assert runs == [12]
    dist.spawn_threads(body, 1)     # one rank: the list is the process's
    assert _shard_threads() == []


class _Odd(nn.Module):
    """Sends only the shards with a positive first input through its
    SyncBatchNorm: shards that disagree on the path."""

    def __init__(self):
        super().__init__()
        self.bn = nn.SyncBatchNorm(2)

    def forward(self, x):
        return self.bn(x) if float(x[0, 0]) > 0 else x


def test_shards_on_different_paths_and_own_groups_are_refused():
    @deterministic
    def odd(rank, n):
        x = torch.ones(12, 2)
        x[1::4, 0] = -1
        DDP(_Odd())(x)
    with pytest.raises(RuntimeError, match="took different paths"):
        dist.spawn_threads(odd, 1)

    @deterministic
    def own(rank, n):
        group = dist.new_group([0, 1])
        DDP(nn.SyncBatchNorm(2, process_group=group))(torch.ones(6, 2))
    with pytest.raises(RuntimeError, match="SyncBatchNorm with its own "
                       "process_group"):
        dist.spawn_threads(own, 2)
