"""Optimizers: PyTorch's update formulas (checked against float64 NumPy
references and, when installed, torch.optim), validation, param groups,
zero_grad and state_dict round trips."""
import numpy as np
import pytest

import dtorch
from dtorch import optim
from helpers import train_steps

RNG = np.random.default_rng(0)
A = RNG.standard_normal((5, 3))
B = RNG.standard_normal(5)
W0 = RNG.standard_normal(3)


def _grad(w):
    """d/dw sum((A w - b)^2) in float64."""
    return 2 * A.T @ (A @ w - B)


def _run_dtorch(cls, steps, dtype=dtorch.float64, **kw):
    w = dtorch.tensor(W0, dtype=dtype, requires_grad=True)
    a = dtorch.tensor(A, dtype=dtype)
    b = dtorch.tensor(B, dtype=dtype)
    opt = cls([w], **kw)
    for _ in range(steps):
        opt.zero_grad()
        ((a @ w - b) ** 2).sum().backward()
        opt.step()
    return w.detach().numpy(), opt


# ---------------------------------------------- float64 NumPy references --

def ref_sgd(steps, lr=1e-3, momentum=0, dampening=0, weight_decay=0,
            nesterov=False, maximize=False):
    w, buf = W0.copy(), None
    for _ in range(steps):
        g = _grad(w) * (-1 if maximize else 1)
        g = g + weight_decay * w
        if momentum:
            buf = g.copy() if buf is None else \
                momentum * buf + (1 - dampening) * g
            g = g + momentum * buf if nesterov else buf
        w = w - lr * g
    return w


def ref_adam(steps, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0,
             amsgrad=False, maximize=False, decoupled=False):
    w = W0.copy()
    m = np.zeros(3)
    v = np.zeros(3)
    vmax = np.zeros(3)
    for t in range(1, steps + 1):
        g = _grad(w) * (-1 if maximize else 1)
        if decoupled:
            w = w * (1 - lr * weight_decay)
        else:
            g = g + weight_decay * w
        m = betas[0] * m + (1 - betas[0]) * g
        v = betas[1] * v + (1 - betas[1]) * g * g
        vmax = np.maximum(vmax, v)
        vhat = (vmax if amsgrad else v) / (1 - betas[1] ** t)
        w = w - lr / (1 - betas[0] ** t) * m / (np.sqrt(vhat) + eps)
    return w


def ref_rmsprop(steps, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0,
                momentum=0, centered=False):
    w = W0.copy()
    sq, ga, buf = np.zeros(3), np.zeros(3), np.zeros(3)
    for _ in range(steps):
        g = _grad(w) + weight_decay * w
        sq = alpha * sq + (1 - alpha) * g * g
        if centered:
            ga = alpha * ga + (1 - alpha) * g
            avg = np.sqrt(sq - ga * ga) + eps
        else:
            avg = np.sqrt(sq) + eps
        if momentum:
            buf = momentum * buf + g / avg
            w = w - lr * buf
        else:
            w = w - lr * g / avg
    return w


def ref_adagrad(steps, lr=1e-2, lr_decay=0, weight_decay=0,
                initial_accumulator_value=0, eps=1e-10):
    w = W0.copy()
    s = np.full(3, float(initial_accumulator_value))
    for t in range(1, steps + 1):
        g = _grad(w) + weight_decay * w
        clr = lr / (1 + (t - 1) * lr_decay)
        s = s + g * g
        w = w - clr * g / (np.sqrt(s) + eps)
    return w


CASES = [
    (optim.SGD, ref_sgd, dict(lr=0.01)),
    (optim.SGD, ref_sgd, dict(lr=0.01, momentum=0.9)),
    (optim.SGD, ref_sgd, dict(lr=0.01, momentum=0.9, dampening=0.3,
                              weight_decay=0.1)),
    (optim.SGD, ref_sgd, dict(lr=0.01, momentum=0.9, nesterov=True)),
    (optim.SGD, ref_sgd, dict(lr=0.01, momentum=0.5, maximize=True)),
    (optim.Adam, ref_adam, dict(lr=0.05)),
    (optim.Adam, ref_adam, dict(lr=0.05, weight_decay=0.1, amsgrad=True)),
    (optim.Adam, ref_adam, dict(lr=0.05, maximize=True)),
    (optim.RMSprop, ref_rmsprop, dict(lr=0.01)),
    (optim.RMSprop, ref_rmsprop, dict(lr=0.01, centered=True, momentum=0.9,
                                      weight_decay=0.1)),
    (optim.Adagrad, ref_adagrad, dict(lr=0.1)),
    (optim.Adagrad, ref_adagrad, dict(lr=0.1, lr_decay=0.1, weight_decay=0.1,
                                      initial_accumulator_value=0.5)),
]


