"""Selection, gather/scatter, triangle, scan and elementwise ops added for
issue 14: float64 gradchecks and values/gradients against PyTorch."""
import numpy as np
import pytest

import dtorch
from dtorch.autograd import gradcheck
from helpers import same_as_torch

torch = pytest.importorskip("torch")


def _d(a, grad=True):
    return dtorch.tensor(np.asarray(a), dtype=dtorch.float64,
                         requires_grad=grad)


def _t(a, grad=True):
    return torch.tensor(np.asarray(a), dtype=torch.float64,
                        requires_grad=grad)


def _same(fn_d, fn_t, *arrays, atol=1e-10, grad=True):
    """fn on dtorch and torch from the same float64 data: equal values,
    equal gradients of sum(out * w) for a fixed random w."""
    same_as_torch(fn_d, fn_t, *[np.asarray(a, np.float64) for a in arrays],
                  tol=atol, rtol=1e-7, grad=grad, seed=1)


rng = np.random.default_rng(0)
A = rng.standard_normal((4, 5))
A3 = rng.standard_normal((2, 3, 4))


@pytest.mark.parametrize("k", [-2, -1, 0, 1, 3])
def test_tril_triu_match_torch(k):
    _same(lambda x: dtorch.tril(x, k), lambda x: torch.tril(x, k), A3)
    _same(lambda x: x.triu(k), lambda x: x.triu(k), A3)
    assert gradcheck(lambda x: x.tril(k), (_d(A),))


def test_tril_inplace_and_errors():
    x = dtorch.ones(3, 3)
    x.tril_()
    assert x.tolist() == torch.ones(3, 3).tril_().tolist()
    y = dtorch.ones(3, 3)
    assert y.triu_(1) is y and y.tolist() == torch.ones(3, 3).triu(1).tolist()
    with pytest.raises(RuntimeError, match="at least 2 dimensions"):
        dtorch.ones(3).tril()
    # in-place on a non-leaf keeps the graph
    a = _d(A)
    b = a * 2
    b.tril_()
    b.sum().backward()
    np.testing.assert_array_equal(a.grad.numpy(), 2 * np.tril(np.ones((4, 5))))


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_topk_matches_torch(largest, dim):
    k = 2
    _same(lambda x: x.topk(k, dim, largest).values,
          lambda x: x.topk(k, dim, largest).values, A)
    vi = dtorch.topk(_d(A), k, dim, largest).indices
    ti = torch.topk(_t(A), k, dim, largest).indices
    assert vi.tolist() == ti.tolist()
    assert vi.dtype == dtorch.int64


def test_topk_long_row_uses_partition_and_agrees():
    x = rng.standard_normal((3, 500))
    for largest in (True, False):
        d = dtorch.topk(_d(x), 7, largest=largest)
        t = torch.topk(_t(x), 7, largest=largest)
        assert d.indices.tolist() == t.indices.tolist()
    assert gradcheck(lambda t: t.topk(7).values, (_d(x[:, :80]),))


def test_topk_errors_and_k0():
    with pytest.raises(RuntimeError, match="k out of range"):
        dtorch.randn(3).topk(4)
    assert dtorch.randn(2, 3).topk(0).values.shape == (2, 0)


def test_sort_stable_ties_and_nan_like_torch():
    x = np.array([[3., 1., 2., 1., np.nan, 3.], [0., -1., 0., 5., 5., -1.]])
    for desc in (False, True):
        d = dtorch.sort(dtorch.tensor(x), 1, descending=desc, stable=True)
        t = torch.sort(torch.tensor(x), dim=1, descending=desc, stable=True)
        assert d.indices.tolist() == t.indices.tolist()
        np.testing.assert_array_equal(d.values.numpy(), t.values.numpy())
        assert dtorch.argsort(dtorch.tensor(x), 1, descending=desc).tolist() \
            == torch.argsort(torch.tensor(x), dim=1, descending=desc,
                             stable=True).tolist()
    ints = np.array([3, -9223372036854775808, 2, 3, 0])
    assert dtorch.tensor(ints).sort(descending=True).indices.tolist() == \
        torch.tensor(ints).sort(descending=True, stable=True).indices.tolist()


