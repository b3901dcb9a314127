"""Elementwise fusion in dtorch.compile's replay (dtorch/_compile/fuse.py):
fused results against eager over a table of op chains (broadcasting,
float32/float64/int, numbers, NaN/inf), gradients through fused groups,
recapture on a dtype change, the exact and off options, deterministic
mode, the parallel kernel, and the CuPy stand-in's fused path (one launch
per group). Fusion is checked to have happened by the program's groups,
never by a timing."""
import numpy as np
import pytest

import dtorch
from dtorch import _kernels

pytestmark = pytest.mark.skipif(not _kernels.enabled(),
                                reason="fusion on the CPU needs numba")

F32, F64 = np.float32, np.float64
_SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e30, -2.5, 3.0])


def _arr(shape, dt, special=False, seed=0):
    rng = np.random.default_rng(seed)
    if np.dtype(dt).kind in "iu":
        return rng.integers(-9, 9, shape).astype(dt)
    a = rng.standard_normal(shape).astype(dt)
    if special:
        flat = a.reshape(-1)
        flat[:len(_SPECIAL)] = _SPECIAL[:flat.size].astype(dt)
    return a


# name, function, inputs (shape, dtype, NaN/inf), exact ops only
CHAINS = [
    ("scalars", lambda x: (x * 1.01 + 0.1) * 3 - 2 / x,
     [((7,), F32, False)], True),
    ("bias", lambda x, b: ((x + b) * x - b) / 2.0,
     [((4, 5), F32, False), ((5,), F32, False)], True),
    ("outer", lambda x, y: (x * y + x) - y / 3,
     [((3, 1), F64, False), ((1, 4), F64, False)], True),
    ("mixed", lambda x, y: (x * y + 1) / y - x,
     [((6,), F32, False), ((6,), F64, False)], True),
    ("specials", lambda x, y: (x * y - x) / y + (-x),
     [((8,), F32, True), ((8,), F32, True)], True),
    ("relu", lambda x, y: ((x - 0.5).relu() * y).relu() + y,
     [((3, 8), F32, True), ((8,), F32, False)], True),
    ("reuse", lambda x: x * x + x * 2 - x,
     [((5, 3), F64, False)], True),
    ("sqrt", lambda x: ((x * x + 1).sqrt() - x) * 0.5,
     [((9,), F32, True)], True),
    ("tanh", lambda x: ((x * 1.01 + 0.1).tanh() * 1.01 + 0.1).tanh(),
     [((10,), F32, True)], False),
    ("sigmoid_exp", lambda x, b: ((x + b).sigmoid() * 2 - 1).exp() + x,
     [((4, 6), F64, False), ((4, 1), F64, False)], False),
    ("log_sin", lambda x: ((x * x + 1).log() - x.sin()) * x,
     [((16,), F32, True)], False),
    ("int", lambda i, j: (i * 3 + j) - 7 * j,
     [((6,), np.int64, False), ((2, 6), np.int32, False)], True),
    ("int_to_float", lambda i: (i / 2 + 1.5) * i,
     [((6,), np.int64, False)], True),
    ("int_tanh", lambda i: (i * 2).tanh() * 3,
     [((6,), np.int32, False)], False),
]


def _groups(c):
    progs = [e.program for e in c.cache.values() if e.program is not None]
    assert progs, "no program was captured"
    return [g for p in progs for g in p.groups]


def _run(fn, arrays, fuse, calls=3):
    """Eager and compiled results: (outputs, gradients) of the last call,
    with a fixed upstream gradient; the compiled callable."""
    grad_ok = [a.dtype.kind == "f" for a in arrays]
    res = []
    c = dtorch.compile(fn, options={"fuse": fuse})
    for f in (fn, c):
        for _ in range(calls if f is c else 1):
            ts = [dtorch.tensor(a.copy(), requires_grad=g)
                  for a, g in zip(arrays, grad_ok)]
            out = f(*ts)
            grads = []
            if out.requires_grad:
                up = dtorch.tensor(_arr(tuple(out.shape),
                                        out.detach().numpy().dtype, seed=1))
                out.backward(up)
                grads = [t.grad.numpy().copy() for t, g in zip(ts, grad_ok)
                         if g]
        res.append((out.detach().numpy().copy(), grads))
    return res, c


