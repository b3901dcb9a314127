"""dtorch.ao.quantization.quantize_dynamic: int8 per-channel weights, uint8
activations quantized per call, exact int32 accumulation; Linear and LSTM
against float and against torch's dynamic quantization; the digits model
keeps its accuracy and its Linear weights shrink ~4x."""
import io
import os
import sys

import numpy as np
import pytest

import dtorch
import dtorch.nn as nn
from dtorch.ao.quantization import quantize_dynamic
from dtorch.ao.quantization import _core as Q
from dtorch.ao.nn.quantized import dynamic as qd
from helpers import run_python
from torch_oracle import torch_oracle


def _linear(k, n, seed=0):
    dtorch.manual_seed(seed)
    return nn.Linear(k, n)


def test_names_and_old_path():
    assert dtorch.qint8 is dtorch.ao.quantization.qint8
    assert repr(dtorch.qint8) == "dtorch.qint8"
    import dtorch.quantization as old
    assert old.quantize_dynamic is quantize_dynamic
    assert dtorch.quantization.qint8 is dtorch.qint8


def test_int_matmul_is_exact_int32_accumulation():
    # extreme codes and K past the float32-exact chunk (512): a float32
    # GEMM over all of K would round; the chunked one must equal int64 math
    rng = np.random.default_rng(0)
    for k in (1, 511, 512, 513, 1500):
        qx = rng.choice([0, 255], size=(3, k)).astype(np.uint8)
        qw = rng.choice([-127, 127], size=(4, k)).astype(np.int8)
        qx[0] = 255
        qw[0] = 127                              # the largest row sum
        got = Q.int_matmul(qx, 0, qw)
        want = qx.astype(np.int64) @ qw.astype(np.int64).T
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, want)
        want_zp = (qx.astype(np.int64) - 3) @ qw.astype(np.int64).T
        np.testing.assert_array_equal(Q.int_matmul(qx, 3, qw), want_zp)


def test_weight_codes_and_scales():
    w = np.array([[0.5, -1.0, 0.25], [0.0, 0.0, 0.0],
                  [3.0, 1.5, -0.75]], np.float32)
    q, s = Q.quantize_weight_per_channel(w)
    assert q.dtype == np.int8 and s.dtype == np.float32
    np.testing.assert_allclose(s, [1 / 127, 1.0, 3 / 127], rtol=1e-6)
    np.testing.assert_array_equal(q[0], [64, -127, 32])   # rint(63.5) = 64
    np.testing.assert_array_equal(q[1], 0)
    assert np.abs(q).max() <= 127
    with pytest.raises(ValueError, match="inf or NaN"):
        Q.quantize_weight_per_channel(np.array([[np.nan, 1.0]], np.float32))


@pytest.mark.parametrize("k,n,batch", [(16, 8, 1), (300, 40, 7),
                                       (700, 20, (2, 3))])
def test_quantized_linear_close_to_float(k, n, batch):
    lin = _linear(k, n)
    q = qd.Linear.from_float(lin)
    shape = (batch,) if isinstance(batch, int) else batch
    x = dtorch.randn(*shape, k)
    y = lin(x).detach().numpy()
    yq = q(x).numpy()
    assert yq.shape == y.shape and yq.dtype == np.float32
    # error bound: half a step of each code, summed over K
    xs = x.numpy()
    sx, _ = Q.choose_qparams(xs)
    sw = q.weight_scale.numpy()
    wmax = np.abs(lin.weight.detach().numpy()).max(1)
    bound = 0.5 * (sx * wmax + sw * np.abs(xs).max()) * k
    assert (np.abs(yq - y) <= bound + 1e-5).all()
    # and in practice far tighter than the worst case
    assert np.abs(yq - y).max() < 0.02 * max(1.0, np.abs(y).max())


def test_quantized_linear_equals_its_own_integer_model():
    # the module is exactly: dequant(int32 sum of codes), nothing else
    lin = _linear(40, 6, seed=3)
    q = qd.Linear.from_float(lin)
    x = dtorch.randn(5, 40).numpy()
    sx, zp = Q.choose_qparams(x)
    qx = Q.quantize_activation(x, sx, zp).astype(np.int64)
    acc = (qx - zp) @ q.weight_int8.numpy().astype(np.int64).T
    want = (acc * (q.weight_scale.numpy() * sx)).astype(np.float32) \
        + q.bias.numpy()
    np.testing.assert_allclose(q(dtorch.tensor(x)).numpy(), want,
                               rtol=1e-6, atol=1e-6)


