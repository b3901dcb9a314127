"""ZeroRedundancyOptimizer (dtorch.distributed.optim), stage 1 and stage 2
(reduce_scatter_hook on DDP): 20-step trajectories equal the unsharded
optimizer on the whole batch (float64; 2 and 3 ranks; uneven parameter
sizes, a bias of 1 element, smaller than the world size; two parameter
groups; an LR scheduler); optimizer state per rank ~1/N of the total;
consolidate_state_dict gives the unsharded optimizer's state dict, which
loads back on another world size; clip_grad_norm_ by the global norm.
Threads backend; the MPI variant under mpiexec."""
import numpy as np
import pytest

import dtorch
import dtorch.distributed as dist
from dtorch import nn, optim
from dtorch.distributed.algorithms.ddp_comm_hooks.zero_hook import \
    reduce_scatter_hook
from dtorch.distributed.optim import ZeroRedundancyOptimizer
from dtorch.nn.parallel import DistributedDataParallel as DDP

F64 = dtorch.float64
BATCH = 12                       # divisible by 2 and 3
STEPS = 20


def _build():
    dtorch.manual_seed(0)
    m = net()
    return {k: v.detach().numpy().copy() for k, v in m.state_dict().items()}


def net():
    # sizes 35+5, 15+3, 3+1: uneven; the last bias has 1 element
    return nn.Sequential(nn.Linear(7, 5), nn.Tanh(), nn.Linear(5, 3),
                         nn.Tanh(), nn.Linear(3, 1)).to(F64)


_STATE = _build()


def model():
    m = net()
    m.load_state_dict({k: dtorch.tensor(v) for k, v in _STATE.items()})
    return m


def batch(step):
    rng = np.random.default_rng(100 + step)
    return (dtorch.tensor(rng.standard_normal((BATCH, 7))),
            dtorch.tensor(rng.standard_normal((BATCH, 1))))


OPTIMS = {
    "adam": (optim.Adam, dict(lr=0.05, weight_decay=0.01)),
    "sgd": (optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True)),
    "rmsprop": (optim.RMSprop, dict(lr=0.01, momentum=0.5)),
}


def groups(m):
    ps = list(m.parameters())
    return [{"params": ps[:2]}, {"params": ps[2:], "lr": 0.02}]


def reference(name, steps=STEPS, clip=None):
    cls, kw = OPTIMS[name]
    m = model()
    opt = cls(groups(m), **kw)
    sched = optim.lr_scheduler.StepLR(opt, 7, 0.5)
    for s in range(steps):
        x, y = batch(s)
        opt.zero_grad()
        ((m(x) - y) ** 2).mean().backward()
        if clip is not None:
            nn.utils.clip_grad_norm_(m.parameters(), clip)
        opt.step()
        sched.step()
    return [p.detach().numpy().copy() for p in m.parameters()], opt


def train(rank, size, name, stage2, steps=STEPS, zero=None, m=None,
          start=0, clip=None, sched_state=None):
    cls, kw = OPTIMS[name]
    if m is None:
        m = model()
    ddp = DDP(m)
    if zero is None:
        zero = ZeroRedundancyOptimizer(groups(m), cls, **kw)
    if stage2:
        ddp.register_comm_hook(zero, reduce_scatter_hook)
    sched = optim.lr_scheduler.StepLR(zero, 7, 0.5)
    if sched_state is not None:
        sched.load_state_dict(sched_state)
    k = BATCH // size
    norms = []
    for s in range(start, start + steps):
        x, y = batch(s)
        zero.zero_grad()
        ((ddp(x[rank * k:(rank + 1) * k]) - y[rank * k:(rank + 1) * k])
         ** 2).mean().backward()
        if clip is not None:
            norms.append(float(zero.clip_grad_norm_(clip)))
        zero.step()
        sched.step()
    zero.sched = sched
    return m, zero, norms


def close(a, b):
    np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("stage2", [False, True], ids=["zero1", "zero2"])
@pytest.mark.parametrize("name", sorted(OPTIMS))
@pytest.mark.parametrize("size", [2, 3])
def test_trajectory_equals_unsharded(size, name, stage2):
    ref, _ = reference(name)

    def body(rank, size):
        m, zero, _ = train(rank, size, name, stage2)
        return [p.detach().numpy().copy() for p in m.parameters()]
    for params in dist.spawn_threads(body, size, timeout=120):
        for a, b in zip(params, ref):
            close(a, b)


