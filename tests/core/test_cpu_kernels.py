"""dtorch._kernels: the compiled CPU kernels (numba) against the NumPy path
they replace, in one process (``_kernels.forced``), boundary values
included; the switch (DTORCH_NUMBA=0, numba missing), thread counts, fork.

Exactness: optimizer updates are bit for bit the NumPy path's; kernels with
exp/log/erf or row sums agree to float rounding (float32 rtol 1e-5 /
float64 1e-12 here), with NaN and inf in the same places."""
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import dtorch
import dtorch.nn.functional as F
from dtorch import _kernels

try:
    import numba
except ImportError:      # the NumPy path's tests still run
    numba = None

need_numba = pytest.mark.skipif(numba is None, reason="numba not installed")
TOL = {np.float32: dict(rtol=1e-5, atol=1e-6),
       np.float64: dict(rtol=1e-12, atol=1e-13)}


def paths():
    """The paths a test compares: NumPy always, the kernels where numba
    imports."""
    return [False, True] if numba is not None else [False]


class Counting:
    """The kernel module, counting the kernels called through it."""

    def __init__(self, mod):
        self.mod, self.calls = mod, []

    def __getattr__(self, name):
        self.calls.append(name)
        return getattr(self.mod, name)


def both(fn, kernel=True):
    """fn() under each path: {on: result}. ``kernel``: the compiled path
    must have called a kernel (it did not fall back unseen)."""
    out = {}
    for on in paths():
        with _kernels.forced(on):
            spy = None
            if on:
                spy = _kernels._state["mod"] = Counting(_kernels._state["mod"])
            out[on] = fn()
            if spy is not None:
                assert bool(spy.calls) == kernel, spy.calls
    return out


def close(a, b, dtype):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape and a.dtype == b.dtype
    np.testing.assert_array_equal(np.isnan(a), np.isnan(b))
    np.testing.assert_array_equal(np.isposinf(a), np.isposinf(b))
    np.testing.assert_array_equal(np.isneginf(a), np.isneginf(b))
    fin = np.isfinite(a)
    np.testing.assert_allclose(a[fin], b[fin], **TOL[dtype])


