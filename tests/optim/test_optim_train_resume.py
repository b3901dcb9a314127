"""Optimizers on tiny dtorch.nn models: training agrees with torch, and a
checkpoint (model + optimizer + scheduler through dtorch.save) resumes
training exactly."""
import numpy as np
import pytest

import dtorch
import dtorch.nn as nn
from dtorch import optim
from helpers import train_steps


def _mlp():
    dtorch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))


def _data():
    rng = np.random.default_rng(0)
    return (rng.standard_normal((32, 4)).astype(np.float32),
            rng.standard_normal((32, 2)).astype(np.float32))


def _train(model, opt, sched, steps, x, y):
    loss_fn = nn.MSELoss()
    return train_steps(opt, lambda: loss_fn(model(x), y), steps,
                       sched).item()


@pytest.mark.parametrize("name,kw", [
    ("SGD", dict(lr=0.1, momentum=0.9, weight_decay=1e-3)),
    ("Adam", dict(lr=0.01)),
    ("AdamW", dict(lr=0.01, amsgrad=True)),
    ("RMSprop", dict(lr=0.01, centered=True)),
    ("Adagrad", dict(lr=0.1)),
])
def test_tiny_mlp_against_torch(name, kw):
    torch = pytest.importorskip("torch")
    x, y = _data()
    model = _mlp()
    tmodel = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(),
                                 torch.nn.Linear(8, 2))
    with torch.no_grad():
        for tp, p in zip(tmodel.parameters(), model.parameters()):
            tp.copy_(torch.tensor(p.detach().numpy()))
    opt = getattr(optim, name)(model.parameters(), **kw)
    topt = getattr(torch.optim, name)(tmodel.parameters(), **kw)
    _train(model, opt, None, 15, dtorch.tensor(x), dtorch.tensor(y))
    _train(tmodel, topt, None, 15, torch.tensor(x), torch.tensor(y))
    for tp, p in zip(tmodel.parameters(), model.parameters()):
        np.testing.assert_allclose(p.detach().numpy(),
                                   tp.detach().numpy(), rtol=1e-4,
                                   atol=1e-5)


def test_training_reduces_loss():
    x, y = map(dtorch.tensor, _data())
    model = _mlp()
    opt = optim.Adam(model.parameters(), lr=0.05)
    first = _train(model, opt, None, 1, x, y)
    assert _train(model, opt, None, 60, x, y) < 0.7 * first


def test_checkpoint_resume_is_exact(tmp_path):
    x, y = map(dtorch.tensor, _data())

    def build():
        model = _mlp()
        opt = optim.AdamW(model.parameters(), lr=0.02)
        sched = optim.lr_scheduler.CosineAnnealingLR(opt, T_max=20)
        return model, opt, sched

    model, opt, sched = build()
    _train(model, opt, sched, 20, x, y)
    want = [p.detach().numpy().copy() for p in model.parameters()]

    model, opt, sched = build()
    _train(model, opt, sched, 9, x, y)
    dtorch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                 "sched": sched.state_dict(), "epoch": 9},
                tmp_path / "ck.pt")
    model, opt, sched = build()
    ck = dtorch.load(tmp_path / "ck.pt")
    model.load_state_dict(ck["model"])
    opt.load_state_dict(ck["opt"])
    sched.load_state_dict(ck["sched"])
    _train(model, opt, sched, 20 - ck["epoch"], x, y)
    for w, p in zip(want, model.parameters()):
        np.testing.assert_array_equal(p.detach().numpy(), w)


def test_frozen_and_grouped_parameters():
    model = _mlp()
    model[0].weight.requires_grad_(False)
    frozen = model[0].weight.detach().clone()
    opt = optim.SGD([{"params": model[0].parameters(), "lr": 0.0},
                     {"params": model[2].parameters()}], lr=0.1)
    x, y = map(dtorch.tensor, _data())
    _train(model, opt, None, 3, x, y)
    assert model[0].weight.equal(frozen)
    assert model[0].weight.grad is None
