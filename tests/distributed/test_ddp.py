"""DistributedDataParallel: equivalence with single-process training on the
concatenated batch (float64, 1e-10), buckets, no_sync, unused parameters,
join, comm hooks; threads backend here, MPI under mpiexec."""
import numpy as np
import pytest

import dtorch
import dtorch.distributed as dist
from dtorch import nn
from dtorch.nn.parallel import DistributedDataParallel as DDP

F64 = dtorch.float64


def make_model(seed=0):
    dtorch.manual_seed(seed)
    m = nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 16),
                      nn.ReLU(), nn.Linear(16, 3)).to(F64)
    return m


def state_arrays(model):
    return {k: v.detach().numpy().copy()
            for k, v in model.state_dict().items()}


def load_arrays(model, arrays):
    model.load_state_dict({k: dtorch.tensor(v) for k, v in arrays.items()})


def data(n, seed=1):
    rng = np.random.default_rng(seed)
    return (dtorch.tensor(rng.standard_normal((n, 5))),
            dtorch.tensor(rng.standard_normal((n, 3))))


def train_single(init, x, y, steps, micro=1):
    m = make_model()
    load_arrays(m, init)
    opt = dtorch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.mse_loss(m(x), y).backward()
        opt.step()
    return state_arrays(m)


def train_ddp(rank, ws, init, x, y, steps, micro=1, comm_hook=None,
              **ddp_kw):
    m = make_model(seed=100 + rank)     # different init: DDP must sync
    if rank == 0:
        load_arrays(m, init)
    model = DDP(m, **ddp_kw)
    if comm_hook is not None:
        model.register_comm_hook(None, comm_hook)
    opt = dtorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    b = x.shape[0] // ws
    xs, ys = x[rank * b:(rank + 1) * b], y[rank * b:(rank + 1) * b]
    mb = b // micro
    for _ in range(steps):
        opt.zero_grad()
        for k in range(micro):
            xk, yk = xs[k * mb:(k + 1) * mb], ys[k * mb:(k + 1) * mb]
            if k < micro - 1:
                with model.no_sync():
                    (nn.functional.mse_loss(model(xk), yk) / micro).backward()
            else:
                (nn.functional.mse_loss(model(xk), yk) / micro).backward()
        opt.step()
    return state_arrays(m)


def assert_same(a, b, tol=1e-10):
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=0, atol=tol, err_msg=k)


@pytest.mark.parametrize("ws", [2, 4])
@pytest.mark.parametrize("cap", [25, 0.0005])
def test_ddp_equals_single_process_on_concatenated_batch(ws, cap):
    init = state_arrays(make_model())
    x, y = data(8 * ws)
    ref = train_single(init, x, y, steps=4)
    res = dist.spawn_threads(
        lambda r, n: train_ddp(r, n, init, x, y, 4, bucket_cap_mb=cap), ws,
        timeout=60)
    for r in res:
        assert_same(ref, r)


def test_no_sync_accumulation_equals_one_big_step():
    init = state_arrays(make_model())
    x, y = data(24)
    ref = train_single(init, x, y, steps=3)
    res = dist.spawn_threads(
        lambda r, n: train_ddp(r, n, init, x, y, 3, micro=3), 2, timeout=60)
    for r in res:
        assert_same(ref, r)


def test_gradient_as_bucket_view_same_result():
    init = state_arrays(make_model())
    x, y = data(16)
    ref = train_single(init, x, y, steps=3)
    res = dist.spawn_threads(
        lambda r, n: train_ddp(r, n, init, x, y, 3, bucket_cap_mb=0.001,
                               gradient_as_bucket_view=True), 2, timeout=60)
    for r in res:
        assert_same(ref, r)


