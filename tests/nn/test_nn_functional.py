"""nn.functional additions (issue 14) and their modules against PyTorch:
values and gradients in float64, plus gradchecks."""
import numpy as np
import pytest

import dtorch
import dtorch.nn as nn
import dtorch.nn.functional as F
from dtorch.autograd import gradcheck
from helpers import same_as_torch

torch = pytest.importorskip("torch")
TF = torch.nn.functional

rng = np.random.default_rng(0)


def _same(fd, ft, *arrays, tol=1e-10, grad=True, nograd=()):
    """Equal values and input gradients; arrays at indices in ``nograd``
    (targets PyTorch does not differentiate) are constants."""
    same_as_torch(fd, ft, *arrays, tol=tol, grad=grad, nograd=nograd)


X = rng.standard_normal((4, 6))
X4 = rng.standard_normal((2, 4, 5, 6))


@pytest.mark.parametrize("name,kw", [
    ("hardswish", {}), ("hardsigmoid", {}), ("selu", {}), ("celu", {}),
    ("celu", {"alpha": 0.5}), ("softsign", {}), ("tanhshrink", {}),
    ("hardshrink", {}), ("softshrink", {"lambd": 0.3}), ("glu", {}),
    ("glu", {"dim": 0}), ("threshold", {"threshold": 0.1, "value": -2.0}),
    ("logsigmoid", {}),
])
def test_activations(name, kw):
    # torch's hardsigmoid backward multiplies by a float32 1/6
    _same(lambda x: getattr(F, name)(x, **kw),
          lambda x: getattr(TF, name)(x, **kw), X,
          tol=1e-7 if name == "hardsigmoid" else 1e-10)


def test_prelu_and_modules():
    w = np.array([0.1, 0.2, 0.3, 0.4])
    _same(lambda x, a: F.prelu(x, a), lambda x, a: TF.prelu(x, a), X4, w)
    _same(lambda x, a: F.prelu(x, a), lambda x, a: TF.prelu(x, a), X,
          np.array([0.25]))
    m = nn.PReLU(4)
    assert list(m.state_dict()) == ["weight"]
    assert m.weight.tolist() == [0.25] * 4
    for cls in ("Hardswish", "Hardsigmoid", "SELU", "Softsign", "GLU",
                "Tanhshrink", "Hardshrink", "Softshrink", "CELU"):
        a = getattr(nn, cls)()(dtorch.tensor(X)).numpy()
        b = getattr(torch.nn, cls)()(torch.tensor(X)).numpy()
        np.testing.assert_allclose(a, b, atol=1e-12)
    np.testing.assert_allclose(
        nn.Threshold(0.2, 5.)(dtorch.tensor(X)).numpy(),
        torch.nn.Threshold(0.2, 5.)(torch.tensor(X)).numpy())


def test_distances():
    Y = rng.standard_normal((4, 6))
    _same(F.cosine_similarity, TF.cosine_similarity, X, Y)
    _same(lambda a, b: F.cosine_similarity(a, b, 0),
          lambda a, b: TF.cosine_similarity(a, b, 0), X, Y)
    _same(F.pairwise_distance, TF.pairwise_distance, X, Y)
    _same(lambda a, b: F.pairwise_distance(a, b, 1, keepdim=True),
          lambda a, b: TF.pairwise_distance(a, b, 1, keepdim=True), X, Y)
    _same(lambda a: F.pdist(a), lambda a: TF.pdist(a), X)
    np.testing.assert_allclose(
        nn.CosineSimilarity(dim=0)(dtorch.tensor(X), dtorch.tensor(Y)).numpy(),
        torch.nn.CosineSimilarity(dim=0)(torch.tensor(X),
                                         torch.tensor(Y)).numpy())


