"""Every differentiable core op: float64 finite-difference gradients
(gradcheck), including broadcasting, keepdim, indexing with repeats and
chained views; forward values against NumPy."""
import numpy as np
import pytest

import dtorch
from dtorch.autograd import gradcheck


def leaf(*shape, device="cpu", positive=False, seed=None):
    rng = np.random.default_rng(seed if seed is not None else sum(shape) + 7)
    a = rng.standard_normal(shape)
    if positive:
        a = np.abs(a) + 0.5
    return dtorch.tensor(a, dtype=dtorch.float64, device=device,
                         requires_grad=True)


# (name, fn, input shapes, positive inputs)
BINARY = [
    ("add", lambda a, b: a + b, [(3, 4), (4,)]),
    ("sub", lambda a, b: a - b, [(3, 1), (1, 4)]),
    ("mul", lambda a, b: a * b, [(2, 3, 4), (3, 1)]),
    ("div", lambda a, b: a / b, [(3, 4), (3, 4)]),
    ("rsub", lambda a, b: 2.0 - a * b, [(3,), (3,)]),
    ("rdiv", lambda a, b: 1.5 / (a * a + 1) + b, [(3,), ()]),
    ("pow_tensor", lambda a, b: a ** b, [(3, 4), (4,)]),
    ("maximum", lambda a, b: dtorch.maximum(a, b), [(3, 4), (4,)]),
    ("minimum", lambda a, b: dtorch.minimum(a, b), [(3, 4), (3, 4)]),
    ("matmul_2d", lambda a, b: a @ b, [(3, 4), (4, 5)]),
    ("matmul_batched_bcast", lambda a, b: a @ b, [(2, 3, 4), (4, 2)]),
    ("matmul_1d_2d", lambda a, b: a @ b, [(4,), (4, 3)]),
    ("matmul_2d_1d", lambda a, b: a @ b, [(3, 4), (4,)]),
    ("matmul_1d_1d", lambda a, b: a @ b, [(4,), (4,)]),
    ("where", lambda a, b: dtorch.where(a > 0, a, b), [(3, 4), (4,)]),
    ("cat", lambda a, b: dtorch.cat([a, b], 1), [(2, 3), (2, 2)]),
    ("stack", lambda a, b: dtorch.stack([a, b], 1), [(2, 3), (2, 3)]),
    ("linear", lambda a, b: dtorch.ops.Linear.apply(a, b, b[0]),
     [(5, 4), (4, 4)]),
]

UNARY = [
    ("neg", lambda a: -a, False),
    ("exp", lambda a: a.exp(), False),
    ("log", lambda a: a.log(), True),
    ("sqrt", lambda a: a.sqrt(), True),
    ("rsqrt", lambda a: a.rsqrt(), True),
    ("abs", lambda a: a.abs(), False),
    ("pow_scalar", lambda a: a ** 3, False),
    ("pow_frac", lambda a: a ** 0.5, True),
    ("rpow", lambda a: 2.0 ** a, False),
    ("clamp", lambda a: a.clamp(-0.5, 0.5), False),
    ("clamp_min", lambda a: a.clamp(min=0.1), False),
    ("tanh", lambda a: a.tanh(), False),
    ("sigmoid", lambda a: a.sigmoid(), False),
    ("relu", lambda a: a.relu(), False),
    ("sin", lambda a: a.sin(), False),
    ("cos", lambda a: a.cos(), False),
    ("sum_all", lambda a: a.sum(), False),
    ("sum_dim", lambda a: a.sum(1), False),
    ("sum_keepdim", lambda a: a.sum((0, 2), keepdim=True), False),
    ("mean_dim", lambda a: a.mean(-1), False),
    ("mean_all", lambda a: a.mean(), False),
    ("var", lambda a: a.var(1), False),
    ("var_biased_keepdim", lambda a: a.var(0, unbiased=False, keepdim=True),
     False),
    ("std", lambda a: a.std(), False),
    ("max_all", lambda a: a.max(), False),
    ("max_dim", lambda a: a.max(1).values, False),
    ("min_dim_keepdim", lambda a: a.min(2, keepdim=True)[0], False),
    ("amax_multi", lambda a: a.amax((0, 1)), False),
    ("prod_all", lambda a: a.prod(), False),
    ("prod_dim", lambda a: a.prod(1), False),
    ("cumsum", lambda a: a.cumsum(1), False),
    ("logsumexp", lambda a: a.logsumexp(1), False),
    ("norm", lambda a: a.norm(), False),
    ("view_chain", lambda a: a.view(6, 4).t().reshape(2, 12)[:, 3:9]
     .unsqueeze(0).squeeze(0).transpose(0, 1), False),
    ("permute_expand", lambda a: a.permute(2, 0, 1)[:, :1].expand(4, 5, 3),
     False),
    ("flatten", lambda a: a.flatten(1) * 2, False),
    ("index_int_slice", lambda a: a[1, ::2], False),
    ("index_none_ellipsis", lambda a: a[None, ..., 1], False),
    ("index_repeats", lambda a: a[[0, 0, 1, 0]], False),
    ("index_2d_arrays", lambda a: a[[0, 1, 1], [2, 2, 0]], False),
    ("index_mixed", lambda a: a[:, [1, 1, 2]], False),
    ("index_mask", lambda a: a[a > 0], False),
    ("masked_fill", lambda a: a.masked_fill(a < 0, 0.25), False),
    ("split", lambda a: a.split([1, 2], 1)[1] * 3, False),
    ("chunk", lambda a: a.chunk(2, 2)[0] + 1, False),
    ("unbind", lambda a: a.unbind(0)[1], False),
    ("repeat", lambda a: a.repeat(2, 1, 1), False),
    ("flip_roll", lambda a: a.flip(0).roll(1, 2), False),
    ("cast_roundtrip", lambda a: a.float().double() * 2, False),
]


