"""FullyShardedDataParallel (dtorch.distributed.fsdp): 20-step trajectories
equal the unsharded model on the whole batch (float64; 2 and 3 ranks;
wrapping by module class, by size, one unit; a 1-element bias); parameter
and optimizer bytes per rank ~1/N, peak parameter bytes ~ total/N + the
largest unit, gathered parameters really freed; full and sharded state
dicts; clip_grad_norm_ by the global norm. Threads backend; the MPI variant
under mpiexec."""
import functools
import gc

import numpy as np
import pytest

import dtorch
import dtorch.distributed as dist
from dtorch import nn, optim
from dtorch.distributed.fsdp import (FSDP, FSDPModule, ModuleWrapPolicy,
                                     StateDictType,
                                     fully_shard,
                                     size_based_auto_wrap_policy)

F64 = dtorch.float64
BATCH = 12
STEPS = 20


def net():
    # 35+5, 15+3, 3+1 elements: uneven; the last bias has 1 element
    return nn.Sequential(nn.Linear(7, 5), nn.Tanh(), nn.Linear(5, 3),
                         nn.Tanh(), nn.Linear(3, 1)).to(F64)


def _build(make):
    dtorch.manual_seed(0)
    return {k: v.detach().numpy().copy()
            for k, v in make().state_dict().items()}


_STATE = _build(net)


def model(make=net, state=None):
    m = make()
    state = _STATE if state is None else state
    m.load_state_dict({k: dtorch.tensor(v) for k, v in state.items()})
    return m


def batch(step, width=7):
    rng = np.random.default_rng(100 + step)
    return (dtorch.tensor(rng.standard_normal((BATCH, width))),
            dtorch.tensor(rng.standard_normal((BATCH, 1))))


POLICIES = {
    "per_linear": ModuleWrapPolicy({nn.Linear}),
    "size": functools.partial(size_based_auto_wrap_policy,
                              min_num_params=19),
    "one_unit": None,
}


def reference(steps=STEPS, clip=None):
    m = model()
    opt = optim.Adam(m.parameters(), lr=0.05, weight_decay=0.01)
    norms = []
    for s in range(steps):
        x, y = batch(s)
        opt.zero_grad()
        ((m(x) - y) ** 2).mean().backward()
        if clip is not None:
            norms.append(float(nn.utils.clip_grad_norm_(m.parameters(),
                                                        clip)))
        opt.step()
    return {k: v.detach().numpy().copy()
            for k, v in m.state_dict().items()}, norms


def train(rank, size, policy, steps=STEPS, clip=None):
    f = FSDP(model(), auto_wrap_policy=POLICIES[policy])
    opt = optim.Adam(f.parameters(), lr=0.05, weight_decay=0.01)
    k = BATCH // size
    norms = []
    for s in range(steps):
        x, y = batch(s)
        opt.zero_grad()
        ((f(x[rank * k:(rank + 1) * k]) - y[rank * k:(rank + 1) * k])
         ** 2).mean().backward()
        if clip is not None:
            norms.append(float(f.clip_grad_norm_(clip)))
        opt.step()
    return f, opt, norms


def close(a, b):
    np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("size", [2, 3])
def test_trajectory_equals_unsharded(size, policy):
    ref, _ = reference()

    def body(rank, size):
        f, opt, _ = train(rank, size, policy)
        n_units = sum(1 for u in f._units() if u._flat_param is not None)
        return ({k: v.detach().numpy().copy()
                 for k, v in f.state_dict().items()}, n_units)
    want_units = {"per_linear": 3, "size": 2, "one_unit": 1}[policy]
    for sd, n_units in dist.spawn_threads(body, size, timeout=120):
        assert n_units == want_units
        assert sorted(sd) == sorted(ref)
        for k in ref:
            close(sd[k], ref[k])


def deep():
    """A root with no parameters of its own around 4 blocks of 16x16
    (272 elements each) and a 16->1 head (17): per_linear makes 5 units."""
    return nn.Sequential(*[m for _ in range(4)
                           for m in (nn.Linear(16, 16), nn.Tanh())],
                         nn.Linear(16, 1)).to(F64)


