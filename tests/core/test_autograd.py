"""Autograd semantics: accumulation, retain_graph, freed graphs, hooks,
custom Functions, autograd.grad, grad modes, version counters, deep graphs."""
import threading

import numpy as np
import pytest

import dtorch
from dtorch.autograd import Function, gradcheck


def test_seed_scalar_example():
    x = dtorch.tensor(2.0, requires_grad=True)
    y = x * 3
    z = y + 1
    z.backward()
    assert x.grad.item() == 3.0
    assert repr(x.grad) == "tensor(3.)"


def test_gradients_accumulate_across_backward_calls():
    x = dtorch.tensor([1.0, 2.0], requires_grad=True)
    (x * x).sum().backward()
    (x * 3).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [2 + 3, 4 + 3])


def test_shared_subexpression_accumulates():
    x = dtorch.tensor(3.0, requires_grad=True)
    y = x * x
    (y + y * x).backward()      # d/dx (x^2 + x^3) = 2x + 3x^2
    assert x.grad.item() == pytest.approx(6 + 27)


def test_second_backward_through_freed_graph_raises():
    x = dtorch.tensor(1.0, requires_grad=True)
    y = x.exp()
    y.backward()
    with pytest.raises(RuntimeError, match="backward through the graph a "
                                           "second time"):
        y.backward()


def test_retain_graph_allows_second_backward():
    x = dtorch.tensor(1.0, requires_grad=True)
    y = x.exp()
    y.backward(retain_graph=True)
    y.backward()
    assert x.grad.item() == pytest.approx(2 * np.e)


def test_nonscalar_backward_needs_gradient():
    x = dtorch.ones(3, requires_grad=True)
    y = x * 2
    with pytest.raises(RuntimeError, match="implicitly created only for "
                                           "scalar outputs"):
        y.backward()
    y.backward(dtorch.tensor([1.0, 2.0, 3.0]))
    np.testing.assert_allclose(x.grad.numpy(), [2, 4, 6])
    with pytest.raises(RuntimeError, match="Mismatch in shape"):
        (x * 2).backward(dtorch.ones(2))


def test_backward_on_tensor_without_grad_raises():
    with pytest.raises(RuntimeError, match="does not require grad"):
        dtorch.ones(2).sum().backward()


def test_long_chain_has_no_recursion_limit():
    x = dtorch.tensor(1.0, dtype=dtorch.float64, requires_grad=True)
    y = x
    for _ in range(10_000):
        y = y * 1.0001
    y.backward()
    assert x.grad.item() == pytest.approx(1.0001 ** 10_000, rel=1e-6)


def test_tensor_hook_changes_gradient_and_retain_grad():
    x = dtorch.ones(3, requires_grad=True)
    y = x * 2
    y.retain_grad()
    y.register_hook(lambda g: g * 10)
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [20, 20, 20])
    np.testing.assert_allclose(y.grad.numpy(), [1, 1, 1])


def test_leaf_hooks_and_post_accumulate_order():
    a = dtorch.ones(2, requires_grad=True)
    b = dtorch.ones(2, requires_grad=True)
    seen = []
    a.register_hook(lambda g: g * 2)
    a.register_post_accumulate_grad_hook(lambda t: seen.append("a"))
    b.register_post_accumulate_grad_hook(lambda t: seen.append("b"))
    h = (a * 3).sum()
    out = (h * b).sum()   # b's gradient is final before a's
    out.backward()
    np.testing.assert_allclose(a.grad.numpy(), [12, 12])
    assert seen == ["b", "a"]


def test_autograd_grad_returns_without_accumulating():
    x = dtorch.tensor([1.0, 2.0], requires_grad=True)
    w = dtorch.tensor([3.0, 4.0], requires_grad=True)
    y = (x * w).sum()
    gx, = dtorch.autograd.grad(y, [x], retain_graph=True)
    np.testing.assert_allclose(gx.numpy(), [3, 4])
    assert x.grad is None and w.grad is None
    mid = x * 2
    z = (mid * mid).sum()
    gm, = dtorch.autograd.grad(z, mid)
    np.testing.assert_allclose(gm.numpy(), [4, 8])
    u = dtorch.ones(1, requires_grad=True)
    with pytest.raises(RuntimeError, match="not have been used"):
        dtorch.autograd.grad((x * 2).sum(), [u])
    assert dtorch.autograd.grad((x * 2).sum(), [u], allow_unused=True) \
        == (None,)


class MulAdd(Function):
    @staticmethod
    def forward(ctx, x, y, alpha=1.0):
        ctx.save_for_backward(x, y)
        ctx.alpha = alpha
        return x * y + alpha

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        gx = g * y if ctx.needs_input_grad[0] else None
        gy = g * x if ctx.needs_input_grad[1] else None
        return gx, gy, None


