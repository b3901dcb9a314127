"""The whole-model save/load patterns of two public programs, run with
``import dtorch as torch`` exactly as they are written:

- pytorch/examples word_language_model: ``with open(args.save, 'wb') as
  f: torch.save(model, f)``, then ``with open(args.save, 'rb') as f:``
  ``with torch.serialization.safe_globals([...]): model = torch.load(f)``
  (weights_only=True by default) and ``model.rnn.flatten_parameters()``;
  generate.py adds ``map_location=device``.
- pytorch/examples super_resolution: ``torch.save(model, path)``, then
  super_resolve.py loads it inside ``safe_globals([Net, ReLU, Conv2d,
  PixelShuffle])``.
"""
import math

import numpy as np
import pytest

import dtorch as torch
import dtorch.nn as nn
import dtorch.nn.functional as F


class Net(nn.Module):            # super_resolution's model, smaller
    def __init__(self, upscale_factor):
        super().__init__()
        self.relu = nn.ReLU()
        self.conv1 = nn.Conv2d(1, 4, (5, 5), (1, 1), (2, 2))
        self.conv2 = nn.Conv2d(4, upscale_factor ** 2, (3, 3), (1, 1),
                               (1, 1))
        self.pixel_shuffle = nn.PixelShuffle(upscale_factor)

    def forward(self, x):
        return self.pixel_shuffle(self.conv2(self.relu(self.conv1(x))))


class RNNModel(nn.Module):       # word_language_model's RNN model
    def __init__(self, rnn_type, ntoken, ninp, nhid, nlayers, dropout=0.5):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        if rnn_type in ["LSTM", "GRU"]:
            self.rnn = getattr(nn, rnn_type)(ninp, nhid, nlayers,
                                             dropout=dropout)
        else:
            nonlinearity = {"RNN_TANH": "tanh", "RNN_RELU": "relu"}[rnn_type]
            self.rnn = nn.RNN(ninp, nhid, nlayers, nonlinearity=nonlinearity,
                              dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        self.rnn_type, self.nhid, self.nlayers = rnn_type, nhid, nlayers

    def forward(self, input, hidden):
        output, hidden = self.rnn(self.drop(self.encoder(input)), hidden)
        return F.log_softmax(self.decoder(self.drop(output)), dim=-1), hidden

    def init_hidden(self, bsz):
        z = torch.zeros(self.nlayers, bsz, self.nhid)
        return (z, z.clone()) if self.rnn_type == "LSTM" else z


class PositionalEncoding(nn.Module):
    def __init__(self, d_model, dropout=0.1, max_len=64):
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)
        pe = torch.zeros(max_len, d_model)
        position = torch.arange(0, max_len, dtype=torch.float).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2).float()
                             * (-math.log(10000.0) / d_model))
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe.unsqueeze(0).transpose(0, 1))

    def forward(self, x):
        return self.dropout(x + self.pe[:x.size(0), :])


class TransformerModel(nn.Transformer):
    def __init__(self, ntoken, ninp, nhead, nhid, nlayers, dropout=0.5):
        super().__init__(d_model=ninp, nhead=nhead, dim_feedforward=nhid,
                         num_encoder_layers=nlayers)
        self.src_mask = None
        self.pos_encoder = PositionalEncoding(ninp, dropout)
        self.input_emb = nn.Embedding(ntoken, ninp)
        self.ninp = ninp
        self.decoder = nn.Linear(ninp, ntoken)

    def forward(self, src):
        src = self.pos_encoder(self.input_emb(src) * math.sqrt(self.ninp))
        return F.log_softmax(self.decoder(self.encoder(src,
                                                       mask=self.src_mask)),
                             dim=-1)


RNN_SAFE = [RNNModel, torch.nn.modules.dropout.Dropout,
            torch.nn.modules.linear.Linear, torch.nn.modules.rnn.GRU,
            torch.nn.modules.rnn.LSTM, torch.nn.modules.rnn.RNN,
            torch.nn.modules.sparse.Embedding]
TRANSFORMER_SAFE = [
    PositionalEncoding, TransformerModel, torch.nn.functional.relu,
    torch.nn.modules.activation.MultiheadAttention,
    torch.nn.modules.container.ModuleList, torch.nn.modules.dropout.Dropout,
    torch.nn.modules.linear.Linear,
    torch.nn.modules.linear.NonDynamicallyQuantizableLinear,
    torch.nn.modules.normalization.LayerNorm,
    torch.nn.modules.sparse.Embedding,
    torch.nn.modules.transformer.TransformerEncoder,
    torch.nn.modules.transformer.TransformerEncoderLayer]


def _close(a, b):
    np.testing.assert_array_equal(a.detach().numpy(), b.detach().numpy())


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN_TANH", "Transformer"])
def test_word_language_model_save_and_reload(kind, tmp_path):
    torch.manual_seed(0)
    save = str(tmp_path / "model.pt")
    if kind == "Transformer":
        model = TransformerModel(12, 8, 2, 16, 2)
    else:
        model = RNNModel(kind, 12, 6, 6, 2)
    data = torch.randint(0, 12, (5, 3))
    model.eval()
    if kind == "Transformer":
        before = model(data)
    else:
        before = model(data, model.init_hidden(3))[0]
    with open(save, 'wb') as f:
        torch.save(model, f)
    with open(save, 'rb') as f:
        safe_globals = TRANSFORMER_SAFE if kind == "Transformer" \
            else RNN_SAFE
        with torch.serialization.safe_globals(safe_globals):
            model = torch.load(f)
        if kind in ['RNN_TANH', 'RNN_RELU', 'LSTM', 'GRU']:
            model.rnn.flatten_parameters()
    if kind == "Transformer":
        _close(before, model(data))
    else:
        _close(before, model(data, model.init_hidden(3))[0])
    # generate.py: the same file, with map_location
    with open(save, 'rb') as f:
        with torch.serialization.safe_globals(safe_globals):
            model = torch.load(f, map_location=torch.device("cpu"))
    assert type(model).__name__ in ("RNNModel", "TransformerModel")
    # without the list, the default (weights_only=True) refuses to run
    # the file's classes, with PyTorch's way out in the message
    with open(save, 'rb') as f:
        with pytest.raises(torch.serialization.WeightsOnlyError,
                           match="add_safe_globals"):
            torch.load(f)


def test_super_resolution_save_and_reload(tmp_path):
    torch.manual_seed(0)
    model = Net(upscale_factor=2)
    x = torch.randn(1, 1, 6, 6)
    y = model(x)
    model_out_path = str(tmp_path / "model_epoch_1.pth")
    torch.save(model, model_out_path)
    with open(model_out_path, 'rb') as f:
        safe_globals = [
            Net,
            torch.nn.modules.activation.ReLU,
            torch.nn.modules.conv.Conv2d,
            torch.nn.modules.pixelshuffle.PixelShuffle,
        ]
        with torch.serialization.safe_globals(safe_globals):
            model = torch.load(f)
    _close(y, model(x))
    assert model(x).shape == (1, 1, 12, 12)
    # weights_only=False, asked for, needs no list
    _close(y, torch.load(model_out_path, weights_only=False)(x))
