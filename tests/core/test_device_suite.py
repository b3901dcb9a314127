"""The device-parametrised suite: ops, nn layers, losses, optimizers,
serialization, DDP and tensor parallel (over spawn_threads) give on the
`device` fixture's device what they give on the CPU (float64, 1e-10).

On a CPU machine the cuda half runs on the strict CuPy stand-in
(DTORCH_FAKE_CUDA=1, tests/fakecupy): it checks the CUDA path's use of
CuPy's API; on a GPU machine (benchmarks/gpu_check.sh, ``-m gpu``) the same
tests check the GPU's results."""
import numpy as np
import pytest

import dtorch
import dtorch.distributed as dist
from dtorch import nn
from dtorch.nn import functional as F

F64 = dtorch.float64
CUDA = dtorch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs CuPy (or "
                                "DTORCH_FAKE_CUDA=1)")
# with two GPUs the suite also runs on cuda:1 while device 0 stays current:
# CuPy launches kernels on the current device, so every op, backward node
# and optimizer update must run under its operands' device
DEVICES = ["cpu"] + (["cuda"] if CUDA else []) + (
    ["cuda:1"] if CUDA and dtorch.cuda.device_count() >= 2 else [])


@pytest.fixture(params=DEVICES)
def device(request):
    if request.param == "cuda:1":
        assert dtorch.cuda.current_device() == 0
        yield request.param
        # the device guards leave the current device as they found it
        assert dtorch.cuda.current_device() == 0
    else:
        yield request.param


# DDP and tensor parallel ranks make their own GPU current first
# (dtorch.cuda.set_device, as PyTorch requires for NCCL);
# test_ddp_ranks_on_different_gpus_reduce_on_their_devices covers that
RANK_DEVICES = [d for d in DEVICES if d != "cuda:1"]


def host(t):
    return t.detach().cpu().numpy()


def same(a, b, tol=1e-10, what=""):
    for i, (x, y) in enumerate(zip(a, b)):
        np.testing.assert_allclose(x, y, rtol=tol, atol=tol,
                                   err_msg=f"{what} output {i}")


def rnd(*shape, seed=0, device="cpu", grad=True, positive=False):
    a = np.random.default_rng(seed).standard_normal(shape)
    if positive:
        a = np.abs(a) + 0.1
    return dtorch.tensor(a, dtype=F64, device=device, requires_grad=grad)


def outputs_and_grads(fn, xs):
    out = fn(*xs)
    outs = out if isinstance(out, tuple) else (out,)
    loss = sum((o.double() * (k + 1.5)).sum() for k, o in enumerate(outs)
               if o.dtype.is_floating_point)
    loss.backward()
    return [host(o) for o in outs] + [host(x.grad) for x in xs
                                      if x.grad is not None]


# (name, fn, input shapes, positive)
OPS = [
    ("matmul_bcast", lambda a, b: a @ b, [(2, 3, 4), (4, 5)], False),
    ("softmax", lambda a: F.softmax(a, -1), [(3, 5)], False),
    ("log_softmax", lambda a: F.log_softmax(a, 1), [(3, 5, 2)], False),
    ("gelu_erf", lambda a: F.gelu(a), [(4, 3)], False),
    ("gelu_tanh", lambda a: F.gelu(a, approximate="tanh"), [(4, 3)], False),
    ("silu_sigmoid", lambda a: F.silu(a) + dtorch.sigmoid(a), [(5,)], False),
    ("layer_norm", lambda a, w, b: F.layer_norm(a, (4,), w, b),
     [(3, 4), (4,), (4,)], False),
    ("batch_norm_train", lambda a: F.batch_norm(
        a, None, None, training=True), [(6, 3, 2)], False),
    ("conv2d", lambda a, w, b: F.conv2d(a, w, b, stride=1, padding=1),
     [(2, 3, 5, 5), (4, 3, 3, 3), (4,)], False),
    ("conv2d_stride_groups", lambda a, w: F.conv2d(a, w, stride=2,
                                                   groups=2),
     [(1, 4, 6, 6), (2, 2, 2, 2)], False),
    ("max_pool2d", lambda a: F.max_pool2d(a, 2), [(2, 3, 4, 4)], False),
    ("avg_pool2d", lambda a: F.avg_pool2d(a, 2), [(2, 3, 4, 4)], False),
    ("max_dim", lambda a: a.max(1)[0], [(3, 4)], False),
    ("pow_rpow", lambda a, b: a ** b + 2.0 ** b, [(3, 4), (4,)], True),
    ("where_scalar", lambda a: dtorch.where(a > 0, a, 0.5 * a), [(6,)],
     False),
    ("cat_stack_index", lambda a, b: dtorch.cat([a, b])[[0, 2, 2]] +
     dtorch.stack([a, b]).sum(0)[1], [(2, 3), (2, 3)], False),
    ("view_of_transpose", lambda a: a.t().reshape(-1) * 2, [(3, 4)], False),
    ("cumsum_logsumexp", lambda a: a.cumsum(1) + a.logsumexp(1, True),
     [(3, 4)], False),
    ("norm_clamp", lambda a: a.norm(dim=1) + a.clamp(-0.5, 0.5).sum(1),
     [(3, 4)], False),
    ("dropout_eval", lambda a: F.dropout(a, 0.5, training=False),
     [(4, 4)], False),
]