@pytest.mark.parametrize("name,fn,shapes", BINARY, ids=[b[0] for b in BINARY])
def test_binary_gradcheck(name, fn, shapes, device):
    pos = name.startswith("pow")
    xs = [leaf(*s, device=device, positive=pos, seed=i)
          for i, s in enumerate(shapes)]
    if name == "div":
        xs[1] = leaf(*shapes[1], device=device, positive=True, seed=5)
    tol = {"atol": 1e-3, "rtol": 1e-2} if name == "cast_roundtrip" else {}
    assert gradcheck(fn, xs, **tol)


@pytest.mark.parametrize("name,fn,pos", UNARY, ids=[u[0] for u in UNARY])
def test_unary_gradcheck(name, fn, pos, device):
    x = leaf(2, 3, 4, device=device, positive=pos)
    if name == "cast_roundtrip":
        # float32 in the middle: finite differences are coarse
        assert gradcheck(lambda a: fn(a), [x], eps=1e-3, atol=1e-2)
        return
    if name.startswith("prod"):
        x = leaf(2, 3, 2, device=device)
    assert gradcheck(fn, [x])


def test_prod_gradient_with_zeros():
    x = dtorch.tensor([[2.0, 0.0, 3.0], [0.0, 0.0, 1.0]],
                      dtype=dtorch.float64, requires_grad=True)
    assert gradcheck(lambda a: a.prod(1), [x])
    x.prod().backward()
    # product of the others: zero everywhere (two zeros in total)
    assert np.all(x.grad.numpy() == 0)


def test_index_repeats_accumulate():
    x = dtorch.zeros(4, 2, requires_grad=True)
    x[dtorch.tensor([0, 0, 3, 0])].sum().backward()
    np.testing.assert_array_equal(x.grad.numpy()[:, 0], [3, 0, 0, 1])


def test_setitem_gradcheck():
    def f(a, v):
        b = a * 1
        b[1:, [0, 2]] = v
        return b
    a = leaf(3, 4)
    v = leaf(2, 2, seed=3)
    assert gradcheck(f, [a, v])


def test_broadcast_reduction_shapes(device):
    a = leaf(3, 1, 4, device=device)
    b = leaf(5, 1, device=device)
    (a * b).sum().backward()
    assert a.grad.shape == (3, 1, 4) and b.grad.shape == (5, 1)
    np.testing.assert_allclose(
        a.grad.cpu().numpy(),
        np.broadcast_to(b.detach().cpu().numpy().sum(), (3, 1, 4)))


def test_forward_values_match_numpy():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 4)).astype(np.float32)
    b = rng.standard_normal((4,)).astype(np.float32)
    ta, tb = dtorch.tensor(a), dtorch.tensor(b)
    np.testing.assert_allclose((ta * tb + ta / 2).numpy(), a * b + a / 2,
                               rtol=1e-6)
    np.testing.assert_allclose(ta.var(1).numpy(), a.var(1, ddof=1),
                               rtol=1e-5)
    np.testing.assert_allclose(ta.std(0, unbiased=False).numpy(),
                               a.std(0), rtol=1e-5)
    np.testing.assert_allclose(ta.cumsum(1).numpy(), a.cumsum(1), rtol=1e-6)
    assert ta.argmax().item() == a.argmax()
    np.testing.assert_array_equal(ta.argmin(1).numpy(), a.argmin(1))
    m = ta.max(1)
    np.testing.assert_array_equal(m.values.numpy(), a.max(1))
    np.testing.assert_array_equal(m.indices.numpy(), a.argmax(1))
    assert m.indices.dtype == dtorch.int64
