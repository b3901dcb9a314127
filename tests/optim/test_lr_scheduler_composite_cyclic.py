"""The schedulers added for issue 14 against torch.optim.lr_scheduler: the
same learning-rate (and momentum) sequences."""
import warnings

import numpy as np
import pytest

import dtorch

torch = pytest.importorskip("torch")


def _lrs(lib, make_opt, make_sched, steps, epochs=None):
    p = lib.zeros(2, requires_grad=True)
    q = lib.zeros(2, requires_grad=True)
    opt = make_opt(lib, [{"params": [p]}, {"params": [q], "lr": 0.05}])
    sched = make_sched(lib.optim.lr_scheduler, opt)
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(steps):
            opt.step()
            if epochs is None:
                sched.step()
            else:
                sched.step(epochs[i])
            out.append([g["lr"] for g in opt.param_groups]
                       + [g.get("momentum", g.get("betas", (0,))[0])
                          for g in opt.param_groups])
    return np.array(out), sched


def sgd(lib, groups):
    return lib.optim.SGD(groups, lr=0.1, momentum=0.9)


def adam(lib, groups):
    return lib.optim.Adam(groups, lr=0.1)


CASES = [
    (sgd, lambda S, o: S.ConstantLR(o, factor=0.5, total_iters=3)),
    (sgd, lambda S, o: S.MultiplicativeLR(o, lambda e: 0.9)),
    (sgd, lambda S, o: S.PolynomialLR(o, total_iters=6, power=2.0)),
    (sgd, lambda S, o: S.CosineAnnealingWarmRestarts(o, T_0=3)),
    (sgd, lambda S, o: S.CosineAnnealingWarmRestarts(o, T_0=2, T_mult=2,
                                                     eta_min=0.01)),
    (sgd, lambda S, o: S.CyclicLR(o, 0.01, 0.1, step_size_up=3)),
    (adam, lambda S, o: S.CyclicLR(o, [0.01, 0.02], 0.1, step_size_up=2,
                                   step_size_down=4, mode="triangular2")),
    (sgd, lambda S, o: S.CyclicLR(o, 0.01, 0.1, step_size_up=2,
                                  mode="exp_range", gamma=0.9)),
    (sgd, lambda S, o: S.SequentialLR(o, [
        S.LinearLR(o, start_factor=0.1, total_iters=3),
        S.ExponentialLR(o, gamma=0.9)], milestones=[3])),
    (sgd, lambda S, o: S.SequentialLR(o, [
        S.ConstantLR(o, factor=0.2, total_iters=2),
        S.CosineAnnealingLR(o, T_max=5),
        S.StepLR(o, 2, 0.5)], milestones=[2, 6])),
    (sgd, lambda S, o: S.ChainedScheduler([
        S.ConstantLR(o, factor=0.1, total_iters=2),
        S.ExponentialLR(o, gamma=0.9)])),
]


@pytest.mark.parametrize("make_opt,make_sched", CASES)
def test_sequences_match_torch(make_opt, make_sched):
    a, _ = _lrs(dtorch, make_opt, make_sched, 14)
    b, _ = _lrs(torch, make_opt, make_sched, 14)
    np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-15)


def test_warm_restarts_fractional_epochs_match_torch():
    epochs = [0.5, 1.0, 1.7, 2.2, 5.0, 6.5, 13.1]
    make = (lambda S, o: S.CosineAnnealingWarmRestarts(o, T_0=2, T_mult=2))
    a, _ = _lrs(dtorch, sgd, make, len(epochs), epochs)
    b, _ = _lrs(torch, sgd, make, len(epochs), epochs)
    np.testing.assert_allclose(a, b, rtol=1e-12)


def test_errors_and_state_dict():
    S = dtorch.optim.lr_scheduler
    o = dtorch.optim.SGD([dtorch.zeros(1, requires_grad=True)], lr=0.1)
    with pytest.raises(ValueError, match="between 0 and 1"):
        S.ConstantLR(o, factor=2)
    with pytest.raises(ValueError, match="T_0"):
        S.CosineAnnealingWarmRestarts(o, T_0=0)
    with pytest.raises(ValueError, match="one more than"):
        S.SequentialLR(o, [S.ConstantLR(o)], milestones=[2])
    o2 = dtorch.optim.Adagrad([dtorch.zeros(1, requires_grad=True)])
    with pytest.raises(ValueError, match="momentum"):
        S.CyclicLR(o2, 0.01, 0.1)
    assert S._LRScheduler is S.LRScheduler
    seq = S.SequentialLR(o, [S.ConstantLR(o, 0.5, 2),
                             S.ExponentialLR(o, 0.9)], [2])
    for _ in range(3):
        o.step()
        seq.step()
    sd = seq.state_dict()
    assert len(sd["_schedulers"]) == 2 and sd["last_epoch"] == 3
