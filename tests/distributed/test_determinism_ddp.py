"""Deterministic data parallelism (issue 26): under
``use_deterministic_algorithms(True)`` a plain DDP script gives the same
bits on 1, 2, 3 and 4 ranks (nn/parallel/_deterministic.py)."""
import hashlib
import math

import numpy as np
import pytest

import dtorch as torch
import dtorch.distributed as dist
import dtorch.distributed.checkpoint as dcp
import dtorch.nn.functional as F
from dtorch import nn
from dtorch.distributed.clip_grad import exact_norm
from dtorch.distributed.algorithms.ddp_comm_hooks.zero_hook import \
    reduce_scatter_hook
from dtorch.distributed.optim import ZeroRedundancyOptimizer
from dtorch.distributed.checkpoint.state_dict import (get_state_dict,
                                                      set_state_dict)
from dtorch.nn.parallel import DistributedDataParallel as DDP
from dtorch.nn.parallel._deterministic import fixed_point_sum
from dtorch.utils.data import DataLoader, DistributedSampler, TensorDataset


def sample_losses(out, y, world):
    """Every sample's loss, from all ranks, in global batch order
    (DistributedSampler gives rank r the positions r, r + world, ...)."""
    mine = F.cross_entropy(out.detach(), y, reduction="none")
    parts = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(parts, mine)
    return torch.stack(parts, 1).reshape(-1)


def state_digest(model, opt, losses=()):
    """sha256 of parameters, gradients, optimizer state and RNG state (and
    of the per-sample losses of every step)."""
    h = hashlib.sha256()
    for t in losses:
        h.update(t.cpu().numpy().tobytes())
    for p in model.parameters():
        h.update(p.detach().cpu().numpy().tobytes())
        if p.grad is not None:
            h.update(p.grad.cpu().numpy().tobytes())
    for st in (opt.state.values() if opt is not None else ()):
        for k in sorted(st):
            v = st[k]
            h.update(np.asarray(v.cpu().numpy() if hasattr(v, "numpy")
                                else v).tobytes())
    h.update(repr(torch.get_rng_state()).encode())
    return h.hexdigest()


def _data():
    g = torch.Generator().manual_seed(1)
    X = torch.randn(240, 10, generator=g)
    Y = torch.randint(0, 3, (240,), generator=g)
    return TensorDataset(X, Y)


def train_mlp(rank, world, det=True, steps=12, accum=1, dropout=0.2,
              batch=24, save=None, resume=None, zero=False, scaler=None,
              opt_state=True, device="cpu", shards=None):
    """The owners' check: MLP + dropout + AdamW + clip_grad_norm_ under DDP
    with a DistributedSampler, global batch 24 (per optimizer step).
    ``save=(path, step)``: checkpoint there (dcp) and stop; ``resume``: a
    checkpoint to continue from; ``zero``: ZeroRedundancyOptimizer (1:
    ZeRO-1, 2: with the reduce-scatter hook) and its clip_grad_norm_; ``scaler``: a GradScaler's init_scale, with
    an infinite loss at step 3 (a skipped step); ``opt_state``: hash the
    optimizer's state too (ZeRO's is sharded: never)."""
    torch.use_deterministic_algorithms(det)
    torch.manual_seed(0)
    ds = _data()
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Dropout(dropout),
                          nn.Linear(32, 3)).to(device)
    ddp = DDP(model, virtual_shards=shards)
    if zero:
        opt = ZeroRedundancyOptimizer(ddp.parameters(), torch.optim.AdamW,
                                      lr=1e-2)
        if zero == 2:
            ddp.register_comm_hook(opt, reduce_scatter_hook)
    else:
        opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
    gs = None if scaler is None else torch.amp.GradScaler(
        "cpu", init_scale=scaler, growth_interval=2)
    sampler = DistributedSampler(ds, shuffle=True, seed=3)
    # the loader's own generator: each iterator draws a base seed from it,
    # which would otherwise advance the default one once more on a resume
    loader = DataLoader(ds, batch_size=batch // world // accum,
                        sampler=sampler,
                        generator=torch.Generator().manual_seed(9))
    step, micro, losses = 0, 0, []
    if resume is not None:
        step = _checkpoint(dcp.load, resume, ddp, opt, sampler, step)
    for _ in epochs(sampler, resume is not None):
        for x, y in loader:
            micro += 1
            last = micro % accum == 0
            ctx = ddp.no_sync() if not last else _null()
            with ctx:
                x, y = x.to(device), y.to(device)
                out = ddp(x)
                if step >= 8:       # (the resumed runs see steps 6-12)
                    losses.append(sample_losses(out, y, world))
                loss = F.cross_entropy(out, y) / accum
                if gs is not None:
                    loss = gs.scale(loss * (math.inf if step == 2 else 1))
                loss.backward()
            if not last:
                continue
            if gs is not None:
                gs.unscale_(opt)
            if zero:
                opt.clip_grad_norm_(0.5)
            else:
                nn.utils.clip_grad_norm_(ddp.parameters(), 0.5)
            if gs is not None:
                gs.step(opt)
                gs.update()
            else:
                opt.step()
            step += 1
            if save is not None and step == save[1]:
                return _checkpoint(dcp.save, save[0], ddp, opt, sampler,
                                   step)
            if step == steps:
                if zero == 2:
                    # each element's gradient is on its owner only: the
                    # sum over ranks (x + 0) is the full gradient, exactly
                    for p in model.parameters():
                        dist.all_reduce(p.grad)
                if gs is not None:
                    return state_digest(model, opt) + repr(gs.get_scale())
                keep = opt_state and not zero
                return state_digest(model, opt if keep else None, losses)
            opt.zero_grad()


