"""Recurrent layers RNN, LSTM, GRU (and their cells) with PyTorch's
parameter names (``weight_ih_l0``, ``bias_hh_l1_reverse``, ...), gate order
and init. Each layer and direction is two nodes: one Linear for the input
projections of all time steps, then one fused recurrence primitive
(``dtorch/ops/rnn.py``) that loops over time in forward and backward.

Embedding straight into the first layer: when the input is the output of an
``Embedding`` (its grad_fn, with a leaf weight, no padding_idx, no
scale_grad_by_freq) and the table has at most a quarter as many rows as the
input has tokens, the input projections are taken from the projected
*table*: ``(E @ W_ih.T + b)[idx]`` instead of
``E[idx] @ W_ih.T + b``, the same values, with the GEMM over V rows instead
of T * N (a char-level model: 256 rows against 2048 tokens, 8x fewer
FLOPs, forward and backward). Autograd then takes the gradients of E and
W_ih through the table."""
import math

from .module import Module
from ..parameter import Parameter
from .. import functional as F
from .. import init
from ..._creation import empty, zeros, cat, stack
from ... import ops as N
from ...autograd.function import autocast_op


_GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}


def _embedding_source(x):
    """(weight, idx) when x is a fresh ``Embedding`` output of a leaf
    weight without padding_idx or scale_grad_by_freq (gradient rules the
    table path would not keep), else None."""
    fn = x.grad_fn
    if type(fn) is not N.Embedding or getattr(fn, "pad", 0) is not None \
            or getattr(fn, "freq", True):
        return None
    edge = fn.next_edges[0]
    w = getattr(edge[0], "variable", None) if edge is not None else None
    if w is None or w.dim() != 2 or fn.idx.shape != x.shape[:-1]:
        return None
    return w, fn.idx


def _configure(m, input_size, hidden_size, num_layers, bias, batch_first,
               dropout, bidirectional):
    """nn.RNNBase's configuration attributes, in PyTorch's names (the
    dynamic quantized LSTM keeps the same)."""
    m.input_size = input_size
    m.hidden_size = hidden_size
    m.num_layers = num_layers
    m.bias = bias
    m.batch_first = batch_first
    m.dropout = float(dropout)
    m.bidirectional = bidirectional


def _suffix(layer, d):
    """PyTorch's parameter-name suffix of a layer and direction: _l0,
    _l0_reverse, _l1, ..."""
    return f"_l{layer}" + ("_reverse" if d else "")


def _layers(num_layers, bidirectional, input_size, hidden_size):
    """(suffix, input features) of every layer and direction, in PyTorch's
    parameter order."""
    dirs = 2 if bidirectional else 1
    for layer in range(num_layers):
        for d in range(dirs):
            yield (_suffix(layer, d),
                   input_size if layer == 0 else hidden_size * dirs)