@pytest.mark.parametrize("name,fn,shapes,pos", OPS,
                         ids=[o[0] for o in OPS])
def test_ops_match_cpu(name, fn, shapes, pos, device):
    def run(dev):
        xs = [rnd(*s, seed=i, device=dev, positive=pos)
              for i, s in enumerate(shapes)]
        return outputs_and_grads(fn, xs)
    same(run("cpu"), run(device), what=name)


class _SelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x):
        return self.attn(x, x, x)[0]


def _layers():
    return [
        ("linear_mlp", lambda: nn.Sequential(
            nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)),
         lambda d: rnd(5, 6, seed=1, device=d, grad=False)),
        ("embedding_lstm", lambda: nn.Sequential(
            nn.Embedding(10, 4), nn.LSTM(4, 5, batch_first=True)),
         lambda d: dtorch.tensor([[1, 2, 3], [4, 5, 9]], device=d)),
        ("gru", lambda: nn.GRU(3, 4, num_layers=2),
         lambda d: rnd(5, 2, 3, seed=2, device=d, grad=False)),
        ("conv_bn_pool", lambda: nn.Sequential(
            nn.Conv2d(2, 3, 3, padding=1), nn.BatchNorm2d(3), nn.ReLU(),
            nn.MaxPool2d(2), nn.Flatten(), nn.Linear(12, 2)),
         lambda d: rnd(2, 2, 4, 4, seed=3, device=d, grad=False)),
        ("multihead_attention", lambda: _SelfAttention(),
         lambda d: rnd(2, 3, 8, seed=4, device=d, grad=False)),
    ]


@pytest.mark.parametrize("k", range(len(_layers())),
                         ids=[l[0] for l in _layers()])
def test_layers_match_cpu(k, device):
    name, make, inp = _layers()[k]

    def run(dev):
        dtorch.manual_seed(0)
        m = make().to(F64).to(dev)
        out = m(inp(dev))
        out = out[0] if isinstance(out, tuple) else out
        (out * out).sum().backward()
        return [host(out)] + [host(p.grad) for p in m.parameters()]
    same(run("cpu"), run(device), what=name)


LOSSES = [
    ("cross_entropy", lambda x, t: F.cross_entropy(x, t)),
    ("cross_entropy_smooth_ignore", lambda x, t: F.cross_entropy(
        x, t.masked_fill(t == 1, -100), label_smoothing=0.1)),
    ("cross_entropy_weight_sum", lambda x, t: F.cross_entropy(
        x, t, weight=dtorch.arange(1., 5., dtype=F64, device=x.device),
        reduction="sum")),
    ("nll_loss", lambda x, t: F.nll_loss(F.log_softmax(x, 1), t)),
    ("mse", lambda x, t: F.mse_loss(x, dtorch.zeros_like(x) + 0.3)),
    ("l1_smooth_l1", lambda x, t: F.l1_loss(x, x.detach() * 0.5) +
     F.smooth_l1_loss(x, x.detach() * 0.1)),
    ("bce", lambda x, t: F.binary_cross_entropy(
        dtorch.sigmoid(x), (x.detach() > 0).double())),
    ("bce_with_logits", lambda x, t: F.binary_cross_entropy_with_logits(
        x, (x.detach() > 0.2).double())),
    ("kl_div", lambda x, t: F.kl_div(F.log_softmax(x, 1),
                                     F.softmax(x.detach() * 2, 1),
                                     reduction="batchmean")),
]


@pytest.mark.parametrize("name,fn", LOSSES, ids=[x[0] for x in LOSSES])
def test_losses_match_cpu(name, fn, device):
    def run(dev):
        x = rnd(6, 4, seed=5, device=dev)
        t = dtorch.tensor([0, 1, 3, 2, 1, 0], device=dev)
        loss = fn(x, t)
        loss.backward()
        return [host(loss), host(x.grad)]
    same(run("cpu"), run(device), what=name)


