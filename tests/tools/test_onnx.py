"""dtorch.onnx.export: the checker passes and onnxruntime reproduces dtorch's
outputs (atol 1e-5) for the examples' models (digits CNN, an MLP, an LSTM
text model, the GPT), at the traced batch size and another one."""
import os
import sys
import warnings

import numpy as np
import pytest

import dtorch
from dtorch import nn
import dtorch.nn.functional as F

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "examples"))
import digits_common  # noqa: E402
import gpt  # noqa: E402
from helpers import run_python


def roundtrip(model, args, tmp_path, other=None, **kw):
    """Export, check, run in onnxruntime; compare with dtorch on ``args``
    and (dynamic batch) on ``other``."""
    path = str(tmp_path / "m.onnx")
    args = args if isinstance(args, tuple) else (args,)
    names = [f"x{i}" for i in range(len(args))]
    kw.setdefault("dynamic_axes", {n: {0: "batch"} for n in names}
                  | {"y": {0: "batch"}})
    dtorch.onnx.export(model, args, path, input_names=names,
                       output_names=["y"], **kw)
    m = onnx.load(path)
    onnx.checker.check_model(m, full_check=True)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    model.eval()
    for inp in [args] + ([other if isinstance(other, tuple) else (other,)]
                         if other is not None else []):
        with dtorch.no_grad():
            want = model(*inp)
        want = want[0] if isinstance(want, tuple) else want
        got, = sess.run(None, {n: a.numpy() for n, a in zip(names, inp)})
        assert got.shape == tuple(want.shape)
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-5)
    return m


def ops_of(m):
    return {n.op_type for n in m.graph.node}


def test_mlp(tmp_path):
    dtorch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.Linear(16, 8),
                          nn.Tanh(), nn.Linear(8, 5), nn.SiLU(),
                          nn.Linear(5, 4), nn.LogSoftmax(-1))
    m = roundtrip(model, dtorch.randn(3, 6), tmp_path,
                  other=dtorch.randn(7, 6))
    assert "Gemm" in ops_of(m)
    # parameters keep their state_dict names
    inits = {t.name for t in m.graph.initializer}
    assert "0.weight" in inits and "6.bias" in inits


def test_digits_cnn(tmp_path):
    dtorch.manual_seed(0)
    model = digits_common.DigitsCNN()
    m = roundtrip(model, dtorch.rand(2, 1, 8, 8), tmp_path,
                  other=dtorch.rand(5, 1, 8, 8))
    assert {"Conv", "MaxPool", "Relu", "Reshape", "Gemm"} <= ops_of(m)
    assert "Dropout" not in ops_of(m)