@pytest.mark.parametrize("cls,ref,kw", CASES)
def test_matches_float64_reference(cls, ref, kw):
    got, _ = _run_dtorch(cls, 7, **kw)
    np.testing.assert_allclose(got, ref(7, **kw), rtol=1e-10, atol=1e-12)


def test_adamw_is_decoupled():
    got, opt = _run_dtorch(optim.AdamW, 5, lr=0.05, weight_decay=0.3)
    want = ref_adam(5, lr=0.05, weight_decay=0.3, decoupled=True)
    np.testing.assert_allclose(got, want, rtol=1e-10)
    assert optim.AdamW([dtorch.zeros(1, requires_grad=True)]) \
        .defaults["weight_decay"] == 1e-2


def test_sgd_hand_values():
    # one parameter, grad = 2 w: w=1, lr=0.1, momentum=0.9
    w = dtorch.tensor([1.0], requires_grad=True)
    opt = optim.SGD([w], lr=0.1, momentum=0.9)
    for want in (0.8, 0.46):        # buf: 2.0, then 0.9*2 + 1.6 = 3.4
        opt.zero_grad()
        (w * w).sum().backward()
        opt.step()
        assert w.item() == pytest.approx(want, rel=1e-6)


def test_adam_first_step_is_lr_times_sign():
    # after bias correction the first Adam step is lr * g / (|g| + eps')
    w = dtorch.tensor([1.0, -2.0], requires_grad=True)
    opt = optim.Adam([w], lr=0.1)
    (w * w).sum().backward()
    opt.step()
    np.testing.assert_allclose(w.detach().numpy(), [0.9, -1.9], rtol=1e-6)
    st = opt.state[w]
    assert set(st) == {"step", "exp_avg", "exp_avg_sq"}
    assert isinstance(st["step"], dtorch.Tensor) and st["step"].item() == 1


def test_float32_params_stay_float32():
    w = dtorch.randn(4, requires_grad=True)
    for cls in (optim.SGD, optim.Adam, optim.RMSprop, optim.Adagrad):
        opt = cls([w], lr=0.1)
        w.grad = dtorch.ones(4)
        opt.step()
        assert w.dtype == dtorch.float32
        for v in opt.state[w].values():
            if v.ndim:
                assert v.dtype == dtorch.float32


def test_step_bumps_version_and_skips_missing_grads():
    w = dtorch.randn(3, requires_grad=True)
    u = dtorch.randn(3, requires_grad=True)
    u0 = u.detach().clone()
    opt = optim.SGD([w, u], lr=0.1)
    w.grad = dtorch.ones(3)
    v0 = w._version
    opt.step()
    assert w._version == v0 + 1
    assert u.equal(u0) and len(opt.state) == 0


def test_closure_runs_with_grad():
    w = dtorch.tensor([3.0], requires_grad=True)
    opt = optim.SGD([w], lr=0.25)

    def closure():
        opt.zero_grad()
        loss = (w * w).sum()
        loss.backward()
        return loss

    with dtorch.no_grad():
        loss = opt.step(closure)
    assert loss.item() == 9.0 and w.item() == pytest.approx(1.5)


# ---------------------------------------------------------- validation --

@pytest.mark.parametrize("cls,kw,msg", [
    (optim.SGD, dict(lr=-1), "Invalid learning rate: -1"),
    (optim.SGD, dict(momentum=-0.1), "Invalid momentum value: -0.1"),
    (optim.SGD, dict(weight_decay=-1), "Invalid weight_decay value: -1"),
    (optim.SGD, dict(nesterov=True),
     "Nesterov momentum requires a momentum and zero dampening"),
    (optim.Adam, dict(lr=-0.5), "Invalid learning rate: -0.5"),
    (optim.Adam, dict(eps=-1), "Invalid epsilon value: -1"),
    (optim.Adam, dict(betas=(1.0, 0.9)),
     "Invalid beta parameter at index 0: 1.0"),
    (optim.AdamW, dict(betas=(0.9, -0.1)),
     "Invalid beta parameter at index 1: -0.1"),
    (optim.RMSprop, dict(alpha=-1), "Invalid alpha value: -1"),
    (optim.Adagrad, dict(lr_decay=-1), "Invalid lr_decay value: -1"),
    (optim.Adagrad, dict(initial_accumulator_value=-1),
     "Invalid initial_accumulator_value value: -1"),
])
def test_validation_messages(cls, kw, msg):
    with pytest.raises(ValueError, match="^" + msg.replace("(", r"\(")):
        cls([dtorch.zeros(1, requires_grad=True)], **kw)