def test_sort_gradient():
    _same(lambda x: x.sort(0).values, lambda x: x.sort(0).values, A)
    assert gradcheck(lambda t: t.sort(-1, descending=True).values, (_d(A),))


def test_kthvalue_median_quantile():
    _same(lambda x: x.kthvalue(2, 1).values, lambda x: x.kthvalue(2, 1).values,
          A)
    _same(lambda x: x.median(0).values, lambda x: x.median(0).values, A)
    _same(lambda x: x.median(), lambda x: x.median(), A)
    assert dtorch.tensor(A).median(1, keepdim=True).indices.tolist() == \
        torch.tensor(A).median(1, keepdim=True).indices.tolist()
    for mode in ("linear", "lower", "higher", "midpoint", "nearest"):
        _same(lambda x: dtorch.quantile(x, 0.3, 1, interpolation=mode),
              lambda x: torch.quantile(x, 0.3, 1, interpolation=mode), A)
    q = [0.1, 0.5, 0.9]
    _same(lambda x: x.quantile(dtorch.tensor(q, dtype=dtorch.float64), 0,
                               keepdim=True),
          lambda x: x.quantile(torch.tensor(q, dtype=torch.float64), 0,
                               keepdim=True), A)
    _same(lambda x: x.quantile(0.25), lambda x: x.quantile(0.25), A)


def test_gather_scatter_match_torch():
    idx = rng.integers(0, 5, (4, 3))
    _same(lambda x: x.gather(1, dtorch.tensor(idx)),
          lambda x: x.gather(1, torch.tensor(idx)), A)
    idx0 = rng.integers(0, 4, (2, 5))
    _same(lambda x: dtorch.gather(x, 0, dtorch.tensor(idx0)),
          lambda x: torch.gather(x, 0, torch.tensor(idx0)), A)
    assert gradcheck(lambda x: x.gather(1, dtorch.tensor(idx)), (_d(A),))
    # scatter: unique targets per column so the result is well defined
    perm = np.stack([rng.permutation(4)[:3] for _ in range(5)], 1)
    src = rng.standard_normal((3, 5))
    _same(lambda x, s: x.scatter(0, dtorch.tensor(perm), s),
          lambda x, s: x.scatter(0, torch.tensor(perm), s), A, src)
    _same(lambda x, s: x.scatter_add(0, dtorch.tensor(idx0), s),
          lambda x, s: x.scatter_add(0, torch.tensor(idx0), s), A,
          rng.standard_normal((2, 5)))
    _same(lambda x: x.scatter(1, dtorch.tensor(idx), 2.5),
          lambda x: x.scatter(1, torch.tensor(idx), 2.5), A)
    assert gradcheck(lambda x, s: x.scatter_add(0, dtorch.tensor(idx0), s),
                     (_d(A), _d(rng.standard_normal((2, 5)))))


def test_scatter_inplace_and_one_hot_idiom():
    labels = dtorch.tensor([2, 0, 1])
    oh = dtorch.zeros(3, 4).scatter_(1, labels.unsqueeze(1), 1.0)
    assert oh.tolist() == torch.zeros(3, 4).scatter_(
        1, torch.tensor([2, 0, 1]).unsqueeze(1), 1.0).tolist()
    z = dtorch.zeros(5)
    z.scatter_add_(0, dtorch.tensor([1, 1, 3]), dtorch.tensor([1., 2., 3.]))
    assert z.tolist() == [0, 3, 0, 3, 0]
    with pytest.raises(IndexError, match="out of bounds"):
        dtorch.zeros(3).scatter_(0, dtorch.tensor([3]), 1.0)
    with pytest.raises(RuntimeError, match="int64"):
        dtorch.zeros(3).gather(0, dtorch.tensor([0.5]))