def epochs(sampler, resumed):
    """The epochs from the sampler's on, each set on it, except a resumed
    one, which goes on from its place."""
    for epoch in range(sampler.epoch, 10):
        if not resumed or epoch > sampler.epoch:
            sampler.set_epoch(epoch)
        resumed = False
        yield epoch


def deterministic(fn):
    """``fn`` (a rank's body) under use_deterministic_algorithms(True),
    switched off after it."""
    def body(*args, **kwargs):
        torch.use_deterministic_algorithms(True)
        try:
            return fn(*args, **kwargs)
        finally:
            torch.use_deterministic_algorithms(False)
    return body


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


def test_one_hash_on_the_device(device):
    hashes = {h for w in (1, 2, 3) for h in dist.spawn_threads(
        lambda r, n: train_mlp(r, n, steps=4, device=device), w)}
    assert len(hashes) == 1


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


@pytest.mark.parametrize("stage", [1, 2])
def test_zero_gives_the_same_parameters_on_any_world_size(stage):
    hashes = {h for w in (1, 2, 3, 4) for h in dist.spawn_threads(
        lambda r, n: train_mlp(r, n, steps=6, zero=stage), w)}
    # the element-wise AdamW on shards is AdamW on the whole parameters:
    # ZeRO-1/2's parameters and gradients are plain DDP's
    plain = dist.spawn_threads(lambda r, n: train_mlp(
        r, n, steps=6, opt_state=False), 1)[0]
    assert hashes == {plain}


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
def test_grad_scaler_skip_decision_is_world_size_independent():
    hashes = {h for w in (1, 2, 3) for h in dist.spawn_threads(
        lambda r, n: train_mlp(r, n, steps=5, scaler=2.0 ** 8), w)}
    assert len(hashes) == 1
    # the infinite loss of step 3 was skipped, the scale backed off
    assert hashes.pop().endswith(repr(2.0 ** 8 * 2 * 0.5 * 2))


def test_exact_norm_does_not_depend_on_the_split():
    rng = np.random.default_rng(1)
    flat = (rng.standard_normal(1001) * 10.0 ** rng.integers(
        -5, 5, 1001)).astype(np.float32)

    def norm(world, p):
        def body(rank, n):
            # ZeRO/FSDP-like contiguous chunks of a different size per world
            bounds = np.linspace(0, flat.size, n + 1).astype(int)
            mine = [flat[bounds[rank]:bounds[rank + 1]]]
            return exact_norm(mine, p, (dist.group.WORLD,))
        return set(dist.spawn_threads(body, world))
    for p in (1.0, 2.0, 3.0):
        one = norm(1, p)
        assert norm(2, p) == norm(3, p) == norm(4, p) == one
        ref = float(np.sum(np.abs(flat.astype(np.float64)) ** p) ** (1 / p))
        assert abs(one.pop() - ref) <= 1e-12 * ref
    bad = flat.copy()
    bad[7] = np.inf
    assert exact_norm([bad], 2.0, ()) == math.inf
    bad[8] = np.nan
    assert math.isnan(exact_norm([bad], 2.0, ()))
    assert exact_norm([np.zeros(3, np.float32)], 2.0, ()) == 0.0


