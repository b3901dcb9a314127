"""GradScaler: PyTorch's scale sequence and skip decisions, unscale_ +
clipping, the stage errors, checkpoint/resume, and ranks agreeing on skips
when only one rank's gradients overflow (threads backend and MPI)."""
import json
import math

import numpy as np
import pytest

import dtorch
import dtorch.distributed as dist
from dtorch.amp import GradScaler

torch = pytest.importorskip("torch")

# per step: the multiplier of the loss (its gradient is this times the
# scale); inf/nan make non-finite gradients
SCRIPT = [1.0, 2.0, 1.0, math.inf, 1.0, 1.0, 1.0, 1.0, math.nan, 0.5, 1.0,
          1.0, 1.0, -math.inf, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]


def _run(L, Scaler, script, **kw):
    """Scales, growth trackers, step results and the parameter after each
    step of a scripted run (SGD on one 3-vector)."""
    p = L.nn.Parameter(L.tensor([1.0, -2.0, 3.0]))
    opt = L.optim.SGD([p], lr=0.1)
    s = Scaler("cpu", **kw)
    out = []
    for c in script:
        opt.zero_grad()
        loss = (p * L.tensor([c, 1.0, 1.0])).sum() if math.isfinite(c) \
            else (p * L.tensor([c, 1.0, 1.0])).sum()
        s.scale(loss).backward()
        s.step(opt)
        s.update()
        out.append((s.get_scale(), s._get_growth_tracker(),
                    p.detach().numpy().tolist()))
    return out, s


@pytest.mark.filterwarnings("ignore:invalid value")
@pytest.mark.filterwarnings("ignore:overflow")
@pytest.mark.parametrize("kw", [
    dict(init_scale=4.0, growth_interval=3),
    dict(init_scale=2.0 ** 16, growth_factor=4.0, backoff_factor=0.25,
         growth_interval=2),
    # growth that would overflow float32 is not taken
    dict(init_scale=2.0 ** 126, growth_interval=1),
])
def test_scale_sequence_and_skips_equal_torch(kw):
    got, _ = _run(dtorch, GradScaler, SCRIPT, **kw)
    want, _ = _run(torch, torch.amp.GradScaler, SCRIPT, **kw)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g[0] == w[0], (i, g, w)
        assert g[1] == w[1], (i, g, w)
        np.testing.assert_array_equal(g[2], w[2], err_msg=str(i))


def test_state_dict_equals_torch_and_resume_is_exact():
    kw = dict(init_scale=8.0, growth_interval=3)
    _, s = _run(dtorch, GradScaler, SCRIPT[:7], **kw)
    _, ts = _run(torch, torch.amp.GradScaler, SCRIPT[:7], **kw)
    sd = s.state_dict()
    assert sd == ts.state_dict()
    # the state is JSON (dtorch checkpoints keep non-tensor state as JSON)
    sd = json.loads(json.dumps(sd))
    full, _ = _run(dtorch, GradScaler, SCRIPT, **kw)

    # resume: a fresh scaler loads the state and continues the script
    p = dtorch.nn.Parameter(dtorch.tensor(full[6][2]))
    opt = dtorch.optim.SGD([p], lr=0.1)
    r = GradScaler("cpu")
    r.load_state_dict(sd)
    assert r.get_scale() == s.get_scale()
    for i, c in enumerate(SCRIPT[7:], 7):
        opt.zero_grad()
        r.scale((p * dtorch.tensor([c, 1.0, 1.0])).sum()).backward()
        r.step(opt)
        r.update()
        assert (r.get_scale(), r._get_growth_tracker(),
                p.detach().numpy().tolist()) == full[i], i
    with pytest.raises(RuntimeError, match="source state dict is empty"):
        GradScaler("cpu").load_state_dict({})


def test_unscale_then_clip_equals_clipping_true_gradients():
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal((5, 4)).astype(np.float32)
    x = dtorch.tensor(rng.standard_normal((3, 4)).astype(np.float32))

    def grads(scaler):
        lin = dtorch.nn.Linear(4, 5)
        with dtorch.no_grad():
            lin.weight.copy_(dtorch.tensor(w0))
            lin.bias.zero_()
        opt = dtorch.optim.SGD(lin.parameters(), lr=1.0)
        loss = (lin(x) ** 2).sum()
        (scaler.scale(loss) if scaler else loss).backward()
        if scaler:
            scaler.unscale_(opt)
        n = dtorch.nn.utils.clip_grad_norm_(lin.parameters(), 0.5)
        return float(n), [p.grad.numpy().copy() for p in lin.parameters()]

    n1, g1 = grads(GradScaler("cpu", init_scale=2.0 ** 10))
    n0, g0 = grads(None)
    assert n1 == pytest.approx(n0, rel=1e-6)
    for a, b in zip(g1, g0):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


# the float16 parameter's gradient (65536) overflows float16
@pytest.mark.filterwarnings("ignore:overflow")
def test_stage_errors_as_torch():
    p = dtorch.nn.Parameter(dtorch.ones(2))
    opt = dtorch.optim.SGD([p], lr=0.1)
    s = GradScaler("cpu")
    with pytest.raises(AssertionError, match="_scale is None"):
        s.unscale_(opt)
    s.scale(p.sum()).backward()
    s.unscale_(opt)
    with pytest.raises(RuntimeError, match="already been called on this "
                       "optimizer since the last update"):
        s.unscale_(opt)
    s.step(opt)
    with pytest.raises(RuntimeError, match="after step"):
        s.unscale_(opt)
    with pytest.raises(RuntimeError, match="step\\(\\) has already been"):
        s.step(opt)
    s.update()
    with pytest.raises(AssertionError, match="No inf checks"):
        s.update()
    with pytest.raises(RuntimeError, match="Closure use"):
        s.scale(p.sum()).backward()
        s.step(opt, closure=lambda: 0)
    p16 = dtorch.nn.Parameter(dtorch.ones(2, dtype=dtorch.float16))
    o16 = dtorch.optim.SGD([p16], lr=0.1)
    s.scale(p16.float().sum()).backward()
    with pytest.raises(ValueError, match="unscale FP16 gradients"):
        s.unscale_(o16)


