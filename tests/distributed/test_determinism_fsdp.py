"""FSDP under ``use_deterministic_algorithms(True)`` (issue 26): the bits of
deterministic DDP on one rank, on 1-4 ranks, as one unit, with nested
units (auto_wrap_policy) and with fully_shard (distributed/fsdp/
_deterministic.py)."""
import hashlib

import numpy as np
import pytest

import dtorch as torch
import dtorch.distributed as dist
import dtorch.distributed.checkpoint as dcp
import dtorch.nn.functional as F
from dtorch import nn
from dtorch.distributed.fsdp import (FullyShardedDataParallel as FSDP,
                                     MixedPrecision, ModuleWrapPolicy,
                                     StateDictType, fully_shard)
from dtorch.nn.parallel import DistributedDataParallel as DDP
from test_determinism_ddp import deterministic


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.drop = nn.Dropout(0.2)

    def forward(self, x):
        return self.drop(torch.relu(self.lin(x)))


def _model(sync_bn=False):
    m = nn.Sequential(nn.Linear(10, 16), Block(), Block(), nn.Linear(16, 3))
    if sync_bn:
        m.insert(1, nn.SyncBatchNorm(16))
    return m


def _wrap(model, kind, shards=None):
    if kind == "ddp":
        return DDP(model, virtual_shards=shards)
    if kind == "fsdp":
        return FSDP(model, virtual_shards=shards)
    if kind == "nested":
        return FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Block}))
    for b in model:
        if isinstance(b, Block):
            fully_shard(b)
    return fully_shard(model)