def test_losses():
    a, b = rng.standard_normal(8), rng.standard_normal(8)
    y = np.where(rng.random(8) > 0.5, 1.0, -1.0)
    for red in ("mean", "sum", "none"):
        _same(lambda p, q, t: F.margin_ranking_loss(p, q, t, 0.1,
                                                    reduction=red),
              lambda p, q, t: TF.margin_ranking_loss(p, q, t, 0.1,
                                                     reduction=red), a, b, y,
              nograd=(2,))
        _same(lambda p, t: F.hinge_embedding_loss(p, t, reduction=red),
              lambda p, t: TF.hinge_embedding_loss(p, t, reduction=red), a, y,
              nograd=(1,))
        _same(lambda p, t: F.soft_margin_loss(p, t, reduction=red),
              lambda p, t: TF.soft_margin_loss(p, t, reduction=red), a, y,
              nograd=(1,))
    A, B, C = (rng.standard_normal((5, 3)) for _ in range(3))
    t5 = np.where(rng.random(5) > 0.5, 1.0, -1.0)
    _same(lambda p, q, t: F.cosine_embedding_loss(p, q, t, 0.2),
          lambda p, q, t: TF.cosine_embedding_loss(p, q, t, 0.2), A, B, t5,
          nograd=(2,))
    _same(lambda p, q, r: F.triplet_margin_loss(p, q, r, swap=True),
          lambda p, q, r: TF.triplet_margin_loss(p, q, r, swap=True), A, B, C)
    pos = np.abs(rng.standard_normal((5, 3)))
    _same(lambda p, t: F.poisson_nll_loss(p, t),
          lambda p, t: TF.poisson_nll_loss(p, t), A, pos)
    _same(lambda p, t: F.poisson_nll_loss(p, t, log_input=False, full=True),
          lambda p, t: TF.poisson_nll_loss(p, t, log_input=False, full=True),
          pos + 0.5, pos * 3)
    _same(lambda p, t, v: F.gaussian_nll_loss(p, t, v),
          lambda p, t, v: TF.gaussian_nll_loss(p, t, v), A, B, pos + 0.1)
    lab = (rng.random((5, 3)) > 0.5).astype(np.float64)
    _same(F.multilabel_soft_margin_loss, TF.multilabel_soft_margin_loss, A,
          lab, nograd=(1,))
    cls = rng.integers(0, 3, 5)
    for p in (1, 2):
        _same(lambda x, t: F.multi_margin_loss(x, t, p=p),
              lambda x, t: TF.multi_margin_loss(x, t, p=p), A, cls)
    np.testing.assert_allclose(
        nn.TripletMarginLoss(margin=0.5)(*map(dtorch.tensor, (A, B, C)))
        .item(),
        torch.nn.TripletMarginLoss(margin=0.5)(*map(torch.tensor, (A, B, C)))
        .item())


@pytest.mark.parametrize("kw", [
    dict(scale_factor=2, mode="nearest"),
    dict(size=(7, 4), mode="nearest"),
    dict(size=(7, 9), mode="nearest-exact"),
    dict(scale_factor=2, mode="bilinear", align_corners=False),
    dict(scale_factor=1.7, mode="bilinear", align_corners=True),
    dict(size=(3, 8), mode="bilinear"),
    dict(size=(2, 3), mode="area"),
])
def test_interpolate_2d(kw):
    _same(lambda x: F.interpolate(x, **kw), lambda x: TF.interpolate(x, **kw),
          X4)


def test_interpolate_1d_and_upsample_module():
    x = rng.standard_normal((2, 3, 5))
    _same(lambda t: F.interpolate(t, scale_factor=3, mode="linear"),
          lambda t: TF.interpolate(t, scale_factor=3, mode="linear"), x)
    _same(lambda t: F.interpolate(t, size=8),
          lambda t: TF.interpolate(t, size=8), x)
    a = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)
    b = torch.nn.Upsample(scale_factor=2, mode="bilinear",
                          align_corners=False)
    np.testing.assert_allclose(a(dtorch.tensor(X4)).numpy(),
                               b(torch.tensor(X4)).numpy(), atol=1e-12)
    assert gradcheck(lambda t: F.interpolate(t, scale_factor=2,
                                             mode="bilinear"),
                     (dtorch.tensor(X4[:1, :1, :3, :3], requires_grad=True),))