def test_params_errors():
    w = dtorch.zeros(2, requires_grad=True)
    with pytest.raises(TypeError, match="iterable of Tensors"):
        optim.SGD(w, lr=0.1)
    with pytest.raises(ValueError, match="empty parameter list"):
        optim.SGD([], lr=0.1)
    with pytest.raises(TypeError, match="ordered collections"):
        optim.SGD([{"params": {w}}], lr=0.1)
    with pytest.warns(UserWarning, match="duplicate parameters"):
        optim.SGD([w, w], lr=0.1)
    with pytest.raises(ValueError, match="non-leaf"):
        optim.SGD([w * 2], lr=0.1)
    opt = optim.SGD([w], lr=0.1)
    with pytest.raises(ValueError, match="more than one parameter group"):
        opt.add_param_group({"params": [w]})


def test_param_groups_and_defaults():
    a = dtorch.zeros(2, requires_grad=True)
    b = dtorch.zeros(2, requires_grad=True)
    opt = optim.SGD([{"params": [a]}, {"params": b, "lr": 0.5}], lr=0.1,
                    momentum=0.9)
    assert [g["lr"] for g in opt.param_groups] == [0.1, 0.5]
    assert opt.param_groups[1]["momentum"] == 0.9
    assert opt.param_groups[1]["params"][0] is b
    c = dtorch.zeros(1, requires_grad=True)
    opt.add_param_group({"params": [c], "lr": 1.0})
    a.grad = dtorch.ones(2)
    b.grad = dtorch.ones(2)
    c.grad = dtorch.ones(1)
    opt.step()
    np.testing.assert_allclose(a.detach().numpy(), [-0.1, -0.1])
    np.testing.assert_allclose(b.detach().numpy(), [-0.5, -0.5])
    np.testing.assert_allclose(c.detach().numpy(), [-1.0])
    assert "Parameter Group 2" in repr(opt) and "lr: 1.0" in repr(opt)


def test_zero_grad():
    w = dtorch.zeros(2, requires_grad=True)
    opt = optim.Adam([w])
    w.grad = dtorch.ones(2)
    g = w.grad
    opt.zero_grad(set_to_none=False)
    assert w.grad is g and g.tolist() == [0.0, 0.0]
    opt.zero_grad()
    assert w.grad is None


# --------------------------------------------------------- state dicts --

def _train(opt, w, steps):
    a = dtorch.tensor(A, dtype=dtorch.float32)
    b = dtorch.tensor(B, dtype=dtorch.float32)
    train_steps(opt, lambda: ((a @ w - b) ** 2).sum(), steps)


@pytest.mark.parametrize("cls,kw", [
    (optim.SGD, dict(lr=0.01, momentum=0.9, nesterov=True)),
    (optim.Adam, dict(lr=0.05, amsgrad=True)),
    (optim.AdamW, dict(lr=0.05)),
    (optim.RMSprop, dict(lr=0.01, centered=True, momentum=0.5)),
    (optim.Adagrad, dict(lr=0.1, lr_decay=0.01)),
])
def test_state_dict_round_trip_resumes_exactly(cls, kw, tmp_path):
    w1 = dtorch.tensor(W0, dtype=dtorch.float32, requires_grad=True)
    opt1 = cls([w1], **kw)
    _train(opt1, w1, 8)
    # interrupted run: 4 steps, checkpoint to a file, fresh objects, 4 more
    w2 = dtorch.tensor(W0, dtype=dtorch.float32, requires_grad=True)
    opt2 = cls([w2], **kw)
    _train(opt2, w2, 4)
    path = tmp_path / "ckpt.pt"
    dtorch.save({"w": w2.detach(), "opt": opt2.state_dict()}, path)
    ck = dtorch.load(path)
    w3 = ck["w"].clone().requires_grad_(True)
    opt3 = cls([w3], lr=123.0)          # hyper-parameters come from file
    opt3.load_state_dict(ck["opt"])
    assert opt3.param_groups[0]["lr"] == kw["lr"]
    assert opt3.param_groups[0]["params"][0] is w3
    _train(opt3, w3, 4)
    np.testing.assert_array_equal(w3.detach().numpy(), w1.detach().numpy())


def test_state_dict_format_is_pytorchs():
    a = dtorch.zeros(2, requires_grad=True)
    b = dtorch.zeros(3, requires_grad=True)
    opt = optim.SGD([{"params": [a]}, {"params": [b], "lr": 0.5}], lr=0.1,
                    momentum=0.9)
    a.grad, b.grad = dtorch.ones(2), dtorch.ones(3)
    opt.step()
    sd = opt.state_dict()
    assert set(sd) == {"state", "param_groups"}
    assert sorted(sd["state"]) == [0, 1]
    assert sd["state"][1]["momentum_buffer"].shape == (3,)
    assert [g["params"] for g in sd["param_groups"]] == [[0], [1]]
    assert sd["param_groups"][1]["lr"] == 0.5