def boundary(shape, dtype, seed=0):
    """Random rows, plus rows holding 0, +-inf, NaN, a whole -inf row, huge
    and tiny values, ties."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(dtype) * 3
    rows = x.reshape(-1, shape[-1])
    specials = [[0.0], [np.inf], [-np.inf], [np.nan], [-np.inf] * shape[-1],
                [100.0, -100.0], [88.8, -104.0], [1e-30, -1e-30], [7.0] * 4]
    for i, vals in enumerate(specials):
        if i < rows.shape[0]:
            rows[i, :len(vals)] = vals[:shape[-1]]
    return x


def fwd_bwd(f, x, seed=1):
    """(output, input gradient) of f at x (a float array), for an upstream
    gradient of cosines."""
    t = dtorch.tensor(x, requires_grad=True)
    y = f(t)
    g = np.cos(np.arange(y.numel())).reshape(tuple(y.shape))
    y.backward(dtorch.tensor(g.astype(x.dtype)) if y.ndim else None)
    return y.detach().numpy(), t.grad.numpy()


ACTS = {
    "softmax": lambda t: F.softmax(t, -1),
    "softmax_dim2": lambda t: F.softmax(t, 2),
    "softmax_dim1": lambda t: F.softmax(t, 1),       # NumPy path in both
    "log_softmax": lambda t: F.log_softmax(t, -1),
    "gelu": F.gelu,
    "silu": F.silu,
    "layer_norm": lambda t: F.layer_norm(t, t.shape[-1:]),
    "layer_norm_2d": lambda t: F.layer_norm(t, t.shape[-2:]),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(ACTS))
def test_ops_match_the_numpy_path(name, dtype, monkeypatch):
    from dtorch.ops import activation
    monkeypatch.setattr(activation, "_GELU_MIN", 0)    # small data here
    x = boundary((4, 9, 37), dtype)
    r = both(lambda: fwd_bwd(ACTS[name], x), kernel=name != "softmax_dim1")
    y0, g0 = r[False]
    assert np.isfinite(y0).any()           # the data is not all NaN
    for y, g in r.values():
        close(y, y0, dtype)
        close(g, g0, dtype)


@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_weight_and_bias_gradients(affine):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6, 5, 33)).astype(np.float32)
    x[0, 0, :] = 5.0                       # a constant row: xhat 0
    x[1, 1, 3] = np.nan

    def run():
        w = dtorch.tensor(rng.standard_normal(33).astype(np.float32),
                          requires_grad=True) if affine else None
        b = dtorch.tensor(np.full(33, 0.5, np.float32),
                          requires_grad=True) if affine else None
        t = dtorch.tensor(x, requires_grad=True)
        y = F.layer_norm(t, (33,), w, b)
        (y * dtorch.tensor(np.sin(np.arange(y.numel())).reshape(
            x.shape).astype(np.float32))).sum().backward()
        out = [y.detach().numpy(), t.grad.numpy()]
        return out + ([w.grad.numpy(), b.grad.numpy()] if affine else [])
    rng_state = rng.bit_generator.state
    r = {}
    for on in paths():
        rng.bit_generator.state = rng_state
        with _kernels.forced(on):
            r[on] = run()
    for got in r.values():
        for a, b in zip(got, r[False]):
            close(a, b, np.float32)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True])
def test_cross_entropy_matches_the_numpy_path(reduction, weighted):
    x = boundary((12, 10), np.float32)
    t = np.array([0, 1, 2, 3, -100, 5, 6, 7, 8, 9, 1, 2])
    x[1, 1] = np.inf                    # inf logit at the target
    w = np.linspace(0.5, 2, 10).astype(np.float32) if weighted else None

    def f(u):
        return F.cross_entropy(u, dtorch.tensor(t), reduction=reduction,
                               weight=None if w is None else dtorch.tensor(w))
    r = both(lambda: fwd_bwd(f, x))
    for y, g in r.values():
        close(y, r[False][0], np.float32)
        close(g, r[False][1], np.float32)


def test_small_gelu_stays_on_numpy():
    """GELU's kernel starts at _GELU_MIN elements (it lost below)."""
    from dtorch.ops import activation
    x = boundary((3, activation._GELU_MIN // 3 - 1), np.float32)
    both(lambda: fwd_bwd(F.gelu, x[:, :8].copy()), kernel=False)
    r = both(lambda: fwd_bwd(F.gelu, np.tile(x, (2, 1))))
    close(r[True][1], r[False][1], np.float32)


def test_empty_and_noncontiguous_inputs_take_the_numpy_path():
    x = np.zeros((0, 5), np.float32)
    for on in paths():
        with _kernels.forced(on):
            assert _kernels.kernels(x) is None
            y, g = fwd_bwd(lambda t: F.softmax(t, -1), x)
            assert y.shape == g.shape == (0, 5)
            z = np.ones((4, 6), np.float32)[:, ::2]
            assert _kernels.kernels(z) is None
            assert _kernels.kernels(z.astype(np.float16)) is None
    xt = boundary((5, 8), np.float32).T       # a transposed view
    r = both(lambda: fwd_bwd(F.gelu, xt), kernel=False)
    for y, g in r.values():
        close(y, r[False][0], np.float32)


# ------------------------------------------------------------ optimizers --

def _trajectory(make, dtype, steps=5, seed=0):
    """Parameters and state after ``steps`` steps on fixed gradients, some
    holding NaN and inf."""
    rng = np.random.default_rng(seed)
    shapes = [(7, 5), (5,), (3, 4, 2)]
    ps = [dtorch.nn.Parameter(dtorch.tensor(
        rng.standard_normal(s).astype(dtype))) for s in shapes]
    opt = make(ps)
    for k in range(steps):
        for i, p in enumerate(ps):
            g = rng.standard_normal(p.shape).astype(dtype)
            if k == 3 and i == 0:
                g[0, :3] = [np.nan, np.inf, -np.inf]
            p.grad = dtorch.tensor(g)
        opt.step()
    state = [v.numpy() for p in ps for v in opt.state[p].values()
             if isinstance(v, dtorch.Tensor)]
    return [p.detach().numpy() for p in ps] + state


OPTS = {
    "adam": lambda ps: dtorch.optim.Adam(ps, lr=1e-2),
    "adam_amsgrad_wd": lambda ps: dtorch.optim.Adam(
        ps, lr=1e-2, amsgrad=True, weight_decay=0.1, maximize=True),
    "adamw": lambda ps: dtorch.optim.AdamW(ps, lr=1e-2, betas=(0.8, 0.9)),
    "sgd": lambda ps: dtorch.optim.SGD(ps, lr=0.1),
    "sgd_momentum": lambda ps: dtorch.optim.SGD(ps, lr=0.1, momentum=0.9,
                                                dampening=0.3),
    "sgd_nesterov_wd": lambda ps: dtorch.optim.SGD(
        ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(OPTS))
def test_optimizer_kernels_are_bit_for_bit_the_numpy_path(name, dtype):
    r = both(lambda: _trajectory(OPTS[name], dtype))
    for got in r.values():
        assert len(got) == len(r[False])
        for a, b in zip(got, r[False]):
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(a, b)


@need_numba
def test_optimizer_kernel_runs_and_noncontiguous_grad_falls_back(
        monkeypatch):
    calls = []
    real = _kernels._load(switch=False).adam

    class Spy:
        def __getattr__(self, n):
            return getattr(_kernels._load(switch=False), n)

        def adam(self, *a):
            calls.append(a[0].size)
            return real(*a)
    p = dtorch.nn.Parameter(dtorch.ones(4, 6))
    opt = dtorch.optim.Adam([p])
    with _kernels.forced(True):
        monkeypatch.setitem(_kernels._state, "mod", Spy())
        p.grad = dtorch.ones(4, 6)
        opt.step()
        assert calls == [24]
        p.grad = dtorch.ones(6, 4).t()          # a strided view
        assert not p.grad._data.flags.c_contiguous
        opt.step()
        assert calls == [24]


# -------------------------------------------------------- the float32 exp --

@need_numba
def test_vectorised_exp_is_within_two_ulp_with_numpy_special_values():
    from dtorch._kernels._numba import vexp

    @numba.njit
    def run(x, out):
        for i in range(x.size):
            out[i] = vexp(x[i])
    x = np.concatenate([
        np.linspace(-110, 90, 400001, dtype=np.float32),
        np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 88.72283, 88.7229,
                  -87.33655, -103.97, -103.98, 1e-30], np.float32)])
    got = np.empty_like(x)
    run(x, got)
    with np.errstate(over="ignore", invalid="ignore"):
        want = np.exp(x.astype(np.float64)).astype(np.float32)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    np.testing.assert_array_equal(got == 0, want == 0)
    fin = np.isfinite(want) & (want > 0)
    ulp = np.abs(got[fin].view(np.int32).astype(np.int64)
                 - want[fin].view(np.int32).astype(np.int64))
    assert ulp.max() <= 2


# ------------------------------------------ convolution and batch norm --

def _threads(n, fn):
    """fn() with the kernels at n threads (every size threaded)."""
    saved = _kernels._state["threads"]
    try:
        _kernels.set_num_threads(n)
        return fn()
    finally:
        _kernels._state["threads"] = saved
        _kernels._state.pop("n", None)


def _same_bits(run, kernel=True):
    """run() gives the NumPy path's bits (signed zeros included) on the
    kernel path at 1 and 2 threads; ``kernel``: a kernel ran there."""
    with _kernels.forced(False):
        ref = run()
    for th in (1, 2):
        r = _threads(th, lambda: both(run, kernel=kernel))
        for a, b in zip(r[paths()[-1]], ref):
            np.testing.assert_array_equal(a, b)
            np.testing.assert_array_equal(np.signbit(a), np.signbit(b))


def _conv_grads(x, w, stride, pad, dilation):
    xt = dtorch.tensor(x, requires_grad=True)
    wt = dtorch.tensor(w, requires_grad=True)
    y = F.conv2d(xt, wt, None, stride, pad, dilation)
    g = np.cos(np.arange(y.numel())).reshape(tuple(y.shape))
    y.backward(dtorch.tensor(g.astype(x.dtype)))
    return y.detach().numpy(), xt.grad.numpy(), wt.grad.numpy()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n,stride,pad,dilation", [
    (3, 1, 1, 1),        # im2col forward, weight grad, stride-1 input grad
    (1, 2, 1, 1),        # col2im (strided input gradient), one image
    (2, 1, 0, 2),        # dilated, unpadded
    (0, 1, 1, 1),        # empty batch: the NumPy path in both
])
def test_conv_kernels_are_bit_for_bit_the_numpy_path(dtype, n, stride, pad,
                                                     dilation, monkeypatch):
    """im2col copies and col2im adds in the NumPy path's order: the same
    bits, at 1 and 2 threads, odd image sizes."""
    monkeypatch.setattr(_kernels, "PARALLEL_MIN", 0)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((n, 32, 7, 5)).astype(dtype)
    w = rng.standard_normal((6, 32, 3, 3)).astype(dtype)
    _same_bits(lambda: _conv_grads(x, w, stride, pad, dilation), n > 0)