@deterministic
def train(rank, world, kind, steps=4, sync_bn=False, device="cpu",
          shards=None, save=None, resume=None):
    """4 AdamW steps with clipping on global batches of 24: the sha256 of
    the full state dict, the evaluation outputs and the RNG state.
    ``save=(path, step)``: a sharded dcp checkpoint there, and stop;
    ``resume``: go on from one (FSDP)."""
    torch.manual_seed(0)
    model = _model(sync_bn).to(device)
    w = _wrap(model, kind, shards)
    opt = torch.optim.AdamW(w.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    X = torch.randn(steps, 24, 10, generator=g).to(device)
    Y = torch.randint(0, 3, (steps, 24), generator=g).to(device)
    h = hashlib.sha256()
    start = 0 if resume is None else _sharded(dcp.load, resume, w, opt)
    for s in range(start, steps):
        if save is not None and s == save[1]:
            return _sharded(dcp.save, save[0], w, opt, s)
        loss = F.cross_entropy(w(X[s][rank::world]), Y[s][rank::world])
        loss.backward()
        if kind == "ddp":
            nn.utils.clip_grad_norm_(w.parameters(), 0.5)
        else:
            w.clip_grad_norm_(0.5)
        opt.step()
        opt.zero_grad()
    with torch.no_grad():             # evaluation: no gradient kept
        out = w(X[0][rank::world])
    parts = [torch.zeros_like(out) for _ in range(world)]
    dist.all_gather(parts, out)       # in global batch order
    h.update(torch.stack(parts, 1).cpu().numpy().tobytes())
    sd = (w.module if kind == "ddp" else w).state_dict()
    for k in sorted(sd):
        h.update(k.encode() + sd[k].cpu().numpy().tobytes())
    h.update(repr(torch.get_rng_state()).encode())
    return h.hexdigest()


def _sharded(fn, path, w, opt, step=None):
    """dcp.save / dcp.load of FSDP's sharded model and optimizer state
    and the RNG state; the step."""
    if fn is dcp.load:
        for p in w.parameters():      # AdamW's state entries to fill
            p.grad = torch.zeros_like(p)
        opt.step()
        opt.zero_grad()
    with w.state_dict_type(StateDictType.SHARDED_STATE_DICT):
        st = {"model": w.state_dict(), "optim": w.optim_state_dict(opt),
              "rng": dcp.RNGState(), "step": step}
    fn(st, checkpoint_id=path)
    if fn is dcp.load:
        with w.state_dict_type(StateDictType.SHARDED_STATE_DICT):
            w.load_state_dict(st["model"])
        opt.load_state_dict(w.optim_state_dict_to_load(opt, st["optim"]))
    return st["step"]


@pytest.mark.parametrize("kind,worlds", [("fsdp", (1, 2, 3, 4)),
                                         ("nested", (1, 3, 4)),
                                         ("fully_shard", (2, 3))])
def test_bits_of_deterministic_ddp_on_one_rank(kind, worlds):
    one = dist.spawn_threads(lambda r, n: train(r, n, "ddp"), 1)[0]
    for world in worlds:
        got = dist.spawn_threads(lambda r, n: train(r, n, kind), world)
        assert set(got) == {one}, (kind, world)


def test_same_bits_on_the_device(device):
    one = dist.spawn_threads(lambda r, n: train(r, n, "ddp", 2,
                                                device=device), 1)
    two = dist.spawn_threads(lambda r, n: train(r, n, "nested", 2,
                                                device=device), 2)
    assert set(two) == set(one)


def test_virtual_shards_as_ddp_and_layouts_it_refuses():
    one = dist.spawn_threads(lambda r, n: train(r, n, "ddp", 2,
                                                shards=4), 1)
    assert set(dist.spawn_threads(lambda r, n: train(
        r, n, "fsdp", 2, shards=4), 2)) == set(one)
    with pytest.raises(RuntimeError, match=r"world size 3 does not divide "
                       r"the 8 virtual shards .*FullyShardedDataParallel\("
                       r"virtual_shards=\)"):
        dist.spawn_threads(lambda r, n: train(r, n, "fsdp", 1, shards=8), 3)


def test_sharded_checkpoint_of_2_ranks_resumed_on_3(tmp_path):
    path = str(tmp_path / "ck")
    one = dist.spawn_threads(lambda r, n: train(r, n, "ddp"), 1)[0]
    dist.spawn_threads(lambda r, n: train(r, n, "nested",
                                          save=(path, 2)), 2)
    got = dist.spawn_threads(lambda r, n: train(r, n, "nested",
                                                resume=path), 3)
    assert set(got) == {one}


def test_sync_batch_norm_inside_fsdp():
    one = dist.spawn_threads(lambda r, n: train(r, n, "ddp", 2, True), 1)
    got = dist.spawn_threads(lambda r, n: train(r, n, "nested", 2, True), 3)
    assert set(got) == set(one)


def test_gathered_parameters_are_freed_and_shards_stay():
    @deterministic
    def body(rank, world):
        w = FSDP(_model(), auto_wrap_policy=ModuleWrapPolicy({Block}))
        shard = [p.numel() for p in w.parameters()]
        w(torch.randn(12, 10)).sum().backward()
        # outside the step every unit's parameters are placeholders
        assert all(u.__dict__.get("_full") is None for u in w._units())
        assert w.module[0].weight.numel() == 0
        assert [p.grad.numel() for p in w.parameters()] == shard
        return [p.grad.numpy().copy() for p in w.parameters()]
    two = dist.spawn_threads(body, 2)
    # rank r holds chunk r of each unit's flat gradient: the chunks differ
    assert not all(np.array_equal(a, b) for a, b in zip(*two))


def test_mixed_precision_and_a_nested_unit_alone_are_refused():
    @deterministic
    def mp(rank, world):
        FSDP(_model(), mixed_precision=MixedPrecision(
            param_dtype=torch.bfloat16))(torch.randn(12, 10))
    with pytest.raises(RuntimeError, match="mixed precision under use_"):
        dist.spawn_threads(mp, 2)

    @deterministic
    def nested(rank, world):
        w = FSDP(_model(), auto_wrap_policy=ModuleWrapPolicy({Block}))
        w.module[1](torch.randn(12, 16))
    with pytest.raises(RuntimeError, match="nested unit runs inside its "
                       "root's forward only"):
        dist.spawn_threads(nested, 2)