class RNNBase(Module):
    def __init__(self, mode, input_size, hidden_size, num_layers=1,
                 bias=True, batch_first=False, dropout=0.0,
                 bidirectional=False, proj_size=0, device=None, dtype=None):
        super().__init__()
        if not isinstance(dropout, (int, float)) or not 0 <= dropout <= 1 \
                or isinstance(dropout, bool):
            raise ValueError("dropout should be a number in range [0, 1] "
                             "representing the probability of an element "
                             "being zeroed")
        if not isinstance(hidden_size, int) or hidden_size <= 0:
            raise ValueError("hidden_size must be a positive integer")
        if not isinstance(num_layers, int) or num_layers <= 0:
            raise ValueError("num_layers must be a positive integer")
        if proj_size:
            raise NotImplementedError("LSTM proj_size is not supported by "
                                      "dtorch")
        self.mode = mode
        _configure(self, input_size, hidden_size, num_layers, bias,
                   batch_first, dropout, bidirectional)
        self.proj_size = proj_size
        gate = _GATES[mode] * hidden_size
        fk = {"device": device, "dtype": dtype}
        self._flat_weights_names = []
        for sfx, lin in _layers(num_layers, bidirectional, input_size,
                                hidden_size):
            names = ["weight_ih" + sfx, "weight_hh" + sfx]
            params = [Parameter(empty((gate, lin), **fk)),
                      Parameter(empty((gate, hidden_size), **fk))]
            if bias:
                names += ["bias_ih" + sfx, "bias_hh" + sfx]
                params += [Parameter(empty(gate, **fk)),
                           Parameter(empty(gate, **fk))]
            for n, p in zip(names, params):
                setattr(self, n, p)
            self._flat_weights_names.extend(names)
        self.reset_parameters()

    def reset_parameters(self):
        std = 1.0 / math.sqrt(self.hidden_size) if self.hidden_size else 0
        for w in self.parameters():
            init.uniform_(w, -std, std)

    def flatten_parameters(self):
        """A cuDNN detail in PyTorch; nothing to do here."""

    @property
    def _flat_weights(self):
        return [getattr(self, n) for n in self._flat_weights_names]

    @property
    def all_weights(self):
        per = 4 if self.bias else 2
        w = self._flat_weights
        return [w[i:i + per] for i in range(0, len(w), per)]

    def _layer_params(self, layer, d):
        sfx = _suffix(layer, d)
        b_ih = getattr(self, "bias_ih" + sfx) if self.bias else None
        b_hh = getattr(self, "bias_hh" + sfx) if self.bias else None
        return (getattr(self, "weight_ih" + sfx),
                getattr(self, "weight_hh" + sfx), b_ih, b_hh)

    def _check_hidden(self, h, expected, what="hidden"):
        if tuple(h.shape) != expected:
            raise RuntimeError(f"Expected {what} size {expected}, got "
                               f"{list(h.shape)}")

    def forward(self, input, hx=None):
        from ..utils.rnn import PackedSequence, packed_forward
        if isinstance(input, PackedSequence):
            return packed_forward(self, input, hx)
        name = "RNN" if self.mode.startswith("RNN") else self.mode
        if input.dim() not in (2, 3):
            raise ValueError(f"{name}: Expected input to be 2D or 3D, got "
                             f"{input.dim()}D instead")
        batched = input.dim() == 3
        lstm = self.mode == "LSTM"
        src = _embedding_source(input)
        if not batched:
            input = input.unsqueeze(1)
            if hx is not None:
                hx = tuple(h.unsqueeze(1) for h in hx) if lstm \
                    else hx.unsqueeze(1)
        elif self.batch_first:
            input = input.transpose(0, 1)
        if input.shape[-1] != self.input_size:
            raise RuntimeError(
                f"input.size(-1) must be equal to input_size. Expected "
                f"{self.input_size}, got {input.shape[-1]}")
        T, n = input.shape[:2]
        if T == 0:
            raise RuntimeError("Expected sequence length to be larger than 0 "
                               "in RNN")
        dirs = 2 if self.bidirectional else 1
        hshape = (self.num_layers * dirs, n, self.hidden_size)
        if hx is None:
            h0 = zeros(hshape, dtype=input.dtype, device=input.device)
            c0 = h0 if lstm else None
        elif lstm:
            h0, c0 = hx
            self._check_hidden(h0, hshape)
            self._check_hidden(c0, hshape, "hidden[1]")
        else:
            h0, c0 = hx, None
            self._check_hidden(h0, hshape)
        if src is not None:
            emb_w, idx = src
            if 4 * emb_w.shape[0] > T * n:
                src = None        # too few tokens per row to gain
            else:                 # idx laid out like input: (T, N)
                idx = idx[:, None] if not batched else \
                    idx.T if self.batch_first else idx
                src = emb_w, idx
        x = input
        hn, cn = [], []
        for layer in range(self.num_layers):
            outs = []
            for d in range(dirs):
                w_ih, w_hh, b_ih, b_hh = self._layer_params(layer, d)
                k = layer * dirs + d
                if b_hh is not None and self.mode != "GRU":
                    # b_hh only adds to the gates: one bias for the input
                    # projection, none per step (GRU's b_hn is inside r *)
                    b_ih, b_hh = b_ih + b_hh, None
                if layer == 0 and src is not None:
                    xw = N.Embedding.apply(F.linear(src[0], w_ih, b_ih),
                                           src[1])
                else:
                    xw = F.linear(x, w_ih, b_ih)
                rev = d == 1
                if lstm:
                    y = N.LSTMLayer.apply(xw, h0[k], c0[k], w_hh, b_hh,
                                          reverse=rev)
                    hn.append(y[0] if rev else y[T - 1])
                    cn.append(y[T])
                elif self.mode == "GRU":
                    y = N.GRULayer.apply(xw, h0[k], w_hh, b_hh, reverse=rev)
                    hn.append(y[T])
                else:
                    act = "tanh" if self.mode == "RNN_TANH" else "relu"
                    y = N.RNNLayer.apply(xw, h0[k], w_hh, b_hh, reverse=rev,
                                         nonlinearity=act)
                    hn.append(y[T])
                outs.append(y[:T])
            x = outs[0] if dirs == 1 else cat(outs, -1)
            if self.dropout and self.training and \
                    layer < self.num_layers - 1:
                x = F.dropout(x, self.dropout, True)
        h_n = stack(hn, 0)
        out = x
        if not batched:
            out = out.squeeze(1)
            h_n = h_n.squeeze(1)
        elif self.batch_first:
            out = out.transpose(0, 1)
        if lstm:
            c_n = stack(cn, 0)
            if not batched:
                c_n = c_n.squeeze(1)
            return out, (h_n, c_n)
        return out, h_n

    def extra_repr(self):
        s = f"{self.input_size}, {self.hidden_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if self.bias is not True:
            s += f", bias={self.bias}"
        if self.batch_first is not False:
            s += f", batch_first={self.batch_first}"
        if self.dropout != 0:
            s += f", dropout={self.dropout}"
        if self.bidirectional is not False:
            s += f", bidirectional={self.bidirectional}"
        return s