class ConvNet(nn.Module):
    """Eval BatchNorm, avg pooling, sigmoid/softmax, cat/split, permute."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.pool = nn.AvgPool2d(2)
        self.fc = nn.Linear(8 * 2 * 2, 6)

    def forward(self, x):
        y = self.pool(F.relu(self.bn(self.conv(x))))
        a, b = y.split(4, dim=1)
        y = dtorch.cat([b.sigmoid(), a * 2.0 - 1.0], dim=1)
        y = y.permute(0, 2, 3, 1).flatten(1)
        return F.softmax(self.fc(y), dim=-1)


def test_convnet_batchnorm_eval(tmp_path):
    dtorch.manual_seed(0)
    model = ConvNet()
    with dtorch.no_grad():        # non-trivial running statistics
        model.bn.running_mean.uniform_(-1, 1)
        model.bn.running_var.uniform_(0.5, 2)
    model.train()
    m = roundtrip(model, dtorch.randn(2, 3, 8, 8), tmp_path,
                  other=dtorch.randn(4, 3, 8, 8))
    assert {"AveragePool", "Concat", "Transpose", "Softmax"} <= ops_of(m)
    model.train()
    dtorch.onnx.export(model, dtorch.randn(2, 3, 8, 8),
                       str(tmp_path / "again.onnx"))
    assert model.training        # export restores the mode


class TextLSTM(nn.Module):
    def __init__(self, vocab=20, emb=8, hidden=12, gru=False, layers=2):
        super().__init__()
        self.emb = nn.Embedding(vocab, emb)
        rnn = nn.GRU if gru else nn.LSTM
        self.rnn = rnn(emb, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, idx):
        out, _ = self.rnn(self.emb(idx))
        return self.head(out[:, -1])


@pytest.mark.parametrize("gru", [False, True])
def test_lstm_gru_text_model(tmp_path, gru):
    dtorch.manual_seed(0)
    model = TextLSTM(gru=gru)
    x = dtorch.randint(0, 20, (3, 7))
    m = roundtrip(model, x, tmp_path, other=dtorch.randint(0, 20, (5, 7)))
    kind = "GRU" if gru else "LSTM"
    assert sum(n.op_type == kind for n in m.graph.node) == 2
    assert "Gather" in ops_of(m)


def test_gpt(tmp_path):
    dtorch.manual_seed(0)
    model = gpt.GPT(vocab=30, n_layer=2, n_head=2, d_model=16, block_size=8)
    x = dtorch.randint(0, 30, (2, 8))
    m = roundtrip(model, x, tmp_path, other=dtorch.randint(0, 30, (3, 8)))
    assert {"LayerNormalization", "Softmax", "MatMul", "Gather",
            "Where"} <= ops_of(m)


def test_dynamic_axes_in_graph(tmp_path):
    model = nn.Linear(4, 2)
    path = str(tmp_path / "m.onnx")
    dtorch.onnx.export(model, dtorch.randn(3, 4), path,
                       input_names=["x"], output_names=["y"],
                       dynamic_axes={"x": [0], "y": {0: "n"}})
    m = onnx.load(path)
    assert m.graph.input[0].type.tensor_type.shape.dim[0].dim_param
    assert m.graph.output[0].type.tensor_type.shape.dim[0].dim_param == "n"
    # without dynamic_axes the batch is fixed
    dtorch.onnx.export(model, dtorch.randn(3, 4), path)
    m = onnx.load(path)
    assert m.graph.input[0].type.tensor_type.shape.dim[0].dim_value == 3


class Cumsummer(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(4, 4), CumsumLayer())

    def forward(self, x):
        return self.inner(x)


class CumsumLayer(nn.Module):
    def forward(self, x):
        return x.cumsum(1)


def test_unsupported_op_names_op_and_module(tmp_path):
    model = Cumsummer()
    with pytest.raises(dtorch.onnx.UnsupportedOperatorError,
                       match=r"'Cumsum'.*'inner\.1' \(CumsumLayer\)"):
        dtorch.onnx.export(model, dtorch.randn(2, 4),
                           str(tmp_path / "m.onnx"))
    # the tracer is gone: ops run normally afterwards
    assert Cumsummer()(dtorch.randn(2, 4)).shape == (2, 4)
    from dtorch.autograd.function import Function
    assert "traced" not in repr(Function.__dict__["apply"].__func__)


def test_no_effect_kwargs_warn_once_and_unknown_rejected(tmp_path):
    model = nn.Linear(2, 2)
    path = str(tmp_path / "m.onnx")
    dtorch.onnx._export._warned.discard("do_constant_folding")
    with pytest.warns(UserWarning, match="do_constant_folding"):
        dtorch.onnx.export(model, dtorch.randn(1, 2), path,
                           do_constant_folding=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dtorch.onnx.export(model, dtorch.randn(1, 2), path,
                           do_constant_folding=True)
    with pytest.raises(TypeError, match="bogus"):
        dtorch.onnx.export(model, dtorch.randn(1, 2), path, bogus=1)
    with pytest.raises(ValueError, match="opset"):
        dtorch.onnx.export(model, dtorch.randn(1, 2), path, opset_version=9)


def test_import_without_onnx():
    """`import dtorch` loads no onnx; dtorch.onnx imports without it and
    export names the extra."""
    code = (
        "import sys\n"
        "import dtorch\n"
        "assert 'onnx' not in sys.modules, 'import dtorch loaded onnx'\n"
        "sys.modules['onnx'] = None\n"
        "import dtorch.onnx\n"
        "try:\n"
        "    dtorch.onnx.export(dtorch.nn.Linear(2, 2), dtorch.randn(1, 2),"
        " 'x.onnx')\n"
        "except ImportError as e:\n"
        "    assert \"pip install -e '.[onnx]'\" in str(e), e\n"
        "else:\n"
        "    raise SystemExit('no ImportError')\n")
    run_python(code)


def test_lstm_embedding_table_path_bidirectional(tmp_path):
    """Many tokens per row: nn.LSTM projects the embedding table instead of
    each token (the index array reaches the op raw, transposed); a
    bidirectional layer becomes a forward and a reverse ONNX LSTM."""
    dtorch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(5, 4), nn.LSTM(4, 6,
                                                      bidirectional=True))

    class Out(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = model

        def forward(self, idx):
            return self.body(idx)[0]
    m = roundtrip(Out(), dtorch.randint(0, 5, (9, 4)), tmp_path,
                  other=dtorch.randint(0, 5, (9, 4)), dynamic_axes={})
    dirs = sorted(a.s.decode() for n in m.graph.node if n.op_type == "LSTM"
                  for a in n.attribute if a.name == "direction")
    assert dirs == ["forward", "reverse"]


class GivenState(nn.Module):
    """h0/c0 as graph inputs, a relu RNN and a GRU cell stack."""

    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(3, 5)
        self.rnn = nn.RNN(5, 4, nonlinearity="relu")

    def forward(self, x, h0, c0):
        y, (h, c) = self.lstm(x, (h0, c0))
        z, _ = self.rnn(y)
        return dtorch.stack([h[0], c[0]], 1).sum(-1) + z[-1].mean(-1, True)


def test_rnn_with_initial_state(tmp_path):
    dtorch.manual_seed(0)
    args = (dtorch.randn(6, 2, 3), dtorch.randn(1, 2, 5),
            dtorch.randn(1, 2, 5))
    other = (dtorch.randn(6, 3, 3), dtorch.randn(1, 3, 5),
             dtorch.randn(1, 3, 5))
    m = roundtrip(GivenState(), args, tmp_path, other=other,
                  dynamic_axes={"x0": {1: "b"}, "x1": {1: "b"},
                                "x2": {1: "b"}, "y": {0: "b"}})
    assert {"LSTM", "RNN"} <= ops_of(m)


class InPlace(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        y = self.lin(x)
        y += 1.0
        y.mul_(2.0)
        return F.relu(y, inplace=True) * x


class HiddenInPlace(nn.Module):
    def forward(self, x):
        with dtorch.no_grad():
            x.add_(1.0)
        return x * 2


def test_inplace_ops(tmp_path):
    dtorch.manual_seed(0)
    roundtrip(InPlace(), dtorch.randn(2, 3), tmp_path,
              other=dtorch.randn(5, 3))
    # a change autograd does not record cannot be exported: an error, not
    # a graph that silently misses it
    with pytest.raises(dtorch.onnx.OnnxExporterError, match="in place"):
        dtorch.onnx.export(HiddenInPlace(), dtorch.randn(2, 3),
                           str(tmp_path / "m.onnx"))


class RawCompare(nn.Module):
    def forward(self, x):
        # a mask made in NumPy: nothing the tracer can follow
        m = dtorch.tensor((x.detach().numpy() > 0).astype(np.float32))
        return x * m


class ValueBranch(nn.Module):
    def forward(self, x):
        return x * 2.0 if x.sum().item() > 0 else x * 3.0


def test_values_computed_outside_ops_are_refused(tmp_path):
    path = str(tmp_path / "m.onnx")
    x = dtorch.tensor([[0.5, -1.0, 2.0]])
    with pytest.raises(dtorch.onnx.OnnxExporterError,
                       match=r"'Mul'.*outside dtorch's ops"):
        dtorch.onnx.export(RawCompare(), x, path)
    with pytest.raises(dtorch.onnx.OnnxExporterError,
                       match=r"'Mul'.*outside dtorch's ops"):
        dtorch.onnx.export(ValueBranch(), x, path)


def test_transformer_encoder_layer(tmp_path):
    """nn.MultiheadAttention folds the batch into the heads dim
    ((L, N * h, d) reshapes): those reshapes stay dynamic."""
    dtorch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0,
                                       batch_first=True)
    roundtrip(layer, dtorch.randn(2, 5, 8), tmp_path,
              other=dtorch.randn(3, 5, 8))


class Misc(nn.Module):
    """Reductions (whose axes moved to an input in opset 18), GELU (an ONNX
    op from opset 20), indexing, stack, expand, pad, clamp."""

    def forward(self, x):
        y = F.gelu(x) + F.gelu(x, approximate="tanh")
        y = y - y.amax(-1, keepdim=True) + x.max(1)[0][:, None]
        y = F.normalize(y, dim=-1) + y.mean(-1, keepdim=True)
        y = dtorch.stack([y[:, 1, 2:5], y[..., :3].sum(1)], 1)
        y = y + y[:, :1].expand(-1, 2, 3) + y[:, [1, 0]]
        return F.pad(y.clamp(-0.5, 0.5), (1, 2)) * F.hardswish(y).sum()


@pytest.mark.parametrize("opset", [17, 18, 20])
def test_misc_ops_opsets(tmp_path, opset):
    m = roundtrip(Misc(), dtorch.randn(2, 4, 6), tmp_path,
                  other=dtorch.randn(2, 4, 6), opset_version=opset,
                  dynamic_axes={})
    assert m.opset_import[0].version == opset
    assert ("Gelu" in ops_of(m)) == (opset >= 20)


class MaskedPool(nn.Module):
    """Comparisons, logical ops and argmax (Tensor methods that compute on
    arrays, not through ops) become graph nodes: a padding mask from the
    token ids, a where on a comparison, an argmax."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)

    def forward(self, idx):
        pad = (idx == 0) | (idx >= 8)
        h = self.emb(idx).masked_fill(pad[..., None], 0.0)
        keep = (~pad).logical_and(idx != 5)
        h = dtorch.where(h > 0.1, h, h * 0.5) * keep[..., None]
        best = h.sum(-1).argmax(-1, keepdim=True)
        return h.sum(1) / (keep.sum(1, keepdim=True) + 1) + best


