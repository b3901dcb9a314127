"""mode, lgamma/digamma, nonzero/put_/resize_, autograd.Variable,
detect_anomaly, autograd.functional.jacobian, DataParallel, EmbeddingBag
(issue 14) against PyTorch."""
import numpy as np
import pytest

import dtorch
import dtorch.nn as nn
from dtorch.autograd import gradcheck

torch = pytest.importorskip("torch")

rng = np.random.default_rng(0)


def test_mode_matches_torch():
    x = np.array([[1, 2, 2, 3, 3, 0], [5, 5, 1, 1, 1, 5]])
    for dim, keep in ((1, False), (0, True), (-1, True)):
        d = dtorch.mode(dtorch.tensor(x), dim, keep)
        t = torch.mode(torch.tensor(x), dim, keep)
        assert d.values.tolist() == t.values.tolist()
        assert d.indices.tolist() == t.indices.tolist()
    f = rng.integers(0, 3, (4, 7)).astype(np.float64)
    a = dtorch.tensor(f, requires_grad=True)
    b = torch.tensor(f, requires_grad=True)
    va, vb = a.mode(1), b.mode(1)
    assert va.indices.tolist() == vb.indices.tolist()
    va.values.sum().backward()
    vb.values.sum().backward()
    np.testing.assert_array_equal(a.grad.numpy(), b.grad.numpy())


def test_lgamma_digamma_match_torch():
    v = np.array([-3.7, -0.5, 1e-6, 0.1, 0.5, 1.0, 2.5, 7.0, 30.0, 150.0,
                  1e5])
    for name in ("lgamma", "digamma"):
        a = getattr(dtorch, name)(dtorch.tensor(v)).numpy()
        b = getattr(torch, name)(torch.tensor(v)).numpy()
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    poles = np.array([0.0, -1.0, -2.0])
    np.testing.assert_array_equal(dtorch.lgamma(dtorch.tensor(poles)).numpy(),
                                  torch.lgamma(torch.tensor(poles)).numpy())
    np.testing.assert_array_equal(
        dtorch.digamma(dtorch.tensor(poles)).numpy(),
        torch.digamma(torch.tensor(poles)).numpy())
    x = dtorch.tensor([-2.3, 0.4, 1.7, 12.0], dtype=dtorch.float64,
                      requires_grad=True)
    assert gradcheck(dtorch.lgamma, (x,))
    assert gradcheck(lambda t: t.digamma(), (x,))
    assert dtorch.tensor([3]).lgamma().dtype == dtorch.float32


def test_nonzero_put_resize():
    x = np.array([[0, 1, 0], [2, 0, 3]])
    assert dtorch.tensor(x).nonzero().tolist() == \
        torch.tensor(x).nonzero().tolist()
    assert [t.tolist() for t in dtorch.tensor(x).nonzero(as_tuple=True)] \
        == [t.tolist() for t in torch.tensor(x).nonzero(as_tuple=True)]
    for acc in (False, True):
        a = dtorch.zeros(2, 3).put_(dtorch.tensor([0, 5, 5]),
                                    dtorch.tensor([1., 2., 3.]), acc)
        b = torch.zeros(2, 3).put_(torch.tensor([0, 5, 5]),
                                   torch.tensor([1., 2., 3.]), acc)
        if acc:
            assert a.tolist() == b.tolist()
        else:   # the last write to a repeated index is unspecified
            assert a[0, 0].item() == 1 and a[1, 2].item() in (2., 3.)
    r = dtorch.arange(6.).resize_(2, 2)
    assert r.tolist() == [[0., 1.], [2., 3.]]
    assert dtorch.arange(2.).resize_(3).shape == (3,)
    with pytest.raises(RuntimeError, match="require grad"):
        dtorch.zeros(2, requires_grad=True).resize_(3)


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
def test_variable_and_anomaly_detection():
    from dtorch.autograd import Variable
    x = dtorch.ones(2, requires_grad=True)
    v = Variable(x)
    tv = torch.autograd.Variable(torch.ones(2, requires_grad=True))
    assert v.requires_grad == tv.requires_grad and v is not x
    assert Variable(dtorch.ones(2), requires_grad=True).is_leaf
    assert isinstance(x, Variable)
    y = dtorch.tensor([0.0, 1.0], requires_grad=True)
    with dtorch.autograd.detect_anomaly():
        out = (y.sqrt() * 0).sum()     # d sqrt at 0 * 0 = nan
        with pytest.raises(RuntimeError, match="returned nan values"):
            out.backward()
    (y.sqrt() * 0).sum().backward()    # off again: no error
    dtorch.autograd.set_detect_anomaly(True)
    try:
        with pytest.raises(RuntimeError, match="nan"):
            (y.sqrt() * 0).sum().backward()
    finally:
        dtorch.autograd.set_detect_anomaly(False)


