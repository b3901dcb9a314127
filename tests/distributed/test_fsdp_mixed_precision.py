"""FSDP mixed precision (MixedPrecision / MixedPrecisionPolicy): the shards
stay float32 master weights, the gathered parameters the forward and
backward see are param_dtype, gradients are averaged in reduce_dtype and
land on the shards as float32; a 5-step trajectory equals a single-process
reference doing the same casts. Threads backend, 2 ranks."""
import copy

import numpy as np
import pytest

import dtorch
import dtorch.distributed as dist
from dtorch import nn, optim
from dtorch.amp import GradScaler
from dtorch.distributed.fsdp import (FSDP, MixedPrecision,
                                     MixedPrecisionPolicy, ModuleWrapPolicy,
                                     fully_shard)

BF16, F16, F32 = dtorch.bfloat16, dtorch.float16, dtorch.float32
BATCH, STEPS, SIZE = 8, 5, 2


def _make():
    return nn.Sequential(nn.Linear(7, 5), nn.Tanh(), nn.Linear(5, 3),
                         nn.Tanh(), nn.Linear(3, 1))


dtorch.manual_seed(0)
_STATE = {k: v.detach().numpy().copy()
          for k, v in _make().state_dict().items()}


def net():
    # the same weights on every rank (threads share the global RNG)
    m = _make()
    m.load_state_dict({k: dtorch.tensor(v) for k, v in _STATE.items()})
    return m


def batch(step):
    rng = np.random.default_rng(200 + step)
    return (dtorch.tensor(rng.standard_normal((BATCH, 7)), dtype=F32),
            dtorch.tensor(rng.standard_normal((BATCH, 1)), dtype=F32))


def loss_fn(out, y):
    return ((out - y) ** 2).mean()


def fsdp_train(rank, mp, policy=True, steps=STEPS):
    f = FSDP(net(), mixed_precision=mp,
             auto_wrap_policy=ModuleWrapPolicy({nn.Linear}) if policy
             else None)
    opt = optim.Adam(f.parameters(), lr=0.05)
    k = BATCH // SIZE
    for s in range(steps):
        x, y = batch(s)
        opt.zero_grad()
        loss_fn(f(x[rank * k:(rank + 1) * k]),
                y[rank * k:(rank + 1) * k]).backward()
        opt.step()
    return {n: v.detach().numpy().copy() for n, v in f.state_dict().items()}


def reference(param_dtype, reduce_dtype, steps=STEPS):
    """Single process: per rank, a param_dtype copy of the float32 master
    model runs that rank's half batch; the gradients are averaged in
    reduce_dtype (halved, then summed: exact for 2 ranks) and cast to
    float32 for the same optimizer."""
    m = net()
    opt = optim.Adam(m.parameters(), lr=0.05)
    rnp = reduce_dtype.np
    k = BATCH // SIZE
    for s in range(steps):
        x, y = batch(s)
        total = None
        for r in range(SIZE):
            low = copy.deepcopy(m).to(param_dtype)
            loss_fn(low(x[r * k:(r + 1) * k].to(param_dtype)),
                    y[r * k:(r + 1) * k]).backward()
            gs = [p.grad.numpy().astype(rnp) / rnp.type(SIZE)
                  for p in low.parameters()]
            total = gs if total is None else [a + b for a, b in
                                              zip(total, gs)]
        opt.zero_grad()
        for p, g in zip(m.parameters(), total):
            p.grad = dtorch.tensor(g.astype(np.float32))
        opt.step()
    return {n: v.detach().numpy().copy() for n, v in m.state_dict().items()}


def test_forward_sees_low_precision_shards_stay_float32():
    def body(rank, size):
        inner = net()
        seen = []
        for lin in (inner[0], inner[4]):
            lin.register_forward_hook(lambda m, i, o: seen.append(
                (m.weight.dtype, m.bias.dtype, i[0].dtype, o.dtype)))
        f = FSDP(inner, mixed_precision=MixedPrecision(param_dtype=BF16),
                 auto_wrap_policy=ModuleWrapPolicy({nn.Linear}))
        x, y = batch(0)
        out = f(x)
        loss_fn(out, y).backward()
        return (seen, out.dtype, [p.dtype for p in f.parameters()],
                [p.grad.dtype for p in f.parameters()],
                {n: v.dtype for n, v in f.state_dict().items()})
    for seen, odt, pdt, gdt, sdt in dist.spawn_threads(body, SIZE,
                                                       timeout=120):
        # forward, and the recomputation in backward
        assert len(seen) == 4
        assert all(s == (BF16, BF16, BF16, BF16) for s in seen), seen
        assert odt == BF16
        assert len(pdt) == 3 and all(d == F32 for d in pdt)
        assert all(d == F32 for d in gdt)
        assert all(d == F32 for d in sdt.values())