class RNN(RNNBase):
    """Elman RNN: h_t = tanh(x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh)."""

    def __init__(self, *args, **kwargs):
        nl = kwargs.pop("nonlinearity", "tanh")
        if len(args) > 3:
            nl = args[3]
            args = args[:3] + args[4:]
        if nl not in ("tanh", "relu"):
            raise ValueError(f"Unknown nonlinearity '{nl}'. Select from "
                             f"'tanh' or 'relu'.")
        self.nonlinearity = nl
        super().__init__("RNN_TANH" if nl == "tanh" else "RNN_RELU", *args,
                         **kwargs)

    def extra_repr(self):
        s = super().extra_repr()
        if self.nonlinearity != "tanh":
            s += f", nonlinearity={self.nonlinearity!r}"
        return s


class LSTM(RNNBase):
    """LSTM with PyTorch's gates (i, f, g, o) stacked in weight_ih_l*.

    Example::

        lstm = nn.LSTM(10, 20, num_layers=2, batch_first=True)
        out, (h, c) = lstm(dtorch.randn(3, 5, 10))
    """

    def __init__(self, *args, **kwargs):
        super().__init__("LSTM", *args, **kwargs)


class GRU(RNNBase):
    """GRU with PyTorch's gates (r, z, n)."""

    def __init__(self, *args, **kwargs):
        super().__init__("GRU", *args, **kwargs)


