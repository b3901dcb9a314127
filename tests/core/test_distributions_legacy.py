"""dtorch.distributions (Categorical, Normal, Bernoulli, kl_divergence),
the legacy typed tensor classes (torch.LongTensor, ...) and
distributed.get_default_backend_for_device, against PyTorch."""
import numpy as np
import pytest

import dtorch
import dtorch.distributions as D
from helpers import close

torch = pytest.importorskip("torch")
TD = torch.distributions

rng = np.random.default_rng(0)


def _close(a, b, tol=1e-12):
    close(a, b, tol)


@pytest.mark.parametrize("param", ["probs", "logits"])
def test_categorical_matches_torch(param):
    p = np.array([[0.2, 0.3, 0.5], [0.1, 0.0, 0.9]])
    v = p if param == "probs" else rng.standard_normal((2, 3))
    xd = dtorch.tensor(v, requires_grad=True)
    xt = torch.tensor(v, requires_grad=True)
    a = D.Categorical(**{param: xd})
    b = TD.Categorical(**{param: xt})
    _close(a.probs, b.probs)
    _close(a.logits, b.logits)
    _close(a.entropy(), b.entropy())
    val = [2, 1]
    la, lb = a.log_prob(dtorch.tensor(val)), b.log_prob(torch.tensor(val))
    _close(la, lb)
    (la.sum() + a.entropy().sum()).backward()
    (lb.sum() + b.entropy().sum()).backward()
    _close(xd.grad, xt.grad, 1e-9)
    # broadcasting a batch of values against the batch shape
    vals = np.array([[0, 2], [1, 1], [2, 0]])
    _close(a.log_prob(dtorch.tensor(vals)), b.log_prob(torch.tensor(vals)))
    assert a.batch_shape == b.batch_shape and a.mode.tolist() == \
        b.mode.tolist()
    dtorch.manual_seed(0)
    s = a.sample((20000,))
    assert tuple(s.shape) == tuple(b.sample((20000,)).shape)
    freq = np.stack([np.bincount(s[:, i].numpy(), minlength=3) / 20000
                     for i in range(2)])
    np.testing.assert_allclose(freq, b.probs.detach().numpy(), atol=0.02)


def test_normal_and_bernoulli_match_torch():
    loc, scale = rng.standard_normal(4), np.abs(rng.standard_normal(4)) + .1
    ld, sd = (dtorch.tensor(v, requires_grad=True) for v in (loc, scale))
    lt, st = (torch.tensor(v, requires_grad=True) for v in (loc, scale))
    a, b = D.Normal(ld, sd), TD.Normal(lt, st)
    x = rng.standard_normal((3, 4))
    _close(a.log_prob(dtorch.tensor(x)), b.log_prob(torch.tensor(x)))
    _close(a.entropy(), b.entropy())
    _close(a.cdf(dtorch.tensor(x)), b.cdf(torch.tensor(x)), 1e-7)
    q = dict(loc=np.zeros(4), scale=np.ones(4))
    kd = D.kl_divergence(a, D.Normal(*(dtorch.tensor(v) for v in
                                       q.values())))
    kt = TD.kl_divergence(b, TD.Normal(*(torch.tensor(v) for v in
                                         q.values())))
    _close(kd, kt)
    kd.sum().backward()
    kt.sum().backward()
    _close(ld.grad, lt.grad)
    _close(sd.grad, st.grad)
    r = D.Normal(dtorch.zeros(3), 2.0).rsample((5000,))
    assert r.shape == (5000, 3) and abs(r.std().item() - 2) < 0.1
    z = D.Normal(ld, sd).rsample()
    z.sum().backward()               # reparameterised: gradients flow
    assert ld.grad is not None
    pr = rng.random(5)
    bd, bt = D.Bernoulli(dtorch.tensor(pr)), TD.Bernoulli(torch.tensor(pr))
    y = (rng.random(5) > 0.5).astype(np.float64)
    _close(bd.log_prob(dtorch.tensor(y)), bt.log_prob(torch.tensor(y)),
           1e-9)
    _close(bd.entropy(), bt.entropy(), 1e-9)
    lg = rng.standard_normal(5)
    _close(D.Bernoulli(logits=dtorch.tensor(lg)).probs,
           TD.Bernoulli(logits=torch.tensor(lg)).probs)
    _close(D.kl_divergence(bd, D.Bernoulli(dtorch.tensor(pr[::-1].copy()))),
           TD.kl_divergence(bt, TD.Bernoulli(torch.tensor(pr[::-1].copy()))),
           1e-9)
    with pytest.raises(ValueError, match="not both"):
        D.Categorical()
    with pytest.raises(NotImplementedError, match="KL"):
        D.kl_divergence(bd, a)


def test_reinforce_idiom():
    # pytorch/examples reinforcement_learning: sample, log_prob, backward
    logits = dtorch.randn(1, 4, requires_grad=True)
    m = D.Categorical(logits=logits)
    action = m.sample()
    loss = -m.log_prob(action) * 1.5
    loss.sum().backward()
    assert logits.grad.shape == (1, 4) and action.item() in range(4)


def test_legacy_tensor_types():
    a = dtorch.LongTensor([1, 2])
    t = torch.LongTensor([1, 2])
    assert a.dtype == dtorch.int64 and a.tolist() == t.tolist()
    f = dtorch.FloatTensor(2, 3)
    assert f.shape == (2, 3) and f.dtype == dtorch.float32
    assert isinstance(a, dtorch.LongTensor)
    assert not isinstance(f, dtorch.LongTensor)
    assert isinstance(f, dtorch.FloatTensor)
    assert f.type(dtorch.LongTensor).dtype == dtorch.int64
    assert f.type("torch.DoubleTensor").dtype == dtorch.float64
    assert dtorch.BoolTensor([True]).dtype == dtorch.bool
    assert dtorch.distributed.get_default_backend_for_device("cpu") == \
        torch.distributed.get_default_backend_for_device("cpu")
    assert dtorch.distributed.get_default_backend_for_device("cuda") == \
        "nccl"