def _bn_grads(x, affine, dim=1):
    c = x.shape[1]
    rng = np.random.default_rng(9)
    w = dtorch.tensor(rng.standard_normal(c).astype(x.dtype),
                      requires_grad=True) if affine else None
    b = dtorch.tensor(rng.standard_normal(c).astype(x.dtype),
                      requires_grad=True) if affine else None
    rm = dtorch.zeros(c, dtype=dtorch.tensor(x).dtype)
    rv = dtorch.ones(c, dtype=rm.dtype)
    xt = dtorch.tensor(x, requires_grad=True)
    y = F.batch_norm(xt, rm, rv, w, b, training=True)
    g = np.cos(np.arange(y.numel())).reshape(tuple(y.shape))
    y.backward(dtorch.tensor(g.astype(x.dtype)))
    out = [y.detach().numpy(), xt.grad.numpy(), rm.numpy(), rv.numpy()]
    return out + ([w.grad.numpy(), b.grad.numpy()] if affine else [])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,affine", [
    ((6, 5, 3, 7), True), ((4, 3, 9), False), ((2, 1), True),
    ((1, 4, 1, 3), True)])
def test_batch_norm_kernel_matches_the_numpy_path(dtype, shape, affine,
                                                  monkeypatch):
    """Per-channel float64 sums: float rounding away from the NumPy path's
    pairwise sums, the same bits at 1 and 2 threads (one thread sums a
    channel), and the NumPy path itself in deterministic mode."""
    monkeypatch.setattr(_kernels, "PARALLEL_MIN", 0)
    x = boundary(shape, dtype)[..., :] if shape[-1] > 8 else \
        np.random.default_rng(2).standard_normal(shape).astype(dtype) * 3
    x[np.isinf(x) | np.isnan(x)] = 1.5      # a finite batch: stats exist
    with _kernels.forced(False):
        ref = _bn_grads(x, affine)
    runs = [_threads(th, lambda: both(lambda: _bn_grads(x, affine)))
            for th in (1, 2)]
    for a, b in zip(runs[0][paths()[-1]], ref):
        close(a, b, dtype)
    for a, b in zip(runs[0][paths()[-1]], runs[1][paths()[-1]]):
        np.testing.assert_array_equal(a, b)
    dtorch.use_deterministic_algorithms(True)
    try:
        det = both(lambda: _bn_grads(x, affine), kernel=False)
    finally:
        dtorch.use_deterministic_algorithms(False)
    for a, b in zip(det[paths()[-1]], ref):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(3, 4, 6, 10), (1, 1, 2, 2)])