def test_index_select_add_copy_fill():
    idx = [3, 0, 3]
    _same(lambda x: x.index_select(0, dtorch.tensor(idx)),
          lambda x: x.index_select(0, torch.tensor(idx)), A)
    _same(lambda x: dtorch.index_select(x, 1, dtorch.tensor(idx)),
          lambda x: torch.index_select(x, 1, torch.tensor(idx)), A)
    src = rng.standard_normal((3, 5))
    _same(lambda x, s: x.index_add(0, dtorch.tensor(idx), s, alpha=2),
          lambda x, s: x.index_add(0, torch.tensor(idx), s, alpha=2), A, src)
    _same(lambda x, s: x.index_copy(0, dtorch.tensor([3, 0, 1]), s),
          lambda x, s: x.index_copy(0, torch.tensor([3, 0, 1]), s), A, src)
    _same(lambda x: x.index_fill(1, dtorch.tensor([0, 4]), -1.0),
          lambda x: x.index_fill(1, torch.tensor([0, 4]), -1.0), A)
    assert gradcheck(lambda x: x.index_select(1, dtorch.tensor(idx)), (_d(A),))


def test_take_masked_select_take_along_dim():
    _same(lambda x: x.take(dtorch.tensor([[0, 19], [7, 7]])),
          lambda x: x.take(torch.tensor([[0, 19], [7, 7]])), A)
    m = A > 0
    _same(lambda x: x.masked_select(dtorch.tensor(m)),
          lambda x: x.masked_select(torch.tensor(m)), A)
    ind = np.argsort(A, 1)
    _same(lambda x: dtorch.take_along_dim(x, dtorch.tensor(ind), 1),
          lambda x: torch.take_along_dim(x, torch.tensor(ind), 1), A)


def test_scans():
    x = np.array([[1., 2., 0., 3.], [-1., 0.5, 2., -2.]])
    _same(lambda t: t.cumprod(1), lambda t: t.cumprod(1), x)
    _same(lambda t: t.cumprod(0), lambda t: t.cumprod(0), A)
    assert gradcheck(lambda t: t.cumprod(1), (_d(x),))
    _same(lambda t: t.cummax(1).values, lambda t: t.cummax(1).values, A)
    _same(lambda t: t.cummin(0).values, lambda t: t.cummin(0).values, A)
    ties = np.array([1., 3., 3., 2., 3.])
    assert dtorch.tensor(ties).cummax(0).indices.tolist() == \
        torch.tensor(ties).cummax(0).indices.tolist()
    _same(lambda t: t.logcumsumexp(1), lambda t: t.logcumsumexp(1), A)
    _same(lambda t: t.diff(dim=1), lambda t: t.diff(dim=1), A)
    _same(lambda t: dtorch.diff(t, n=2, dim=0), lambda t: torch.diff(t, 2, 0),
          A)


def test_matrix_helpers():
    _same(lambda t: t.diagonal(1), lambda t: t.diagonal(1), A)
    _same(lambda t: t.diagonal(0, 0, 2), lambda t: t.diagonal(0, 0, 2), A3)
    _same(lambda t: t.diagonal(-1, 1, 2), lambda t: t.diagonal(-1, 1, 2), A3)
    _same(lambda t: dtorch.diag(t, 1), lambda t: torch.diag(t, 1), A[0])
    _same(lambda t: dtorch.diag(t), lambda t: torch.diag(t), A)
    _same(lambda t: dtorch.diag_embed(t, 1), lambda t: torch.diag_embed(t, 1),
          A3)
    _same(lambda t: t.trace(), lambda t: t.trace(), A)
    _same(lambda a, b: dtorch.outer(a, b), lambda a, b: torch.outer(a, b),
          A[0], A[1, :3])
    _same(lambda t: t.movedim(0, -1), lambda t: t.movedim(0, -1), A3)
    _same(lambda t: t.movedim((0, 1), (2, 0)),
          lambda t: t.movedim((0, 1), (2, 0)), A3)
    _same(lambda t: t.unfold(1, 2, 2), lambda t: t.unfold(1, 2, 2), A3)
    _same(lambda t: t.repeat_interleave(2, dim=1),
          lambda t: t.repeat_interleave(2, dim=1), A)
    _same(lambda t: t.repeat_interleave(dtorch.tensor([1, 0, 2, 1])),
          lambda t: t.repeat_interleave(torch.tensor([1, 0, 2, 1])), A[0, :4])
    _same(lambda t: dtorch.tile(t, (2,)), lambda t: torch.tile(t, (2,)), A)
    _same(lambda a, b, c: dtorch.addmm(a, b, c, beta=0.5, alpha=2),
          lambda a, b, c: torch.addmm(a, b, c, beta=0.5, alpha=2),
          A[:3, :2], A[:3], A.T[:, :2].copy())