_DEEP = _build(deep)


@pytest.mark.parametrize("size", [2, 3])
def test_memory_one_nth_and_peak(size):
    total = sum(p.numel() for p in deep().parameters()) * 8
    unit = 272 * 8

    def body(rank, size):
        m = model(deep, _DEEP)
        originals = list(m.parameters())
        f = FSDP(m, auto_wrap_policy=ModuleWrapPolicy({nn.Linear}))
        # the unsharded arrays are gone, not kept next to the shards
        assert all(p.numel() == 0 for p in originals)
        opt = optim.Adam(f.parameters(), lr=0.01)
        x, _ = batch(0, width=16)
        held = sum(p._data.nbytes for p in f.parameters())
        out = f(x)
        # nothing (no graph, no view, no reference cycle: the garbage
        # collector is off) keeps a gathered array after forward/backward
        alive = sum(r() is not None for r in f._stats.freed)
        out.sum().backward()
        opt.step()
        alive += sum(r() is not None for r in f._stats.freed)
        state = sum(v._data.nbytes for s in opt.state.values()
                    for k, v in s.items() if k != "step")
        return held, f._stats.peak, alive, state
    gc.disable()
    try:
        res = dist.spawn_threads(body, size, timeout=120)
    finally:
        gc.enable()
    for held, peak, alive, state in res:
        pad = 5 * (size - 1) * 8                # one chunk's padding a unit
        assert held <= total / size + pad
        assert alive == 0
        # the largest unit in full on top of the shards, never two
        assert held + unit <= peak <= total / size + pad + unit
        assert peak < total                     # less than one replica
        assert state <= 2 * (total / size + pad)    # Adam's two moments


def test_full_state_dict_loads_on_another_world_size():
    ref, _ = reference(steps=10)
    saved = {}

    def first(rank, size):
        f, _, _ = train(rank, size, "per_linear", steps=10)
        saved[rank] = {k: v.detach().numpy().copy()
                       for k, v in f.state_dict().items()}
        return True
    assert all(dist.spawn_threads(first, 2, timeout=120))
    for k in ref:
        close(saved[0][k], ref[k])
        close(saved[1][k], ref[k])
    single = model(state=saved[0])
    x, _ = batch(5)
    want = single(x).detach().numpy()

    def second(rank, size):
        f = FSDP(net(), auto_wrap_policy=POLICIES["size"])
        f.load_state_dict({k: dtorch.tensor(v) for k, v in saved[0].items()})
        return f(x).detach().numpy()
    for out in dist.spawn_threads(second, 3, timeout=120):
        close(out, want)


def test_sharded_state_dict_round_trip():
    def body(rank, size):
        f, _, _ = train(rank, size, "per_linear", steps=3)
        with f.state_dict_type(StateDictType.SHARDED_STATE_DICT):
            sd = f.state_dict()
        pieces = {k: v for k, v in sd.items()
                  if getattr(v, "_dcp_shard", None) is not None}
        assert len(pieces) == 6
        full = {k: v.detach().numpy().copy()
                for k, v in f.state_dict().items()}
        g = FSDP(model(), auto_wrap_policy=POLICIES["per_linear"])
        g.load_state_dict(sd)
        got = {k: v.detach().numpy() for k, v in g.state_dict().items()}
        for k in full:
            close(got[k], full[k])
        return sum(v.numel() for v in pieces.values())
    counts = dist.spawn_threads(body, 3, timeout=120)
    assert sum(counts) == 62          # every element in exactly one piece


def test_sharded_state_dict_refuses_other_world_size():
    saved = {}

    def first(rank, size):
        f = FSDP(model(), auto_wrap_policy=POLICIES["per_linear"])
        with f.state_dict_type(StateDictType.SHARDED_STATE_DICT):
            saved[rank] = f.state_dict()
        return True
    dist.spawn_threads(first, 2, timeout=60)

    def second(rank, size):
        f = FSDP(model(), auto_wrap_policy=POLICIES["per_linear"])
        with pytest.raises(ValueError, match="world size"):
            f.load_state_dict(saved[0])
        return True
    assert all(dist.spawn_threads(second, 3, timeout=60))


