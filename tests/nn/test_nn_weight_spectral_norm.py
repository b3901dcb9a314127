"""nn.utils.weight_norm / spectral_norm (hook API) against PyTorch: the
same parameters and buffers (state_dict keys), outputs, power-iteration
updates and gradients from the same start."""
import numpy as np
import pytest

import dtorch
import dtorch.nn as nn
from helpers import close

torch = pytest.importorskip("torch")

rng = np.random.default_rng(0)


def _load(dm, tm):
    sd = tm.state_dict()
    assert list(dm.state_dict()) == list(sd)
    dm.load_state_dict({k: dtorch.tensor(v.detach().numpy())
                        for k, v in sd.items()})


def _close(a, b):
    close(a, b, atol=1e-12)


@pytest.mark.filterwarnings("ignore:`torch.nn.utils.weight_norm` is deprecated")
@pytest.mark.parametrize("dim", [0, 1, None])
def test_weight_norm_matches_torch(dim):
    tm = torch.nn.utils.weight_norm(torch.nn.Linear(4, 3).double(), dim=dim)
    dm = nn.utils.weight_norm(nn.Linear(4, 3).double(), dim=dim)
    _load(dm, tm)
    x = rng.standard_normal((5, 4))
    od, ot = dm(dtorch.tensor(x)), tm(torch.tensor(x))
    _close(od, ot)
    od.pow(2).sum().backward()
    ot.pow(2).sum().backward()
    _close(dm.weight_g.grad, tm.weight_g.grad)
    _close(dm.weight_v.grad, tm.weight_v.grad)
    nn.utils.remove_weight_norm(dm)
    torch.nn.utils.remove_weight_norm(tm)
    assert list(dm.state_dict()) == list(tm.state_dict())
    _close(dm.weight, tm.weight)


@pytest.mark.parametrize("make", [
    lambda L: L.nn.Linear(5, 3),
    lambda L: L.nn.Conv2d(2, 4, 3),
    lambda L: L.nn.ConvTranspose2d(3, 2, 3),
])
def test_spectral_norm_matches_torch(make):
    tm = torch.nn.utils.spectral_norm(make(torch).double(),
                                      n_power_iterations=2)
    dm = nn.utils.spectral_norm(make(dtorch).double(), n_power_iterations=2)
    _load(dm, tm)
    shape = (2, 5) if isinstance(tm, torch.nn.Linear) else \
        (2, tm.in_channels, 6, 6)
    x = rng.standard_normal(shape)
    for _ in range(3):           # training: u, v move each forward
        od, ot = dm(dtorch.tensor(x)), tm(torch.tensor(x))
        _close(od, ot)
        _close(dm.weight_u, tm.weight_u)
        _close(dm.weight_v, tm.weight_v)
    od.sum().backward()
    ot.sum().backward()
    _close(dm.weight_orig.grad, tm.weight_orig.grad)
    dm.eval()
    tm.eval()
    _close(dm(dtorch.tensor(x)), tm(torch.tensor(x)))
    nn.utils.remove_spectral_norm(dm)
    torch.nn.utils.remove_spectral_norm(tm)
    assert list(dm.state_dict()) == list(tm.state_dict())
    _close(dm.weight, tm.weight)
    with pytest.raises(ValueError, match="not found"):
        nn.utils.remove_spectral_norm(dm)


def test_parametrizations_weight_norm_matches_torch():
    P = torch.nn.utils.parametrizations
    tm = P.weight_norm(torch.nn.Conv1d(3, 4, 2).double())
    dm = nn.utils.parametrizations.weight_norm(nn.Conv1d(3, 4, 2).double())
    _load(dm, tm)
    assert "parametrizations.weight.original0" in dm.state_dict()
    x = rng.standard_normal((2, 3, 5))
    od, ot = dm(dtorch.tensor(x)), tm(torch.tensor(x))
    _close(od, ot)
    _close(dm.weight, tm.weight)
    od.sum().backward()
    ot.sum().backward()
    for k in ("original0", "original1"):
        _close(getattr(dm.parametrizations.weight, k).grad,
               getattr(tm.parametrizations.weight, k).grad)
    assert nn.utils.parametrize.is_parametrized(dm, "weight")
    assert type(dm).__name__ == type(tm).__name__ == "ParametrizedConv1d"
    # assigning the tensor goes through right_inverse
    w = rng.standard_normal((4, 3, 2))
    dm.weight = dtorch.tensor(w)
    tm.weight = torch.tensor(w)
    _close(dm.weight, tm.weight)
    _close(dm.parametrizations.weight.original0,
           tm.parametrizations.weight.original0)
    nn.utils.parametrize.remove_parametrizations(dm, "weight")
    torch.nn.utils.parametrize.remove_parametrizations(tm, "weight")
    assert list(dm.state_dict()) == list(tm.state_dict())
    assert type(dm) is nn.Conv1d
    _close(dm.weight, tm.weight)