@pytest.mark.parametrize("finite_g", [True, False])
def test_max_pool_2x2_kernel_is_bit_for_bit_the_numpy_path(dtype, shape,
                                                           finite_g,
                                                           monkeypatch):
    """Ties (first maximum wins), NaN (the last NaN wins), signed zeros
    (np.maximum's choice), an infinite upstream gradient; 1 and 2 threads;
    and the winners that create_graph's backward reads from what forward
    kept."""
    monkeypatch.setattr(_kernels, "PARALLEL_MIN", 0)
    x = np.random.default_rng(4).standard_normal(shape).astype(dtype)
    flat = x.reshape(-1)
    flat[::7], flat[::11], flat[3::13], flat[5::13] = 0.5, np.nan, -0.0, 0.0

    def run():
        xt = dtorch.tensor(x, requires_grad=True)
        y = F.max_pool2d(xt, 2)
        g = np.cos(np.arange(y.numel())).reshape(tuple(y.shape))
        if not finite_g:
            g.reshape(-1)[::5] = np.inf
        gt = dtorch.tensor(g.astype(dtype), requires_grad=True)
        gx, = dtorch.autograd.grad(y, xt, gt, create_graph=True)
        x2 = dtorch.tensor(x, requires_grad=True)
        F.max_pool2d(x2, 2).backward(gt.detach())
        return y.detach().numpy(), gx.detach().numpy(), x2.grad.numpy()

    _same_bits(run)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("finite_g", [True, False])
