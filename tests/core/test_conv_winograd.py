"""The Winograd F(2x2, 3x3) convolution path (dtorch/ops/conv.py
``_winograd``, kernels dtorch._kernels._numba ``wino_*``) against the
column-matrix NumPy path and PyTorch: forward, input and weight gradients,
float32 and float64, odd sizes, padding, 1x1 images, empty batches; the
same bits on every run and thread count; the shapes that keep the column
path."""
import os

import numpy as np
import pytest

import dtorch
import dtorch.nn.functional as F
from dtorch import _kernels
from dtorch.ops import conv

numba = pytest.importorskip("numba")


def _grads(x, w, b, pad, **conf):
    xt = dtorch.tensor(x, requires_grad=True)
    wt = dtorch.tensor(w, requires_grad=True)
    bt = dtorch.tensor(b, requires_grad=True) if b is not None else None
    y = F.conv2d(xt, wt, bt, 1, pad, **conf)
    g = np.cos(np.arange(y.numel())).reshape(tuple(y.shape))
    y.backward(dtorch.tensor(g.astype(x.dtype)))
    out = [y.detach().numpy(), xt.grad.numpy(), wt.grad.numpy()]
    return out + ([bt.grad.numpy()] if b is not None else [])


class _Spy:
    """Counts the Winograd forward and weight-gradient calls."""

    def __init__(self, monkeypatch):
        self.calls = {"fwd": 0, "gw": 0}
        for name, key in (("_wino_conv", "fwd"), ("_wino_weight_grad", "gw")):
            real = getattr(conv, name)

            def spy(*a, real=real, key=key):
                self.calls[key] += 1
                return real(*a)
            monkeypatch.setattr(conv, name, spy)


def _data(n, c, h, w, o, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, c, h, w)).astype(dtype),
            (rng.standard_normal((o, c, 3, 3)) * 0.2).astype(dtype),
            rng.standard_normal(o).astype(dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n,c,h,w,o,pad,bias,calls", [
    (2, 16, 8, 8, 16, 1, True, 2),   # even output: whole tiles
    (3, 17, 7, 9, 19, 1, False, 2),  # odd height and width: edge tiles
    (4, 32, 5, 6, 16, 0, True, 2),   # unpadded
    # padding wider than one; the input gradient (4x3 images, 8 tiles)
    # is the column path's
    (2, 16, 4, 3, 24, 2, False, 1),
    (16, 16, 1, 1, 16, 1, True, 2),  # 1x1 images (3x3 padded)
])
def test_winograd_matches_the_column_path_and_torch(n, c, h, w, o, pad,
                                                    bias, calls, dtype,
                                                    monkeypatch):
    torch = pytest.importorskip("torch")
    x, wt, b = _data(n, c, h, w, o, dtype)
    b = b if bias else None
    with _kernels.forced(False):
        ref = _grads(x, wt, b, pad)
    spy = _Spy(monkeypatch)
    with _kernels.forced(True):
        got = _grads(x, wt, b, pad)
    # forward, the stride-1 input gradient (a convolution itself) and the
    # weight gradient took it
    assert spy.calls == {"fwd": calls, "gw": 1}
    tol = 2e-5 if dtype == np.float32 else 1e-12
    for a, r in zip(got, ref):
        assert a.dtype == r.dtype and a.shape == r.shape
        np.testing.assert_allclose(a, r, rtol=tol,
                                   atol=tol * np.abs(r).max())
    xt = torch.tensor(x, requires_grad=True)
    wtt = torch.tensor(wt, requires_grad=True)
    bt = torch.tensor(b, requires_grad=True) if b is not None else None
    y = torch.nn.functional.conv2d(xt, wtt, bt, 1, pad)
    y.backward(torch.tensor(np.cos(np.arange(y.numel())).reshape(
        y.shape).astype(dtype)))
    want = [y.detach().numpy(), xt.grad.numpy(), wtt.grad.numpy()] + (
        [bt.grad.numpy()] if b is not None else [])
    for a, r in zip(got, want):
        np.testing.assert_allclose(a, r, rtol=tol,
                                   atol=tol * np.abs(r).max())


def test_winograd_gradients_against_finite_differences(monkeypatch):
    """float64 gradcheck of the Winograd path (edge tiles: 3x5 output)."""
    spy = _Spy(monkeypatch)
    monkeypatch.setattr(conv, "_WINO_MIN_TILES", 1)
    x, w, b = _data(1, 16, 3, 5, 16, np.float64, seed=3)
    xt = dtorch.tensor(x, requires_grad=True)
    wt = dtorch.tensor(w[:, :, :, :], requires_grad=True)
    with _kernels.forced(True):
        assert dtorch.autograd.gradcheck(
            lambda a, k: F.conv2d(a, k, None, 1, 1), (xt, wt), eps=1e-6,
            atol=1e-7)
    assert spy.calls["fwd"] > 0 and spy.calls["gw"] > 0


def test_double_backward_through_a_winograd_forward(monkeypatch):
    """create_graph=True after a Winograd forward: gradgradcheck (float64)
    in x and the output gradient."""
    spy = _Spy(monkeypatch)
    monkeypatch.setattr(conv, "_WINO_MIN_TILES", 1)
    x, w, _ = _data(1, 16, 3, 3, 16, np.float64, seed=6)
    wt = dtorch.tensor(w)
    xt = dtorch.tensor(x, requires_grad=True)
    with _kernels.forced(True):
        assert dtorch.autograd.gradgradcheck(
            lambda a: F.conv2d(a, wt, None, 1, 1), (xt,), eps=1e-6,
            atol=1e-7)
    assert spy.calls["fwd"] > 0