def test_sharded_dcp_checkpoint_on_another_world_size(tmp_path):
    """dcp.save of a 2-rank sharded state dict, dcp.load into a 3-rank
    model's sharded state dict (other units too): the same model."""
    import dtorch.distributed.checkpoint as dcp
    ref, _ = reference(steps=3)
    path = str(tmp_path / "ckpt")

    def first(rank, size):
        f, _, _ = train(rank, size, "per_linear", steps=3)
        with f.state_dict_type(StateDictType.SHARDED_STATE_DICT):
            dcp.save({"model": f.state_dict()}, checkpoint_id=path)
        return True
    assert all(dist.spawn_threads(first, 2, timeout=120))

    def second(rank, size):
        f = FSDP(net(), auto_wrap_policy=POLICIES["size"])
        with f.state_dict_type(StateDictType.SHARDED_STATE_DICT):
            sd = f.state_dict()
        state = {"model": sd}
        dcp.load(state, checkpoint_id=path)
        f.load_state_dict(state["model"])
        return {k: v.detach().numpy().copy()
                for k, v in f.state_dict().items()}
    for sd in dist.spawn_threads(second, 3, timeout=120):
        for k in ref:
            close(sd[k], ref[k])


def test_optim_state_dict_full_equals_plain_adam():
    ref, _ = reference(steps=5)
    m = model()
    plain = optim.Adam(m.parameters(), lr=0.05, weight_decay=0.01)
    for s in range(5):
        x, y = batch(s)
        plain.zero_grad()
        ((m(x) - y) ** 2).mean().backward()
        plain.step()
    names = [n for n, _ in m.named_parameters()]
    want = plain.state_dict()

    def body(rank, size):
        f, opt, _ = train(rank, size, "per_linear", steps=5)
        return f.optim_state_dict(opt)
    for osd in dist.spawn_threads(body, 3, timeout=120):
        assert sorted(osd["state"]) == sorted(names)
        for i, st in want["state"].items():
            for k, v in st.items():
                close(osd["state"][names[i]][k].detach().numpy(),
                      v.detach().numpy())


def test_sharded_model_and_optimizer_resume_on_another_world_size(tmp_path):
    """Model and Adam state through dcp, saved by 2 ranks (per-Linear
    units), loaded by 3 ranks (size-based units): 10 more steps equal 20
    unsharded steps."""
    import dtorch.distributed.checkpoint as dcp
    ref, _ = reference(steps=20)
    path = str(tmp_path / "ckpt")

    def first(rank, size):
        f, opt, _ = train(rank, size, "per_linear", steps=10)
        with f.state_dict_type(StateDictType.SHARDED_STATE_DICT):
            dcp.save({"model": f.state_dict(),
                      "optim": f.optim_state_dict(opt)}, checkpoint_id=path)
        return True
    assert all(dist.spawn_threads(first, 2, timeout=120))

    def second(rank, size):
        f = FSDP(net(), auto_wrap_policy=POLICIES["size"])
        opt = optim.Adam(f.parameters(), lr=0.05, weight_decay=0.01)
        # one step with zero gradients makes the state entries to fill
        for p in f.parameters():
            p.grad = dtorch.zeros_like(p)
        opt.step()
        with f.state_dict_type(StateDictType.SHARDED_STATE_DICT):
            state = {"model": f.state_dict(),
                     "optim": f.optim_state_dict(opt)}
        dcp.load(state, checkpoint_id=path)
        f.load_state_dict(state["model"])
        opt.load_state_dict(f.optim_state_dict_to_load(opt, state["optim"]))
        k = BATCH // size
        for s in range(10, 20):
            x, y = batch(s)
            opt.zero_grad()
            ((f(x[rank * k:(rank + 1) * k]) - y[rank * k:(rank + 1) * k])
             ** 2).mean().backward()
            opt.step()
        return {k: v.detach().numpy().copy()
                for k, v in f.state_dict().items()}
    for sd in dist.spawn_threads(second, 3, timeout=120):
        for k in ref:
            close(sd[k], ref[k])


