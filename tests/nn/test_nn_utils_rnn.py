"""nn.utils.rnn and RNN/LSTM/GRU on PackedSequence against PyTorch: the
same packed layout, padded outputs, final states and gradients."""
import numpy as np
import pytest

import dtorch
import dtorch.nn as nn
from dtorch.nn.utils import rnn as R
from helpers import close

torch = pytest.importorskip("torch")
TR = torch.nn.utils.rnn

rng = np.random.default_rng(0)


def _close(a, b, tol=1e-10):
    close(a, b, tol)


def test_pad_and_pack_layout_match_torch():
    seqs = [rng.standard_normal((n, 3)) for n in (2, 5, 3)]
    for bf in (False, True):
        for side in ("right", "left"):
            _close(R.pad_sequence([dtorch.tensor(s) for s in seqs], bf, -1.0,
                                  side),
                   TR.pad_sequence([torch.tensor(s) for s in seqs], bf, -1.0,
                                   side))
    pd = R.pack_sequence([dtorch.tensor(s) for s in seqs],
                         enforce_sorted=False)
    pt = TR.pack_sequence([torch.tensor(s) for s in seqs],
                          enforce_sorted=False)
    _close(pd.data, pt.data)
    assert pd.batch_sizes.tolist() == pt.batch_sizes.tolist()
    assert pd.sorted_indices.tolist() == pt.sorted_indices.tolist()
    assert pd.unsorted_indices.tolist() == pt.unsorted_indices.tolist()
    padded_d, len_d = R.pad_packed_sequence(pd, batch_first=True,
                                            total_length=6)
    padded_t, len_t = TR.pad_packed_sequence(pt, batch_first=True,
                                             total_length=6)
    _close(padded_d, padded_t)
    assert len_d.tolist() == len_t.tolist() == [2, 5, 3]
    back = R.unpack_sequence(pd)
    for a, s in zip(back, seqs):
        np.testing.assert_array_equal(a.numpy(), s)
    with pytest.raises(RuntimeError, match="decreasing order"):
        R.pack_padded_sequence(dtorch.zeros(5, 3, 2), [2, 5, 3])
    with pytest.raises(RuntimeError, match="greater than 0"):
        R.pack_padded_sequence(dtorch.zeros(5, 2, 2), [5, 0])


@pytest.mark.parametrize("mode", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("batch_first", [False, True])
def test_rnn_on_packed_sequence_matches_torch(mode, bidirectional,
                                              batch_first):
    kw = dict(input_size=3, hidden_size=4, num_layers=2,
              bidirectional=bidirectional, batch_first=batch_first)
    torch.manual_seed(0)
    tm = getattr(torch.nn, mode)(**kw).double()
    dm = getattr(nn, mode)(**kw).double()
    dm.load_state_dict({k: dtorch.tensor(v.detach().numpy())
                        for k, v in tm.state_dict().items()})
    lengths = [3, 6, 1, 6]
    x = rng.standard_normal((4, 6, 3) if batch_first else (6, 4, 3))
    xd = dtorch.tensor(x, requires_grad=True)
    xt = torch.tensor(x, requires_grad=True)
    dirs = 2 if bidirectional else 1
    h0 = rng.standard_normal((2 * dirs, 4, 4))
    hx_d = dtorch.tensor(h0)
    hx_t = torch.tensor(h0)
    if mode == "LSTM":
        hx_d, hx_t = (hx_d, dtorch.tensor(h0 * 0.5)), \
            (hx_t, torch.tensor(h0 * 0.5))
    pd = R.pack_padded_sequence(xd, lengths, batch_first, False)
    pt = TR.pack_padded_sequence(xt, lengths, batch_first, False)
    od, hd = dm(pd, hx_d)
    ot, ht = tm(pt, hx_t)
    assert isinstance(od, R.PackedSequence)
    _close(od.data, ot.data)
    assert od.batch_sizes.tolist() == ot.batch_sizes.tolist()
    if mode == "LSTM":
        _close(hd[0], ht[0])
        _close(hd[1], ht[1])
        hd, ht = hd[0], ht[0]
    else:
        _close(hd, ht)
    padded_d, _ = R.pad_packed_sequence(od, batch_first)
    padded_t, _ = TR.pad_packed_sequence(ot, batch_first)
    _close(padded_d, padded_t)
    w = rng.standard_normal(tuple(padded_t.shape))
    ((padded_d * dtorch.tensor(w)).sum() + hd.sum()).backward()
    ((padded_t * torch.tensor(w)).sum() + ht.sum()).backward()
    _close(xd.grad, xt.grad)
    for (k, a), (_, b) in zip(dm.named_parameters(), tm.named_parameters()):
        _close(a.grad, b.grad)