def test_einsum_matches_torch():
    B = rng.standard_normal((2, 4, 3))
    C = rng.standard_normal((2, 3, 5))
    _same(lambda a, b: dtorch.einsum("bij,bjk->bik", a, b),
          lambda a, b: torch.einsum("bij,bjk->bik", a, b), B, C)
    _same(lambda a: dtorch.einsum("ii->i", a),
          lambda a: torch.einsum("ii->i", a), A[:4, :4])
    _same(lambda a: dtorch.einsum("ij->", a), lambda a: torch.einsum("ij->", a),
          A)
    _same(lambda a, b: dtorch.einsum("...ij,...jk", a, b),
          lambda a, b: torch.einsum("...ij,...jk", a, b), B, C)
    _same(lambda a, b: dtorch.einsum("i,j->ij", [a, b]),
          lambda a, b: torch.einsum("i,j->ij", [a, b]), A[0], A[1])
    _same(lambda a, b: dtorch.einsum("bij,bkj->bik", a, b),
          lambda a, b: torch.einsum("bij,bkj->bik", a, b), B, B)
    assert gradcheck(lambda a, b: dtorch.einsum("bij,bjk->bk", a, b),
                     (_d(B), _d(C)))


def test_elementwise_maths_match_torch():
    u = rng.uniform(-0.9, 0.9, (3, 4))
    for name in ("asin", "acos", "atan", "sinh", "cosh", "asinh", "atanh",
                 "exp2", "erf", "erfc", "erfinv", "frac", "sinc"):
        _same(lambda t: getattr(t, name)(), lambda t: getattr(t, name)(), u,
              atol=1e-8)
        assert gradcheck(lambda t: getattr(dtorch, name)(t), (_d(u),)), name
    p = rng.uniform(0.05, 0.95, (3, 4))
    _same(lambda t: t.logit(), lambda t: t.logit(), p)
    _same(lambda t: t.logit(0.1), lambda t: t.logit(0.1), p)
    _same(lambda a, b: dtorch.atan2(a, b), lambda a, b: torch.atan2(a, b), A,
          A[::-1].copy())
    _same(lambda a, b: dtorch.hypot(a, b), lambda a, b: torch.hypot(a, b), A,
          A[::-1].copy())
    _same(lambda a, b: dtorch.xlogy(a, b), lambda a, b: torch.xlogy(a, b),
          np.where(A > 0, A, 0), np.abs(A) + 0.1)
    _same(lambda a: a.remainder(0.7), lambda a: a.remainder(0.7), A)
    _same(lambda a: dtorch.fmod(a, -0.7), lambda a: torch.fmod(a, -0.7), A)
    ints = np.array([-7, -3, 0, 5, 9])
    assert dtorch.remainder(dtorch.tensor(ints), 4).tolist() == \
        torch.remainder(torch.tensor(ints), 4).tolist()
    assert dtorch.fmod(dtorch.tensor(ints), 4).tolist() == \
        torch.fmod(torch.tensor(ints), 4).tolist()
    # integer input gives the default float dtype
    assert dtorch.tensor([1, 2]).erf().dtype == dtorch.float32


def test_erfinv_without_scipy_is_accurate(monkeypatch):
    # Newton steps on dtorch's scipy-free erf (accurate to ~1e-7)
    import sys
    from dtorch.ops import elementwise
    monkeypatch.setitem(sys.modules, "scipy.special", None)
    y = np.linspace(-0.999, 0.999, 101)
    np.testing.assert_allclose(elementwise.erfinv(np, y),
                               torch.erfinv(torch.tensor(y)).numpy(),
                               rtol=1e-5, atol=1e-6)


