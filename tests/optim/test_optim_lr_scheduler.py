"""Learning-rate schedulers: hand-computed sequences, PyTorch's sequences
(when torch is installed) and state_dict round trips."""
import math
import warnings

import pytest

import dtorch
from dtorch import optim
from dtorch.optim import lr_scheduler as S


def _opt(lr=1.0, cls=optim.SGD, **kw):
    w = dtorch.zeros(1, requires_grad=True)
    w.grad = dtorch.zeros(1)
    return cls([w], lr=lr, **kw)


def _lrs(sched, n, metric=None):
    out = [sched.get_last_lr()[0]]
    for i in range(n):
        sched.optimizer.step()
        if metric is None:
            sched.step()
        else:
            sched.step(metric(i))
        out.append(sched.get_last_lr()[0])
    return out


def test_step_lr():
    s = S.StepLR(_opt(), step_size=2, gamma=0.5)
    assert _lrs(s, 5) == pytest.approx([1, 1, 0.5, 0.5, 0.25, 0.25])


def test_multistep_lr():
    s = S.MultiStepLR(_opt(), milestones=[1, 3, 3], gamma=0.1)
    assert _lrs(s, 4) == pytest.approx([1, 0.1, 0.1, 0.001, 0.001])


def test_exponential_lr():
    s = S.ExponentialLR(_opt(2.0), gamma=0.5)
    assert _lrs(s, 3) == pytest.approx([2, 1, 0.5, 0.25])


def test_cosine_annealing_lr():
    s = S.CosineAnnealingLR(_opt(), T_max=4, eta_min=0.1)
    want = [0.1 + 0.9 * (1 + math.cos(math.pi * t / 4)) / 2
            for t in range(5)]
    assert _lrs(s, 4) == pytest.approx(want)


def test_lambda_lr_per_group():
    a = dtorch.zeros(1, requires_grad=True)
    b = dtorch.zeros(1, requires_grad=True)
    opt = optim.SGD([{"params": [a]}, {"params": [b], "lr": 2.0}], lr=1.0)
    s = S.LambdaLR(opt, [lambda e: 0.5 ** e, lambda e: e + 1])
    opt.step()
    s.step()
    opt.step()
    s.step()
    assert s.get_last_lr() == [0.25, 6.0]
    with pytest.raises(ValueError, match="Expected 2 lr_lambdas, but got 1"):
        S.LambdaLR(opt, [lambda e: 1])


def test_linear_lr_warmup():
    s = S.LinearLR(_opt(), start_factor=0.25, total_iters=3)
    assert _lrs(s, 5) == pytest.approx([0.25, 0.5, 0.75, 1, 1, 1])
    with pytest.raises(ValueError, match="Starting multiplicative factor"):
        S.LinearLR(_opt(), start_factor=0)


def test_one_cycle_lr():
    opt = _opt(cls=optim.SGD, momentum=0.9)
    s = S.OneCycleLR(opt, max_lr=1.0, total_steps=10, pct_start=0.3,
                     div_factor=10.0, final_div_factor=100.0)
    lrs = _lrs(s, 9)
    assert lrs[0] == pytest.approx(0.1)            # max_lr / div_factor
    assert max(lrs) == pytest.approx(1.0) and lrs.index(max(lrs)) == 2
    assert lrs[-1] == pytest.approx(0.1 / 100)     # initial / final_div
    assert opt.param_groups[0]["momentum"] == pytest.approx(0.95)
    s.step()
    with pytest.raises(ValueError, match="Tried to step 11 times"):
        s.step()
    with pytest.raises(ValueError, match="must define either total_steps"):
        S.OneCycleLR(_opt(momentum=0.9), max_lr=1.0)


def test_one_cycle_cycles_adam_beta1():
    opt = _opt(cls=optim.Adam)
    s = S.OneCycleLR(opt, max_lr=0.1, total_steps=4)
    assert opt.param_groups[0]["betas"][0] == pytest.approx(0.95)
    opt.step()
    s.step()
    assert opt.param_groups[0]["betas"][0] < 0.95


def test_reduce_lr_on_plateau():
    opt = _opt()
    s = S.ReduceLROnPlateau(opt, patience=1, factor=0.5, cooldown=1,
                            min_lr=0.2)
    metrics = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.5]
    lrs = []
    for m in metrics:
        s.step(m)
        lrs.append(s.get_last_lr()[0])
    # bad epochs 1,2 -> reduce at epoch 3; cooldown 1; then 2 more bad
    assert lrs == pytest.approx([1, 1, 0.5, 0.5, 0.5, 0.25, 0.25, 0.25])
    for _ in range(10):
        s.step(2.0)
    assert s.get_last_lr()[0] == pytest.approx(0.2)        # min_lr
    with pytest.raises(ValueError, match="Factor should be < 1.0"):
        S.ReduceLROnPlateau(opt, factor=1.0)


def test_warns_when_stepped_before_optimizer():
    s = S.StepLR(_opt(), step_size=1)
    with pytest.warns(UserWarning, match="before `optimizer.step\\(\\)`"):
        s.step()
    s2 = S.StepLR(_opt(), step_size=1)
    s2.optimizer.step()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s2.step()


