"""Deterministic data parallelism (issue 26): under
``use_deterministic_algorithms(True)`` a plain DDP script gives the same
bits on 1, 2, 3 and 4 ranks (nn/parallel/_deterministic.py)."""
import hashlib

import numpy as np
import pytest

import dtorch as torch
import dtorch.distributed as dist
import dtorch.distributed.checkpoint as dcp
import dtorch.nn.functional as F
from dtorch import nn
from dtorch.distributed.checkpoint.state_dict import (get_state_dict,
                                                      set_state_dict)
from dtorch.nn.parallel import DistributedDataParallel as DDP
from dtorch.nn.parallel._deterministic import fixed_point_sum
from dtorch.utils.data import DataLoader, DistributedSampler, TensorDataset


def state_digest(model, opt):
    """sha256 of parameters, gradients, optimizer state and RNG state."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
        h.update(p.grad.numpy().tobytes())
    for st in opt.state.values():
        for k in sorted(st):
            v = st[k]
            h.update(np.asarray(v.numpy() if hasattr(v, "numpy") else v)
                     .tobytes())
    h.update(repr(torch.get_rng_state()).encode())
    return h.hexdigest()


def _data():
    g = torch.Generator().manual_seed(1)
    X = torch.randn(240, 10, generator=g)
    Y = torch.randint(0, 3, (240,), generator=g)
    return TensorDataset(X, Y)


def train_mlp(rank, world, det=True, steps=12, accum=1, dropout=0.2,
              batch=24, save=None, resume=None):
    """The owners' check: MLP + dropout + AdamW + clip_grad_norm_ under DDP
    with a DistributedSampler, global batch 24 (per optimizer step).
    ``save=(path, step)``: checkpoint there (dcp) and stop; ``resume``: a
    checkpoint to continue from."""
    torch.use_deterministic_algorithms(det)
    torch.manual_seed(0)
    ds = _data()
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Dropout(dropout),
                          nn.Linear(32, 3))
    ddp = DDP(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
    sampler = DistributedSampler(ds, shuffle=True, seed=3)
    # the loader's own generator: each iterator draws a base seed from it,
    # which would otherwise advance the default one once more on a resume
    loader = DataLoader(ds, batch_size=batch // world // accum,
                        sampler=sampler,
                        generator=torch.Generator().manual_seed(9))
    step, micro = 0, 0
    if resume is not None:
        step = _checkpoint(dcp.load, resume, ddp, opt, sampler, step)
    for epoch in range(sampler.epoch, 10):
        if resume is None or epoch > sampler.epoch:
            sampler.set_epoch(epoch)
        resume = None
        for x, y in loader:
            micro += 1
            last = micro % accum == 0
            ctx = ddp.no_sync() if not last else _null()
            with ctx:
                loss = F.cross_entropy(ddp(x), y) / accum
                loss.backward()
            if not last:
                continue
            nn.utils.clip_grad_norm_(ddp.parameters(), 0.5)
            opt.step()
            step += 1
            if save is not None and step == save[1]:
                return _checkpoint(dcp.save, save[0], ddp, opt, sampler,
                                   step)
            if step == steps:
                return state_digest(model, opt)
            opt.zero_grad()


def _checkpoint(fn, path, ddp, opt, sampler, step):
    """dcp.save or dcp.load of the whole training state; the step."""
    msd, osd = get_state_dict(ddp, opt)
    st = {"model": msd, "optim": osd, "sampler": sampler,
          "rng": dcp.RNGState(), "step": step}
    fn(st, checkpoint_id=path)
    if fn is dcp.load:
        set_state_dict(ddp, opt, model_state_dict=msd, optim_state_dict=osd)
    return st["step"]


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def test_owners_check_one_hash_on_1_2_3_4_thread_ranks():
    hashes = {w: set(dist.spawn_threads(train_mlp, w)) for w in (1, 2, 3, 4)}
    assert all(len(h) == 1 for h in hashes.values()), hashes
    assert len(set.union(*hashes.values())) == 1, hashes
    # the normal mode is not world-size independent (why the switch exists)
    normal = {dist.spawn_threads(lambda r, n: train_mlp(r, n, det=False),
                                 w)[0] for w in (1, 3)}
    assert len(normal) == 2


def test_no_sync_accumulation_is_world_size_independent():
    def run(world):
        return set(dist.spawn_threads(
            lambda r, n: train_mlp(r, n, steps=4, accum=2), world))
    assert run(1) == run(2) == run(4)


def test_save_on_2_ranks_resume_on_3_mid_epoch(tmp_path):
    """Step 5 of an epoch of 10, saved by 2 ranks, resumed by 3 and 4:
    the bits of the uninterrupted run on 1 rank after 12 steps."""
    path = str(tmp_path / "ck")
    full = dist.spawn_threads(train_mlp, 1)[0]
    dist.spawn_threads(lambda r, n: train_mlp(r, n, save=(path, 5)), 2)
    for world in (3, 4):
        res = dist.spawn_threads(
            lambda r, n: train_mlp(r, n, resume=path), world)
        assert set(res) == {full}


def test_sampler_refuses_world_size_dependent_padding():
    ds = TensorDataset(torch.arange(10))
    torch.use_deterministic_algorithms(True)
    try:
        assert len(list(DistributedSampler(ds, 2, 1))) == 5
        with pytest.raises(ValueError, match="10 samples left in epoch 0 "
                           "do not split evenly into 3 replicas"):
            list(DistributedSampler(ds, 3, 0))
        assert len(list(DistributedSampler(ds, 3, 0, pad=False))) == 4
    finally:
        torch.use_deterministic_algorithms(False)
    assert len(list(DistributedSampler(ds, 3, 0))) == 4   # padded


def _grads(rank, world, det, virtual_shards=None):
    torch.use_deterministic_algorithms(det)
    torch.manual_seed(0)
    ds = _data()
    model = nn.Sequential(nn.Linear(10, 32), nn.Tanh(), nn.Linear(32, 3))
    ddp = DDP(model, virtual_shards=virtual_shards)
    x, y = ds[rank * 24 // world:(rank + 1) * 24 // world]
    F.cross_entropy(ddp(x), y).backward()
    return [p.grad.numpy().astype(np.float64) for p in model.parameters()]


def test_gradients_equal_normal_ddp_up_to_rounding():
    det = dist.spawn_threads(lambda r, n: _grads(r, n, True), 2)[0]
    ref = dist.spawn_threads(lambda r, n: _grads(r, n, False), 2)[0]
    for a, b in zip(det, ref):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-7)


def test_fixed_point_sum_is_order_free_and_accurate():
    rng = np.random.default_rng(0)
    parts = [(rng.standard_normal((5, 7)) *
              10.0 ** rng.integers(-6, 6, (5, 7))).astype(np.float32)
             for _ in range(12)]
    parts[3][0, 0] = 0.0
    one = fixed_point_sum([parts], 12, None)[0]

    def split(world):
        # rank r holds shards r, r + world, ... (the sampler's layout)
        return dist.spawn_threads(lambda r, n: fixed_point_sum(
            [parts[r::n][::-1]], 12, None if n == 1 else
            dist.group.WORLD)[0], world)
    for w in (2, 3, 4):
        for res in split(w):
            assert res.tobytes() == one.tobytes()
    exact = np.sum(np.stack(parts).astype(np.float64), 0)
    top = np.abs(np.stack(parts)).max()
    # 12 roundings to the grid, whose step is 2^-48 of the largest
    assert np.abs(one - exact).max() <= top * 12 * 2.0 ** -49


def test_fixed_point_sum_nonfinite_and_zero():
    a = np.array([1.0, np.inf, np.nan, np.inf, 0.0], np.float32)
    b = np.array([2.0, 1.0, 0.0, -np.inf, 0.0], np.float32)
    out = fixed_point_sum([[a, b]], 2, None)[0]
    assert out[0] == 3.0 and out[1] == np.inf
    assert np.isnan(out[2]) and np.isnan(out[3]) and out[4] == 0.0
    z = fixed_point_sum([[np.zeros(3, np.float32)] * 2], 2, None)[0]
    assert (z == 0).all()


@pytest.mark.parametrize("world,shards,batch,match", [
    (3, 8, 24, "world size 3 does not divide the 8 virtual shards"),
    (2, 12, 20, "local batch of 10 samples on rank .* 6 virtual shards"),
    (3, 12, 36, "neither the world size 3 nor the local batch 12"),
])
def test_layouts_that_cannot_be_identical_fail_before_the_step(
        world, shards, batch, match):
    def body(rank, n):
        torch.use_deterministic_algorithms(True)
        ddp = DDP(nn.Linear(4, 2), virtual_shards=shards)
        ddp(torch.randn(batch // n, 4)).sum().backward()
    with pytest.raises(RuntimeError, match=match):
        dist.spawn_threads(body, world)


def test_batchnorm_and_comm_hooks_are_refused():
    def bn(rank, n):
        torch.use_deterministic_algorithms(True)
        DDP(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)))(
            torch.randn(12, 4))
    with pytest.raises(RuntimeError, match="BatchNorm1d '1'.*SyncBatchNorm"):
        dist.spawn_threads(bn, 2)

    def hook(rank, n):
        torch.use_deterministic_algorithms(True)
        ddp = DDP(nn.Linear(4, 4))
        ddp.register_comm_hook(None, lambda s, b: None)
        ddp(torch.randn(12, 4))
    with pytest.raises(RuntimeError, match="communication hook"):
        dist.spawn_threads(hook, 2)


def test_warn_only_goes_on_with_a_warning():
    def body(rank, n):
        torch.use_deterministic_algorithms(True, warn_only=True)
        ddp = DDP(nn.Linear(4, 2), virtual_shards=8)
        ddp(torch.randn(12, 4))
        return True
    # the warnings module is process-wide: catch the ranks' from here
    with pytest.warns(UserWarning, match="world size 3 .*warn_only"):
        assert dist.spawn_threads(body, 3) == [True] * 3


@pytest.mark.mpi(min_size=2)
def test_mpi_world_gives_the_thread_ranks_bits(mpi_world):
    one = dist.spawn_threads(train_mlp, 1)[0]
    try:
        mine = train_mlp(dist.get_rank(), dist.get_world_size())
    finally:
        torch.use_deterministic_algorithms(False)
    assert mine == one
