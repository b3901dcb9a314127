"""The recurrent layers' CUDA path: one fused elementwise kernel (cupy.fuse)
per time step and direction, forward and backward, besides the recurrent
GEMM; results equal the NumPy path's, gradients equal finite differences.

On a CPU machine this runs on the CuPy stand-in (DTORCH_FAKE_CUDA=1), whose
``fuse`` executes the very Python functions that CuPy compiles, with NumPy
semantics, and counts kernel launches; on a GPU the equality tests and the
gradcheck run on the real CuPy (the launch counts need the stand-in)."""
import copy

import numpy as np
import pytest

import dtorch
from dtorch import nn
from dtorch import ops as N

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not dtorch.cuda.is_available(),
                       reason="needs the cuda device (a GPU, or the CuPy "
                              "stand-in: DTORCH_FAKE_CUDA=1)")]


def _np(t):
    return t.detach().cpu().numpy()


CASES = [
    ("LSTM", {}),
    ("GRU", {}),
    ("RNN", {"nonlinearity": "tanh"}),
    ("RNN", {"nonlinearity": "relu"}),
    ("LSTM", {"bidirectional": True, "num_layers": 2}),
    ("GRU", {"bidirectional": True, "num_layers": 2, "batch_first": True}),
    ("RNN", {"bidirectional": True, "nonlinearity": "relu",
             "batch_first": True}),
    ("LSTM", {"batch_first": True, "bias": False}),
    ("GRU", {"bias": False}),
]


IDS = [m + "".join(f"-{k}={v}" for k, v in kw.items()) for m, kw in CASES]


@pytest.mark.parametrize("mode,kw", CASES, ids=IDS)
@pytest.mark.parametrize("with_h0", [False, True], ids=["no_h0", "h0"])
def test_cuda_equals_cpu_forward_and_gradients(mode, kw, with_h0):
    dtorch.manual_seed(1)
    m = getattr(nn, mode)(3, 5, dtype=dtorch.float64, **kw)
    mc = copy.deepcopy(m).to("cuda")
    L = m.num_layers * (2 if m.bidirectional else 1)
    T, B = 4, 2
    x = dtorch.randn(*((B, T, 3) if m.batch_first else (T, B, 3)),
                     dtype=dtorch.float64, requires_grad=True)
    xc = x.detach().to("cuda").requires_grad_()
    args, argsc = (x,), (xc,)
    if with_h0:
        h0 = dtorch.randn(L, B, 5, dtype=dtorch.float64, requires_grad=True)
        hs = (h0,)
        if mode == "LSTM":
            hs += (dtorch.randn(L, B, 5, dtype=dtorch.float64,
                                requires_grad=True),)
        hsc = tuple(h.detach().to("cuda").requires_grad_() for h in hs)
        args += (hs if mode == "LSTM" else hs[0],)
        argsc += (hsc if mode == "LSTM" else hsc[0],)
    y, hn = m(*args)
    yc, hnc = mc(*argsc)
    assert yc.device.type == "cuda"
    np.testing.assert_allclose(_np(yc), _np(y), rtol=1e-12, atol=1e-12)
    hn, hnc = (hn, hnc) if mode == "LSTM" else ((hn,), (hnc,))
    for a, b in zip(hnc, hn):
        np.testing.assert_allclose(_np(a), _np(b), rtol=1e-12, atol=1e-12)
    # a loss touching y and every final state, with unequal weights
    def loss(y, hn):
        s = (y * y.detach().sin()).sum()
        for j, h in enumerate(hn):
            s = s + (j + 2) * (h * h).sum()
        return s
    loss(y, hn).backward()
    loss(yc, hnc).backward()
    pairs = [(xc, x)] + list(zip(mc.parameters(), m.parameters()))
    if with_h0:
        pairs += list(zip(hsc, hs))
    for a, b in pairs:
        assert a.grad is not None
        np.testing.assert_allclose(_np(a.grad), _np(b.grad), rtol=1e-10,
                                   atol=1e-12)


def _layer_inputs(kind, T=3, n=2, H=3, device="cuda", bias=True):
    G = {"lstm": 4, "gru": 3, "tanh": 1, "relu": 1}[kind]
    dtorch.manual_seed(2)
    mk = lambda *s: dtorch.randn(*s, dtype=dtorch.float64,  # noqa: E731
                                 device=device).requires_grad_()
    ins = [mk(T, n, G * H), mk(n, H)]
    if kind == "lstm":
        ins.append(mk(n, H))
    ins.append(mk(G * H, H) * 0.7)
    if bias:
        ins.append(mk(G * H))
    return [t.detach().requires_grad_() for t in ins]


def _apply(kind, reverse):
    def f(*ins):
        if kind == "lstm":
            return N.LSTMLayer.apply(*ins, reverse=reverse)
        if kind == "gru":
            return N.GRULayer.apply(*ins, reverse=reverse)
        return N.RNNLayer.apply(*ins, reverse=reverse, nonlinearity=kind)
    return f