class RNNCellBase(Module):
    def __init__(self, input_size, hidden_size, bias, num_chunks,
                 device=None, dtype=None):
        super().__init__()
        fk = {"device": device, "dtype": dtype}
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.bias = bias
        self.weight_ih = Parameter(empty((num_chunks * hidden_size,
                                          input_size), **fk))
        self.weight_hh = Parameter(empty((num_chunks * hidden_size,
                                          hidden_size), **fk))
        if bias:
            self.bias_ih = Parameter(empty(num_chunks * hidden_size, **fk))
            self.bias_hh = Parameter(empty(num_chunks * hidden_size, **fk))
        else:
            self.register_parameter("bias_ih", None)
            self.register_parameter("bias_hh", None)
        self.reset_parameters()

    def reset_parameters(self):
        std = 1.0 / math.sqrt(self.hidden_size) if self.hidden_size else 0
        for w in self.parameters():
            init.uniform_(w, -std, std)

    def _prep(self, input, hx, w_ih=None, b_ih=None):
        """(input @ w_ih + b_ih as a length-1 sequence, hx batched and
        zeros when None, whether input was batched); w_ih/b_ih default to
        the cell's own (LSTMCell passes autocast's casts)."""
        batched = input.dim() == 2
        if input.dim() not in (1, 2):
            raise ValueError(f"{type(self).__name__}: Expected input to be "
                             f"1D or 2D, got {input.dim()}D instead")
        if not batched:
            input = input.unsqueeze(0)
        if hx is None:
            hx = zeros((input.shape[0], self.hidden_size),
                       dtype=input.dtype, device=input.device)
        elif not batched:
            hx = hx.unsqueeze(0)
        if w_ih is None:
            w_ih, b_ih = self.weight_ih, self.bias_ih
        xw = F.linear(input, w_ih, b_ih).unsqueeze(0)
        return xw, hx, batched

    def _step(self, layer, input, hx, **kwargs):
        """One step of the recurrent ``layer`` op with the cell's weights:
        the new h, unbatched where the input was."""
        xw, hx, batched = self._prep(input, hx)
        h = layer.apply(xw, hx, self.weight_hh, self.bias_hh, **kwargs)[1]
        return h if batched else h.squeeze(0)

    def extra_repr(self):
        s = f"{self.input_size}, {self.hidden_size}"
        if self.bias is not True:
            s += f", bias={self.bias}"
        return s


class RNNCell(RNNCellBase):
    def __init__(self, input_size, hidden_size, bias=True,
                 nonlinearity="tanh", device=None, dtype=None):
        super().__init__(input_size, hidden_size, bias, 1, device, dtype)
        self.nonlinearity = nonlinearity

    def forward(self, input, hx=None):
        return self._step(N.RNNLayer, input, hx,
                          nonlinearity=self.nonlinearity)


class GRUCell(RNNCellBase):
    def __init__(self, input_size, hidden_size, bias=True, device=None,
                 dtype=None):
        super().__init__(input_size, hidden_size, bias, 3, device, dtype)

    def forward(self, input, hx=None):
        return self._step(N.GRULayer, input, hx)


class LSTMCell(RNNCellBase):
    def __init__(self, input_size, hidden_size, bias=True, device=None,
                 dtype=None):
        super().__init__(input_size, hidden_size, bias, 4, device, dtype)

    def forward(self, input, hx=None):
        h0, c0 = (None, None) if hx is None else hx
        return _lstm_cell(self, input, h0, c0, self.weight_ih, self.bias_ih,
                          self.weight_hh, self.bias_hh)


# One op for autocast, as PyTorch's lstm_cell: float32 on CPU (not in its
# CPU lower-precision list, unlike nn.LSTM), the low dtype on CUDA.
@autocast_op({"cpu": "fp32", "cuda": "lower"})
def _lstm_cell(cell, input, h0, c0, w_ih, b_ih, w_hh, b_hh):
    xw, h0, batched = cell._prep(input, h0, w_ih, b_ih)
    if c0 is None:
        c0 = zeros(tuple(h0.shape), dtype=h0.dtype, device=h0.device)
    elif not batched:
        c0 = c0.unsqueeze(0)
    y = N.LSTMLayer.apply(xw, h0, c0, w_hh, b_hh)
    h, c = y[0], y[1]
    if not batched:
        h, c = h.squeeze(0), c.squeeze(0)
    return h, c