def test_multinomial_distribution_and_errors():
    dtorch.manual_seed(0)
    p = dtorch.tensor([[0.1, 0.0, 0.6, 0.3], [1.0, 1.0, 0.0, 2.0]])
    s = dtorch.multinomial(p, 20000, replacement=True)
    assert s.shape == (2, 20000) and s.dtype == dtorch.int64
    f0 = np.bincount(s[0].numpy(), minlength=4) / 20000
    f1 = np.bincount(s[1].numpy(), minlength=4) / 20000
    np.testing.assert_allclose(f0, [0.1, 0, 0.6, 0.3], atol=0.02)
    np.testing.assert_allclose(f1, [0.25, 0.25, 0, 0.5], atol=0.02)
    assert f0[1] == 0 and f1[2] == 0
    # without replacement: distinct categories, never a zero-weight one
    w = p[0].multinomial(3)
    assert sorted(w.tolist()) == [0, 2, 3]
    # first draw follows the weights
    firsts = np.array([p[0].multinomial(2)[0].item() for _ in range(3000)])
    np.testing.assert_allclose(np.bincount(firsts, minlength=4) / 3000,
                               [0.1, 0, 0.6, 0.3], atol=0.04)
    with pytest.raises(RuntimeError, match="cannot sample n_sample >"):
        dtorch.tensor([0.5, 0.5]).multinomial(3)
    with pytest.raises(RuntimeError, match="inf"):
        dtorch.tensor([0.5, float("nan")]).multinomial(1)
    with pytest.raises(RuntimeError, match="sum of probabilities"):
        dtorch.tensor([0.0, 0.0]).multinomial(1, True)
    with pytest.raises(RuntimeError, match="not enough"):
        dtorch.tensor([0.0, 1.0]).multinomial(2)


def test_bernoulli_and_random_fills():
    dtorch.manual_seed(0)
    p = dtorch.full((20000,), 0.3)
    b = dtorch.bernoulli(p)
    assert abs(b.mean().item() - 0.3) < 0.02 and set(b.unique().tolist()) \
        <= {0.0, 1.0}
    e = dtorch.empty(20000).exponential_(2.0)
    assert abs(e.mean().item() - 0.5) < 0.02 and e.min().item() >= 0
    with pytest.raises(RuntimeError, match="p_in"):
        dtorch.bernoulli(dtorch.tensor([1.5]))