def test_relu_kernel_is_bit_for_bit_the_numpy_path(dtype, finite_g,
                                                   monkeypatch):
    """1 and 2 threads; NaN, +-0, +-inf inputs; an upstream inf (masked
    to +0, as keep_grad does)."""
    monkeypatch.setattr(_kernels, "PARALLEL_MIN", 0)
    x = boundary((3, 37), dtype)
    x[0, :4] = [-0.0, 0.0, -1e-40, np.nan]

    def run():
        xt = dtorch.tensor(x, requires_grad=True)
        y = F.relu(xt)
        g = -np.cos(np.arange(y.numel())).reshape(tuple(y.shape))
        if not finite_g:
            g[::4] = np.inf
        y.backward(dtorch.tensor(g.astype(dtype)))
        return y.detach().numpy(), xt.grad.numpy()

    _same_bits(run)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("f,kernel", [
    (lambda t: F.dropout(t, 0.3), True),
    (lambda t: F.dropout2d(t, 0.3), False)])  # broadcast mask: NumPy's
def test_dropout_kernel_is_bit_for_bit_the_numpy_path(dtype, f, kernel,
                                                      monkeypatch):
    """The same mask (same seed) in both paths; inf/NaN/-0 inputs."""
    monkeypatch.setattr(_kernels, "PARALLEL_MIN", 0)
    x = boundary((3, 5, 37), dtype)
    x[0, 0, :3] = [-0.0, np.inf, np.nan]

    def run():
        dtorch.manual_seed(3)
        return fwd_bwd(f, x)

    _same_bits(run, kernel)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("vocab,n,dim", [(7, 40, 130), (3, 1, 1), (5, 0, 4)])
def test_embedding_backward_kernel_matches_the_numpy_path(dtype, vocab, n,
                                                          dim, monkeypatch):
    """Repeated and negative-free indices, a padding row, 1 and 2 threads
    (the same bits: a thread owns whole columns), float rounding away
    from NumPy's segment sums, NumPy's bits in deterministic mode."""
    monkeypatch.setattr(_kernels, "PARALLEL_MIN", 0)
    rng = np.random.default_rng(6)
    w = rng.standard_normal((vocab, dim)).astype(dtype)
    idx = rng.integers(0, vocab, (n,))
    g = rng.standard_normal((n, dim)).astype(dtype)

    def run():
        wt = dtorch.tensor(w, requires_grad=True)
        y = F.embedding(dtorch.tensor(idx), wt, padding_idx=1)
        y.backward(dtorch.tensor(g))
        return wt.grad.numpy()

    with _kernels.forced(False):
        ref = run()
    runs = [_threads(th, lambda: both(run, kernel=n > 0)) for th in (1, 2)]
    close(runs[0][paths()[-1]], ref, dtype)
    np.testing.assert_array_equal(runs[0][paths()[-1]], runs[1][paths()[-1]])
    dtorch.use_deterministic_algorithms(True)
    try:
        det = both(run, kernel=False)
    finally:
        dtorch.use_deterministic_algorithms(False)
    np.testing.assert_array_equal(det[paths()[-1]], ref)


# ------------------------------------------------- threads and the switch --

@need_numba
def test_results_do_not_depend_on_the_thread_count(monkeypatch):
    """Row kernels and layer norm's column sums split work the same way
    whatever the count: 1 and 2 threads give the same bits."""
    monkeypatch.setattr(_kernels, "PARALLEL_MIN", 0)
    x = boundary((40, 70), np.float32)
    out = []
    saved = _kernels._state["threads"]
    try:
        for n in (1, 2):
            _kernels.set_num_threads(n)
            with _kernels.forced(True):
                out.append([fwd_bwd(f, x) for f in (
                    ACTS["softmax"], ACTS["layer_norm"], F.silu)])
    finally:
        _kernels._state["threads"] = saved
        _kernels._state.pop("n", None)
    for a, b in zip(out[0], out[1]):
        for u, v in zip(a, b):
            np.testing.assert_array_equal(u, v)


