"""Small PyTorch names against torch: fmax / fmin (NaN semantics and
gradients, ties included), Tensor.sgn, Tensor.is_xpu, NumPy's axis= /
keepdims= aliases where torch's argument parser takes them, and the
top-level autocast queries (is_autocast_enabled, get_autocast_dtype)."""
import math

import numpy as np
import pytest

import dtorch

torch = pytest.importorskip("torch")

NAN = math.nan
X = [1.0, NAN, 3.0, NAN, 2.0, -0.0, math.inf]
Y = [2.0, 1.0, NAN, NAN, 2.0, 0.0, -math.inf]


@pytest.mark.parametrize("name", ["fmax", "fmin"])
def test_fmax_fmin_values_and_gradients(name):
    res = []
    for lib in (dtorch, torch):
        x = lib.tensor(X, requires_grad=True)
        y = lib.tensor(Y, requires_grad=True)
        out = getattr(lib, name)(x, y)
        m = getattr(x, name)(y)
        (out * lib.arange(7.0)).sum().backward()
        res.append((out.detach().numpy(), m.detach().numpy(),
                    x.grad.numpy(), y.grad.numpy()))
    for a, b in zip(*res):
        np.testing.assert_array_equal(a, b)       # NaN where both are
    # broadcasting and promotion (int with float)
    d = getattr(dtorch, name)(dtorch.tensor([[1, 5]]),
                              dtorch.tensor([[2.0], [NAN]]))
    t = getattr(torch, name)(torch.tensor([[1, 5]]),
                             torch.tensor([[2.0], [NAN]]))
    assert d.dtype == dtorch.float32 and t.dtype == torch.float32
    np.testing.assert_array_equal(d.numpy(), t.numpy())
    with pytest.raises(TypeError, match="must be Tensor"):
        getattr(dtorch, name)(dtorch.ones(2), 1.0)


def test_sgn_and_is_xpu():
    v = [-2.5, -0.0, 0.0, 3.0, NAN]
    np.testing.assert_array_equal(dtorch.tensor(v).sgn().numpy(),
                                  torch.tensor(v).sgn().numpy())
    np.testing.assert_array_equal(dtorch.sgn(dtorch.tensor(v)).numpy(),
                                  torch.sgn(torch.tensor(v)).numpy())
    assert dtorch.ones(1).is_xpu is torch.ones(1).is_xpu is False


CALLS = [
    ("sum", {"axis": 1}), ("sum", {"axis": 0, "keepdims": True}),
    ("sum", {"dim": 1, "keepdims": True}), ("mean", {"axis": (0, 1)}),
    ("std", {"axis": 0}), ("var", {"axis": 1, "keepdims": True}),
    ("prod", {"axis": 1}), ("amax", {"axis": 0}), ("amin", {"axis": 1}),
    ("argmax", {"axis": 1}), ("argmin", {"axis": 0, "keepdims": True}),
    ("max", {"axis": 1}), ("min", {"axis": 0, "keepdims": True}),
    ("all", {"axis": 1}), ("any", {"axis": 0}), ("cumsum", {"axis": 1}),
    ("cumprod", {"axis": 0}), ("logsumexp", {"axis": 1}),
    ("nansum", {"axis": 0}), ("nanmean", {"axis": 1}),
    ("median", {"axis": 1}), ("softmax", {"axis": 1}),
    ("log_softmax", {"axis": 0}), ("count_nonzero", {"axis": 0}),
    ("sort", {"axis": 0}), ("argsort", {"axis": 1}),
    ("squeeze", {"axis": 0}), ("unsqueeze", {"axis": 2}),
]


@pytest.mark.parametrize("name,kw", CALLS)
def test_axis_and_keepdims_aliases(name, kw):
    a = np.array([[0.5, -1.0, 2.0], [3.0, 0.0, -0.5]])
    a = a[:1] if name == "squeeze" else a
    outs = []
    for lib in (dtorch, torch):
        m = getattr(lib.tensor(a), name)(**kw)
        f = getattr(lib, name)(lib.tensor(a), **kw)
        outs.append([o for r in (m, f) for o in
                     (r if isinstance(r, tuple) else (r,))])
    for d, t in zip(*outs):
        assert tuple(d.shape) == tuple(t.shape)
        np.testing.assert_allclose(d.numpy(), t.numpy(), rtol=1e-6)


def test_axis_for_cat_stack_and_conflicts():
    for name in ("cat", "concat", "concatenate", "stack"):
        d = getattr(dtorch, name)([dtorch.ones(2, 1)] * 2, axis=1)
        t = getattr(torch, name)([torch.ones(2, 1)] * 2, axis=1)
        assert tuple(d.shape) == tuple(t.shape)
    for lib in (dtorch, torch):
        with pytest.raises(TypeError):
            lib.ones(2).sum(dim=0, axis=0)
    # gradients flow through an aliased call
    x = dtorch.ones(2, 3, requires_grad=True)
    x.mean(axis=1, keepdims=True).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.full((2, 3), 1 / 3))


def test_autocast_queries_match_torch():
    def probe(lib):
        r = [lib.is_autocast_enabled(), lib.is_autocast_enabled("cpu"),
             lib.is_autocast_enabled("cuda:0"), lib.is_autocast_enabled("xpu"),
             lib.get_autocast_dtype("cpu"), lib.get_autocast_dtype("cuda")]
        with lib.autocast("cpu"):
            r += [lib.is_autocast_enabled(), lib.is_autocast_enabled("cpu"),
                  lib.get_autocast_dtype("cpu")]
            with lib.autocast("cpu", enabled=False):
                r.append(lib.is_autocast_enabled("cpu"))
        with lib.autocast("cpu", dtype=lib.float16):
            r.append(lib.get_autocast_dtype("cpu"))
        return [str(v).split(".")[-1] for v in r]
    assert probe(dtorch) == probe(torch)
    for lib in (dtorch, torch):
        with pytest.raises(RuntimeError, match="device type at start of "
                                               "device string: foo"):
            lib.is_autocast_enabled("foo")
        with pytest.raises(TypeError, match="must be str"):
            lib.get_autocast_dtype(3)