@pytest.mark.parametrize("size", [2, 3])
def test_global_clipping_equals_unsharded(size):
    ref, ref_norms = reference(clip=0.05)

    def body(rank, size):
        f, _, norms = train(rank, size, "per_linear", clip=0.05)
        return ({k: v.detach().numpy().copy()
                 for k, v in f.state_dict().items()}, norms)
    for sd, norms in dist.spawn_threads(body, size, timeout=120):
        np.testing.assert_allclose(norms, ref_norms, rtol=1e-10)
        for k in ref:
            close(sd[k], ref[k])


def test_summon_full_params_writeback():
    def body(rank, size):
        f = FSDP(model(), auto_wrap_policy=POLICIES["per_linear"])
        with f.summon_full_params():
            inner = f.module[0].module
            assert inner.weight.shape == (5, 7)
            inner.weight._data[...] = 1.0
        sd = f.state_dict()
        return float(sd["0.weight"].detach().numpy().min())
    assert dist.spawn_threads(body, 2, timeout=60) == [1.0, 1.0]


def test_sync_module_states_takes_rank0():
    def body(rank, size):
        m = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4),
                          nn.Linear(4, 1)).to(F64)
        with dtorch.no_grad():
            for t in list(m.parameters()) + [m[1].running_mean]:
                t.fill_(float(rank))          # every rank differs
        f = FSDP(m, auto_wrap_policy=ModuleWrapPolicy({nn.Linear}),
                 sync_module_states=True)
        return {k: float(np.abs(v.detach().numpy()).max())
                for k, v in f.state_dict().items()
                if k not in ("1.num_batches_tracked", "1.running_var")}
    for rank, maxes in enumerate(dist.spawn_threads(body, 3, timeout=60)):
        assert set(maxes.values()) == {0.0}, (rank, maxes)
        assert "1.running_mean" in maxes and "0.weight" in maxes


def test_sync_module_states_two_worlds_at_once():
    """Two spawn_threads worlds running FSDP side by side (threads of one
    process, the same default-group machinery) each take their own rank
    0's values: nothing is shared between worlds."""
    import threading
    out = {}

    def world(base):
        def body(rank, size):
            m = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)).to(F64)
            with dtorch.no_grad():
                for t in list(m.parameters()) + [m[1].running_mean]:
                    t.fill_(base + rank)
            f = FSDP(m, auto_wrap_policy=ModuleWrapPolicy({nn.Linear}),
                     sync_module_states=True)
            return {k: sorted(set(np.ravel(v.detach().numpy()).tolist()))
                    for k, v in f.state_dict().items()
                    if k not in ("1.num_batches_tracked", "1.running_var")}
        out[base] = dist.spawn_threads(body, 3, timeout=60)

    ts = [threading.Thread(target=world, args=(b,)) for b in (10.0, 20.0)]
    [t.start() for t in ts]
    [t.join(120) for t in ts]
    for base in (10.0, 20.0):
        for rank, vals in enumerate(out[base]):
            assert all(v == [base] for v in vals.values()), (base, rank,
                                                              vals)


def test_sync_module_states_refuses_models_that_differ():
    """Ranks whose buffers differ in shape: the broadcast names both
    shapes instead of NumPy broadcasting rank 0's scalar into the others'
    buffers (a silent wrong answer on the threads backend)."""
    def body(rank, size):
        m = nn.Linear(2, 2).to(F64)
        m.register_buffer("scale", dtorch.ones(()) if rank == 0
                          else dtorch.zeros(3))
        with pytest.raises(dist.CollectiveMismatchError) as e:
            FSDP(m, sync_module_states=True)
        return str(e.value)
    for msg in dist.spawn_threads(body, 2, timeout=60):
        assert "broadcast" in msg and "[] float32" in msg \
            and "[3] float32" in msg, msg