@need_numba
def test_thread_count_follows_set_num_threads_in_every_thread(monkeypatch):
    monkeypatch.setattr(_kernels, "PARALLEL_MIN", 0)
    saved = _kernels._state["threads"]
    seen = {}
    x = np.ones((8, 8), np.float32)

    def probe(key):
        with _kernels.forced(True):
            _kernels.kernels(x)
            seen[key] = numba.get_num_threads()
    try:
        dtorch.set_num_threads(1)
        probe("main")
        th = threading.Thread(target=probe, args=("thread",))
        th.start()
        th.join(60)
        assert seen == {"main": 1, "thread": 1}
        assert _kernels.num_threads() == 1
        # below PARALLEL_MIN elements a kernel runs on the calling thread
        _kernels.set_num_threads(2)
        monkeypatch.setattr(_kernels, "PARALLEL_MIN", 100)
        probe("small")
        monkeypatch.setattr(_kernels, "PARALLEL_MIN", 10)
        probe("large")
        assert seen["small"] == 1
        # one thread only where numba's pool had to share a libgomp
        # loaded before (tests/core/test_kernel_threads.py)
        want = 1 if _kernels._state.get("serial") else \
            min(2, numba.config.NUMBA_NUM_THREADS)
        assert seen["large"] == want
    finally:
        dtorch.set_num_threads(saved or _kernels._default_threads())


def _child(code, **env):
    e = dict(os.environ, **env)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True,
                       text=True, timeout=300, env=e)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


SWITCH = """
import sys, numpy as np, dtorch, dtorch.nn.functional as F
from dtorch import _kernels
x = dtorch.tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
y = F.softmax(x, -1)
print(_kernels.enabled(), _kernels.kernels(x.numpy()) is not None,
      sys.modules.get('numba') is not None, 'collectives' in sys.modules,
      _kernels.num_threads(), float(y.sum()))
"""


@pytest.mark.parametrize("value, on", [("0", "False"), ("off", "False"),
                                       ("1", "True")])
def test_dtorch_numba_switch(value, on):
    out = _child(SWITCH, DTORCH_NUMBA=value, OMP_NUM_THREADS="1")
    want = on if numba is not None else "False"
    assert out[:2] == [want, want]
    assert abs(float(out[5]) - 3.0) < 1e-5


def test_unset_switch_loads_no_collectives_and_follows_omp_threads():
    env = {k: v for k, v in os.environ.items() if k != "DTORCH_NUMBA"}
    env["OMP_NUM_THREADS"] = "1"
    r = subprocess.run([sys.executable, "-c", SWITCH], capture_output=True,
                       text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    out = r.stdout.split()
    assert out[3] == "False"            # no collectives for the switch
    assert out[4] == "1"


def test_bad_switch_value_names_the_variable():
    code = ("import numpy as np\nfrom dtorch import _kernels\n"
            "try:\n    _kernels.enabled()\n"
            "except ValueError as e:\n    print('ERR', e)\n")
    out = " ".join(_child(code, DTORCH_NUMBA="maybe"))
    assert out.startswith("ERR") and "DTORCH_NUMBA='maybe'" in out


def test_missing_numba_falls_back_to_numpy():
    code = ("import sys\nsys.modules['numba'] = None\n" + SWITCH)
    out = _child(code, OMP_NUM_THREADS="1")
    assert out[:3] == ["False", "False", "False"]
    assert abs(float(out[5]) - 3.0) < 1e-5
    code = ("import sys\nsys.modules['numba'] = None\n"
            "from dtorch import _kernels\n"
            "try:\n    _kernels.forced(True).__enter__()\n"
            "except ImportError as e:\n    print('ERR', e)\n")
    assert _child(code)[0] == "ERR"


@need_numba
def test_kernels_that_cannot_load_warn_and_fall_back():
    code = """
import warnings, numba.np.ufunc.parallel as P
def broken():
    raise ValueError("No threading layer could be loaded.")
P._launch_threads = broken
from dtorch import _kernels
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    print(_kernels.enabled(), 'No threading layer' in str(w[0].message))
"""
    assert _child(code) == ["False", "True"]


@need_numba
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_runs_the_numpy_path():
    code = """
import os, numpy as np, dtorch.nn.functional as F, dtorch
from dtorch import _kernels
x = np.ones((300, 500), np.float32)
with _kernels.forced(True):
    F.softmax(dtorch.tensor(x), -1)          # kernels ran in the parent
pid = os.fork()
if pid == 0:
    ok = _kernels.kernels(x) is None and float(
        F.softmax(dtorch.tensor(x), -1).sum()) == 300.0
    os._exit(0 if ok else 3)
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status))
"""
    assert _child(code) == ["0"]