def test_resume_needs_initial_lr():
    with pytest.raises(KeyError, match="initial_lr"):
        S.StepLR(_opt(), step_size=1, last_epoch=3)


@pytest.mark.parametrize("make", [
    lambda o: S.StepLR(o, 3, 0.5),
    lambda o: S.MultiStepLR(o, [2, 5], 0.1),
    lambda o: S.CosineAnnealingLR(o, 6, 0.01),
    lambda o: S.LinearLR(o, 0.1, 1.0, 4),
    lambda o: S.OneCycleLR(o, 1.0, total_steps=12),
    lambda o: S.LambdaLR(o, lambda e: 0.9 ** e),
])
def test_state_dict_round_trip(make, tmp_path):
    full = make(_opt(momentum=0.9))
    want = _lrs(full, 10)
    opt = _opt(momentum=0.9)
    s = make(opt)
    first = _lrs(s, 5)
    dtorch.save({"s": s.state_dict(), "o": opt.state_dict()},
                tmp_path / "s.pt")
    ck = dtorch.load(tmp_path / "s.pt")
    # PyTorch's resume order: build both, then load both
    opt2 = _opt(momentum=0.9)
    s2 = make(opt2)
    opt2.load_state_dict(ck["o"])
    s2.load_state_dict(ck["s"])
    rest = _lrs(s2, 5)
    assert first + rest[1:] == want


def test_plateau_state_dict_round_trip(tmp_path):
    opt = _opt()
    s = S.ReduceLROnPlateau(opt, patience=0, mode="max")
    s.step(1.0)
    s.step(0.5)
    dtorch.save(s.state_dict(), tmp_path / "p.pt")
    s2 = S.ReduceLROnPlateau(_opt(), patience=0, mode="max")
    s2.load_state_dict(dtorch.load(tmp_path / "p.pt"))
    assert s2.best == 1.0 and s2.last_epoch == 2
    assert s2.mode_worse == -math.inf


# ------------------------------------------------------ torch as oracle --

TORCH_CASES = [
    ("StepLR", dict(step_size=3, gamma=0.3)),
    ("MultiStepLR", dict(milestones=[2, 4, 4, 9], gamma=0.5)),
    ("ExponentialLR", dict(gamma=0.9)),
    ("CosineAnnealingLR", dict(T_max=5, eta_min=0.01)),
    ("LinearLR", dict(start_factor=0.2, end_factor=0.9, total_iters=6)),
    ("OneCycleLR", dict(max_lr=0.5, total_steps=20)),
    ("OneCycleLR", dict(max_lr=0.5, epochs=4, steps_per_epoch=5,
                        three_phase=True, anneal_strategy="linear")),
]


@pytest.mark.parametrize("name,kw", TORCH_CASES)
def test_against_torch(name, kw):
    torch = pytest.importorskip("torch")
    n = 19 if name == "OneCycleLR" else 15
    tw = torch.zeros(1, requires_grad=True)
    topt = torch.optim.SGD([tw], lr=0.1, momentum=0.9)
    ts = getattr(torch.optim.lr_scheduler, name)(topt, **kw)
    ds = getattr(S, name)(_opt(0.1, momentum=0.9), **kw)
    want = [ts.get_last_lr()[0]]
    for _ in range(n):
        topt.step()
        ts.step()
        want.append(ts.get_last_lr()[0])
    got = _lrs(ds, n)
    assert got == want          # the same float operations, bit for bit
    assert ds.optimizer.param_groups[0]["momentum"] == \
        topt.param_groups[0]["momentum"]


def test_plateau_against_torch():
    torch = pytest.importorskip("torch")
    metrics = [5, 4, 4, 4.1, 4, 3.9996, 4, 4, 4, 4, 3, 3, 3, 3]
    kw = dict(patience=1, factor=0.3, threshold=1e-3, cooldown=1)
    topt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    ts = torch.optim.lr_scheduler.ReduceLROnPlateau(topt, **kw)
    ds = S.ReduceLROnPlateau(_opt(), **kw)
    for m in metrics:
        ts.step(m)
        ds.step(m)
        assert ds.get_last_lr() == ts.get_last_lr()


def test_schedulers_live_in_lr_scheduler_by_name():
    # split into family files, every scheduler keeps torch's home module
    # (pickled names, reprs)
    for name in S.__all__:
        assert getattr(S, name).__module__ == "dtorch.optim.lr_scheduler"


def test_per_group_length_mismatch_is_torchs_error():
    torch = pytest.importorskip("torch")
    msgs = []
    for lib in (dtorch, torch):
        w = lib.zeros(1, requires_grad=True)
        opt = lib.optim.SGD([w], lr=0.1, momentum=0.9)
        for make in (lambda: lib.optim.lr_scheduler.OneCycleLR(
                         opt, max_lr=[0.1, 0.2], total_steps=10),
                     lambda: lib.optim.lr_scheduler.CyclicLR(
                         opt, base_lr=[0.1, 0.2], max_lr=1.0)):
            with pytest.raises(ValueError) as e:
                make()
            msgs.append(str(e.value))
    assert msgs[:2] == msgs[2:]