def test_misc_functions_match_torch():
    x, y = rng.standard_normal((5, 3)), rng.standard_normal((4, 3))
    _same(lambda a, b: dtorch.cdist(a, b), lambda a, b: torch.cdist(a, b),
          x, y)
    _same(lambda a, b: dtorch.cdist(a, b, p=1),
          lambda a, b: torch.cdist(a, b, p=1), x, y)
    _same(lambda a: dtorch.cdist(a, a), lambda a: torch.cdist(a, a), x)
    _same(lambda a, b: dtorch.kron(a, b), lambda a, b: torch.kron(a, b),
          x[:2, :2], y[:3, :2])
    _same(lambda a, b: dtorch.cross(a, b, dim=1),
          lambda a, b: torch.cross(a, b, dim=1), x, x[::-1].copy())
    _same(lambda a, b: dtorch.tensordot(a, b, ([1], [1])),
          lambda a, b: torch.tensordot(a, b, ([1], [1])), x, y)
    for ind in ("ij", "xy"):
        g_d = dtorch.meshgrid(dtorch.arange(3), dtorch.arange(4),
                              indexing=ind)
        g_t = torch.meshgrid(torch.arange(3), torch.arange(4), indexing=ind)
        for a, b in zip(g_d, g_t):
            assert a.tolist() == b.tolist()
    assert dtorch.triu_indices(3, 4, 1).tolist() == \
        torch.triu_indices(3, 4, 1).tolist()
    assert dtorch.tril_indices(4, 3, -1).tolist() == \
        torch.tril_indices(4, 3, -1).tolist()
    s = np.sort(rng.standard_normal((2, 6)), 1)
    v = rng.standard_normal((2, 3))
    for right in (False, True):
        assert dtorch.searchsorted(dtorch.tensor(s), dtorch.tensor(v),
                                   right=right).tolist() == \
            torch.searchsorted(torch.tensor(s), torch.tensor(v),
                               right=right).tolist()
    assert dtorch.bucketize(dtorch.tensor([0.5, 2., 9.]),
                            dtorch.tensor([1., 2., 3.])).tolist() == \
        torch.bucketize(torch.tensor([0.5, 2., 9.]),
                        torch.tensor([1., 2., 3.])).tolist()
    assert dtorch.bincount(dtorch.tensor([0, 2, 2, 5])).tolist() == \
        torch.bincount(torch.tensor([0, 2, 2, 5])).tolist()
    np.testing.assert_allclose(
        dtorch.histc(dtorch.tensor([1., 2., 1., 4.]), 4, 0, 4).numpy(),
        torch.histc(torch.tensor([1., 2., 1., 4.]), 4, 0, 4).numpy())
    u_d = dtorch.unique(dtorch.tensor([3, 1, 3, 2]), return_inverse=True,
                        return_counts=True)
    u_t = torch.unique(torch.tensor([3, 1, 3, 2]), return_inverse=True,
                       return_counts=True)
    assert [a.tolist() for a in u_d] == [a.tolist() for a in u_t]
    assert dtorch.cartesian_prod(dtorch.tensor([1, 2]),
                                 dtorch.tensor([3, 4, 5])).tolist() == \
        torch.cartesian_prod(torch.tensor([1, 2]),
                             torch.tensor([3, 4, 5])).tolist()
    assert dtorch.combinations(dtorch.tensor([1, 2, 3])).tolist() == \
        torch.combinations(torch.tensor([1, 2, 3])).tolist()
    assert dtorch.block_diag(dtorch.ones(1, 2), dtorch.ones(2, 1)).tolist() \
        == torch.block_diag(torch.ones(1, 2), torch.ones(2, 1)).tolist()
    for f in ("hstack", "vstack", "dstack", "column_stack"):
        a = getattr(dtorch, f)([dtorch.tensor(x), dtorch.tensor(x)])
        b = getattr(torch, f)([torch.tensor(x), torch.tensor(x)])
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    v_d, m_d = dtorch.var_mean(dtorch.tensor(x), 0)
    v_t, m_t = torch.var_mean(torch.tensor(x), 0)
    np.testing.assert_allclose(v_d.numpy(), v_t.numpy())
    np.testing.assert_allclose(m_d.numpy(), m_t.numpy())
    for name in ("float16", "bfloat16", "float32", "float64"):
        a, b = dtorch.finfo(getattr(dtorch, name)), \
            torch.finfo(getattr(torch, name))
        for k in ("bits", "eps", "max", "min", "tiny", "resolution"):
            assert getattr(a, k) == getattr(b, k), (name, k)
    assert dtorch.iinfo(dtorch.int32).min == torch.iinfo(torch.int32).min
    assert dtorch.finfo().eps == torch.finfo().eps


def test_issue_14_call_forms():
    # the exact forms scripts used
    c = dtorch.tensor([True, False, True])
    assert dtorch.where(c, 1, 0).tolist() == [1, 0, 1]
    assert dtorch.where(c, 1, 0).dtype == dtorch.int64
    assert dtorch.where(c, 1.0, 0).dtype == dtorch.float32
    r = dtorch.randint(10, (4, 2))
    assert r.shape == (4, 2) and r.dtype == dtorch.int64
    assert 0 <= r.min().item() and r.max().item() < 10
    assert dtorch.randint(3, 5, (6,)).min().item() >= 3
    x = dtorch.randn(2, 3)
    assert x.contiguous(memory_format=dtorch.contiguous_format) is x
    assert not x.is_sparse and not dtorch.is_complex(x) and \
        not x.is_complex()
    assert dtorch.compile(x.sum, disable=True) == x.sum