def test_errors():
    def body(rank, size):
        m = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2).to(F64))
        with pytest.raises(ValueError, match="float64|float32"):
            FSDP(m)
        with pytest.raises(NotImplementedError, match="cpu_offload"):
            FSDP(net(), cpu_offload=True)
        with pytest.raises(TypeError, match="nn.Module"):
            FSDP(3)
        return True
    assert all(dist.spawn_threads(body, 2, timeout=60))


def test_pytorch_oracle_single_step():
    """One FSDP step on 2 ranks equals torch's unsharded Adam step."""
    torch = pytest.importorskip("torch")
    tm = torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.Tanh(),
                             torch.nn.Linear(5, 3), torch.nn.Tanh(),
                             torch.nn.Linear(3, 1)).double()
    tm.load_state_dict({k: torch.tensor(v) for k, v in _STATE.items()})
    opt = torch.optim.Adam(tm.parameters(), lr=0.05, weight_decay=0.01)
    x, y = batch(0)
    ((tm(torch.tensor(x.numpy())) - torch.tensor(y.numpy())) ** 2
     ).mean().backward()
    opt.step()
    want = {k: v.detach().numpy() for k, v in tm.state_dict().items()}

    def body(rank, size):
        f, _, _ = train(rank, size, "per_linear", steps=1)
        return {k: v.detach().numpy() for k, v in f.state_dict().items()}
    for sd in dist.spawn_threads(body, 2, timeout=60):
        for k in want:
            close(sd[k], want[k])


class Block(nn.Module):
    """Linear + dropout, returning a tuple and taking a keyword."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.drop = nn.Dropout(0.5)

    def forward(self, x, scale=1.0):
        h = self.drop(self.lin(x)) * scale
        return h, h.sum()


class TwoBlocks(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = Block(), Block()

    def forward(self, x):
        h, s1 = self.a(x, scale=2.0)
        h, s2 = self.b(h)
        return (h ** 2).sum() + s1 + s2


def test_recompute_restores_rng_kwargs_tuples():
    """Dropout inside a unit: backward's recomputation draws the same mask
    (the RNG is restored), so one rank's FSDP equals the plain model."""
    dtorch.manual_seed(1)
    plain = TwoBlocks().to(F64)
    state = {k: v.detach().numpy().copy()
             for k, v in plain.state_dict().items()}
    x = dtorch.tensor(np.random.default_rng(0).standard_normal((5, 6)))
    dtorch.manual_seed(7)
    plain(x).backward()
    opt = optim.SGD(plain.parameters(), lr=0.1)
    opt.step()
    want = {k: v.detach().numpy() for k, v in plain.state_dict().items()}

    def body(rank, size):
        m = TwoBlocks().to(F64)
        m.load_state_dict({k: dtorch.tensor(v) for k, v in state.items()})
        f = FSDP(m, auto_wrap_policy=ModuleWrapPolicy({Block}))
        dtorch.manual_seed(7)
        f(x).backward()
        optim.SGD(f.parameters(), lr=0.1).step()
        return {k: v.detach().numpy() for k, v in f.state_dict().items()}
    got = dist.spawn_threads(body, 1, timeout=60)[0]
    for k in want:
        close(got[k], want[k])


class Counted(nn.Linear):
    calls = 0

    def forward(self, x):
        type(self).calls += 1
        return super().forward(x)


