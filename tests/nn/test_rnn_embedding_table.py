"""Embedding straight into a recurrent layer: the input projections come
from the projected table (fewer FLOPs when the table has fewer rows than
the batch has tokens). Same values and gradients as the plain path."""
import numpy as np
import pytest

import dtorch
from dtorch import nn
from dtorch.autograd import gradcheck
from dtorch.ops.index import index_add0
import dtorch.nn.modules.rnn as R


def _grads(named):
    return {k: v.grad.numpy().copy() for k, v in named.items()}


@pytest.mark.parametrize("mode", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("batch_first", [True, False])
def test_table_path_matches_plain_path(mode, batch_first, monkeypatch):
    dtorch.manual_seed(0)
    emb = nn.Embedding(16, 8).double()
    rnn = getattr(nn, mode)(8, 6, num_layers=2, bidirectional=True,
                            batch_first=batch_first).double()
    named = dict(list(emb.named_parameters()) + list(rnn.named_parameters()))
    idx = dtorch.randint(0, 16, (5, 40) if batch_first else (40, 5))
    used = []
    orig = R._embedding_source
    monkeypatch.setattr(R, "_embedding_source",
                        lambda x: used.append(orig(x)) or used[-1])
    out, h = rnn(emb(idx))
    assert used[-1] is not None            # 16 rows < 200 tokens: taken
    ((out ** 2).sum() + (h[0] if mode == "LSTM" else h).sum()).backward()
    g_table = _grads(named)
    for p in named.values():
        p.grad = None
    out2, h2 = rnn(emb(idx) * 1.0)         # not an Embedding output
    assert used[-1] is None
    ((out2 ** 2).sum() + (h2[0] if mode == "LSTM" else h2).sum()).backward()
    np.testing.assert_allclose(out.detach().numpy(), out2.detach().numpy(),
                               rtol=1e-12, atol=1e-12)
    for k, g in _grads(named).items():
        np.testing.assert_allclose(g_table[k], g, rtol=1e-10, atol=1e-12,
                                   err_msg=k)


def test_table_path_gradcheck_and_when_it_is_not_taken():
    dtorch.manual_seed(1)
    emb = nn.Embedding(3, 2).double()
    lstm = nn.LSTM(2, 3, batch_first=True).double()
    idx = dtorch.tensor([[0, 1, 2, 1], [2, 2, 0, 1], [1, 0, 0, 2]])

    def fn(w, w_ih):
        return lstm(nn.functional.embedding(idx, w))[0]
    assert gradcheck(fn, (emb.weight, lstm.weight_ih_l0))
    # padding_idx keeps its own gradient rule: the plain path
    pad = nn.Embedding(3, 2, padding_idx=0).double()
    assert R._embedding_source(pad(idx)) is None
    assert R._embedding_source(emb(idx)) is not None
    with dtorch.no_grad():
        assert R._embedding_source(emb(idx)) is None


@pytest.mark.parametrize("width", [3, 2000])
def test_index_add0_both_ways_match_add_at(width):
    # narrow rows take add.reduceat, wide rows one reduce per segment
    rng = np.random.default_rng(0)
    idx = rng.integers(-5, 5, 64)
    src = rng.standard_normal((64, width))
    got = index_add0(np, (5, width), np.float64, idx, src)
    want = np.zeros((5, width))
    np.add.at(want, np.where(idx < 0, idx + 5, idx), src)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_embedding_scale_grad_by_freq_matches_torch():
    torch = pytest.importorskip("torch")
    w = np.random.default_rng(0).standard_normal((5, 3))
    idx = np.array([[0, 1, 1], [4, 1, 0]])
    for pad in (None, 0):
        e = nn.Embedding(5, 3, padding_idx=pad, scale_grad_by_freq=True)
        te = torch.nn.Embedding(5, 3, padding_idx=pad,
                                scale_grad_by_freq=True)
        with dtorch.no_grad():
            e.weight.copy_(dtorch.tensor(w, dtype=dtorch.float32))
        with torch.no_grad():
            te.weight.copy_(torch.tensor(w, dtype=torch.float32))
        (e(dtorch.tensor(idx)) ** 2).sum().backward()
        (te(torch.tensor(idx)) ** 2).sum().backward()
        np.testing.assert_allclose(e.weight.grad.numpy(),
                                   te.weight.grad.numpy(), rtol=1e-6)
        assert R._embedding_source(e(dtorch.tensor(idx))) is None


def test_embedding_scale_grad_by_freq_by_hand():
    e = nn.Embedding(4, 2, scale_grad_by_freq=True)
    e(dtorch.tensor([1, 1, 1, 3])).sum().backward()
    np.testing.assert_allclose(e.weight.grad.numpy(),
                               [[0, 0], [1, 1], [0, 0], [1, 1]])