def train_lm(rank, world, steps=4):
    """A padded token LM with variable lengths: the loss is the sum over
    valid tokens divided by their global count (all ranks), times the
    world size (DDP averages over ranks), not a per-rank mean of means."""
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(2)
    n, seq, vocab = 32, 8, 16
    tok = torch.randint(0, vocab, (n, seq + 1), generator=g)
    lengths = torch.randint(2, seq + 1, (n,), generator=g)
    tgt = tok[:, 1:].clone()
    tgt[torch.arange(seq)[None, :] >= lengths[:, None]] = -100   # padding
    ds = TensorDataset(tok[:, :-1], tgt)
    model = nn.Sequential(nn.Embedding(vocab, 12), nn.Dropout(0.1),
                          nn.Linear(12, vocab))
    ddp = DDP(model, virtual_shards=4)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
    sampler = DistributedSampler(ds, shuffle=True, seed=4)
    loader = DataLoader(ds, batch_size=8 // world, sampler=sampler,
                        generator=torch.Generator().manual_seed(9))
    for step, (x, y) in zip(range(steps), loader):
        count = (y != -100).sum()
        dist.all_reduce(count)          # integers: exact in any order
        logits = ddp(x)
        loss = F.cross_entropy(logits.reshape(-1, vocab), y.reshape(-1),
                               ignore_index=-100, reduction="sum")
        opt.zero_grad()
        (loss * world / count).backward()
        opt.step()
    return state_digest(model, opt)


def test_padded_token_lm_normalised_by_the_global_token_count():
    hashes = {w: set(dist.spawn_threads(train_lm, w)) for w in (1, 2, 4)}
    assert len(set.union(*hashes.values())) == 1, hashes


