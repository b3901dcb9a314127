"""float16/bfloat16 norms accumulate in float32 (PyTorch's behaviour):
a float16 gradient of norm 300 has a sum of squares of 90000, beyond
float16's 65504, yet its norm and clipping are right (issue 20)."""
import numpy as np
import pytest

import dtorch
from dtorch.nn.utils import clip_grad_norm_


def _grads(dtype, device):
    rng = np.random.default_rng(0)
    g = rng.standard_normal(1000)
    g *= 300.0 / np.linalg.norm(g)          # norm 300
    p = dtorch.nn.Parameter(dtorch.zeros(1000, dtype=dtype, device=device))
    p.grad = dtorch.tensor(g, dtype=dtype, device=device)
    return p, g


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, float("inf")])
def test_clip_grad_norm_half_matches_float32(dtype, norm_type, device):
    dt = getattr(dtorch, dtype)
    if device != "cpu" and dt is dtorch.bfloat16:
        pytest.skip("CuPy has no bfloat16")
    p16, g = _grads(dt, device)
    p32, _ = _grads(dtorch.float32, device)
    n16 = clip_grad_norm_([p16], max_norm=1.0, norm_type=norm_type)
    n32 = clip_grad_norm_([p32], max_norm=1.0, norm_type=norm_type)
    assert n16.dtype is dt
    eps = float(np.finfo(np.float16).eps) if dt is dtorch.float16 else 2**-7
    assert np.isfinite(n16.item())
    assert n16.item() == pytest.approx(n32.item(), rel=2 * eps)
    # the gradient was scaled, not zeroed
    a16 = p16.grad.float().cpu().numpy()
    a32 = p32.grad.cpu().numpy()
    assert np.abs(a16).max() > 0
    np.testing.assert_allclose(a16, a32, rtol=4 * eps, atol=4 * eps * np.abs(a32).max())


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_tensor_norm_half_accumulates_in_float32(dtype, device):
    dt = getattr(dtorch, dtype)
    if device != "cpu" and dt is dtorch.bfloat16:
        pytest.skip("CuPy has no bfloat16")
    x = dtorch.full((1000,), 10.0, dtype=dt, device=device)  # norm 316.2
    for p, want in (("fro", 1000 ** 0.5 * 10), (2, 1000 ** 0.5 * 10),
                    (3, 1000 ** (1 / 3) * 10)):
        n = x.norm(p)
        assert n.dtype is dt
        assert n.item() == pytest.approx(want, rel=1e-2), p
    # the gradient flows through the float32 computation back to half
    y = dtorch.full((4,), 200.0, dtype=dt, device=device, requires_grad=True)
    y.norm().backward()
    assert y.grad.dtype is dt
    np.testing.assert_allclose(y.grad.float().cpu().numpy(), 0.5, rtol=1e-2)
