"""Work on a CUDA device other than the current one (issue 20).

CuPy launches kernels on the current device, not on the operands': a
cuda:1 tensor's op run while device 0 is current lands on device 0, or
fails without peer access (the stand-in raises as CuPy does then). dtorch
runs every op (Function.apply), every backward node, every optimizer update
and the random draws under the device of their tensors, as PyTorch's device
guard does. Run with a GPU or DTORCH_FAKE_CUDA=1 (2 devices)."""
import numpy as np
import pytest

import dtorch
from dtorch import nn
from dtorch.nn import functional as F

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not dtorch.cuda.is_available() or dtorch.cuda.device_count() < 2,
    reason="needs 2 CUDA devices (or DTORCH_FAKE_CUDA=1)")]

F64 = dtorch.float64


@pytest.fixture(autouse=True)
def _device0_current():
    prev = dtorch.cuda.current_device()
    dtorch.cuda.set_device(0)
    yield
    # the guards leave the current device as they found it
    assert dtorch.cuda.current_device() == 0
    dtorch.cuda.set_device(prev)


def host(t):
    return t.detach().cpu().numpy()


def on_device1(t):
    assert t.device == dtorch.device("cuda:1"), t.device
    assert t._data.device.id == 1


def test_the_stand_in_refuses_a_kernel_on_another_device():
    # what the guard prevents: a raw CuPy op on device-1 arrays while
    # device 0 is current (real CuPy: runs on device 0, or fails the same
    # way without peer access)
    import cupy
    if not getattr(cupy, "_FAKE", False):
        pytest.skip("the stand-in's behaviour")
    with cupy.cuda.Device(1):
        a = cupy.ones(3)
    with pytest.raises(ValueError, match="Peer access"):
        a * 2
    with cupy.cuda.Device(1):
        assert (a * 2).device.id == 1