def test_any_split_into_ranks_and_accumulation_with_one_sample_shards():
    """One sample per virtual shard: (ranks, micro-batches per step) of
    (4, 1), (2, 1), (3, 2), (1, 2), (2, 3) give the same bits."""
    def run(world, accum):
        return set(dist.spawn_threads(lambda r, n: train_mlp(
            r, n, steps=3, accum=accum, shards=24 // accum), world))
    ref = run(4, 1)
    assert len(ref) == 1
    for world, accum in ((2, 1), (3, 2), (1, 2), (2, 3)):
        assert run(world, accum) == ref, (world, accum)


def test_evaluation_outputs_and_metrics_are_world_size_independent():
    from dtorch.distributed.metrics import MetricSum

    def evaluate(rank, world):
        torch.use_deterministic_algorithms(True)
        torch.manual_seed(0)
        ds = _data()
        ddp = DDP(nn.Sequential(nn.Linear(10, 32), nn.Tanh(),
                                nn.Linear(32, 3)))
        ddp.eval()
        sampler = DistributedSampler(ds, shuffle=False, pad=False)
        m = MetricSum()
        outs = []
        with torch.no_grad():
            for x, y in DataLoader(ds, batch_size=48 // world,
                                   sampler=sampler):
                out = ddp(x)
                outs.append(sample_losses(out, y, world))
                m.update(loss=F.cross_entropy(out, y, reduction="none"),
                         correct=(out.argmax(1) == y).sum(), n=len(y))
        r = m.compute()
        r["all"] = torch.cat(outs).numpy().astype(np.float64)
        return state_digest(ddp.module, None, outs), r
    res = [dist.spawn_threads(evaluate, w) for w in (1, 2, 3, 4)]
    assert len({h for rr in res for h, _ in rr}) == 1
    metrics = [r for rr in res for _, r in rr]
    every = metrics[0].pop("all")
    for r in metrics[1:]:
        r.pop("all")
        assert r == metrics[0]
    assert metrics[0]["n"] == 240
    # exact: the sum of the float32 per-sample losses, rounded once
    assert metrics[0]["loss"] == math.fsum(every)


class _TiedLM(nn.Module):
    """A tied embedding/head (one Parameter in two modules), keyword
    tensors and a dict output."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.head = nn.Linear(8, 16, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, x, scale=None):
        h = torch.tanh(self.emb(x)) * scale
        return {"logits": self.head(h), "aux": (h.sum(-1),)}


def test_tied_weights_keyword_inputs_and_dict_outputs():
    def body(rank, world):
        torch.use_deterministic_algorithms(True)
        torch.manual_seed(0)
        m = _TiedLM()
        ddp = DDP(m)
        g = torch.Generator().manual_seed(1)
        x = torch.randint(0, 16, (24, 4), generator=g)[rank::world]
        o = ddp(x, scale=torch.full((len(x), 1, 1), 0.5))
        (F.cross_entropy(o["logits"].reshape(-1, 16), x.reshape(-1)) +
         o["aux"][0].mean()).backward()
        return m.emb.weight.grad.numpy()
    res = [g for w in (1, 2, 4) for g in dist.spawn_threads(body, w)]
    assert all(g.tobytes() == res[0].tobytes() for g in res)
    # both uses of the tied weight are in its gradient
    torch.manual_seed(0)
    m = _TiedLM()
    x = torch.randint(0, 16, (24, 4),
                      generator=torch.Generator().manual_seed(1))
    o = m(x, scale=torch.full((24, 1, 1), 0.5))
    (F.cross_entropy(o["logits"].reshape(-1, 16), x.reshape(-1)) +
     o["aux"][0].mean()).backward()
    np.testing.assert_allclose(res[0], m.emb.weight.grad.numpy(),
                               rtol=1e-5, atol=1e-7)


def _grads(rank, world, det, virtual_shards=None, explicit=False):
    torch.use_deterministic_algorithms(det)
    torch.manual_seed(0)
    ds = _data()
    model = nn.Sequential(nn.Linear(10, 32), nn.Tanh(), nn.Linear(32, 3))
    ddp = DDP(model, virtual_shards=virtual_shards)
    x, y = ds[rank * 24 // world:(rank + 1) * 24 // world]
    loss = F.cross_entropy(ddp(x), y)
    loss.backward(torch.ones_like(loss) if explicit else None)
    return [p.grad.numpy().astype(np.float64) for p in model.parameters()]


def test_a_given_backward_gradient_is_averaged_too():
    def grads(explicit):
        return dist.spawn_threads(lambda r, n: _grads(
            r, n, True, explicit=explicit), 3)[0]
    for a, b in zip(grads(False), grads(True)):
        assert a.tobytes() == b.tobytes()


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


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fixed_point_kernel_gives_the_numpy_bits(dtype):
    """The compiled rounding (dtorch/_kernels: one pass) and NumPy's three
    passes: the same bits, tiny, huge, subnormal and non-finite values
    included (large enough arrays that the kernel runs threaded)."""
    from dtorch import _kernels
    rng = np.random.default_rng(1)
    n = _kernels.PARALLEL_MIN + 3
    parts = [(rng.standard_normal(n) * 10.0 ** rng.integers(-30, 30, n))
             .astype(dtype) for _ in range(4)]
    parts[0][:4] = [np.inf, np.nan, 1e-45, -0.0]
    parts[2][5] = -np.inf
    if not _kernels.enabled():
        pytest.skip("numba is not installed (or DTORCH_NUMBA=0)")
    assert _kernels.kernels(parts[0]) is not None
    fast = fixed_point_sum([parts], 4, None)[0]
    with _kernels.forced(False):
        slow = fixed_point_sum([parts], 4, None)[0]
    assert fast.tobytes() == slow.tobytes()


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


def test_batch_norm_in_training_is_refused_eval_is_not():
    # SyncBatchNorm is deterministic (test_determinism_syncbn.py); plain
    # batch norm normalises over the rank's batch
    def bn(rank, n):
        torch.use_deterministic_algorithms(True)
        ddp = DDP(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)))
        ddp.eval()
        with torch.no_grad():
            out = ddp(torch.randn(12, 4))
        ddp.train()
        ddp(torch.randn(12, 4))
        return out
    with pytest.raises(RuntimeError, match="BatchNorm1d '1' in training "
                       "mode normalises over the rank's batch"):
        dist.spawn_threads(bn, 2)


def test_comm_hooks_and_join_are_refused():
    def hook(rank, n):
        torch.use_deterministic_algorithms(True)
        ddp = DDP(nn.Linear(4, 4))
        ddp.register_comm_hook(None, lambda s, b: None)
        ddp(torch.randn(12, 4))
    with pytest.raises(RuntimeError, match="communication hook"):
        dist.spawn_threads(hook, 2)

    def join(rank, n):
        torch.use_deterministic_algorithms(True)
        ddp = DDP(nn.Linear(4, 4))
        with ddp.join():
            ddp(torch.randn(12, 4))
    with pytest.raises(RuntimeError, match="join"):
        dist.spawn_threads(join, 2)


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
