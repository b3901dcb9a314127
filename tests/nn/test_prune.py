"""dtorch.nn.utils.prune against torch.nn.utils.prune: masks, parametrisation
(weight_orig / weight_mask / forward pre-hook), state_dict keys, gradients,
iterative pruning, remove, and errors."""
import numpy as np
import pytest

import dtorch
import dtorch.nn as nn
from dtorch.nn.utils import prune

torch = pytest.importorskip("torch")
import torch.nn.utils.prune  # noqa: E402  (not loaded by torch.nn)


def _pair(shape=(6, 5), seed=0):
    """A dtorch and a torch Linear with equal, tie-free weights."""
    rng = np.random.default_rng(seed)
    w = rng.permutation(np.arange(1, shape[0] * shape[1] + 1)).reshape(shape)
    w = (w * rng.choice([-1, 1], size=shape) / 10).astype(np.float32)
    b = rng.standard_normal(shape[0]).astype(np.float32)
    d = nn.Linear(shape[1], shape[0])
    t = torch.nn.Linear(shape[1], shape[0])
    with dtorch.no_grad():
        d.weight.copy_(dtorch.tensor(w))
        d.bias.copy_(dtorch.tensor(b))
    with torch.no_grad():
        t.weight.copy_(torch.tensor(w))
        t.bias.copy_(torch.tensor(b))
    return d, t


@pytest.mark.parametrize("amount", [0, 1, 7, 0.0, 0.3, 0.5, 1.0])
def test_l1_unstructured_mask_and_layout_match_torch(amount):
    d, t = _pair()
    prune.l1_unstructured(d, "weight", amount=amount)
    torch.nn.utils.prune.l1_unstructured(t, "weight", amount=amount)
    np.testing.assert_array_equal(d.weight_mask.numpy(),
                                  t.weight_mask.numpy())
    np.testing.assert_array_equal(d.weight.detach().numpy(),
                                  t.weight.detach().numpy())
    assert list(d.state_dict()) == list(t.state_dict()) == [
        "bias", "weight_orig", "weight_mask"]
    assert [n for n, _ in d.named_parameters()] == \
        [n for n, _ in t.named_parameters()]
    assert [n for n, _ in d.named_buffers()] == ["weight_mask"]
    assert "weight" not in d._parameters
    assert prune.is_pruned(d)


def test_forward_uses_mask_and_orig_gets_masked_gradient():
    d, t = _pair()
    prune.l1_unstructured(d, "weight", amount=0.4)
    torch.nn.utils.prune.l1_unstructured(t, "weight", amount=0.4)
    x = np.random.default_rng(1).standard_normal((3, 5)).astype(np.float32)
    yd = d(dtorch.tensor(x))
    yt = t(torch.tensor(x))
    np.testing.assert_allclose(yd.detach().numpy(), yt.detach().numpy(),
                               rtol=1e-5, atol=1e-6)
    yd.sum().backward()
    yt.sum().backward()
    np.testing.assert_allclose(d.weight_orig.grad.numpy(),
                               t.weight_orig.grad.numpy(), rtol=1e-5)
    assert (d.weight_orig.grad.numpy()[d.weight_mask.numpy() == 0] == 0).all()
    # the hook recomputes weight: a changed orig shows in the next forward
    with dtorch.no_grad():
        d.weight_orig.fill_(2.0)
    d(dtorch.tensor(x))
    np.testing.assert_array_equal(d.weight.detach().numpy(),
                                  2 * d.weight_mask.numpy())


def test_iterative_pruning_combines_masks_like_torch():
    d, t = _pair((8, 6), seed=3)
    for mod, p in ((d, prune), (t, torch.nn.utils.prune)):
        p.l1_unstructured(mod, "weight", amount=0.25)
        p.l1_unstructured(mod, "weight", amount=0.5)   # of the remaining
        p.ln_structured(mod, "weight", amount=2, n=2, dim=0)
        p.ln_structured(mod, "weight", amount=0.34, n=1, dim=1)
    np.testing.assert_array_equal(d.weight_mask.numpy(),
                                  t.weight_mask.numpy())
    hooks = [h for h, _ in d._forward_pre_hooks.values()]
    assert len(hooks) == 1 and isinstance(hooks[0], prune.PruningContainer)
    assert len(hooks[0]) == 4


@pytest.mark.parametrize("n,dim,amount", [(2, 0, 2), (1, 1, 0.4),
                                          (float("inf"), -1, 1),
                                          (2, 0, 0.0), (2, 1, 1.0)])
def test_ln_structured_matches_torch(n, dim, amount):
    d, t = _pair((6, 5), seed=4)
    prune.ln_structured(d, "weight", amount=amount, n=n, dim=dim)
    torch.nn.utils.prune.ln_structured(t, "weight", amount=amount, n=n,
                                       dim=dim)
    np.testing.assert_array_equal(d.weight_mask.numpy(),
                                  t.weight_mask.numpy())


def test_global_unstructured_matches_torch():
    d1, t1 = _pair((6, 5), seed=5)
    d2, t2 = _pair((4, 6), seed=6)
    with dtorch.no_grad():
        d2.weight.mul_(0.37)          # distinct magnitudes across layers
    with torch.no_grad():
        t2.weight.mul_(0.37)
    prune.global_unstructured([(d1, "weight"), (d2, "weight")],
                              pruning_method=prune.L1Unstructured,
                              amount=0.4)
    torch.nn.utils.prune.global_unstructured(
        [(t1, "weight"), (t2, "weight")],
        pruning_method=torch.nn.utils.prune.L1Unstructured, amount=0.4)
    for d, t in ((d1, t1), (d2, t2)):
        np.testing.assert_array_equal(d.weight_mask.numpy(),
                                      t.weight_mask.numpy())
    total = d1.weight.numel() + d2.weight.numel()
    zeros = int((d1.weight_mask.numpy() == 0).sum()
                + (d2.weight_mask.numpy() == 0).sum())
    assert zeros == round(0.4 * total)
    with pytest.raises(TypeError, match="unstructured"):
        prune.global_unstructured([(d1, "weight")],
                                  pruning_method=prune.LnStructured,
                                  amount=1, n=2, dim=0)