def _same(a, b, exact):
    assert a.dtype == b.dtype and a.shape == b.shape
    if exact:
        np.testing.assert_array_equal(a, b)       # NaN equals NaN here
    else:
        # a few ulp per transcendental function, grown by the chain's
        # cancellations (tanh's 1 - out^2 near out = 1)
        np.testing.assert_allclose(a, b, rtol=2e-5 if a.dtype == F32
                                   else 1e-13, atol=0)


@pytest.mark.parametrize("name,fn,specs,exact", CHAINS,
                         ids=[c[0] for c in CHAINS])
@pytest.mark.parametrize("fuse", [True, "exact"])
def test_fused_chain_equals_eager(name, fn, specs, exact, fuse):
    arrays = [_arr(s, d, sp, seed=k) for k, (s, d, sp) in enumerate(specs)]
    with np.errstate(all="ignore"):
        ((ye, ge), (yc, gc)), c = _run(fn, arrays, fuse)
    bitwise = exact or fuse == "exact"
    _same(ye, yc, bitwise)
    assert len(ge) == len(gc)
    for a, b in zip(ge, gc):
        _same(a, b, bitwise)
    groups = _groups(c)
    if exact or fuse is True:
        assert groups, f"{name}: nothing was fused"
    if fuse == "exact":
        assert not any(g.inexact for g in groups)


def test_off_keeps_every_op():
    x = _arr((5,), F32)
    ((ye, ge), (yc, gc)), c = _run(CHAINS[-6][1], [x], False)
    assert _groups(c) == []
    np.testing.assert_array_equal(ye, yc)
    np.testing.assert_array_equal(ge[0], gc[0])


def test_one_group_for_a_long_chain_with_its_backward():
    def chain(x):
        for _ in range(30):
            x = (x * 1.01 + 0.1).tanh()
        return x.sum()
    ((ye, ge), (yc, gc)), c = _run(chain, [_arr((8,), F32)], True)
    g, = _groups(c)
    assert g.n_ops == 90
    # the backward reads the tanh outputs, one buffer row each
    assert len(g.saved) == 30 and g.graph
    _same(ye, yc, False)
    _same(ge[0], gc[0], False)


def test_dropout_joins_a_group():
    F = dtorch.nn.functional

    def f(x, b):
        return F.dropout((x + b) * 2, 0.3) + x
    c = dtorch.compile(f)
    arrays = [_arr((6, 5), F32), _arr((5,), F32, seed=1)]
    for fn in (f, c, c, c):
        ts = [dtorch.tensor(a, requires_grad=True) for a in arrays]
        dtorch.manual_seed(7)          # the same mask in every call
        y = fn(*ts)
        y.backward(dtorch.ones_like(y))
        got = [y.detach().numpy()] + [t.grad.numpy() for t in ts]
        if fn is f:
            want = got
    for a, b in zip(want, got):
        np.testing.assert_array_equal(a, b)
    # the mask's draw (a step outside ops, reading the product) splits
    # the run in two
    assert [[st[1].__name__ for st in g.ops] for g in _groups(c)] == [
        ["Add", "Mul"], ["Dropout", "Add"]]