@pytest.mark.parametrize("kind", ["lstm", "gru", "tanh", "relu"])
@pytest.mark.parametrize("reverse", [False, True])
def test_gradcheck_on_cuda(kind, reverse):
    ins = _layer_inputs(kind)
    if kind == "relu":      # keep pre-activations away from the kink
        with dtorch.no_grad():
            ins[0].add_(ins[0].sign() * 0.3)
    assert dtorch.autograd.gradcheck(_apply(kind, reverse), ins)


@pytest.mark.parametrize("kind", ["lstm", "gru", "tanh", "relu"])
@pytest.mark.parametrize("T,n", [(5, 2), (1, 2), (0, 2), (3, 0)])
def test_layer_ops_with_b_hh_equal_cpu(kind, T, n):
    # the modules fold b_hh into the input projection for LSTM and RNN; the
    # cells and direct use pass it to the layer op: check that path too,
    # with one step, no step and an empty batch
    ins = _layer_inputs(kind, T=T, n=n, device="cpu")
    insc = [t.detach().to("cuda").requires_grad_() for t in ins]
    for rev in (False, True):
        y = _apply(kind, rev)(*ins)
        yc = _apply(kind, rev)(*insc)
        np.testing.assert_allclose(_np(yc), _np(y), rtol=1e-12, atol=1e-12)
        w = dtorch.randn(*y.shape, dtype=dtorch.float64)
        (y * w).sum().backward()
        (yc * w.to("cuda")).sum().backward()
        for a, b in zip(insc, ins):
            np.testing.assert_allclose(_np(a.grad), _np(b.grad),
                                       rtol=1e-10, atol=1e-12)
            a.grad = b.grad = None


def _cupy_stand_in():
    import cupy
    if not getattr(cupy, "_FAKE", False):
        pytest.skip("kernel launches are counted by the CuPy stand-in only")
    return cupy


def _launches(cp, fn):
    cp._launches.clear()
    fn()
    return dict(cp._launches)


@pytest.mark.parametrize("kind", ["lstm", "gru", "tanh", "relu"])
def test_one_fused_kernel_per_time_step(kind):
    """Per time step: forward one GEMM + one fused kernel, backward the
    same; the counts are the difference between T=7 and T=3 runs, so fixed
    per-call work (buffers, weight gradients) drops out."""
    cp = _cupy_stand_in()
    counts = {}
    for T in (3, 7):
        ins = _layer_inputs(kind, T=T)
        f = _apply(kind, False)
        res = {}
        res["fwd"] = _launches(cp, lambda: res.setdefault("y", f(*ins)))
        y = res["y"]
        w = dtorch.randn(*y.shape, dtype=dtorch.float64, device="cuda")
        loss = (y * w).sum()
        g = {}

        def bwd():
            g["g"] = dtorch.autograd.grad(loss, ins)
        res["bwd"] = _launches(cp, bwd)
        counts[T] = res
    for phase in ("fwd", "bwd"):
        a, b = counts[3][phase], counts[7][phase]
        per_step = {k: (b.get(k, 0) - a.get(k, 0)) / 4
                    for k in set(a) | set(b)}
        per_step = {k: v for k, v in per_step.items() if v}
        fused = {k: v for k, v in per_step.items() if k.startswith("fuse:")}
        assert list(fused.values()) == [1], (phase, per_step)
        other = {k: v for k, v in per_step.items()
                 if not k.startswith("fuse:")}
        # the recurrent GEMM, and nothing elementwise besides the fused step
        assert other == {"matmul": 1}, (phase, per_step)


def test_fused_step_kernel_names():
    cp = _cupy_stand_in()
    ins = _layer_inputs("lstm")
    n = _launches(cp, lambda: N.LSTMLayer.apply(*ins).sum().backward())
    assert n.get("fuse:dtorch_lstm_fwd") == 3
    assert n.get("fuse:dtorch_lstm_bwd") == 3


@pytest.mark.parametrize("kind", ["lstm", "gru", "tanh", "relu"])
@pytest.mark.parametrize("dtype,tol", [("float32", 1e-5), ("float16", 2e-2)])
def test_fused_steps_keep_the_dtype(kind, dtype, tol):
    # the kernels' constants (0.5, 1) and zero-bias arguments must not
    # promote float32/float16 states to float64
    ref = _layer_inputs(kind, T=4, device="cpu")
    dt = getattr(dtorch, dtype)
    ins = [t.detach().to("cuda", dt).requires_grad_() for t in ref]
    # the reference: the same (rounded) inputs, float64 on the CPU
    ref = [t.detach().cpu().double().requires_grad_() for t in ins]
    y = _apply(kind, False)(*ins)
    assert y.dtype == dt
    y.float().sum().backward()
    yr = _apply(kind, False)(*ref)
    yr.sum().backward()
    np.testing.assert_allclose(_np(y).astype(np.float64), _np(yr),
                               rtol=tol, atol=tol)
    for a, b in zip(ins, ref):
        assert a.grad.dtype == dt
        np.testing.assert_allclose(_np(a.grad).astype(np.float64),
                                   _np(b.grad), rtol=10 * tol,
                                   atol=10 * tol)