def test_random_unstructured_prunes_exact_count_and_follows_seed():
    d, _ = _pair((10, 10))
    dtorch.manual_seed(0)
    prune.random_unstructured(d, "weight", amount=0.3)
    m1 = d.weight_mask.numpy().copy()
    assert (m1 == 0).sum() == 30
    d2, _ = _pair((10, 10))
    dtorch.manual_seed(0)
    prune.random_unstructured(d2, "weight", amount=0.3)
    np.testing.assert_array_equal(m1, d2.weight_mask.numpy())
    prune.random_structured(d2, "weight", amount=3, dim=0)
    rows_dead = (d2.weight_mask.numpy().sum(1) == 0).sum()
    assert rows_dead >= 3


def test_remove_makes_pruning_permanent():
    d, t = _pair()
    prune.l1_unstructured(d, "bias", amount=2)
    prune.l1_unstructured(d, "weight", amount=0.5)
    masked = d.weight.detach().numpy().copy()
    prune.remove(d, "weight")
    torch.nn.utils.prune.l1_unstructured(t, "bias", amount=2)
    torch.nn.utils.prune.l1_unstructured(t, "weight", amount=0.5)
    torch.nn.utils.prune.remove(t, "weight")
    assert isinstance(d.weight, nn.Parameter)
    np.testing.assert_array_equal(d.weight.detach().numpy(), masked)
    assert list(d.state_dict()) == list(t.state_dict()) == [
        "bias_orig", "weight", "bias_mask"]
    assert prune.is_pruned(d)          # bias still is
    prune.remove(d, "bias")
    assert not prune.is_pruned(d)
    torch.nn.utils.prune.remove(t, "bias")
    assert list(d.state_dict()) == list(t.state_dict()) == ["weight", "bias"]
    assert not d._forward_pre_hooks
    with pytest.raises(ValueError, match="has to be pruned"):
        prune.remove(d, "weight")


def test_state_dict_roundtrip_into_pruned_model():
    d, _ = _pair()
    prune.l1_unstructured(d, "weight", amount=0.5)
    sd = d.state_dict()
    e, _ = _pair(seed=9)
    prune.identity(e, "weight")
    e.load_state_dict(sd)
    x = dtorch.randn(2, 5)
    np.testing.assert_array_equal(d(x).detach().numpy(),
                                  e(x).detach().numpy())


def test_conv_and_nested_modules():
    model = nn.Sequential(nn.Conv2d(2, 4, 3), nn.ReLU(), nn.Flatten(),
                          nn.Linear(4 * 4 * 4, 3))
    prune.ln_structured(model[0], "weight", amount=0.5, n=2, dim=0)
    assert prune.is_pruned(model)
    assert "0.weight_orig" in model.state_dict()
    assert "0.weight_mask" in model.state_dict()
    m = model[0].weight_mask.numpy()
    assert (m.reshape(4, -1).sum(1) == 0).sum() == 2
    model(dtorch.randn(1, 2, 6, 6)).sum().backward()
    g = model[0].weight_orig.grad.numpy()
    assert (g[m == 0] == 0).all()


def test_bad_amounts_raise_like_torch():
    d, _ = _pair()
    for bad in (-1, 1.5, -0.1):
        with pytest.raises(ValueError, match="should either be a float"):
            prune.l1_unstructured(d, "weight", amount=bad)
    with pytest.raises(ValueError, match="should be smaller than"):
        prune.l1_unstructured(d, "weight", amount=31)
    with pytest.raises(ValueError, match="should be smaller than"):
        prune.ln_structured(d, "weight", amount=7, n=2, dim=0)
    with pytest.raises(ValueError, match="same shape"):
        prune.l1_unstructured(d, "weight", amount=1,
                              importance_scores=dtorch.ones(2, 2))
    assert not prune.is_pruned(d)      # a refused call changes nothing


def test_importance_scores_decide_the_mask():
    d, t = _pair()
    scores = np.random.default_rng(2).permutation(30).reshape(6, 5)
    prune.l1_unstructured(d, "weight", amount=10,
                          importance_scores=dtorch.tensor(
                              scores.astype(np.float32)))
    torch.nn.utils.prune.l1_unstructured(
        t, "weight", amount=10,
        importance_scores=torch.tensor(scores.astype(np.float32)))
    np.testing.assert_array_equal(d.weight_mask.numpy(),
                                  t.weight_mask.numpy())
    assert (d.weight_mask.numpy()[scores < 10] == 0).all()


def test_on_the_device_equals_cpu(device):
    d, _ = _pair((8, 6), seed=7)
    e, _ = _pair((8, 6), seed=7)
    e = e.to(device)
    for mod in (d, e):
        prune.l1_unstructured(mod, "weight", amount=0.3)
        prune.ln_structured(mod, "weight", amount=2, n=2, dim=0)
    assert e.weight_mask.device.type == device
    np.testing.assert_array_equal(e.weight_mask.cpu().numpy(),
                                  d.weight_mask.numpy())
    x = dtorch.randn(3, 6)
    e(x.to(device)).sum().backward()
    d(x).sum().backward()
    np.testing.assert_allclose(e.weight_orig.grad.cpu().numpy(),
                               d.weight_orig.grad.numpy(), rtol=1e-6)
