"""PyTorch's optimizer keyword arguments: every optimizer takes torch.optim's
signature; ``maximize`` follows PyTorch's maths (torch as oracle); the
kernel switches ``foreach``/``fused``/``capturable`` give the default's
results bit for bit and stay silent; ``differentiable=True`` warns once,
naming itself; PyTorch's refusals of incompatible switches are kept."""
import inspect
import warnings

import numpy as np
import pytest

import dtorch
from dtorch import _ignored, optim

NAMES = ["SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "Adadelta", "Adamax",
         "NAdam", "RAdam", "Rprop", "ASGD", "LBFGS"]
# hyper-parameters that make each update non-trivial (momentum, decay)
HYPER = {
    "SGD": dict(lr=0.05, momentum=0.9, weight_decay=0.01),
    "Adam": dict(lr=0.05, weight_decay=0.01, amsgrad=True),
    "AdamW": dict(lr=0.05, weight_decay=0.1),
    "RMSprop": dict(lr=0.01, momentum=0.5, centered=True, weight_decay=0.01),
    "Adagrad": dict(lr=0.1, lr_decay=0.01, weight_decay=0.01),
    "Adadelta": dict(lr=1.0, weight_decay=0.01),
    "Adamax": dict(lr=0.05, weight_decay=0.01),
    "NAdam": dict(lr=0.05, weight_decay=0.01),
    "RAdam": dict(lr=0.05, weight_decay=0.01),
    "Rprop": dict(lr=0.05),
    "ASGD": dict(lr=0.05, t0=2, weight_decay=0.01),
}


def _switches(name):
    """The kernel switches torch.optim.<name> takes (read from dtorch's
    signature; test_signatures_match_torch pins that they are torch's)."""
    params = inspect.signature(getattr(optim, name).__init__).parameters
    return [k for k in ("foreach", "fused", "capturable") if k in params]


@pytest.fixture(autouse=True)
def fresh():
    _ignored._warned.clear()
    yield
    _ignored._warned.clear()


@pytest.mark.parametrize("name", NAMES)
def test_signatures_match_torch(name):
    torch = pytest.importorskip("torch")
    t = inspect.signature(getattr(torch.optim, name).__init__).parameters
    d = inspect.signature(getattr(optim, name).__init__).parameters
    assert list(d) == list(t)
    for k in t:
        assert d[k].kind == t[k].kind, k
        if k not in ("self", "params"):
            assert d[k].default == t[k].default, k


def _run(lib, name, steps=8, **kw):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((12, 4)).astype(np.float32)
    y = rng.standard_normal((12, 2)).astype(np.float32)
    w = lib.tensor(rng.standard_normal((4, 2)).astype(np.float32),
                   requires_grad=True)
    b = lib.tensor(rng.standard_normal(2).astype(np.float32),
                   requires_grad=True)
    xt, yt = lib.tensor(x), lib.tensor(y)
    opt = getattr(lib.optim, name)([w, b], **kw)
    for _ in range(steps):
        opt.zero_grad()
        # maximize: climb -(squared error), i.e. the same fit as minimizing
        loss = ((xt @ w + b - yt) ** 2).mean()
        if kw.get("maximize"):
            loss = -loss
        loss.backward()
        opt.step()
    return w.detach().numpy().copy(), b.detach().numpy().copy()


@pytest.mark.parametrize("name", sorted(HYPER))
def test_maximize_matches_torch(name):
    torch = pytest.importorskip("torch")
    kw = dict(HYPER[name], maximize=True)
    got = _run(dtorch, name, **kw)
    want = _run(torch, name, **kw)
    for g, t in zip(got, want):
        np.testing.assert_allclose(g, t, rtol=3e-5, atol=3e-6)
    # and it is the mirror image of minimizing the negated objective
    mini = _run(dtorch, name, **HYPER[name])
    for g, m in zip(got, mini):
        np.testing.assert_allclose(g, m, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", sorted(HYPER))
def test_kernel_switches_change_nothing_and_stay_silent(name):
    base = _run(dtorch, name, **HYPER[name])
    for switch in _switches(name):
        for value in (True, False):
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                got = _run(dtorch, name, **HYPER[name], **{switch: value})
            assert not [str(x.message) for x in w], (switch, value)
            for g, e in zip(got, base):
                np.testing.assert_array_equal(g, e)


@pytest.mark.parametrize("name", sorted(HYPER))
def test_differentiable_warns_once_at_the_callers_line(name):
    p = dtorch.zeros(2, requires_grad=True)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        getattr(optim, name)([p], differentiable=True)
        getattr(optim, name)([p], differentiable=True)
        getattr(optim, name)([p], differentiable=False)
    assert len(w) == 1, [str(x.message) for x in w]
    msg = str(w[0].message)
    assert msg.startswith(f"{name}: argument differentiable=True has no "
                          f"effect"), msg
    assert "not recorded by autograd" in msg
    assert w[0].filename == __file__


def test_differentiable_in_a_param_group_warns():
    a = dtorch.zeros(2, requires_grad=True)
    b = dtorch.zeros(2, requires_grad=True)
    with pytest.warns(UserWarning, match="differentiable=True"):
        optim.Adam([{"params": [a]},
                    {"params": [b], "differentiable": True}])


@pytest.mark.parametrize("kw", [dict(fused=True, foreach=True),
                                dict(fused=True, differentiable=True)])
@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW", "Adagrad"])
def test_incompatible_switches_refused_as_torch(name, kw):
    torch = pytest.importorskip("torch")
    with pytest.raises(RuntimeError) as want:
        getattr(torch.optim, name)([torch.zeros(2, requires_grad=True)],
                                   **kw)
    with pytest.raises(RuntimeError) as got:
        getattr(optim, name)([dtorch.zeros(2, requires_grad=True)], **kw)
    assert str(got.value) == str(want.value)
    with pytest.raises(RuntimeError, match="cannot be `True` together"):
        optim.SGD([{"params": [dtorch.zeros(2, requires_grad=True)],
                    "fused": True, "foreach": True}])


def test_switches_stay_out_of_param_groups():
    # dtorch's param_groups hold only what its update reads
    opt = optim.Adam([dtorch.zeros(2, requires_grad=True)], foreach=True,
                     capturable=True)
    g = opt.state_dict()["param_groups"][0]
    assert not {"foreach", "fused", "capturable", "differentiable"} & set(g)


def _schedulers(mod):
    return sorted(n for n, c in vars(mod).items()
                  if isinstance(c, type) and c.__module__ == mod.__name__
                  and not n.startswith("_"))


def test_scheduler_signatures_match_torch():
    # SequentialLR took a `verbose` nobody read (torch 2.13 has none)
    torch = pytest.importorskip("torch")
    from dtorch.optim import lr_scheduler as dls
    names = _schedulers(dls)
    assert "SequentialLR" in names and "ReduceLROnPlateau" in names
    for name in names:
        t = inspect.signature(
            getattr(torch.optim.lr_scheduler, name).__init__).parameters
        d = inspect.signature(getattr(dls, name).__init__).parameters
        assert list(d) == list(t), name
        for k in t:
            if k != "self":
                assert d[k].default == t[k].default, (name, k)