class _Cube(dtorch.autograd.Function):
    """A user Function (the tensor path of Function.apply)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x * x

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return g * 3 * x * x


def _model_step(dev, opt_name):
    dtorch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3))
    m = m.to(F64).to(dev)
    opts = {
        "sgd": lambda p: dtorch.optim.SGD(p, lr=0.1, momentum=0.9),
        "adam": lambda p: dtorch.optim.Adam(p, lr=0.01),
        "adagrad": lambda p: dtorch.optim.Adagrad(p, lr=0.1),
        "lbfgs": lambda p: dtorch.optim.LBFGS(p, lr=0.5, max_iter=3),
    }
    opt = opts[opt_name](m.parameters())
    x = dtorch.tensor(np.random.default_rng(1).standard_normal((5, 4)),
                      dtype=F64, device=dev, requires_grad=True)
    t = dtorch.tensor([0, 2, 1, 1, 0], device=dev)
    outs = []

    def closure():
        opt.zero_grad()
        h = m(x)
        y = _Cube.apply(h) + h.logsumexp(1, keepdim=True) * (h > 0)
        loss = F.cross_entropy(y, t) + F.mse_loss(h, h.detach() * 0.5)
        loss.backward()
        outs.append(loss)
        return loss
    for _ in range(2):
        if opt_name == "lbfgs":
            opt.step(closure)
        else:
            closure()
            nn.utils.clip_grad_norm_(m.parameters(), 1.0)
            opt.step()
    return outs, x.grad, list(m.parameters())


@pytest.mark.parametrize("opt_name", ["sgd", "adam", "adagrad", "lbfgs"])
def test_forward_backward_and_step_on_cuda1_equal_the_cpu(opt_name):
    ref_loss, ref_gx, ref_p = _model_step("cpu", opt_name)
    loss, gx, ps = _model_step("cuda:1", opt_name)
    for a, b in zip(ref_loss, loss):
        on_device1(b)
        np.testing.assert_allclose(host(b), host(a), rtol=1e-10, atol=1e-12)
    on_device1(gx)
    np.testing.assert_allclose(host(gx), host(ref_gx), rtol=1e-10,
                               atol=1e-12)
    for a, b in zip(ref_p, ps):
        on_device1(b)
        on_device1(b.grad)
        np.testing.assert_allclose(host(b), host(a), rtol=1e-10, atol=1e-12)


def test_tensor_methods_and_in_place_ops_on_cuda1():
    x = dtorch.arange(6., device="cuda:1").reshape(2, 3)
    for r in (x > 2, x == 1, ~(x > 2), x.isfinite(), x[[0, 1], [2, 0]],
              x.masked_fill(x > 3, -1.), x.clone().add_(1).mul_(2),
              x.clone().zero_(), x.clone().fill_(3.), x.sign(),
              x.clone().clamp_(1, 2)):
        on_device1(r)
    y = dtorch.zeros(2, 3, device="cuda:1")
    y.copy_(dtorch.ones(2, 3, device="cuda:0"))     # from another GPU
    y[0] = dtorch.full((3,), 5., device="cuda:1")
    on_device1(y)
    assert host(y).tolist() == [[5., 5., 5.], [1., 1., 1.]]


def test_optimizer_state_loaded_onto_cuda1_parameters():
    p = nn.Parameter(dtorch.ones(3, dtype=F64, device="cuda:1"))
    opt = dtorch.optim.Adam([p], lr=0.1)
    p.grad = dtorch.ones(3, dtype=F64, device="cuda:1")
    opt.step()
    opt2 = dtorch.optim.Adam([p], lr=0.1)
    opt2.load_state_dict(opt.state_dict())
    for v in opt2.state[p].values():
        if isinstance(v, dtorch.Tensor) and v.ndim:
            on_device1(v)


def test_is_bf16_supported_agrees_with_what_cuda_tensors_accept():
    if dtorch.cuda.is_bf16_supported():
        dtorch.zeros(2, dtype=dtorch.bfloat16, device="cuda")
    else:
        with pytest.raises(TypeError, match="bfloat16.*CUDA"):
            dtorch.zeros(2, dtype=dtorch.bfloat16, device="cuda")
    assert dtorch.cuda.is_bf16_supported() is False


class _CudaItems(dtorch.utils.data.Dataset):
    def __len__(self):
        return 2

    def __getitem__(self, i):
        return dtorch.zeros(2, device="cuda")


def test_cuda_in_a_forked_worker_says_pytorchs_words():
    dtorch.zeros(1, device="cuda")      # CUDA initialised before the fork
    loader = dtorch.utils.data.DataLoader(_CudaItems(), batch_size=2,
                                          num_workers=1)
    with pytest.raises(Exception, match="Cannot re-initialize CUDA in "
                                        "forked subprocess"):
        list(loader)


def _x(dev):
    a = np.random.default_rng(3).standard_normal((3, 4))
    return dtorch.tensor(a, dtype=F64, device=dev)


def _i(dev):
    return dtorch.tensor([[0, 1], [2, 0]], device=dev)


# Tensor methods and functions that compute on the arrays directly (not
# through Function.apply): each runs under its tensor's device
METHODS = {
    "sort": lambda x, i: x.sort(1), "argsort": lambda x, i: x.argsort(),
    "topk": lambda x, i: x.topk(2), "kthvalue": lambda x, i: x.kthvalue(2),
    "median": lambda x, i: x.median(1), "quantile": lambda x, i:
    x.quantile(0.3, dim=1), "gather": lambda x, i: x.gather(1, i),
    "scatter": lambda x, i: x.scatter(1, i, 1.0),
    "scatter_add": lambda x, i: x.scatter_add(1, i, x[:2, :2].contiguous()),
    "index_select": lambda x, i: x.index_select(1, i[0]),
    "index_add_": lambda x, i: x.clone().index_add_(
        1, i[0], x[:, :2].contiguous()),
    "index_fill_": lambda x, i: x.clone().index_fill_(1, i[0], 2.),
    "masked_select": lambda x, i: x.masked_select(x > 0),
    "masked_scatter": lambda x, i: x.masked_scatter(x > 0, x * 2),
    "cumprod_cummax": lambda x, i: (x.cumprod(1), x.cummax(1)[0]),
    "diagonal_diag_trace": lambda x, i: (x.diagonal(), x[0].diag(),
                                         x.trace()),
    "repeat_interleave": lambda x, i: x.repeat_interleave(2, 0),
    "unfold": lambda x, i: x.unfold(1, 2, 1),
    "unique": lambda x, i: i.unique(), "tril_": lambda x, i:
    x.clone().tril_(), "mode": lambda x, i: i.mode(1)[0],
    "put_": lambda x, i: x.clone().put_(i[0], x[0, :2].contiguous()),
    "nonzero": lambda x, i: (x > 0).nonzero(),
    "resize_": lambda x, i: x.clone().resize_(2, 2),
    "logical_xor": lambda x, i: (x > 0).logical_xor(x < 0.5),
    "addcmul_lerp_": lambda x, i: (x.clone().addcmul_(x, x),
                                   x.clone().lerp_(x * 2, 0.5)),
    "searchsorted": lambda x, i: dtorch.searchsorted(x[0].sort()[0], x[1]),
    "one_hot": lambda x, i: F.one_hot(i[0], 3),
    "embedding": lambda x, i: F.embedding(i, x),
    "interpolate": lambda x, i: F.interpolate(x[None], scale_factor=2),
}


@pytest.mark.parametrize("name", list(METHODS))
def test_raw_array_methods_on_cuda1_equal_the_cpu(name):
    f = METHODS[name]
    ref = f(_x("cpu"), _i("cpu"))
    out = f(_x("cuda:1"), _i("cuda:1"))
    refs = ref if isinstance(ref, tuple) else (ref,)
    outs = out if isinstance(out, tuple) else (out,)
    for a, b in zip(refs, outs):
        on_device1(b)
        np.testing.assert_allclose(host(b), host(a), rtol=1e-12, atol=0)