def test_one_all_reduce_per_bucket():
    def body(rank, ws):
        m = make_model()
        model = DDP(m, bucket_cap_mb=0.0015)   # ~390 float64 values a bucket
        calls = []
        pg = model.process_group
        orig, orig_c = pg.all_reduce, pg.all_reduce_coalesced

        def counting(arr, op="sum", async_op=False):
            calls.append(arr.size)
            return orig(arr, op, async_op)

        def counting_c(arrs, op="sum", async_op=False):
            calls.append(sum(a.size for a in arrs))
            return orig_c(arrs, op, async_op)
        pg.all_reduce, pg.all_reduce_coalesced = counting, counting_c
        x, y = data(4, seed=rank)
        for _ in range(2):
            nn.functional.mse_loss(model(x), y).backward()
        n_params = sum(p.numel() for p in m.parameters())
        return len(calls), model.bucket_sizes, sum(calls), n_params
    for n_calls, sizes, total, n_params in dist.spawn_threads(body, 2,
                                                              timeout=60):
        assert len(sizes) > 2            # parameters straddle buckets
        assert n_calls == 2 * len(sizes)
        assert total == 2 * n_params


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4).to(F64)
        self.unused = nn.Linear(4, 4).to(F64)

    def forward(self, x):
        return self.a(x)


def test_unused_parameters_error_names_them_and_flag_fixes_it():
    def body(rank, ws):
        model = DDP(Branchy())
        x = dtorch.randn(2, 4, dtype=F64)
        model(x).sum().backward()
        with pytest.raises(RuntimeError, match="unused.weight, unused.bias"):
            model(x)
        ok = DDP(Branchy(), find_unused_parameters=True)
        for _ in range(2):
            ok(x).sum().backward()
        return ok.module.a.weight.grad is not None
    assert all(dist.spawn_threads(body, 2, timeout=60))


@pytest.mark.parametrize("ws", [2, 3])
@pytest.mark.parametrize("hook,tol", [("fp16_compress_hook", 2e-3),
                                      ("bf16_compress_hook", 2e-2)])
def test_compress_hooks_within_low_precision_tolerance(hook, tol, ws):
    from dtorch.distributed.algorithms.ddp_comm_hooks import default_hooks
    init = state_arrays(make_model())
    x, y = data(8 * ws)
    ref = train_single(init, x, y, steps=2)

    def body(rank, ws):
        m = make_model()
        load_arrays(m, init)
        model = DDP(m, bucket_cap_mb=0.001)    # several buckets, odd sizes
        model.register_comm_hook(None, getattr(default_hooks, hook))
        opt = dtorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        xs, ys = x[rank * 8:(rank + 1) * 8], y[rank * 8:(rank + 1) * 8]
        for _ in range(2):
            opt.zero_grad()
            nn.functional.mse_loss(model(xs), ys).backward()
            opt.step()
        return state_arrays(m)
    res = dist.spawn_threads(body, ws, timeout=60)
    for r in res:
        assert_same(ref, r, tol=tol)
        assert_same(res[0], r, tol=0)        # every rank applies the same


def test_join_uneven_inputs_no_hang():
    def body(rank, ws):
        model = DDP(make_model())
        opt = dtorch.optim.SGD(model.parameters(), lr=0.05)
        n_batches = 2 + rank * 2      # rank 1 has more data
        with model.join():
            for i in range(n_batches):
                x, y = data(4, seed=10 * rank + i)
                opt.zero_grad()
                nn.functional.mse_loss(model(x), y).backward()
                opt.step()
        return state_arrays(model.module)
    a, b = dist.spawn_threads(body, 2, timeout=60)
    assert_same(a, b, tol=0)


def test_state_dict_prefix_and_loading_bare_state():
    def body(rank, ws):
        m = make_model()
        model = DDP(m)
        sd = model.state_dict()
        assert all(k.startswith("module.") for k in sd)
        model.load_state_dict(sd)
        model.load_state_dict(m.state_dict())     # bare keys work too
        return True
    assert all(dist.spawn_threads(body, 2, timeout=60))


def test_world_size_one_is_plain_training():
    init = state_arrays(make_model())
    x, y = data(8)
    ref = train_single(init, x, y, steps=2)
    res = dist.spawn_threads(lambda r, n: train_ddp(r, n, init, x, y, 2), 1)
    assert_same(ref, res[0])