def test_quantize_dynamic_swaps_children_only_and_copies():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(),
                          nn.Sequential(nn.Linear(16, 4)),
                          nn.LSTM(4, 3))
    qm = quantize_dynamic(model, {nn.Linear, nn.LSTM}, dtype=dtorch.qint8)
    assert type(qm[0]) is qd.Linear and type(qm[2][0]) is qd.Linear
    assert type(qm[3]) is qd.LSTM
    assert type(model[0]) is nn.Linear           # the original is intact
    assert "DynamicQuantizedLinear(in_features=8" in repr(qm)
    only = quantize_dynamic(model, {"2.0": dtorch.ao.quantization.
                                    default_dynamic_qconfig})
    assert type(only[0]) is nn.Linear and type(only[2][0]) is qd.Linear
    same = quantize_dynamic(model, {nn.Linear}, inplace=True)
    assert same is model and type(model[0]) is qd.Linear
    bare = nn.Linear(3, 3)
    assert type(quantize_dynamic(bare)) is nn.Linear   # as PyTorch: no swap


@pytest.mark.parametrize("kernel_rows", [0, 32])   # BLAS / numba path
def test_errors(monkeypatch, kernel_rows):
    monkeypatch.setattr(Q, "KERNEL_MAX_ROWS", kernel_rows)
    lin = _linear(4, 3)
    m = nn.Sequential(lin)
    with pytest.raises(NotImplementedError, match="qint8"):
        quantize_dynamic(m, dtype=dtorch.float16)
    with pytest.raises(NotImplementedError, match="Conv2d"):
        quantize_dynamic(m, {nn.Conv2d})
    q = quantize_dynamic(m)
    with pytest.raises(ValueError, match="inf or NaN"):
        q(dtorch.tensor([[1.0, float("nan"), 0.0, 0.0]]))
    with pytest.raises(ValueError, match="inf or NaN"):
        q(dtorch.tensor([[1.0, float("inf"), 0.0, 0.0]]))
    with pytest.raises(ValueError, match="inf or NaN"):
        q(dtorch.tensor([[1.0, float("-inf"), float("nan"), 0.0]]))
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        q(dtorch.randn(2, 5))
    # boundaries: an empty batch, an all-zero input, a constant input
    assert tuple(q(dtorch.randn(0, 4)).shape) == (0, 3)
    np.testing.assert_allclose(q(dtorch.zeros(1, 4)).numpy(),
                               lin.bias.detach().numpy()[None], atol=1e-7)
    c = dtorch.full((2, 4), 0.7)
    np.testing.assert_allclose(q(c).numpy(), lin(c).detach().numpy(),
                               atol=1e-2)


def test_state_dict_roundtrip(tmp_path):
    m = nn.Sequential(nn.Linear(10, 5), nn.LSTM(5, 4))
    q = quantize_dynamic(m)
    sd = q.state_dict()
    assert sd["0.weight_int8"].dtype is dtorch.int8
    path = tmp_path / "q.safetensors"
    dtorch.save(sd, str(path))
    q2 = quantize_dynamic(nn.Sequential(nn.Linear(10, 5), nn.LSTM(5, 4)))
    q2.load_state_dict(dtorch.load(str(path)))
    x = dtorch.randn(3, 2, 10)
    y1 = q[1](q[0](x))[0]
    y2 = q2[1](q2[0](x))[0]
    np.testing.assert_array_equal(y1.numpy(), y2.numpy())


@pytest.mark.parametrize("layers,bidir,batch_first", [(1, False, False),
                                                      (2, True, True)])
def test_quantized_lstm_close_to_float(layers, bidir, batch_first):
    dtorch.manual_seed(1)
    lstm = nn.LSTM(6, 8, num_layers=layers, bidirectional=bidir,
                   batch_first=batch_first)
    q = qd.LSTM.from_float(lstm)
    x = dtorch.randn(3, 5, 6)
    h0 = dtorch.randn(layers * (2 if bidir else 1), 3 if batch_first else 5,
                      8)
    c0 = dtorch.randn(*h0.shape)
    y, (h, c) = lstm(x, (h0, c0))
    yq, (hq, cq) = q(x, (h0, c0))
    assert yq.shape == y.shape and hq.shape == h.shape
    for a, b in ((yq, y), (hq, h), (cq, c)):
        assert np.abs(a.numpy() - b.detach().numpy()).max() < 0.03
    # unbatched input
    y1, _ = lstm(x[0])
    yq1, _ = q(x[0])
    assert np.abs(yq1.numpy() - y1.detach().numpy()).max() < 0.03


# ------------------------------------------------------ torch as the oracle