def test_load_state_dict_errors():
    a = dtorch.zeros(2, requires_grad=True)
    b = dtorch.zeros(2, requires_grad=True)
    sd = optim.SGD([a, b], lr=0.1).state_dict()
    with pytest.raises(ValueError, match="different number of parameter"):
        optim.SGD([{"params": [a]}, {"params": [b]}], lr=0.1) \
            .load_state_dict(sd)
    with pytest.raises(ValueError, match="doesn't match the size"):
        optim.SGD([a], lr=0.1).load_state_dict(sd)


def test_load_state_dict_casts_to_param_dtype_and_copies():
    w = dtorch.zeros(2, dtype=dtorch.float64, requires_grad=True)
    opt = optim.Adam([w])
    w.grad = dtorch.ones(2, dtype=dtorch.float64)
    opt.step()
    sd = opt.state_dict()
    w32 = dtorch.zeros(2, requires_grad=True)
    opt32 = optim.Adam([w32])
    opt32.load_state_dict(sd)
    st = opt32.state[w32]
    assert st["exp_avg"].dtype == dtorch.float32
    assert st["step"].dtype == dtorch.float32
    st["exp_avg"].zero_()
    assert sd["state"][0]["exp_avg"].abs().sum().item() > 0


# ------------------------------------------------------ torch as oracle --

TORCH_CASES = [
    ("SGD", dict(lr=0.01, momentum=0.9, dampening=0.1, weight_decay=0.01)),
    ("SGD", dict(lr=0.01, momentum=0.9, nesterov=True, maximize=False)),
    ("Adam", dict(lr=0.02, weight_decay=0.01)),
    ("Adam", dict(lr=0.02, amsgrad=True, maximize=True)),
    ("AdamW", dict(lr=0.02, weight_decay=0.1, amsgrad=True)),
    ("RMSprop", dict(lr=0.01, alpha=0.9, centered=True, momentum=0.9)),
    ("RMSprop", dict(lr=0.01, weight_decay=0.1)),
    ("Adagrad", dict(lr=0.1, lr_decay=0.01, initial_accumulator_value=0.1)),
]


@pytest.mark.parametrize("name,kw", TORCH_CASES)
def test_against_torch(name, kw):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((16, 4)).astype(np.float32)
    y = rng.standard_normal((16, 2)).astype(np.float32)
    w0 = rng.standard_normal((4, 2)).astype(np.float32)
    b0 = rng.standard_normal(2).astype(np.float32)

    def run(lib, opt_mod):
        w = lib.tensor(w0, requires_grad=True)
        b = lib.tensor(b0, requires_grad=True)
        xt, yt = lib.tensor(x), lib.tensor(y)
        opt = getattr(opt_mod, name)([w, b], **kw)
        for _ in range(10):
            opt.zero_grad()
            loss = ((xt @ w + b - yt) ** 2).mean()
            loss.backward()
            opt.step()
        return w.detach().numpy(), b.detach().numpy()

    got = run(dtorch, optim)
    want = run(torch, torch.optim)
    for g, t in zip(got, want):
        np.testing.assert_allclose(g, t, rtol=2e-5, atol=2e-6)


def test_state_dict_keys_match_torch():
    torch = pytest.importorskip("torch")
    for name in ("SGD", "Adam", "AdamW", "RMSprop", "Adagrad"):
        kw = dict(lr=0.1, momentum=0.9) if name in ("SGD", "RMSprop") \
            else dict(lr=0.1)
        if name == "RMSprop":
            kw["centered"] = True
        tw = torch.zeros(2, requires_grad=True)
        dw = dtorch.zeros(2, requires_grad=True)
        topt = getattr(torch.optim, name)([tw], **kw)
        dopt = getattr(optim, name)([dw], **kw)
        tw.grad, dw.grad = torch.ones(2), dtorch.ones(2)
        topt.step()
        dopt.step()
        tsd, dsd = topt.state_dict(), dopt.state_dict()
        assert set(tsd["state"][0]) == set(dsd["state"][0]), name
        # dtorch leaves out torch's foreach/fused/capturable switches
        extra = set(dsd["param_groups"][0]) - set(tsd["param_groups"][0])
        assert not extra, (name, extra)
        for k, v in dsd["state"][0].items():
            np.testing.assert_allclose(v.numpy(), tsd["state"][0][k].numpy(),
                                       rtol=1e-6)


def test_deepcopy_of_state_dict_is_independent():
    import copy
    w = dtorch.zeros(2, requires_grad=True)
    opt = optim.SGD([w], lr=0.1, momentum=0.9)
    w.grad = dtorch.ones(2)
    opt.step()
    snap = copy.deepcopy(opt.state_dict())
    opt.step()
    buf = snap["state"][0]["momentum_buffer"]
    assert buf.tolist() == [1.0, 1.0]
    opt2 = optim.SGD([w], lr=0.1, momentum=0.9)
    opt2.load_state_dict(snap)
    assert opt2.state[w]["momentum_buffer"].tolist() == [1.0, 1.0]
