"""Deterministic DDP's virtual shards replayed by dtorch.compile (issue 26's
cost, issue 29's replay): the compiled shards give the bits the eager
shards give, on every world size, and a forward compile cannot replay runs
its shards eagerly (nn/parallel/_deterministic.py, ``_replayer``)."""
import dtorch as torch
import dtorch.distributed as dist
import dtorch.nn.functional as F
from dtorch import nn
from dtorch.nn.parallel import DistributedDataParallel as DDP
from dtorch.utils.data import DataLoader, DistributedSampler, TensorDataset
from test_determinism_ddp import state_digest


class TinyLM(nn.Module):
    """Embedding tied to the output head (one parameter, two owners: two
    taps per shard), LayerNorm, GELU, dropout."""

    def __init__(self, vocab=16, d=8, item=False):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(),
                                 nn.Dropout(0.2), nn.Linear(2 * d, d))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.emb.weight
        self.item = item

    def forward(self, idx):
        x = self.emb(idx)
        x = x + self.mlp(self.ln(x))
        if self.item and x.sum().item() > 1e30:   # a graph break
            x = x * 0
        return self.head(x)


def _train(rank, world, compiled, item=False, steps=4):
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    tok = torch.randint(0, 16, (96, 7), generator=g)
    ds = TensorDataset(tok[:, :-1], tok[:, 1:])
    model = TinyLM(item=item)
    ddp = DDP(model, compile_shards=compiled)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
    sampler = DistributedSampler(ds, shuffle=True, seed=3)
    loader = DataLoader(ds, batch_size=24 // world, sampler=sampler)
    for i, (x, y) in enumerate(loader):
        if i == steps:
            break
        out = ddp(x)
        loss = F.cross_entropy(out.reshape(-1, 16), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(ddp.parameters(), 1.0)
        opt.step()
    rep = ddp._det._replay
    stats = dict(rep.stats) if rep is not None else {}
    log = list(rep.log) if rep is not None else []
    return state_digest(model, opt), stats, log


def _run(world, compiled, item=False):
    res = dist.spawn_threads(lambda r, n: _train(r, n, compiled, item),
                             world)
    assert len({h for h, _, _ in res}) == 1, "ranks of one run disagree"
    return res[0]


def test_compiled_shards_equal_eager_shards_and_other_world_sizes():
    eager, stats, _ = _run(1, False)
    assert stats == {}                      # compile_shards=False: eager
    seen = {}
    for world in (1, 2, 3):
        h, stats, log = _run(world, None)
        # 12 / world shards a step, 4 steps: the first two capture, one
        # validation replay, the rest replay
        assert stats.get("programs") == 1, log
        assert stats.get("replays") == 4 * 12 // world - 2, stats
        assert not stats.get("fallbacks"), log
        seen[world] = h
    assert set(seen.values()) == {eager}, (eager, seen)


def test_a_graph_break_runs_the_shards_eagerly_with_the_same_bits():
    eager, _, _ = _run(2, False, item=True)
    h, stats, log = _run(2, None, item=True)
    assert h == eager
    assert not stats.get("replays") and stats.get("fallbacks"), stats
    assert any(".item()" in line or "break" in line for line in log), log
