"""The compiled average-pool kernels (dtorch._kernels._numba avg_pool_*,
dtorch/ops/pool.py AvgPool2d) against the NumPy path and PyTorch: padding,
ceil_mode, count_include_pad, divisor_override, stride above the kernel,
1x1 images, empty batches, float32 / float64, double backward."""
import numpy as np
import pytest

import dtorch
import dtorch.nn.functional as F
from dtorch import _kernels

pytest.importorskip("numba")

CASES = [
    ((2, 3, 8, 8), dict(kernel_size=2)),
    ((2, 3, 7, 9), dict(kernel_size=3, stride=2, padding=1)),
    ((1, 2, 5, 5), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True,
                        count_include_pad=False)),
    ((1, 2, 6, 7), dict(kernel_size=2, stride=3, divisor_override=3)),
    ((3, 2, 1, 1), dict(kernel_size=1)),
    ((1, 1, 4, 5), dict(kernel_size=(2, 3), stride=(1, 2))),
    ((0, 2, 4, 4), dict(kernel_size=2)),
]


def _run(x, kw, kernel):
    with _kernels.forced(kernel):
        xt = dtorch.tensor(x, requires_grad=True)
        y = F.avg_pool2d(xt, **kw)
        g = np.cos(np.arange(y.numel())).reshape(tuple(y.shape)).astype(
            x.dtype)
        y.backward(dtorch.tensor(g))
        return y.detach().numpy(), xt.grad.numpy(), g


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,kw", CASES)
def test_avg_pool_kernel_matches_numpy_and_torch(shape, kw, dtype,
                                                 monkeypatch):
    torch = pytest.importorskip("torch")
    calls = []
    real = _kernels.kernels

    def spy(*a, **k):
        r = real(*a, **k)
        calls.append(r is not None)
        return r
    monkeypatch.setattr(_kernels, "kernels", spy)
    x = np.random.default_rng(0).standard_normal(shape).astype(dtype)
    y, gx, g = _run(x, kw, True)
    assert any(calls) == (shape[0] > 0)     # the kernels ran (not empty)
    y0, gx0, _ = _run(x, kw, False)
    # backward: the NumPy path's additions in its order; forward: each
    # window summed in row-major order (NumPy's reduction pairs them in
    # another): float rounding apart, and PyTorch's order
    np.testing.assert_array_equal(gx, gx0)
    tol = 1e-6 if dtype == np.float32 else 1e-15
    np.testing.assert_allclose(y, y0, rtol=tol, atol=tol)
    xt = torch.tensor(x, requires_grad=True)
    yt = torch.nn.functional.avg_pool2d(xt, **kw)
    yt.backward(torch.tensor(g))
    np.testing.assert_allclose(y, yt.detach().numpy(), rtol=tol, atol=tol)
    np.testing.assert_allclose(gx, xt.grad.numpy(), rtol=tol, atol=tol)


def test_avg_pool_kernel_double_backward_and_noncontiguous_input():
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(1).standard_normal((2, 3, 6, 5))
    kw = dict(kernel_size=3, stride=2, padding=1, count_include_pad=False)
    with _kernels.forced(True):
        xt = dtorch.tensor(x, requires_grad=True)
        assert dtorch.autograd.gradgradcheck(
            lambda a: F.avg_pool2d(a, **kw), (xt,))
        # a transposed (non-contiguous) input takes the NumPy path
        xn = dtorch.tensor(x.transpose(0, 1, 3, 2))
        yn = F.avg_pool2d(xn, **kw)
    want = torch.nn.functional.avg_pool2d(
        torch.tensor(x.transpose(0, 1, 3, 2)), **kw)
    np.testing.assert_allclose(yn.numpy(), want.numpy(), rtol=1e-14)