def test_gradient_reaching_part_of_a_group():
    """A group with two values read outside: a backward from only one of
    them skips the ops after it (as the unfused backward does), so an inf
    times a zero gradient never makes a NaN there."""
    def f(x, y):
        a = x * y
        b = (a + 1) * np.inf
        return a, b
    c = dtorch.compile(f)
    arrays = [_arr((4,), F32), _arr((4,), F32, seed=1)]
    for which in (0, 1, 0):
        for fn in (f, c, c, c):
            ts = [dtorch.tensor(v, requires_grad=True) for v in arrays]
            outs = fn(*ts)
            with np.errstate(all="ignore"):
                outs[which].sum().backward()
            got = [t.grad.numpy() for t in ts]
            if fn is f:
                want = got
        for u, v in zip(want, got):
            np.testing.assert_array_equal(u, v)
    g, = _groups(c)
    assert len(g.entries) == 2 and len(g._bwd) == 2


def test_recapture_when_dtype_changes():
    def f(x, b):
        return (x + b) * 2 - b
    c = dtorch.compile(f)
    outs = {}
    for dt in (F32, F64, F32):
        for _ in range(3):
            x = dtorch.tensor(_arr((3, 4), dt), requires_grad=True)
            b = dtorch.tensor(_arr((4,), dt, seed=2), requires_grad=True)
            y = c(x, b)
            y.sum().backward()
        assert y.dtype == x.dtype
        ye = f(x.detach(), b.detach())
        np.testing.assert_array_equal(y.detach().numpy(), ye.numpy())
        # d/db of (x + b) * 2 - b summed over x's 3 rows: 3 (2 - 1)
        np.testing.assert_array_equal(b.grad.numpy(), np.full(4, 3.0, dt))
        outs[dt] = y
    ex = dtorch.compiler.explain(c)
    assert ex.recaptures >= 1 and ex.graph_count == 2
    assert len(_groups(c)) == 2
    dts = {g.meta[g.slots[0]][1] for g in _groups(c)}
    assert dts == {np.dtype(F32), np.dtype(F64)}


def test_deterministic_mode_fuses_only_exact_ops():
    fn = CHAINS[8][1]                      # tanh: inexact kernels
    x = _arr((10,), F32, True)
    dtorch.use_deterministic_algorithms(True)
    try:
        with np.errstate(all="ignore"):
            ((ye, ge), (yc, gc)), c = _run(fn, [x], True)
    finally:
        dtorch.use_deterministic_algorithms(False)
    np.testing.assert_array_equal(ye, yc)
    np.testing.assert_array_equal(ge[0], gc[0])
    groups = _groups(c)
    assert groups and not any(g.inexact for g in groups)
    assert not any(st[1].__name__ == "Tanh" for g in groups for st in g.ops)


