"""LBFGS and Adadelta against torch.optim from the same start (float64):
the same iterates, step after step."""
import numpy as np
import pytest

import dtorch

torch = pytest.importorskip("torch")


def _problem(lib, w0, x, y):
    """A small non-convex least-squares fit: tanh layer then linear."""
    w1 = lib.tensor(w0[0], dtype=lib.float64, requires_grad=True)
    w2 = lib.tensor(w0[1], dtype=lib.float64, requires_grad=True)
    X = lib.tensor(x, dtype=lib.float64)
    Y = lib.tensor(y, dtype=lib.float64)

    def loss():
        return ((lib.tanh(X @ w1) @ w2 - Y) ** 2).mean()
    return [w1, w2], loss


def _data():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((20, 3))
    y = np.sin(x[:, :1]) + 0.1 * x[:, 1:2]
    w0 = (rng.standard_normal((3, 5)) * 0.5, rng.standard_normal((5, 1)) * 0.5)
    return w0, x, y


def _run(lib, opt_fn, steps, closure_opt=True):
    w0, x, y = _data()
    params, loss_fn = _problem(lib, w0, x, y)
    opt = opt_fn(lib, params)
    losses, iterates = [], []
    for _ in range(steps):
        def closure():
            opt.zero_grad()
            loss = loss_fn()
            loss.backward()
            return loss
        if closure_opt:
            losses.append(float(opt.step(closure).detach()))
        else:
            losses.append(float(closure().detach()))
            opt.step()
        iterates.append([p.detach().numpy().copy() for p in params])
    return losses, iterates, opt


# Near the optimum the problem is ill-conditioned and rounding differences
# (BLAS summation order) grow by ~100x per 20 iterations, so the long runs
# are compared over two steps (40 iterations): measured 5e-12 apart.
@pytest.mark.parametrize("kw,steps", [
    (dict(line_search_fn="strong_wolfe"), 2),
    (dict(), 2),
    (dict(line_search_fn="strong_wolfe", history_size=3, max_iter=7), 3),
    (dict(lr=0.5, max_iter=4), 5),
])
def test_lbfgs_iterates_match_torch(kw, steps):
    def make(lib, params):
        return lib.optim.LBFGS(params, **kw)
    ld, itd, od = _run(dtorch, make, steps)
    lt, itt, ot = _run(torch, make, steps)
    np.testing.assert_allclose(ld, lt, rtol=1e-9, atol=1e-12)
    for a, b in zip(itd, itt):
        for pa, pb in zip(a, b):
            np.testing.assert_allclose(pa, pb, rtol=1e-8, atol=1e-10)
    sd = od.state[od.param_groups[0]["params"][0]]
    st = ot.state[ot.param_groups[0]["params"][0]]
    assert sd["func_evals"] == st["func_evals"]
    assert sd["n_iter"] == st["n_iter"]
    assert len(sd["old_dirs"]) == len(st["old_dirs"])
    # torch's state layout: the same keys, 'al' one slot per history entry
    # (None until used), al/ro/H_diag as 0-d tensors
    assert sorted(sd) == sorted(st)
    for k in ("al", "ro"):
        assert len(sd[k]) == len(st[k])
        for a, b in zip(sd[k], st[k]):
            assert (a is None) == (b is None)
            if a is not None:
                assert a.dtype == dtorch.float64 and a.ndim == 0
                np.testing.assert_allclose(float(a), float(b), rtol=1e-6,
                                           atol=1e-10)
    np.testing.assert_allclose(float(sd["H_diag"]), float(st["H_diag"]),
                               rtol=1e-6)


def test_lbfgs_converges_and_checks_args():
    w = dtorch.tensor([-1.5, 2.0], dtype=dtorch.float64, requires_grad=True)
    opt = dtorch.optim.LBFGS([w], line_search_fn="strong_wolfe", max_iter=100)

    def closure():
        opt.zero_grad()
        f = (1 - w[0]) ** 2 + 100 * (w[1] - w[0] ** 2) ** 2   # Rosenbrock
        f.backward()
        return f
    opt.step(closure)
    np.testing.assert_allclose(w.detach().numpy(), [1.0, 1.0], atol=1e-5)
    with pytest.raises(RuntimeError, match="closure"):
        opt.step(None)
    with pytest.raises(ValueError, match="parameter groups"):
        dtorch.optim.LBFGS([{"params": [w]}, {"params": [dtorch.zeros(
            1, requires_grad=True)]}])
    bad = dtorch.optim.LBFGS([w], line_search_fn="backtracking")
    w.data.add_(0.5)
    with pytest.raises(RuntimeError, match="strong_wolfe"):
        bad.step(closure)