OPTIMS = [
    ("sgd_momentum", lambda p: dtorch.optim.SGD(p, lr=0.1, momentum=0.9,
                                                nesterov=True)),
    ("adam", lambda p: dtorch.optim.Adam(p, lr=0.01)),
    ("adamw_amsgrad", lambda p: dtorch.optim.AdamW(p, lr=0.01,
                                                   amsgrad=True)),
    ("rmsprop", lambda p: dtorch.optim.RMSprop(p, lr=0.01, momentum=0.5)),
    ("adagrad", lambda p: dtorch.optim.Adagrad(p, lr=0.1)),
]


@pytest.mark.parametrize("name,make", OPTIMS, ids=[o[0] for o in OPTIMS])
def test_optimizers_and_clipping_match_cpu(name, make, device):
    def run(dev):
        dtorch.manual_seed(0)
        m = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 2))
        m = m.to(F64).to(dev)
        opt = make(m.parameters())
        x = rnd(8, 4, seed=6, device=dev, grad=False)
        for _ in range(3):
            opt.zero_grad()
            F.mse_loss(m(x), x[:, :2]).backward()
            nn.utils.clip_grad_norm_(m.parameters(), 0.5)
            opt.step()
        return [host(p) for p in m.parameters()]
    same(run("cpu"), run(device), what=name)


def test_serialization_round_trip(device, tmp_path):
    dtorch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)).to(device)
    opt = dtorch.optim.Adam(m.parameters(), lr=0.1)
    m(dtorch.randn(5, 3, device=device)).sum().backward()
    opt.step()
    path = tmp_path / "ckpt.pt"
    dtorch.save({"model": m.state_dict(), "opt": opt.state_dict()}, path)
    for loc in ("cpu", device):
        ck = dtorch.load(path, map_location=loc)
        for k, v in m.state_dict().items():
            assert ck["model"][k].device == dtorch.device(loc)
            np.testing.assert_array_equal(host(ck["model"][k]), host(v))
        m2 = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)).to(device)
        m2.load_state_dict(ck["model"])
        opt2 = dtorch.optim.Adam(m2.parameters(), lr=0.1)
        opt2.load_state_dict(ck["opt"])
        for p in m2.parameters():
            assert p.device == dtorch.device(device)
            for s in opt2.state[p].values():
                if isinstance(s, dtorch.Tensor) and s.ndim:
                    assert s.device == p.device


def _ddp_body(rank, ws, device, init, x, y):
    from dtorch.nn.parallel import DistributedDataParallel as DDP
    m = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3)).to(F64)
    m.load_state_dict({k: dtorch.tensor(v) for k, v in init.items()}
                      if rank == 0 else m.state_dict())
    model = DDP(m.to(device), bucket_cap_mb=0.0001)
    opt = dtorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    b = x.shape[0] // ws
    xs = x[rank * b:(rank + 1) * b].to(device)
    ys = y[rank * b:(rank + 1) * b].to(device)
    for _ in range(3):
        opt.zero_grad()
        F.mse_loss(model(xs), ys).backward()
        opt.step()
    return {k: host(v) for k, v in m.state_dict().items()}


def _ddp_reference():
    """A float64 MLP trained 3 SGD steps in one process: (model, its initial
    state on the host, x, y) for the DDP runs to match."""
    dtorch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3)).to(F64)
    init = {k: host(v).copy() for k, v in ref.state_dict().items()}
    x, y = rnd(8, 5, seed=7, grad=False), rnd(8, 3, seed=8, grad=False)
    opt = dtorch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for _ in range(3):
        opt.zero_grad()
        F.mse_loss(ref(x), y).backward()
        opt.step()
    return ref, init, x, y


@pytest.mark.parametrize("device", RANK_DEVICES)
def test_ddp_over_threads_equals_single_process(device):
    ref, init, x, y = _ddp_reference()
    res = dist.spawn_threads(
        lambda r, n: _ddp_body(r, n, device, init, x, y), 2,
        timeout=60)
    for r in res:
        for k, v in ref.state_dict().items():
            np.testing.assert_allclose(r[k], host(v), rtol=0, atol=1e-10,
                                       err_msg=k)


def _tp_body(rank, ws, device, w1, w2, x):
    from dtorch.nn.parallel import tensor_parallel as tp
    l1, l2 = nn.Linear(6, 8).to(F64), nn.Linear(8, 4).to(F64)
    l1.load_state_dict(w1)
    l2.load_state_dict(w2)
    model = nn.Sequential(
        tp.ColumnParallelLinear.from_linear(l1, gather_output=False),
        nn.Tanh(),
        tp.RowParallelLinear.from_linear(l2, input_is_parallel=True))
    model = model.to(device)
    xin = x.clone().to(device).requires_grad_(True)
    out = model(xin)
    (out * out).sum().backward()
    return host(out), host(xin.grad)