def _torch_quantized(tmod, torch):
    from torch.ao.quantization import (quantize_dynamic as tqd,
                                       per_channel_dynamic_qconfig)
    if not torch.backends.quantized.supported_engines or \
            torch.backends.quantized.engine == "none":
        pytest.skip("torch has no quantized engine in this build")
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tqd(torch.nn.Sequential(tmod),
                   {type(tmod): per_channel_dynamic_qconfig})


def test_linear_matches_torch_quantize_dynamic():
    torch = pytest.importorskip("torch")
    lin = _linear(64, 16, seed=5)
    t = torch.nn.Linear(64, 16)
    with torch.no_grad():
        t.weight.copy_(torch.tensor(lin.weight.detach().numpy()))
        t.bias.copy_(torch.tensor(lin.bias.detach().numpy()))
    tq = _torch_quantized(t, torch)
    x = np.random.default_rng(2).standard_normal((4, 64)).astype(np.float32)
    yt = torch_oracle(tq, torch.tensor(x)).numpy()
    yd = quantize_dynamic(nn.Sequential(lin))(dtorch.tensor(x)).numpy()
    yf = t(torch.tensor(x)).detach().numpy()
    # both approximate the float result with errors of the same size; the
    # schemes differ in detail (torch: 7-bit activations on x86 fbgemm,
    # weight range [-128, 127]), so they agree to a few steps, not bits
    err_t = np.abs(yt - yf).max()
    err_d = np.abs(yd - yf).max()
    assert err_d <= 2 * err_t + 1e-3
    assert np.abs(yd - yt).max() <= 3 * err_t + 1e-3


def test_lstm_matches_torch_quantize_dynamic():
    torch = pytest.importorskip("torch")
    dtorch.manual_seed(4)
    lstm = nn.LSTM(5, 7, num_layers=2)
    t = torch.nn.LSTM(5, 7, num_layers=2)
    with torch.no_grad():
        for name, p in t.named_parameters():
            p.copy_(torch.tensor(getattr(lstm, name).detach().numpy()))
    tq = _torch_quantized(t, torch)
    x = np.random.default_rng(3).standard_normal((6, 2, 5)).astype(
        np.float32)
    yt = torch_oracle(tq, torch.tensor(x))[0].numpy()
    yf = t(torch.tensor(x))[0].detach().numpy()
    yd = qd.LSTM.from_float(lstm)(dtorch.tensor(x))[0].numpy()
    err_t = np.abs(yt - yf).max()
    assert np.abs(yd - yf).max() <= 2 * err_t + 2e-3
    assert np.abs(yd - yt).max() <= 3 * err_t + 2e-3


# ------------------------------------------------------------ the digits