@pytest.mark.parametrize("kw", [dict(), dict(lr=0.5, rho=0.8, eps=1e-4),
                                dict(weight_decay=0.1, maximize=True)])
def test_adadelta_matches_torch(kw):
    def make(lib, params):
        return lib.optim.Adadelta(params, **kw)
    ld, itd, od = _run(dtorch, make, 6, closure_opt=False)
    lt, itt, ot = _run(torch, make, 6, closure_opt=False)
    np.testing.assert_allclose(ld, lt, rtol=1e-12)
    for a, b in zip(itd, itt):
        for pa, pb in zip(a, b):
            np.testing.assert_allclose(pa, pb, rtol=1e-12, atol=1e-14)
    p = od.param_groups[0]["params"][0]
    assert set(od.state[p]) == set(ot.state[ot.param_groups[0]["params"][0]])
    with pytest.raises(ValueError, match="rho"):
        dtorch.optim.Adadelta([p], rho=1.5)


@pytest.mark.parametrize("name,kw", [
    ("Adamax", {}), ("Adamax", dict(lr=0.01, weight_decay=0.1,
                                    maximize=True)),
    ("NAdam", {}), ("NAdam", dict(weight_decay=0.1)),
    ("NAdam", dict(weight_decay=0.1, decoupled_weight_decay=True,
                   momentum_decay=0.01)),
    ("RAdam", {}), ("RAdam", dict(lr=0.01, weight_decay=0.1)),
    ("RAdam", dict(weight_decay=0.1, decoupled_weight_decay=True)),
    ("Rprop", {}), ("Rprop", dict(lr=0.05, etas=(0.3, 1.5),
                                  step_sizes=(1e-3, 0.2))),
    ("ASGD", {}), ("ASGD", dict(lr=0.05, t0=3, lambd=0.01,
                                weight_decay=0.01)),
])
def test_more_optimizers_match_torch(name, kw):
    def make(lib, params):
        return getattr(lib.optim, name)(params, **kw)
    ld, itd, od = _run(dtorch, make, 8, closure_opt=False)
    lt, itt, ot = _run(torch, make, 8, closure_opt=False)
    np.testing.assert_allclose(ld, lt, rtol=1e-12)
    for a, b in zip(itd, itt):
        for pa, pb in zip(a, b):
            np.testing.assert_allclose(pa, pb, rtol=1e-12, atol=1e-14)
    pd = od.param_groups[0]["params"][0]
    pt = ot.param_groups[0]["params"][0]
    assert set(od.state[pd]) == set(ot.state[pt])
    for k, v in ot.state[pt].items():
        np.testing.assert_allclose(np.asarray(od.state[pd][k]._data),
                                   v.numpy(), rtol=1e-12, atol=1e-14)


def test_pytorchs_own_lbfgs_source_runs_on_dtorch():
    """torch/optim/lbfgs.py with only its imports pointed at dtorch (as a
    script that vendors it would): it needs Tensor.is_sparse,
    torch.is_complex, torch.contiguous_format, add_(alpha=tensor), ..."""
    import torch.optim.lbfgs as m
    with open(m.__file__, encoding="utf-8") as f:
        src = f.read()
    src = src.replace("import torch\n", "import dtorch as torch\n", 1)
    src = src.replace("from torch import Tensor\n",
                      "from dtorch import Tensor\n")
    src = src.replace(
        "from .optimizer import _to_scalar, Optimizer, ParamsT\n",
        "from dtorch.optim.optimizer import Optimizer\nParamsT = object\n"
        "def _to_scalar(x):\n    return x.item() if isinstance(x, Tensor) "
        "else x\n")
    ns = {"__name__": "vendored_lbfgs"}
    exec(compile(src, "vendored_lbfgs", "exec"), ns)

    def make_src(lib, params):
        return ns["LBFGS"](params, line_search_fn="strong_wolfe")

    def make_ref(lib, params):
        return lib.optim.LBFGS(params, line_search_fn="strong_wolfe")
    ld, _, _ = _run(dtorch, make_src, 2)
    lt, _, _ = _run(torch, make_ref, 2)
    np.testing.assert_allclose(ld, lt, rtol=1e-9, atol=1e-12)