@pytest.mark.parametrize("device", RANK_DEVICES)
def test_tensor_parallel_over_threads_matches_serial(device):
    dtorch.manual_seed(0)
    l1, l2 = nn.Linear(6, 8).to(F64), nn.Linear(8, 4).to(F64)
    x = rnd(5, 6, seed=9, grad=False)
    xr = x.clone().requires_grad_(True)
    ref = l2(dtorch.tanh(l1(xr)))
    (ref * ref).sum().backward()
    w1, w2 = l1.state_dict(), l2.state_dict()
    res = dist.spawn_threads(
        lambda r, n: _tp_body(r, n, device, w1, w2, x), 2,
        timeout=60)
    for out, gx in res:
        same([host(ref), host(xr.grad)], [out, gx], what="tp")


# ------------------------------------------------ cuda-only behaviour ----

@needs_cuda
@pytest.mark.gpu
def test_cuda_index_honoured_by_factories_and_to():
    if dtorch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA devices")
    for make in (lambda: dtorch.zeros(3, device="cuda:1"),
                 lambda: dtorch.randn(3, device="cuda:1"),
                 lambda: dtorch.tensor([1., 2.], device="cuda:1"),
                 lambda: dtorch.arange(4, device="cuda:1"),
                 lambda: dtorch.ones(2).to("cuda:1"),
                 lambda: dtorch.ones(2, device="cuda").to("cuda:1"),
                 lambda: dtorch.ones(2).cuda(1)):
        t = make()
        assert t.device == dtorch.device("cuda:1")
        assert t._data.device.id == 1
    # back from device 1 to 0, and to the host
    t = dtorch.ones(2, device="cuda:1")
    assert t.to("cuda:0")._data.device.id == 0
    assert t.cpu().device.type == "cpu"


@needs_cuda
@pytest.mark.gpu
def test_cuda_means_the_current_device():
    if dtorch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA devices")
    prev = dtorch.cuda.current_device()
    try:
        dtorch.cuda.set_device(1)
        assert dtorch.zeros(2, device="cuda").device.index == 1
        assert dtorch.ones(2).to("cuda").device.index == 1
        assert dtorch.ones(2).cuda().device.index == 1
    finally:
        dtorch.cuda.set_device(prev)
    assert dtorch.zeros(2, device="cuda").device.index == prev


@needs_cuda
@pytest.mark.gpu
def test_tensor_of_cuda_tensor_to_cpu_copies_to_host():
    c = dtorch.arange(3., device="cuda")
    h = dtorch.tensor(c, device="cpu")
    assert h.device.type == "cpu" and type(h._data) is np.ndarray
    assert h.tolist() == [0., 1., 2.]
    assert dtorch.as_tensor(c, device="cpu").device.type == "cpu"


@needs_cuda
@pytest.mark.gpu
def test_normal_with_cuda_mean_draws_on_that_device():
    mean = dtorch.zeros(4, dtype=F64, device="cuda")
    out = dtorch.normal(mean, 1.0)
    assert out.device == mean.device and out.dtype is F64
    out = dtorch.normal(0.0, dtorch.ones(3, device="cuda"))
    assert out.device.type == "cuda"


@needs_cuda
@pytest.mark.gpu
def test_bfloat16_on_cuda_is_a_clear_error():
    with pytest.raises(TypeError, match="bfloat16.*CUDA"):
        dtorch.zeros(2, dtype=dtorch.bfloat16, device="cuda")
    with pytest.raises(TypeError, match="bfloat16.*CUDA"):
        dtorch.ones(2, device="cuda").to(dtorch.bfloat16)
    with pytest.raises(TypeError, match="bfloat16.*CUDA"):
        dtorch.ones(2, dtype=dtorch.bfloat16).cuda()


def _ddp_rank_on_own_gpu(rank, ws, init, x, y):
    # as under dtorch-launch: each rank makes its GPU current, then works
    # on 'cuda' (here ranks are threads: the current device is per thread)
    dtorch.cuda.set_device(rank)
    return _ddp_body(rank, ws, "cuda", init, x, y)


@needs_cuda
@pytest.mark.gpu
def test_ddp_ranks_on_different_gpus_reduce_on_their_devices():
    """DDP's communication thread works on its rank's device (a new thread
    starts on device 0) and orders its stream after the compute stream."""
    if dtorch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA devices")
    ref, init, x, y = _ddp_reference()
    res = dist.spawn_threads(
        lambda r, n: _ddp_rank_on_own_gpu(r, n, init, x, y), 2, timeout=60)
    for r in res:
        for k, v in ref.state_dict().items():
            np.testing.assert_allclose(r[k], host(v), rtol=0, atol=1e-10,
                                       err_msg=k)