def test_root_with_parameters_keeps_them_not_recomputed():
    """The root owns Linear(7, 5) and the head, a nested unit the middle
    Linear: the nested forward runs twice a step (forward and its own
    recomputation), not a third time inside a recomputed root; two
    forwards before one backward; a forward whose graph is dropped leaves
    nothing alive (gc off)."""
    def make():
        return nn.Sequential(nn.Linear(7, 5), nn.Tanh(), Counted(5, 3),
                             nn.Tanh(), nn.Linear(3, 1)).to(F64)
    state = _build(make)
    plain = model(make, state)
    x, y = batch(0)
    x2, _ = batch(1)
    ((plain(x) - y) ** 2).mean().backward()
    (plain(x2) ** 2).mean().backward()
    want = [p.grad.numpy().ravel() for p in plain.parameters()]
    want = np.concatenate([want[0], want[1], want[4], want[5]]), \
        np.concatenate(want[2:4])

    def body(rank, size):
        f = FSDP(model(make, state),
                 auto_wrap_policy=ModuleWrapPolicy({Counted}))
        Counted.calls = 0
        # two forwards, one backward
        (((f(x) - y) ** 2).mean() + (f(x2) ** 2).mean()).backward()
        calls = Counted.calls
        grads = (f._flat_param.grad.numpy().copy(),
                 f.module[2]._flat_param.grad.numpy().copy())
        f(x)                          # no backward: its graph is dropped
        f(x).sum().backward()
        alive = sum(r() is not None for r in f._stats.freed)
        return calls, alive, f._stats.live, grads
    gc.disable()
    try:
        res = dist.spawn_threads(body, 1, timeout=60)
    finally:
        gc.enable()
    calls, alive, live, (root, inner) = res[0]
    assert calls == 4                 # 2 forwards x (forward + recompute)
    assert alive == 0 and live == 0
    close(root[:want[0].size], want[0])
    close(inner[:want[1].size], want[1])


class Tied(nn.Module):
    """An embedding and an output layer sharing one weight."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(6, 4)
        self.mid = nn.Linear(4, 4)
        self.out = nn.Linear(4, 6, bias=False)
        self.out.weight = self.emb.weight

    def forward(self, idx):
        return self.out(self.mid(self.emb(idx)).tanh())


def test_tied_weights_one_copy():
    """A parameter shared by two modules of a unit is stored once; both
    uses' gradients add up (2 ranks = the plain model after 5 steps)."""
    state = _build(lambda: Tied().to(F64))
    idx = dtorch.tensor(np.random.default_rng(0).integers(0, 6, (8, 3)))
    tgt = dtorch.tensor(np.random.default_rng(1).integers(0, 6, (8, 3)))

    def loss(m, i, t):
        o = m(i)
        return nn.functional.cross_entropy(o.reshape(-1, 6), t.reshape(-1))
    plain = model(lambda: Tied().to(F64), state)
    opt = optim.Adam(plain.parameters(), lr=0.05)
    for _ in range(5):
        opt.zero_grad()
        loss(plain, idx, tgt).backward()
        opt.step()
    want = {k: v.detach().numpy() for k, v in plain.state_dict().items()}

    def only_mid(module, recurse, nonwrapped_numel=0):
        return recurse or (isinstance(module, nn.Linear)
                           and module.bias is not None)

    def body(rank, size):
        # the shared weight cannot live in a nested unit and the root both
        with pytest.raises(ValueError, match="shared with a nested unit"):
            FSDP(model(lambda: Tied().to(F64), state),
                 auto_wrap_policy=ModuleWrapPolicy({nn.Linear}))
        f = FSDP(model(lambda: Tied().to(F64), state),
                 auto_wrap_policy=only_mid)
        # emb.weight (= out.weight) once in the root, mid nested
        assert f._numel == 24
        opt = optim.Adam(f.parameters(), lr=0.05)
        for _ in range(5):
            opt.zero_grad()
            loss(f, idx[rank * 4:(rank + 1) * 4],
                 tgt[rank * 4:(rank + 1) * 4]).backward()
            opt.step()
        return {k: v.detach().numpy() for k, v in f.state_dict().items()}
    for sd in dist.spawn_threads(body, 2, timeout=60):
        assert sorted(sd) == sorted(want)        # out.weight too
        model(lambda: Tied().to(F64), state).load_state_dict(
            {k: dtorch.tensor(v) for k, v in sd.items()})
        for k in sd:
            close(sd[k], want[k])