def test_pixel_shuffle_fold_unfold():
    x = rng.standard_normal((2, 8, 3, 3))
    _same(lambda t: F.pixel_shuffle(t, 2), lambda t: TF.pixel_shuffle(t, 2), x)
    _same(lambda t: F.pixel_unshuffle(t, 2),
          lambda t: TF.pixel_unshuffle(t, 2), X4[:, :, :4, :4])
    for kw in (dict(kernel_size=2), dict(kernel_size=(2, 3), stride=2,
                                         padding=1, dilation=(1, 2))):
        _same(lambda t: F.unfold(t, **kw), lambda t: TF.unfold(t, **kw), X4)
        cols = TF.unfold(torch.tensor(X4), **kw).detach().numpy()
        _same(lambda t: F.fold(t, (5, 6), **kw),
              lambda t: TF.fold(t, (5, 6), **kw), cols)
    assert nn.Unfold(2)(dtorch.tensor(X4)).shape == (2, 16, 20)


def test_adaptive_max_pool_and_lrn():
    for out in ((2, 3), (4, 4), (5, 6), 1):
        _same(lambda t: F.adaptive_max_pool2d(t, out),
              lambda t: TF.adaptive_max_pool2d(t, out), X4)
    _, idd = F.adaptive_max_pool2d(dtorch.tensor(X4), (2, 3), True)
    _, idt = TF.adaptive_max_pool2d(torch.tensor(X4), (2, 3), True)
    assert idd.tolist() == idt.tolist()
    _same(lambda t: F.adaptive_max_pool1d(t, 4),
          lambda t: TF.adaptive_max_pool1d(t, 4), X4[0])
    _same(lambda t: F.local_response_norm(t, 3),
          lambda t: TF.local_response_norm(t, 3), X4)
    _same(lambda t: F.local_response_norm(t, 2),
          lambda t: TF.local_response_norm(t, 2), X4[:, :, 0])


def test_padding_modules():
    x = dtorch.tensor(X4)
    t = torch.tensor(X4)
    for name, arg in (("ZeroPad2d", (1, 2, 0, 1)), ("ReflectionPad2d", 2),
                      ("ReplicationPad2d", (1, 0, 2, 1)),
                      ("ReflectionPad1d", 1)):
        xin, tin = (x[0], t[0]) if name.endswith("1d") else (x, t)
        np.testing.assert_array_equal(getattr(nn, name)(arg)(xin).numpy(),
                                      getattr(torch.nn, name)(arg)(tin).numpy())
    np.testing.assert_array_equal(
        nn.ConstantPad2d(1, 3.5)(x).numpy(),
        torch.nn.ConstantPad2d(1, 3.5)(t).numpy())


def test_affine_grid_and_grid_sample():
    theta = np.array([[[0.9, 0.2, 0.1], [-0.1, 1.1, 0.05]],
                      [[1.0, 0.0, 0.3], [0.0, 0.8, -0.2]]])
    for ac in (False, True):
        _same(lambda th: F.affine_grid(th, (2, 4, 5, 6), align_corners=ac),
              lambda th: TF.affine_grid(th, (2, 4, 5, 6), align_corners=ac),
              theta)
        grid = TF.affine_grid(torch.tensor(theta), (2, 4, 3, 4),
                              align_corners=ac).numpy() * 1.2
        for pm in ("zeros", "border"):
            _same(lambda x, g: F.grid_sample(x, g, padding_mode=pm,
                                             align_corners=ac),
                  lambda x, g: TF.grid_sample(x, g, padding_mode=pm,
                                              align_corners=ac), X4, grid)


def test_dropout_variants_and_gumbel():
    x = dtorch.randn(1000)
    assert F.alpha_dropout(x, 0.5, training=False) is x
    dtorch.manual_seed(0)
    y = F.alpha_dropout(dtorch.randn(20000), 0.2, training=True)
    # alpha dropout keeps zero mean and unit variance of SELU activations
    assert abs(y.mean().item()) < 0.05 and abs(y.std().item() - 1) < 0.05
    logits = dtorch.randn(5, 7)
    g = F.gumbel_softmax(logits, tau=0.5)
    np.testing.assert_allclose(g.sum(-1).numpy(), 1.0, rtol=1e-6)
    h = F.gumbel_softmax(logits.requires_grad_(), hard=True)
    assert (h.sum(-1) == 1).all() and set(h.detach().unique().tolist()) \
        <= {0.0, 1.0}
    h.sum().backward()
    assert logits.grad is not None