def test_weight_transform_and_its_adjoint():
    """<U(w), d> == <w, U^T(d)> for the kernel transform and the weight
    gradient's (float64), and U is G w G^T."""
    k = _kernels._load(switch=False)
    rng = np.random.default_rng(1)
    w = rng.standard_normal((5, 3, 3, 3))
    d = rng.standard_normal((16, 3, 5))
    u = np.empty((16, 3, 5))
    k.wino_weight(w, u)
    g = np.array([[1, 0, 0], [.5, .5, .5], [.5, -.5, .5], [0, 0, 1]])
    np.testing.assert_allclose(
        u, (g @ w @ g.T).transpose(2, 3, 1, 0).reshape(16, 3, 5),
        rtol=1e-14, atol=1e-14)
    gw = np.empty_like(w)
    k.wino_weight_grad(d, gw)
    assert abs(np.vdot(u, d) - np.vdot(w, gw)) < 1e-12 * np.abs(u).sum()


def test_winograd_bits_repeat_at_any_thread_count(monkeypatch):
    """No thread-dependent sums: the same bits on a second run and at 1
    and 2 kernel threads (also under use_deterministic_algorithms)."""
    monkeypatch.setattr(_kernels, "PARALLEL_MIN", 0)
    x, w, b = _data(4, 16, 9, 7, 16, np.float32, seed=2)
    saved = _kernels._state["threads"]
    out = []
    try:
        for n in (1, 2, 2):
            _kernels.set_num_threads(n)
            with _kernels.forced(True):
                out.append(_grads(x, w, b, 1))
        dtorch.use_deterministic_algorithms(True)
        with _kernels.forced(True):
            out.append(_grads(x, w, b, 1))
    finally:
        dtorch.use_deterministic_algorithms(False)
        _kernels._state["threads"] = saved
        _kernels._state.pop("n", None)
    for other in out[1:]:
        for a, r in zip(other, out[0]):
            np.testing.assert_array_equal(a, r)


THREADS = """
import numpy as np, dtorch, dtorch.nn.functional as F
from dtorch import _kernels
_kernels.PARALLEL_MIN = 0
rng = np.random.default_rng(2)
x = rng.standard_normal((4, 16, 9, 7)).astype(np.float32)
w = rng.standard_normal((16, 16, 3, 3)).astype(np.float32)
out = {}
for n in (1, 2):
    dtorch.set_num_threads(n)
    xt = dtorch.tensor(x, requires_grad=True)
    wt = dtorch.tensor(w, requires_grad=True)
    y = F.conv2d(xt, wt, None, 1, 1)
    y.backward(dtorch.tensor(np.cos(np.arange(y.numel())).reshape(
        y.shape).astype(np.float32)))
    out[n] = (_kernels.num_threads(), y.detach().numpy(), xt.grad.numpy(),
              wt.grad.numpy())
print(out[2][0], all(np.array_equal(a, b) for a, b in zip(out[1][1:],
                                                           out[2][1:])))
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2,
                    reason="needs two usable cores")
def test_winograd_bits_at_two_kernel_threads_without_torch():
    """In a process without torch (whose OpenMP keeps the kernels on one
    thread) the kernels really run on 2 threads: the same bits as 1."""
    from helpers import run_python
    r = run_python(THREADS, env=dict(os.environ, OMP_NUM_THREADS="2",
                                     OPENBLAS_NUM_THREADS="1"))
    assert r.stdout.split() == ["2", "True"]


@pytest.mark.parametrize("case", [
    dict(k=(3, 3), stride=2), dict(k=(3, 3), dilation=2),
    dict(k=(3, 3), groups=2), dict(k=(5, 5)), dict(k=(3, 1)),
    dict(k=(3, 3), n=1, h=2),          # 1 tile: below _WINO_MIN_TILES
    dict(k=(3, 3), o=8),               # few output channels
    dict(k=(3, 3), n=0),               # empty batch
])
def test_other_convolutions_keep_the_column_path(case, monkeypatch):
    """Strided, dilated, grouped, non-3x3 and too small convolutions are
    the column path's, bit for bit (the same kernels as before)."""
    spy = _Spy(monkeypatch)
    n, h, o = case.get("n", 2), case.get("h", 6), case.get("o", 16)
    groups = case.get("groups", 1)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((n, 32, h, h)).astype(np.float32)
    w = rng.standard_normal((o, 32 // groups) + case["k"]).astype(
        np.float32)
    conf = dict(stride=case.get("stride", 1), padding=1,
                dilation=case.get("dilation", 1), groups=groups)

    def run():
        xt = dtorch.tensor(x, requires_grad=True)
        wt = dtorch.tensor(w, requires_grad=True)
        y = F.conv2d(xt, wt, None, **conf)
        y.sum().backward()
        return y.detach().numpy(), xt.grad.numpy(), wt.grad.numpy()
    with _kernels.forced(False):
        ref = run()
    with _kernels.forced(True):
        got = run()
    assert spy.calls == {"fwd": 0, "gw": 0}
    for a, r in zip(got, ref):
        np.testing.assert_array_equal(a, r)