@pytest.mark.mpi(min_size=2)
def test_ddp_mpi_equivalence(mpi_world):
    ws, rank = dist.get_world_size(), dist.get_rank()
    init = state_arrays(make_model())
    x, y = data(8 * ws)
    ref = train_single(init, x, y, steps=3)
    for cap in (25, 0.0005):
        res = train_ddp(rank, ws, init, x, y, 3, bucket_cap_mb=cap)
        assert_same(ref, res)
    res = train_ddp(rank, ws, init, x, y, 3, micro=2)
    assert_same(ref, res)
    from dtorch.distributed.algorithms.ddp_comm_hooks import default_hooks
    res = train_ddp(rank, ws, init, x, y, 3, bucket_cap_mb=0.001,
                    comm_hook=default_hooks.fp16_compress_hook)
    assert_same(ref, res, tol=3e-3)


@pytest.mark.parametrize("ws", [2, 3])
def test_sync_batchnorm_equals_batchnorm_on_concatenated_batch(ws):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4 * ws, 3, 5, 5))
    c = rng.standard_normal((4 * ws, 3, 5, 5))
    bn = nn.BatchNorm2d(3).to(F64)
    bn.weight.data.copy_(dtorch.tensor([1.0, 2.0, 0.5]))
    xt = dtorch.tensor(x, requires_grad=True)
    yt = bn(xt)
    (yt * dtorch.tensor(c)).sum().backward()
    ref = (yt.detach().numpy(), xt.grad.numpy(), bn.weight.grad.numpy(),
           bn.running_mean.numpy(), bn.running_var.numpy())

    def body(rank, n):
        m = nn.SyncBatchNorm.convert_sync_batchnorm(
            nn.Sequential(nn.BatchNorm2d(3))).to(F64)
        m[0].weight.data.copy_(dtorch.tensor([1.0, 2.0, 0.5]))
        sl = slice(4 * rank, 4 * rank + 4)
        xr = dtorch.tensor(x[sl], requires_grad=True)
        y = m(xr)
        (y * dtorch.tensor(c[sl])).sum().backward()
        gw = m[0].weight.grad.clone()
        dist.all_reduce(gw)
        return (y.detach().numpy(), xr.grad.numpy(), gw.numpy(),
                m[0].running_mean.numpy(), m[0].running_var.numpy(), rank)
    for y, gx, gw, rm, rv, rank in dist.spawn_threads(body, ws, timeout=30):
        sl = slice(4 * rank, 4 * rank + 4)
        np.testing.assert_allclose(y, ref[0][sl], atol=1e-10)
        np.testing.assert_allclose(gx, ref[1][sl], atol=1e-10)
        np.testing.assert_allclose(gw, ref[2], atol=1e-10)
        np.testing.assert_allclose(rm, ref[3], atol=1e-10)
        np.testing.assert_allclose(rv, ref[4], atol=1e-10)


def test_sync_batchnorm_gradcheck_single_rank():
    m = nn.SyncBatchNorm(2).to(F64)
    x = dtorch.randn(3, 2, 4, dtype=F64, requires_grad=True)
    assert dtorch.autograd.gradcheck(lambda t: m(t), [x])


def test_evaluation_between_steps_needs_no_backward():
    init = state_arrays(make_model())
    x, y = data(16)
    ref = train_single(init, x, y, steps=2)

    def body(rank, ws):
        m = make_model()
        load_arrays(m, init)
        model = DDP(m)
        opt = dtorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        xs, ys = x[rank * 8:(rank + 1) * 8], y[rank * 8:(rank + 1) * 8]
        for _ in range(2):
            with dtorch.no_grad():
                model(xs)                  # evaluation: no reduction owed
            opt.zero_grad()
            nn.functional.mse_loss(model(xs), ys).backward()
            opt.step()
        return state_arrays(m)
    for r in dist.spawn_threads(body, 2, timeout=60):
        assert_same(ref, r)