def test_masks_and_argmax_are_traced(tmp_path):
    dtorch.manual_seed(0)
    x = dtorch.tensor([[1, 0, 5, 9, 3], [2, 2, 0, 7, 8]])
    m = roundtrip(MaskedPool(), x, tmp_path,
                  other=dtorch.randint(0, 10, (4, 5)))
    assert {"Equal", "Or", "Not", "And", "ArgMax", "Where"} <= ops_of(m)
    from dtorch.tensor import Tensor
    assert "fn" not in Tensor._cmp.__qualname__   # restored


def test_export_from_device(tmp_path, device):
    """A model on the GPU exports (constants copied to the host) and the
    file runs on the CPU with the same results."""
    dtorch.manual_seed(0)
    model = TextLSTM(layers=1).to(device)
    x = dtorch.randint(0, 20, (3, 7), device=device)
    path = str(tmp_path / "m.onnx")
    dtorch.onnx.export(model, x, path, input_names=["x"])
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    with dtorch.no_grad():
        want = model(x).cpu().numpy()
    got, = sess.run(None, {"x": x.cpu().numpy()})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


class PaddedAttention(nn.Module):
    """A boolean attention mask that blanks whole rows: 0 there, as
    PyTorch's safe softmax, not ONNX Softmax's NaN."""

    def forward(self, q, keep):
        return F.scaled_dot_product_attention(q, q, q, attn_mask=keep)


def test_attention_fully_masked_rows(tmp_path):
    dtorch.manual_seed(0)
    keep = dtorch.ones(2, 1, 4, 4, dtype=dtorch.bool).tril()
    keep[0, 0, 1] = False                     # row 1 of sample 0: nothing
    roundtrip(PaddedAttention(), (dtorch.randn(2, 2, 4, 3), keep), tmp_path,
              other=(dtorch.randn(3, 2, 4, 3),
                     dtorch.ones(3, 1, 4, 4, dtype=dtorch.bool)))