@pytest.mark.parametrize("stage2", [False, True], ids=["zero1", "zero2"])
@pytest.mark.parametrize("size", [2, 3])
def test_state_bytes_one_nth(size, stage2):
    def body(rank, size):
        m, zero, _ = train(rank, size, "adam", stage2, steps=2)
        elem = sum(v._data.nbytes for s in zero.optim.state.values()
                   for k, v in s.items() if k != "step")
        return elem, zero.local_state_bytes()
    res = dist.spawn_threads(body, size, timeout=120)
    numel = sum(p.numel() for p in model().parameters())
    total = 2 * 8 * numel                      # exp_avg + exp_avg_sq
    assert sum(e for e, _ in res) == total     # every element exactly once
    for elem, all_bytes in res:
        # one chunk per unit: at most ceil per unit over the even share
        assert elem <= 2 * 8 * (numel // size + 3)
        assert all_bytes <= elem + 4 * 6       # + a 'step' per piece


@pytest.mark.parametrize("stage2", [False, True], ids=["zero1", "zero2"])
def test_consolidate_and_reshard(stage2):
    """10 steps on 2 ranks, the consolidated state equals the plain
    optimizer's; loaded on 3 ranks, 10 more steps equal 20 plain ones."""
    ref10_params, ref10 = reference("adam", steps=10)
    ref20, _ = reference("adam", steps=20)
    saved = {}

    def first(rank, size):
        m, zero, _ = train(rank, size, "adam", stage2, steps=10)
        zero.consolidate_state_dict(to=1)
        if rank == 1:
            saved["sd"] = zero.state_dict()
            saved["sched"] = zero.sched.state_dict()
            saved["params"] = {k: v.detach().numpy().copy()
                               for k, v in m.state_dict().items()}
        else:
            with pytest.raises(RuntimeError, match="consolidate"):
                zero.state_dict()
        return True
    assert all(dist.spawn_threads(first, 2, timeout=120))
    sd, want = saved["sd"], ref10.state_dict()
    assert sd["param_groups"] == want["param_groups"]
    assert sorted(sd["state"]) == sorted(want["state"])
    for i, st in want["state"].items():
        for k, v in st.items():
            close(sd["state"][i][k].numpy(), v.numpy())
    # the plain optimizer loads it
    plain = optim.Adam(groups(model()), **OPTIMS["adam"][1])
    plain.load_state_dict(sd)

    def second(rank, size):
        m = model()
        m.load_state_dict({k: dtorch.tensor(v)
                           for k, v in saved["params"].items()})
        cls, kw = OPTIMS["adam"]
        zero = ZeroRedundancyOptimizer(groups(m), cls, **kw)
        zero.load_state_dict(sd)
        m, zero, _ = train(rank, size, "adam", False, steps=10, zero=zero,
                           m=m, start=10, sched_state=saved["sched"])
        return [p.detach().numpy().copy() for p in m.parameters()]
    for params in dist.spawn_threads(second, 3, timeout=120):
        for a, b in zip(params, ref20):
            close(a, b)


@pytest.mark.parametrize("stage2", [False, True], ids=["zero1", "zero2"])
def test_global_clipping_equals_unsharded(stage2):
    ref, _ = reference("sgd", clip=0.05)
    single = model()
    x, y = batch(0)
    ((single(x) - y) ** 2).mean().backward()
    ref_norm = float(nn.utils.get_total_norm(
        [p.grad for p in single.parameters()]))

    def body(rank, size):
        m, zero, norms = train(rank, size, "sgd", stage2, clip=0.05)
        return [p.detach().numpy().copy() for p in m.parameters()], norms[0]
    for params, n0 in dist.spawn_threads(body, 3, timeout=120):
        assert n0 == pytest.approx(ref_norm, rel=1e-12)
        for a, b in zip(params, ref):
            close(a, b)


def test_stage2_grads_hold_only_the_owned_chunk():
    """The hook does reduce-scatter (each rank holds 1/N of the averaged
    gradient, the rest zero), so stage 2 really moves less: the chunks
    together are the averaged gradient."""
    single = model()
    x, y = batch(0)
    ((single(x) - y) ** 2).mean().backward()
    full = np.concatenate([p.grad.numpy().ravel()
                           for p in single.parameters()])

    def body(rank, size):
        m = model()
        ddp = DDP(m)
        zero = ZeroRedundancyOptimizer(m.parameters(), optim.SGD, lr=0.1)
        ddp.register_comm_hook(zero, reduce_scatter_hook)
        k = BATCH // size
        ((ddp(x[rank * k:(rank + 1) * k]) - y[rank * k:(rank + 1) * k])
         ** 2).mean().backward()
        return np.concatenate([p.grad.numpy().ravel()
                               for p in m.parameters()])
    got = dist.spawn_threads(body, 2, timeout=60)
    nonzero = [np.count_nonzero(g) for g in got]
    assert all(n < full.size * 0.75 for n in nonzero)
    close(got[0] + got[1], full)


def test_small_units_same_trajectory(monkeypatch):
    """Units capped at 100 bytes (whole parameters each): more all-gathers
    of smaller buffers, the same trajectory."""
    from dtorch.distributed.optim import zero_redundancy_optimizer as Z
    monkeypatch.setattr(Z, "_UNIT_BYTES", 100)
    ref, _ = reference("adam")

    def body(rank, size):
        m, zero, _ = train(rank, size, "adam", False)
        return [p.detach().numpy().copy() for p in m.parameters()], \
            len(zero._units)
    for params, n_units in dist.spawn_threads(body, 3, timeout=120):
        # group 0: 0.weight | 0.bias; group 1: 2.weight | 2.bias+4.*
        assert n_units == 4
        for a, b in zip(params, ref):
            close(a, b)


def test_errors():
    def body(rank, size):
        m = model()
        with pytest.raises(ValueError, match="LBFGS"):
            ZeroRedundancyOptimizer(m.parameters(), optim.LBFGS)
        with pytest.raises(NotImplementedError, match="overlap_with_ddp"):
            ZeroRedundancyOptimizer(m.parameters(), optim.SGD, lr=0.1,
                                    overlap_with_ddp=True)
        ddp = DDP(m)
        zero = ZeroRedundancyOptimizer(m.parameters(), optim.Adam)
        x, y = batch(0)
        ((ddp(x) - y) ** 2).mean().backward()
        zero.step()
        # the hook after the first step: the shards would have to move
        ddp.register_comm_hook(zero, reduce_scatter_hook)
        ((ddp(x) - y) ** 2).mean().backward()
        with pytest.raises(RuntimeError, match="before"):
            zero.step()
        return True
    assert all(dist.spawn_threads(body, 2, timeout=60))


def test_hook_state_must_be_zero():
    def body(rank, size):
        ddp = DDP(model())
        ddp.register_comm_hook(None, reduce_scatter_hook)
        x, y = batch(0)
        with pytest.raises(Exception, match="ZeroRedundancyOptimizer"):
            ((ddp(x) - y) ** 2).mean().backward()
        return True
    assert all(dist.spawn_threads(body, 2, timeout=60))


@pytest.mark.parametrize("stage2", [False, True], ids=["zero1", "zero2"])
def test_on_device(device, stage2):
    """The same 3 steps with the model on ``device`` (cuda: CuPy arrays
    through every collective, the state_dict back on the host)."""
    ref, _ = reference("adam", steps=3)

    def body(rank, size):
        m = model().to(device)
        ddp = DDP(m)
        cls, kw = OPTIMS["adam"]
        zero = ZeroRedundancyOptimizer(groups(m), cls, **kw)
        if stage2:
            ddp.register_comm_hook(zero, reduce_scatter_hook)
        k = BATCH // size
        for s in range(3):
            x, y = batch(s)
            x, y = x.to(device), y.to(device)
            zero.zero_grad()
            ((ddp(x[rank * k:(rank + 1) * k]) - y[rank * k:(rank + 1) * k])
             ** 2).mean().backward()
            zero.clip_grad_norm_(1e9)
            zero.step()
        zero.consolidate_state_dict(0)
        if rank == 0:
            sd = zero.state_dict()
            assert all(v.device.type == device
                       for st in sd["state"].values() for kk, v in st.items()
                       if kk != "step")
        return [p.detach().cpu().numpy().copy() for p in m.parameters()]
    for params in dist.spawn_threads(body, 2, timeout=120):
        for a, b in zip(params, ref):
            close(a, b)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("stage2", [False, True], ids=["zero1", "zero2"])
def test_trajectory_mpi(mpi_world, stage2):
    size = dist.get_world_size()
    if BATCH % size:
        pytest.skip("batch not divisible by the world size")
    ref, _ = reference("adam")
    m, zero, _ = train(dist.get_rank(), size, "adam", stage2)
    for a, b in zip([p.detach().numpy() for p in m.parameters()], ref):
        close(a, b)