def test_parallel_kernel_is_bitwise(monkeypatch):
    # above PARALLEL_MIN elements with 2 threads: the prange variant
    n = _kernels.PARALLEL_MIN + 5
    prev = dtorch.get_num_threads()
    dtorch.set_num_threads(2)
    try:
        ((ye, ge), (yc, gc)), c = _run(CHAINS[1][1], [
            _arr((n // 5, 5), F32), _arr((5,), F32, seed=1)], True)
    finally:
        dtorch.set_num_threads(prev)
    np.testing.assert_array_equal(ye, yc)
    for a, b in zip(ge, gc):
        np.testing.assert_array_equal(a, b)
    assert _groups(c)


def test_non_contiguous_input():
    def f(x, b):
        return (x.t() + b) * 2 - b
    ((ye, ge), (yc, gc)), c = _run(f, [_arr((5, 3), F32),
                                       _arr((5,), F32, seed=1)], "exact")
    np.testing.assert_array_equal(ye, yc)
    for a, b in zip(ge, gc):
        np.testing.assert_array_equal(a, b)
    assert _groups(c)


def test_kernel_cache_directory(tmp_path, monkeypatch):
    """DTORCH_COMPILE_CACHE: kernels are module files there, with numba's
    cache beside them; a fresh kernel table loads them again."""
    from dtorch._compile import fuse
    monkeypatch.setenv("DTORCH_COMPILE_CACHE", str(tmp_path))
    monkeypatch.setattr(fuse, "_KERNELS", {})
    fn = CHAINS[2][1]
    arrays = [_arr((3, 1), F64), _arr((1, 4), F64, seed=1)]
    ((ye, ge), (yc, gc)), c = _run(fn, arrays, True)
    files = sorted(p.name for p in tmp_path.glob("dtorch_fused_*.py"))
    assert len(files) == 2                        # forward, backward
    assert list(tmp_path.glob("__pycache__/*.nbi"))
    monkeypatch.setattr(fuse, "_KERNELS", {})
    ((_, _), (yc2, gc2)), _ = _run(fn, arrays, True)
    for a, b in [(ye, yc), (ye, yc2)] + list(zip(ge, gc)) + list(zip(ge,
                                                                    gc2)):
        np.testing.assert_array_equal(a, b)
    assert sorted(p.name for p in tmp_path.glob("dtorch_fused_*.py")) == \
        files


def test_empty_tensors():
    ((ye, ge), (yc, gc)), c = _run(CHAINS[1][1], [_arr((0, 5), F32),
                                                  _arr((5,), F32)], True)
    assert yc.shape == (0, 5) and gc[1].shape == (5,)
    np.testing.assert_array_equal(ge[1], gc[1])         # zeros
    assert _groups(c)


def test_fuse_option_is_checked():
    with pytest.raises(RuntimeError, match="options\\['fuse'\\]"):
        dtorch.compile(lambda x: x, options={"fuse": "yes"})
    with pytest.raises(RuntimeError, match="but 'fuse'"):
        dtorch.compile(lambda x: x, options={"fuse": True, "epilogue": 1})


def test_module_step_with_fusion_equals_unfused():
    nn = dtorch.nn

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(6, 6)

        def forward(self, x):
            h = self.l(x)
            return ((h * 0.5 + 1).relu() * h - h / 3).tanh()
    res = []
    for fuse in (False, True):
        dtorch.manual_seed(0)
        m = M()
        opt = dtorch.optim.SGD(m.parameters(), lr=0.1)
        net = dtorch.compile(m, options={"fuse": fuse})
        for i in range(4):
            x = dtorch.tensor(_arr((4, 6), F32, seed=i))
            net(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
        c = dtorch.compiler.explain(net)
        assert ("fused" in " ".join(c.log)) == fuse
        res.append(m.l.weight.detach().numpy().copy())
    np.testing.assert_allclose(res[0], res[1], rtol=1e-5, atol=1e-7)


def test_stand_in_runs_the_fused_path(device):
    """cpu (numba), and cuda on the CuPy stand-in (DTORCH_FAKE_CUDA=1,
    marker gpu): a fused group is one cupy.fuse launch forward and one
    backward, fewer launches than eager."""
    fn = CHAINS[1][1]
    arrays = [_arr((4, 5), F32), _arr((5,), F32, seed=1)]
    launches = {}
    res = {}
    cupy = None
    if device != "cpu":
        import cupy
    for compiled in (False, True):
        f = dtorch.compile(fn) if compiled else fn
        for _ in range(3 if compiled else 1):
            ts = [dtorch.tensor(a, requires_grad=True, device=device)
                  for a in arrays]
            if cupy is not None:
                cupy._launches.clear()
            y = f(*ts)
            y.backward(dtorch.ones_like(y))
            if cupy is not None:
                launches[compiled] = dict(cupy._launches)
        res[compiled] = [y.detach().cpu().numpy()] + [
            t.grad.cpu().numpy() for t in ts]
    g, = _groups(f)
    assert g.gpu == (device != "cpu") and g.n_ops == 4
    for a, b in zip(res[False], res[True]):
        np.testing.assert_array_equal(a, b)
    if cupy is not None:
        assert launches[True].get("fuse:dtorch_fused") == 2   # fwd, bwd
        assert sum(launches[True].values()) < sum(launches[False].values())