@pytest.mark.parametrize("policy", [True, False])
@pytest.mark.parametrize("reduce_dtype", [None, F32])
def test_trajectory_equals_reference_with_same_casts(reduce_dtype, policy):
    mp = MixedPrecision(param_dtype=BF16, reduce_dtype=reduce_dtype)
    want = reference(BF16, reduce_dtype or BF16)
    full = reference(F32, F32)
    for sd in dist.spawn_threads(lambda r, s: fsdp_train(r, mp, policy),
                                 SIZE, timeout=120):
        assert sorted(sd) == sorted(want)
        for n in want:
            assert sd[n].dtype == np.float32
            np.testing.assert_allclose(sd[n], want[n], rtol=1e-6,
                                       atol=1e-7, err_msg=n)
        # and bfloat16 really changed the run
        assert max(np.abs(sd[n] - full[n]).max() for n in full) > 1e-4
    # the float32 run itself is the float32 reference
    for sd in dist.spawn_threads(lambda r, s: fsdp_train(r, None, policy),
                                 SIZE, timeout=120):
        for n in full:
            np.testing.assert_allclose(sd[n], full[n], rtol=1e-5, atol=1e-6)


def test_keep_low_precision_grads_and_buffer_dtype():
    def body(rank, size):
        inner = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
        f = FSDP(inner, mixed_precision=MixedPrecision(
            param_dtype=BF16, buffer_dtype=BF16,
            keep_low_precision_grads=True))
        x = dtorch.randn(6, 4)
        f(x).sum().backward()
        sd = f.state_dict()
        return (f._flat_param.grad.dtype, inner[1].running_mean.dtype,
                sd["1.running_mean"].dtype, sd["1.num_batches_tracked"].dtype)
    for g, buf, saved, nbt in dist.spawn_threads(body, SIZE, timeout=60):
        assert g == BF16 and buf == BF16
        assert saved == F32 and nbt == dtorch.int64


# the first steps overflow float16 on purpose
@pytest.mark.filterwarnings("ignore:.*(overflow|invalid value)")
def test_float16_with_grad_scaler():
    """float16 parameters and reduction; GradScaler's found-inf is agreed
    over the ranks: every rank skips the same steps (a scale too large at
    first) and ends with the same model and scale."""
    def body(rank, size):
        f = FSDP(net(), mixed_precision=MixedPrecision(param_dtype=F16),
                 auto_wrap_policy=ModuleWrapPolicy({nn.Linear}))
        opt = optim.SGD(f.parameters(), lr=0.1)
        scaler = GradScaler("cpu", init_scale=2.0 ** 17)
        start = {n: v.numpy().copy() for n, v in f.state_dict().items()}
        scales, k = [], BATCH // size
        for s in range(8):
            x, y = batch(s)
            opt.zero_grad()
            loss = loss_fn(f(x[rank * k:(rank + 1) * k]),
                           y[rank * k:(rank + 1) * k])
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            scales.append(scaler.get_scale())
        end = {n: v.numpy().copy() for n, v in f.state_dict().items()}
        return scales, start, end
    (s0, a0, e0), (s1, a1, e1) = dist.spawn_threads(body, SIZE, timeout=120)
    assert s0 == s1
    assert s0[0] < 2.0 ** 17          # an overflow was found and skipped
    for n in e0:
        np.testing.assert_array_equal(e0[n], e1[n])
        assert np.isfinite(e0[n]).all()
    assert any(np.abs(e0[n] - a0[n]).max() > 0 for n in e0), s0


def test_fully_shard_mixed_precision_policy():
    def body(rank, size):
        m = net()
        seen = []
        m[0].register_forward_hook(
            lambda mod, i, o: seen.append(mod.weight.dtype))
        # m[0] stays in the root's unit: its hook runs while gathered
        for lin in (m[2], m[4]):
            fully_shard(lin, mp_policy=MixedPrecisionPolicy(
                param_dtype=BF16, reduce_dtype=F32))
        fully_shard(m, mp_policy=MixedPrecisionPolicy(
            param_dtype=BF16, output_dtype=F32))
        x, y = batch(0)
        out = m(x)
        loss_fn(out, y).backward()
        return seen, out.dtype, [p.grad.dtype for p in m.parameters()]
    for seen, odt, gdt in dist.spawn_threads(body, SIZE, timeout=60):
        assert seen and all(d == BF16 for d in seen)
        assert odt == F32
        assert len(gdt) == 3 and all(d == F32 for d in gdt)


def test_bad_mixed_precision_argument():
    def body(rank, size):
        with pytest.raises(TypeError, match="MixedPrecision"):
            FSDP(net(), mixed_precision=BF16)
        with pytest.raises(TypeError, match="MixedPrecisionPolicy"):
            fully_shard(net(), mp_policy=MixedPrecision())
        return True
    assert all(dist.spawn_threads(body, SIZE, timeout=60))