def test_batchnorm_statistics_move_once():
    """BatchNorm inside a unit: the recomputation in backward does not
    update the running statistics again (one rank equals the plain model
    after 3 training steps, running_mean and num_batches_tracked too)."""
    def make():
        return nn.Sequential(nn.Linear(7, 4), nn.BatchNorm1d(4), nn.Tanh(),
                             nn.Linear(4, 1)).to(F64)
    state = _build(make)
    plain = model(make, state)
    opt = optim.SGD(plain.parameters(), lr=0.1)
    for s in range(3):
        x, y = batch(s)
        opt.zero_grad()
        ((plain(x) - y) ** 2).mean().backward()
        opt.step()
    want = {k: v.detach().numpy() for k, v in plain.state_dict().items()}

    def body(rank, size):
        # BatchNorm in the root unit, the Linears nested in it
        f = FSDP(model(make, state),
                 auto_wrap_policy=ModuleWrapPolicy({nn.Linear}))
        opt = optim.SGD(f.parameters(), lr=0.1)
        for s in range(3):
            x, y = batch(s)
            opt.zero_grad()
            ((f(x) - y) ** 2).mean().backward()
            opt.step()
        return {k: v.detach().numpy() for k, v in f.state_dict().items()}
    got = dist.spawn_threads(body, 1, timeout=60)[0]
    assert sorted(got) == sorted(want)
    for k in want:
        close(got[k], want[k])


@pytest.mark.parametrize("size", [2, 3])
def test_fully_shard_in_place(size):
    """PyTorch's FSDP2 API: fully_shard each Linear, then the root; the
    same module objects train as the unsharded model."""
    ref, ref_norms = reference(clip=0.05)

    def body(rank, size):
        m = model()
        for layer in m:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        assert fully_shard(m) is m and isinstance(m, FSDPModule)
        assert isinstance(m, nn.Sequential)
        assert "Linear(in_features=7" in repr(m)
        names = [n for n, _ in m.named_parameters()]
        assert names == ["0._flat_param", "2._flat_param", "4._flat_param"]
        with pytest.raises(ValueError, match="already"):
            fully_shard(m)
        opt = optim.Adam(m.parameters(), lr=0.05, weight_decay=0.01)
        k = BATCH // size
        norms = []
        for s in range(STEPS):
            x, y = batch(s)
            opt.zero_grad()
            ((m(x[rank * k:(rank + 1) * k]) - y[rank * k:(rank + 1) * k])
             ** 2).mean().backward()
            norms.append(float(m.clip_grad_norm_(0.05)))
            opt.step()
        return ({k: v.detach().numpy().copy()
                 for k, v in m.state_dict().items()}, norms, m._fsdp_state)
    for sd, norms, state in dist.spawn_threads(body, size, timeout=120):
        np.testing.assert_allclose(norms, ref_norms, rtol=1e-10)
        assert sorted(sd) == sorted(ref)
        for k in ref:
            close(sd[k], ref[k])
        largest = -(-40 // size) * size * 8         # 0.weight+0.bias, padded
        assert state._stats.peak == state._stats.shard_bytes + largest


def test_on_device(device):
    """3 steps with the model on ``device`` (cuda: CuPy arrays through the
    gathers and reduce-scatters), clipping, full state dict on the host."""
    ref, _ = reference(steps=3, clip=1e9)

    def body(rank, size):
        f = FSDP(model().to(device), auto_wrap_policy=POLICIES["per_linear"])
        opt = optim.Adam(f.parameters(), lr=0.05, weight_decay=0.01)
        k = BATCH // size
        for s in range(3):
            x, y = batch(s)
            x, y = x.to(device), y.to(device)
            opt.zero_grad()
            ((f(x[rank * k:(rank + 1) * k]) - y[rank * k:(rank + 1) * k])
             ** 2).mean().backward()
            f.clip_grad_norm_(1e9)
            opt.step()
        return {k: v.detach().cpu().numpy().copy()
                for k, v in f.state_dict().items()}
    for sd in dist.spawn_threads(body, 2, timeout=120):
        for k in ref:
            close(sd[k], ref[k])


@pytest.mark.mpi(min_size=2)
def test_trajectory_mpi(mpi_world):
    size = dist.get_world_size()
    if BATCH % size:
        pytest.skip("batch not divisible by the world size")
    ref, _ = reference()
    f, _, _ = train(dist.get_rank(), size, "per_linear")
    sd = f.state_dict()
    for k in ref:
        close(sd[k].detach().numpy(), ref[k])