@pytest.fixture(scope="module")
def digits_model():
    pytest.importorskip("sklearn")
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..",
                                    "examples"))
    try:
        from digits_common import load_digits_split, DigitsCNN
    finally:
        sys.path.pop(0)
    xtr, ytr, xte, yte = load_digits_split()
    dtorch.manual_seed(0)
    model = DigitsCNN()
    opt = dtorch.optim.Adam(model.parameters(), lr=3e-3)
    for epoch in range(3):
        perm = dtorch.randperm(len(ytr))
        for i in range(0, len(ytr), 64):
            idx = perm[i:i + 64]
            loss = nn.functional.cross_entropy(model(xtr[idx]), ytr[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()
    return model, xte, yte


def _accuracy(model, x, y):
    with dtorch.no_grad():
        return (model(x).argmax(1) == y).float().mean().item() * 100


def test_digits_accuracy_within_one_point(digits_model):
    model, x, y = digits_model
    acc = _accuracy(model, x, y)
    assert acc > 85, f"the short training itself failed: {acc:.1f}%"
    q = quantize_dynamic(model, {nn.Linear}, dtype=dtorch.qint8)
    accq = _accuracy(q, x, y)
    assert accq >= acc - 1.0, (acc, accq)
    # the quantized model really is different code: outputs are close,
    # not equal
    with dtorch.no_grad():
        d = np.abs(q(x).numpy() - model(x).numpy()).max()
    assert 0 < d < 0.1


def test_digits_linear_weights_four_times_smaller(digits_model):
    model, _, _ = digits_model
    q = quantize_dynamic(model, {nn.Linear})
    f_bytes = sum(m.weight.detach().numpy().nbytes
                  for m in model.modules() if type(m) is nn.Linear)
    # everything a quantized Linear keeps for its weight: codes and scales
    q_bytes = sum(m.weight_int8.numpy().nbytes + m.weight_scale.numpy().nbytes
                  for m in q.modules() if type(m) is qd.Linear)
    assert f_bytes == 4 * (512 * 64 + 64 * 10)
    ratio = f_bytes / q_bytes
    assert 3.9 < ratio <= 4.0, ratio
    # the float weights are not kept alive anywhere in the quantized model
    assert not any(t.dtype is dtorch.float32 and t.dim() == 2
                   for m in q.modules() if type(m) is qd.Linear
                   for t in m.state_dict().values())
    # and on disk
    buf_f, buf_q = io.BytesIO(), io.BytesIO()
    np.savez(buf_f, *[v.numpy() for v in model.head.state_dict().values()])
    np.savez(buf_q, *[v.numpy() for v in q.head.state_dict().values()])
    assert buf_f.tell() / buf_q.tell() > 3.5


def test_on_the_device_equals_cpu(device):
    m = nn.Sequential(nn.Linear(8, 6), nn.LSTM(6, 5, batch_first=True))
    q = quantize_dynamic(m)
    x = dtorch.randn(2, 4, 8)
    want, (wh, wc) = q[1](q[0](x))
    qd_ = quantize_dynamic(m.to(device))        # quantized on the device
    qm = q.to(device)                           # or moved there
    for model in (qd_, qm):
        assert model[0].weight_int8.device.type == device
        y, (h, c) = model[1](model[0](x.to(device)))
        assert y.device.type == device
        np.testing.assert_allclose(y.cpu().numpy(), want.numpy(),
                                   rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(c.cpu().numpy(), wc.numpy(),
                                   rtol=1e-5, atol=1e-6)


# --- the compiled int8 kernel (numba, optional extra 'quant') -------------

def test_import_dtorch_does_not_import_numba():
    run_python("import sys, dtorch, dtorch.ao.quantization; "
               "assert 'numba' not in sys.modules, 'numba imported'")


def test_kernel_is_exact_int32_accumulation():
    pytest.importorskip("numba")
    from dtorch.ao.quantization import _kernels
    rng = np.random.default_rng(1)
    for k in (1, 7, 511, 512, 513, 1500, 4096):
        a = rng.choice([-255, 255], size=(3, k)).astype(np.int16)
        w = rng.choice([-127, 127], size=(5, k)).astype(np.int8)
        a[0], w[0] = 255, 127                    # the largest sum: 32385 * k
        a[1], w[1] = -255, 127
        got = _kernels.int_matmul(a, w)
        want = a.astype(np.int64) @ w.astype(np.int64).T
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("k,n,shape,dtype", [
    (16, 8, (1,), np.float32), (600, 33, (4,), np.float32),
    (1500, 20, (2, 3), np.float32), (300, 9, (1,), np.float64),
    (5, 3, (16,), np.float32), (1500, 20, (2, 3), np.float64)])
def test_kernel_and_blas_paths_bitwise_equal(monkeypatch, k, n, shape,
                                             dtype):
    pytest.importorskip("numba")
    from dtorch.ao.quantization import _kernels
    lin = _linear(k, n, seed=k)
    q = qd.Linear.from_float(lin)
    rng = np.random.default_rng(k)
    x = dtorch.tensor((rng.standard_normal(shape + (k,)) * 3).astype(dtype))
    calls = []
    for name in ("int_matmul", "linear"):       # float64 / float32 input
        monkeypatch.setattr(_kernels, name, lambda *a, real=getattr(
            _kernels, name): calls.append(1) or real(*a))
    monkeypatch.setattr(Q, "KERNEL_MAX_ROWS", 1 << 30)
    if k == 16:
        q.bias = None                 # no bias: -0.0 must stay -0.0
    y_kernel = q(x).numpy()
    assert calls, "the compiled kernel was not used"
    monkeypatch.setattr(Q, "KERNEL_MAX_ROWS", 0)
    y_blas = q(x).numpy()
    assert len(calls) == 1, "KERNEL_MAX_ROWS=0 must keep the BLAS path"
    assert y_kernel.dtype == y_blas.dtype == np.float32
    np.testing.assert_array_equal(y_kernel.view(np.int32),   # bit for bit
                                  y_blas.view(np.int32))


def test_without_numba_falls_back_to_blas(monkeypatch):
    from dtorch.ao.quantization import _kernels
    monkeypatch.setattr(_kernels, "_kernel", False)   # as if not installed
    assert _kernels.kernel() is None
    lin = _linear(40, 6, seed=4)
    q = qd.Linear.from_float(lin)
    x = dtorch.randn(1, 40)
    y = q(x).numpy()
    monkeypatch.setattr(Q, "KERNEL_MAX_ROWS", 0)
    np.testing.assert_array_equal(y, q(x).numpy())