def test_custom_function_like_pytorch():
    x = dtorch.randn(3, dtype=dtorch.float64, requires_grad=True)
    y = dtorch.randn(3, dtype=dtorch.float64, requires_grad=True)
    assert gradcheck(lambda a, b: MulAdd.apply(a, b, 2.0), [x, y])
    out = MulAdd.apply(x, y.detach())
    assert out.grad_fn is not None and out.requires_grad
    out.sum().backward()
    assert y.grad is None
    np.testing.assert_allclose(x.grad.numpy(), y.detach().numpy())


class TwoOutputs(Function):
    @staticmethod
    def forward(ctx, x):
        idx = x.argmax()
        ctx.mark_non_differentiable(idx)
        ctx.save_for_backward(x)
        return x * 2, idx

    @staticmethod
    def backward(ctx, g, g_idx):
        assert g_idx is None or float(g_idx.abs().sum()) == 0
        return g * 2


def test_custom_function_multiple_outputs_non_differentiable():
    x = dtorch.tensor([1.0, 5.0, 2.0], requires_grad=True)
    y, idx = TwoOutputs.apply(x)
    assert not idx.requires_grad and idx.item() == 1
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [2, 2, 2])


def test_saved_tensor_modified_in_place_raises_at_backward():
    x = dtorch.ones(3, requires_grad=True)
    y = x * 2
    z = y.exp()         # saves its output
    z.mul_(2)           # ... which is now changed
    with pytest.raises(RuntimeError, match="modified by an inplace "
                                           "operation.*version 1; expected "
                                           "version 0"):
        z.sum().backward()


def test_inplace_on_input_not_saved_is_fine():
    x = dtorch.ones(3, requires_grad=True)
    y = x * 2
    z = y + 1           # Add saves nothing
    y.add_(5)
    z.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [2, 2, 2])


def test_inplace_ops_are_differentiable():
    x = dtorch.tensor([1.0, -2.0, 3.0], dtype=dtorch.float64,
                      requires_grad=True)

    def f(a):
        b = a * 1
        b.mul_(a)          # b = a^2
        b.add_(a, alpha=2)  # b = a^2 + 2a
        b.clamp_(min=-0.5)
        b[0] = b[0] * 3
        return b
    assert gradcheck(f, [x])


def test_inplace_on_leaf_requiring_grad_raises_but_not_under_no_grad():
    w = dtorch.ones(2, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable that requires "
                                           "grad"):
        w.add_(1)
    with dtorch.no_grad():
        w.add_(1)
        w[0] = 5
    np.testing.assert_allclose(w.detach().numpy(), [5, 2])
    assert w.is_leaf and w.requires_grad


def test_grad_modes():
    x = dtorch.ones(2, requires_grad=True)
    with dtorch.no_grad():
        assert not (x * 2).requires_grad
        with dtorch.enable_grad():
            assert (x * 2).requires_grad
    with dtorch.set_grad_enabled(False):
        assert not (x * 2).requires_grad
    assert dtorch.is_grad_enabled()
    with dtorch.inference_mode():
        assert not (x * 2).requires_grad

    @dtorch.no_grad()
    def f(t):
        return t * 2
    assert not f(x).requires_grad
    dtorch.set_grad_enabled(False)
    assert not dtorch.is_grad_enabled()
    dtorch.set_grad_enabled(True)
    assert (x * 2).requires_grad


def test_grad_mode_is_thread_local():
    results = []

    def worker():
        results.append(dtorch.is_grad_enabled())
    with dtorch.no_grad():
        t = threading.Thread(target=worker)
        t.start()
        t.join()
    assert results == [True]


def test_detach_shares_memory_and_stops_gradients():
    x = dtorch.ones(3, requires_grad=True)
    d = (x * 2).detach()
    assert not d.requires_grad and d.is_leaf
    d2 = x.detach()
    d2[0] = 7
    assert x[0].item() == 7


def test_only_float_tensors_require_grad():
    with pytest.raises(RuntimeError, match="floating point"):
        dtorch.tensor([1, 2], requires_grad=True)


def test_gradcheck_detects_wrong_backward():
    class Bad(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 3
    x = dtorch.randn(3, dtype=dtorch.float64, requires_grad=True)
    with pytest.raises(RuntimeError, match="Jacobian mismatch"):
        gradcheck(Bad.apply, [x])
    assert not gradcheck(Bad.apply, [x], raise_exception=False)


def test_grad_flows_through_dtype_promotion():
    a = dtorch.ones(2, dtype=dtorch.float16, requires_grad=True)
    b = dtorch.ones(2, dtype=dtorch.float32, requires_grad=True)
    c = a * b
    assert c.dtype == dtorch.float32
    c.sum().backward()
    assert a.grad.dtype == dtorch.float16 and b.grad.dtype == dtorch.float32


def test_add_same_grad_to_two_leaves_does_not_alias():
    a = dtorch.ones(2, requires_grad=True)
    b = dtorch.ones(2, requires_grad=True)
    (a + b).sum().backward()
    a.grad.mul_(5)
    np.testing.assert_allclose(b.grad.numpy(), [1, 1])
