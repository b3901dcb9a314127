"""einops on dtorch tensors: rearrange / reduce / repeat / einsum / pack /
unpack values and gradients against torch + einops, the layers
(Rearrange, Reduce, EinMix) inside a dtorch module with torch's weights,
and (in test_lazy_imports.py) how the backend is found: ``import dtorch``
never imports einops, and einops finds dtorch whichever is imported
first."""
import numpy as np
import pytest

import dtorch

einops = pytest.importorskip("einops")
torch = pytest.importorskip("torch")

X = np.random.default_rng(0).standard_normal((2, 6, 4, 3))


def both(fn, *arrays):
    """fn(lib, *tensors) in dtorch and torch: values and the gradient of
    a weighted sum, compared."""
    res = []
    for lib in (dtorch, torch):
        xs = [lib.tensor(a, requires_grad=True) for a in arrays]
        out = fn(lib, *xs)
        outs = out if isinstance(out, (list, tuple)) else [out]
        w = [lib.tensor(np.cos(np.arange(o.numel())).reshape(
            tuple(o.shape)), dtype=o.dtype) for o in outs]
        sum(((o * wi).sum() for o, wi in zip(outs, w))).backward()
        res.append(([o.detach().numpy() for o in outs],
                    [x.grad.numpy() for x in xs]))
    (od, gd), (ot, gt) = res
    for a, b in zip(od + gd, ot + gt):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("pattern,kw", [
    ("b c h w -> b h w c", {}),
    ("b (c1 c2) h w -> (b c1) h (w c2)", {"c1": 2}),
    ("b c h w -> b (c h w)", {}),
    ("b c h w -> c b 1 h w", {}),
    ("b c h w -> (w b) c h", {}),
])
def test_rearrange(pattern, kw):
    both(lambda lib, x: einops.rearrange(x, pattern, **kw), X)


@pytest.mark.parametrize("op", ["sum", "mean", "max", "min", "prod"])
def test_reduce(op):
    both(lambda lib, x: einops.reduce(x, "b (c k) h w -> b c w", op, k=2),
         X)
    both(lambda lib, x: einops.reduce(x, "b c h w -> c", op), X)


def test_reduce_any_all_on_bool():
    m = X > 0
    for op in ("any", "all"):
        d = einops.reduce(dtorch.tensor(m), "b c h w -> b h", op)
        t = einops.reduce(torch.tensor(m), "b c h w -> b h", op)
        assert d.tolist() == t.tolist()


def test_repeat():
    both(lambda lib, x: einops.repeat(x, "b c h w -> b c h w r", r=3), X)
    both(lambda lib, x: einops.repeat(x, "b c h w -> (b r) c (h s) w",
                                      r=2, s=2), X)


def test_einsum_pack_unpack():
    y = np.random.default_rng(1).standard_normal((3, 5))
    both(lambda lib, x, w: einops.einsum(x, w, "b c h w, w e -> b c e h"),
         X, y)

    def packed(lib, x, w):
        p, ps = einops.pack([x, w.reshape(1, 15).expand(2, 15)], "b *")
        return [p] + list(einops.unpack(p * 2, ps, "b *"))
    both(packed, X, y)
    assert einops.parse_shape(dtorch.tensor(X), "b c _ _") == {"b": 2,
                                                               "c": 6}
    np.testing.assert_array_equal(einops.asnumpy(dtorch.tensor(X)), X)


def test_errors_are_einops_errors():
    with pytest.raises(einops.EinopsError):
        einops.rearrange(dtorch.tensor(X), "b c h -> b c h")


def test_layers_in_a_module_equal_torch():
    from einops.layers import torch as tl
    from dtorch.nn import einops as dl

    class Net(dtorch.nn.Module):
        def __init__(self):
            super().__init__()
            self.patch = dl.Rearrange("b c (h p) w -> b h (p w c)", p=2)
            self.mix = dl.EinMix("b h d -> b h e", weight_shape="d e",
                                 bias_shape="e", d=36, e=5)
            self.pool = dl.Reduce("b h e -> b e", "mean")

        def forward(self, x):
            return self.pool(self.mix(self.patch(x)))

    tnet = torch.nn.Sequential(
        tl.Rearrange("b c (h p) w -> b h (p w c)", p=2),
        tl.EinMix("b h d -> b h e", weight_shape="d e", bias_shape="e",
                  d=36, e=5),
        tl.Reduce("b h e -> b e", "mean"))
    net = Net()
    assert sorted(net.state_dict()) == ["mix.bias", "mix.weight"]
    net.mix.weight.data = dtorch.tensor(tnet[1].weight.detach().numpy())
    net.mix.bias.data = dtorch.tensor(tnet[1].bias.detach().numpy())
    x = X.astype(np.float32).transpose(0, 3, 2, 1)     # b c=3 h=4 w=6
    xd = dtorch.tensor(x, requires_grad=True)
    xt = torch.tensor(x, requires_grad=True)
    od, ot = net(xd), tnet(xt)
    np.testing.assert_allclose(od.detach().numpy(), ot.detach().numpy(),
                               1e-5, 1e-6)
    od.pow(2).sum().backward()
    ot.pow(2).sum().backward()
    np.testing.assert_allclose(xd.grad.numpy(), xt.grad.numpy(), 1e-5, 1e-6)
    np.testing.assert_allclose(net.mix.weight.grad.numpy(),
                               tnet[1].weight.grad.numpy(), 1e-5, 1e-6)
    # a multi-head EinMix with pre/post rearranges: only shapes (no torch
    # twin needed for the axis packing, which einops itself tests)
    m = dl.EinMix("b t (h c) -> b t (h e)", weight_shape="h c e",
                  h=2, c=3, e=4)
    assert tuple(m(dtorch.randn(2, 5, 6)).shape) == (2, 5, 8)
    assert repr(net.patch) == "Rearrange('b c (h p) w -> b h (p w c)', p=2)"