def test_jacobian_matches_torch():
    a = rng.standard_normal(3)
    b = rng.standard_normal((2, 3))

    def f(lib):
        return lambda x, w: lib.tanh(w @ x) * x[:2]
    jd = dtorch.autograd.functional.jacobian(
        f(dtorch), (dtorch.tensor(a), dtorch.tensor(b)))
    jt = torch.autograd.functional.jacobian(
        f(torch), (torch.tensor(a), torch.tensor(b)))
    for x, y in zip(jd, jt):
        np.testing.assert_allclose(x.numpy(), y.numpy(), rtol=1e-12)
    single = dtorch.autograd.functional.jacobian(
        lambda x: x ** 2, dtorch.tensor(a))
    np.testing.assert_allclose(single.numpy(), np.diag(2 * a))
    # double backward exists now: the Hessian of a linear function is 0
    h = dtorch.autograd.functional.hessian(lambda x: x.sum(),
                                           dtorch.tensor(a))
    np.testing.assert_array_equal(h.numpy(), np.zeros((3, 3)))


def test_data_parallel_keys_and_forward():
    m = nn.Linear(3, 2)
    dp = nn.DataParallel(m)
    tdp = torch.nn.DataParallel(torch.nn.Linear(3, 2))
    assert list(dp.state_dict()) == list(tdp.state_dict())
    x = dtorch.randn(4, 3)
    np.testing.assert_array_equal(dp(x).detach().numpy(),
                                  m(x).detach().numpy())
    assert dtorch.cuda.is_bf16_supported() in (True, False)
    if not dtorch.cuda.is_available():
        assert dtorch.cuda.is_bf16_supported() is False


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_matches_torch(mode):
    torch.manual_seed(0)
    te = torch.nn.EmbeddingBag(10, 3, mode=mode, padding_idx=2).double()
    de = nn.EmbeddingBag(10, 3, mode=mode, padding_idx=2).double()
    de.load_state_dict({"weight": dtorch.tensor(te.weight.detach().numpy())})
    inp = [1, 2, 4, 5, 4, 3, 2, 9, 2]
    offs = [0, 2, 2, 6]         # includes an empty bag
    od = de(dtorch.tensor(inp), dtorch.tensor(offs))
    ot = te(torch.tensor(inp), torch.tensor(offs))
    np.testing.assert_allclose(od.detach().numpy(), ot.detach().numpy(),
                               atol=1e-12)
    od.pow(2).sum().backward()
    ot.pow(2).sum().backward()
    np.testing.assert_allclose(de.weight.grad.numpy(),
                               te.weight.grad.numpy(), atol=1e-12)
    x2 = np.array([[1, 3, 4], [0, 0, 7]])
    np.testing.assert_allclose(
        de(dtorch.tensor(x2)).detach().numpy(),
        te(torch.tensor(x2)).detach().numpy(), atol=1e-12)
    if mode == "sum":
        w = rng.random(9)
        np.testing.assert_allclose(
            de(dtorch.tensor(inp), dtorch.tensor(offs),
               dtorch.tensor(w)).detach().numpy(),
            te(torch.tensor(inp), torch.tensor(offs),
               torch.tensor(w)).detach().numpy(), atol=1e-12)
    F_d = dtorch.nn.functional.embedding_bag
    F_t = torch.nn.functional.embedding_bag
    np.testing.assert_allclose(
        F_d(dtorch.tensor(inp), de.weight, dtorch.tensor(offs + [9]),
            mode=mode, include_last_offset=True).detach().numpy(),
        F_t(torch.tensor(inp), te.weight, torch.tensor(offs + [9]),
            mode=mode, include_last_offset=True).detach().numpy(),
        atol=1e-12)