def test_disabled_and_new_scale():
    p = dtorch.nn.Parameter(dtorch.ones(2))
    opt = dtorch.optim.SGD([p], lr=1.0)
    s = GradScaler("cpu", enabled=False)
    loss = p.sum()
    assert s.scale(loss) is loss and s.get_scale() == 1.0
    loss.backward()
    s.step(opt)
    s.update()
    assert p.detach().numpy().tolist() == [0.0, 0.0]
    assert s.state_dict() == {}
    if not dtorch.cuda.is_available():
        with pytest.warns(UserWarning, match="CUDA is not available"):
            assert not dtorch.cuda.amp.GradScaler().is_enabled()
    s = GradScaler("cpu", init_scale=4.0)
    s.scale(p.sum()).backward()
    s.step(opt)
    s.update(new_scale=123.0)
    assert s.get_scale() == 123.0
    s.scale(p.sum()).backward()
    s.step(opt)
    s.update(dtorch.tensor(7.0))
    assert s.get_scale() == 7.0
    # scale() keeps a 16-bit loss's range: the product is float32
    assert s.scale(dtorch.tensor(60000.0).half()).dtype is dtorch.float32


def _rank_body(inf_rank, inf_step, steps):
    def body(*_):       # spawn_threads passes (rank, world_size)
        rank = dist.get_rank()
        p = dtorch.nn.Parameter(dtorch.tensor([1.0, 2.0]) * (rank + 1))
        opt = dtorch.optim.SGD([p], lr=0.1)
        s = GradScaler("cpu", init_scale=2.0 ** 8, growth_interval=2)
        log = []
        for i in range(steps):
            c = math.inf if (rank == inf_rank and i == inf_step) else 1.0
            opt.zero_grad()
            s.scale((p * dtorch.tensor([c, 1.0])).sum()).backward()
            before = p.detach().numpy().copy()
            s.step(opt)
            s.update()
            stepped = not np.array_equal(before, p.detach().numpy())
            log.append((stepped, s.get_scale()))
        return log
    return body


@pytest.mark.filterwarnings("ignore:invalid value")
@pytest.mark.filterwarnings("ignore:overflow")
@pytest.mark.parametrize("size", [2, 3])
def test_ranks_agree_on_skips_threads(size):
    logs = dist.spawn_threads(_rank_body(size - 1, 2, 5), size, timeout=60)
    assert all(log == logs[0] for log in logs)
    assert [st for st, _ in logs[0]] == [True, True, False, True, True]
    assert [sc for _, sc in logs[0]] == [256.0, 512.0, 256.0, 256.0, 512.0]


@pytest.mark.mpi(min_size=2)
@pytest.mark.filterwarnings("ignore:invalid value")
@pytest.mark.filterwarnings("ignore:overflow")
def test_ranks_agree_on_skips_mpi(mpi_world):
    size = dist.get_world_size()
    log = _rank_body(size - 1, 1, 4)()
    logs = [None] * size
    dist.all_gather_object(logs, log)
    assert all(lg == logs[0] for lg in logs)
    assert [st for st, _ in log] == [True, False, True, True]


@pytest.mark.filterwarnings("ignore:invalid value")
def test_tensor_parallel_autocast_one_shard_overflows():
    """Column -> Row parallel MLP under bfloat16 autocast with a GradScaler:
    at step 1 only rank 1's weight shard gets a non-finite gradient (as an
    overflow local to its shard would); every rank skips that step, keeps
    its parameters and halves the scale."""
    from dtorch.nn.parallel import tensor_parallel as tp

    def body(rank, n):
        dtorch.manual_seed(0)
        l1 = tp.ColumnParallelLinear(6, 8, gather_output=False)
        l2 = tp.RowParallelLinear(8, 4, input_is_parallel=True)
        params = list(l1.parameters()) + list(l2.parameters())
        opt = dtorch.optim.SGD(params, lr=0.1)
        s = GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=100)
        x = dtorch.randn(5, 6)
        log = []
        for i in range(3):
            opt.zero_grad()
            with dtorch.autocast("cpu"):
                h = l1(x)
                assert h.dtype is dtorch.bfloat16
                # the row layer's bias is added after its all-reduce, in
                # float32 (as a float32 bias after a bfloat16 matmul is)
                out = l2(dtorch.relu(h))
                loss = (out.float() ** 2).mean()
            s.scale(loss).backward()
            assert all(p.grad.dtype is dtorch.float32 for p in params)
            if i == 1 and rank == 1:
                with dtorch.no_grad():
                    l1.weight.grad[0, 0] = float("inf")
            before = [p.detach().numpy().copy() for p in params]
            s.step(opt)
            s.update()
            same = all(np.array_equal(b, p.detach().numpy())
                       for b, p in zip(before, params))
            log.append((same, s.get_scale()))
        return log
    logs = dist.spawn_threads(body, 2, timeout=60)
    assert logs[0] == logs[1]
    assert logs[0] == [(False, 1024.0), (True, 512.0), (False, 512.0)]
