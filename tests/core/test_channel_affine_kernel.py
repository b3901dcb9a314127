"""ChannelAffine (x * scale[c] + shift[c]): eval-mode batch norm and group
norm's weight and bias in one node, its compiled kernel against the NumPy
path. Forward and the input gradient are elementwise (the NumPy path's
bits at 1 and 2 threads); the weight and bias gradients are per-channel
float64 sums (float rounding apart, the same bits at any thread count,
NumPy's bits under use_deterministic_algorithms(True))."""
import numpy as np
import pytest

import dtorch
import dtorch.nn.functional as F
from dtorch import _kernels

numba = pytest.importorskip("numba")
TOL = {np.float32: dict(rtol=2e-5, atol=2e-5),
       np.float64: dict(rtol=1e-12, atol=1e-12)}


class Spy:
    def __init__(self, mod):
        self.mod, self.calls = mod, []

    def __getattr__(self, name):
        self.calls.append(name)
        return getattr(self.mod, name)


def run(fn, on, threads=2):
    """fn() on the kernel path (on) or the NumPy path, every size threaded
    at ``threads``; (result, kernels called)."""
    saved = _kernels._state["threads"], _kernels.PARALLEL_MIN
    try:
        _kernels.set_num_threads(threads)
        _kernels.PARALLEL_MIN = 0
        with _kernels.forced(on):
            spy = None
            if on:
                spy = _kernels._state["mod"] = Spy(_kernels._state["mod"])
            out = fn()
        return out, (spy.calls if spy else [])
    finally:
        _kernels._state["threads"], _kernels.PARALLEL_MIN = saved
        _kernels._state.pop("n", None)


def _params(c, dtype, seed=3):
    rng = np.random.default_rng(seed)
    w, b, rm = (rng.standard_normal(c).astype(dtype) for _ in range(3))
    rv = (np.abs(rng.standard_normal(c)) + 0.5).astype(dtype)
    return w, b, rm, rv


def eval_bn(x, affine):
    """eval-mode batch norm's output and gradients (x, weight, bias)."""
    w, b, rm, rv = _params(x.shape[1], x.dtype)
    xt = dtorch.tensor(x, requires_grad=True)
    wt = dtorch.tensor(w, requires_grad=True) if affine else None
    bt = dtorch.tensor(b, requires_grad=True) if affine else None
    y = F.batch_norm(xt, dtorch.tensor(rm), dtorch.tensor(rv), wt, bt,
                     training=False, eps=1e-3)
    g = np.cos(np.arange(y.numel())).reshape(tuple(y.shape))
    y.backward(dtorch.tensor(g.astype(x.dtype)))
    out = [y.detach().numpy(), xt.grad.numpy()]
    return out + ([wt.grad.numpy(), bt.grad.numpy()] if affine else [])


SHAPES = [(6, 5, 3, 7), (4, 3, 9), (5, 4), (2, 3, 2, 2, 3)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("affine", [True, False])
def test_eval_batch_norm_kernel_against_the_numpy_path(dtype, shape, affine):
    x = (np.random.default_rng(1).standard_normal(shape) * 3).astype(dtype)
    x.reshape(-1)[:3] = [np.inf, np.nan, -0.0]     # elementwise: kept
    ref, _ = run(lambda: eval_bn(x, affine), False)
    # the independent formula for the forward
    w, b, rm, rv = _params(shape[1], dtype)
    sh = (1, shape[1]) + (1,) * (len(shape) - 2)
    s = (1 / np.sqrt(rv + dtype(1e-3))).astype(dtype)
    s = s * w if affine else s
    t = -rm * s + b if affine else -rm * s
    np.testing.assert_array_equal(ref[0], x * s.reshape(sh) + t.reshape(sh))
    for th in (1, 2):
        got, calls = run(lambda: eval_bn(x, affine), True, th)
        assert "channel_affine" in calls
        assert ("channel_affine_bwd" in calls) == affine
        for a, r in zip(got[:2], ref[:2]):       # elementwise: the bits
            np.testing.assert_array_equal(a, r)
            np.testing.assert_array_equal(np.signbit(a), np.signbit(r))
        if th == 1:
            one = got
        else:                                    # sums: thread-count free
            for a, r in zip(got, one):
                np.testing.assert_array_equal(a, r)
    if affine:                                   # weight, bias: finite x
        xf = np.where(np.isfinite(x), x, dtype(1.5))
        ref, _ = run(lambda: eval_bn(xf, affine), False)
        got, _ = run(lambda: eval_bn(xf, affine), True)
        for a, r in zip(got[2:], ref[2:]):
            np.testing.assert_allclose(a, r, **TOL[dtype])


@pytest.mark.parametrize("shape", SHAPES[:2])
def test_deterministic_mode_runs_the_numpy_order(shape):
    x = np.random.default_rng(4).standard_normal(shape).astype(np.float32)
    ref, _ = run(lambda: eval_bn(x, True), False)
    dtorch.use_deterministic_algorithms(True)
    try:
        got, calls = run(lambda: eval_bn(x, True), True)
    finally:
        dtorch.use_deterministic_algorithms(False)
    assert "channel_affine_bwd" not in calls
    for a, r in zip(got, ref):
        np.testing.assert_array_equal(a, r)


def group_norm(x, w, b, groups):
    xt = dtorch.tensor(x, requires_grad=True)
    wt = None if w is None else dtorch.tensor(w, requires_grad=True)
    bt = None if b is None else dtorch.tensor(b, requires_grad=True)
    y = F.group_norm(xt, groups, wt, bt)
    g = np.sin(np.arange(y.numel())).reshape(tuple(y.shape))
    y.backward(dtorch.tensor(g.astype(x.dtype)))
    return [y.detach().numpy(), xt.grad.numpy()] + [
        t.grad.numpy() for t in (wt, bt) if t is not None]


@pytest.mark.parametrize("which", ["both", "weight", "bias", "none"])
def test_group_norm_kernel_against_the_numpy_path(which):
    x = np.random.default_rng(5).standard_normal((3, 6, 5, 4)).astype(
        np.float32)
    w, b, _, _ = _params(6, np.float32)
    w = w if which in ("both", "weight") else None
    b = b if which in ("both", "bias") else None
    ref, _ = run(lambda: group_norm(x, w, b, 3), False)
    got, calls = run(lambda: group_norm(x, w, b, 3), True)
    assert ("channel_affine" in calls) == (which != "none")
    assert len(got) == len(ref)
    for a, r in zip(got, ref):
        np.testing.assert_allclose(a, r, **TOL[np.float32])


def test_eval_batch_norm_double_backward_matches_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(6)
    x = rng.standard_normal((4, 3, 5, 5)).astype(np.float64)
    w, b, rm, rv = _params(3, np.float64)
    res = []
    for lib in (dtorch, torch):
        xt = lib.tensor(x, requires_grad=True)
        wt = lib.tensor(w, requires_grad=True)
        bt = lib.tensor(b, requires_grad=True)
        y = lib.nn.functional.batch_norm(xt, lib.tensor(rm), lib.tensor(rv),
                                         wt, bt, training=False)
        gx, = lib.autograd.grad((y * y).sum(), xt, create_graph=True)
        (gx * gx).sum().backward()
        res.append([gx.detach().numpy(), xt.grad.numpy(), wt.grad.numpy(),
                    bt.grad.numpy()])
    for a, r in zip(*res):
        np.testing.assert_allclose(a, r, rtol=1e-10, atol=1e-10)
