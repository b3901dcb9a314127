"""autograd's PyTorch arguments act or are pinned: gradcheck's nondet_tol
bounds how much two backward runs may differ (PyTorch's reentrancy check;
it was never read), jacobian(vectorize=True) equals the default."""
import numpy as np
import pytest

import dtorch
from dtorch.autograd import Function, gradcheck
from dtorch.autograd.functional import jacobian
from dtorch.autograd.gradcheck import GradcheckError


class NoisySquare(Function):
    """x^2 whose backward adds a different 1e-8 each call: right to the
    finite-difference tolerance, not reproducible."""
    calls = 0

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        NoisySquare.calls += 1
        return 2 * x * g + 1e-8 * NoisySquare.calls


def test_gradcheck_nondet_tol():
    x = dtorch.randn(3, dtype=dtorch.float64, requires_grad=True)
    with pytest.raises(GradcheckError, match="not reentrant.*was 0.0"):
        gradcheck(NoisySquare.apply, (x,))
    assert not gradcheck(NoisySquare.apply, (x,), raise_exception=False)
    assert gradcheck(NoisySquare.apply, (x,), nondet_tol=1e-6)
    # deterministic backward: passes with the default
    assert gradcheck(lambda t: (t * t).sin(), (x,))


def test_jacobian_vectorize_same_result():
    x = dtorch.randn(3, dtype=dtorch.float64)
    w = dtorch.randn(2, 3, dtype=dtorch.float64)

    def f(t):
        return (w @ t).tanh()
    a = jacobian(f, x)
    b = jacobian(f, x, vectorize=True)
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    torch = pytest.importorskip("torch")
    want = torch.autograd.functional.jacobian(
        lambda t: (torch.tensor(w.numpy()) @ t).tanh(),
        torch.tensor(x.numpy()), vectorize=True)
    np.testing.assert_allclose(b.numpy(), want.numpy(), rtol=1e-12)
