"""Dynamically quantized modules: int8 weights (per output channel),
activations quantized to uint8 at each call, int32 accumulation, float32
results (PyTorch's ``torch.ao.nn.quantized.dynamic``).

They are for inference: outputs carry no autograd graph. Weights are
buffers (``weight_int8`` int8, ``weight_scale`` float32 per row, ``bias``
float32), so ``state_dict``/``dtorch.save`` and ``.to(device)`` work.
"""
import numpy as np

from .... import _backend as B
from ....tensor import Tensor
from ....nn.modules.module import Module
from ....nn.modules.rnn import _configure, _layers
from ...quantization import _core as Q
from ...quantization._dtypes import qint8


def _buffer_of(arr):
    return Tensor._wrap(arr)



def _check_dtype(dtype, what):
    if dtype is not qint8:
        raise NotImplementedError(
            f"dynamic quantized {what} supports dtype=dtorch.qint8 only, "
            f"got {dtype}")

class Linear(Module):
    """``y = x W^T + b`` with W stored as int8 and per-channel scales
    (``torch.ao.nn.quantized.dynamic.Linear``)."""
    _FLOAT_MODULE = None     # set below: dtorch.nn.Linear

    def __init__(self, in_features, out_features, bias_=True,
                 dtype=qint8):
        super().__init__()
        _check_dtype(dtype, "Linear")
        self.in_features = in_features
        self.out_features = out_features
        self.dtype = dtype
        self.register_buffer("weight_int8", _buffer_of(
            np.zeros((out_features, in_features), np.int8)))
        self.register_buffer("weight_scale", _buffer_of(
            np.ones(out_features, np.float32)))
        self.register_buffer("bias", _buffer_of(
            np.zeros(out_features, np.float32)) if bias_ else None)

    @classmethod
    def from_float(cls, mod):
        """Quantize a float ``nn.Linear`` (its weights are read, not kept)."""
        w = mod.weight.detach()._data
        q = cls(mod.in_features, mod.out_features, mod.bias is not None)
        qw, scale = Q.quantize_weight_per_channel(w)
        q.weight_int8 = Tensor._wrap(qw)
        q.weight_scale = Tensor._wrap(scale)
        if mod.bias is not None:
            q.bias = Tensor._wrap(
                mod.bias.detach()._data.astype(np.float32, copy=True))
        return q

    def weight(self):
        """The dequantized weight (float32): what the int8 codes stand
        for. (PyTorch returns a quantized tensor here.)"""
        w = self.weight_int8._data.astype(np.float32)
        return Tensor._wrap(w * self.weight_scale._data[:, None])

    def forward(self, input):
        x = input._data
        if x.shape[-1:] != (self.in_features,):
            raise RuntimeError(
                f"mat1 and mat2 shapes cannot be multiplied "
                f"({'x'.join(map(str, x.shape))} and "
                f"{self.in_features}x{self.out_features})")
        if x.dtype.kind != "f":
            raise RuntimeError(f"dynamic quantized Linear expects a "
                               f"floating input, got {input.dtype}")
        b = self.bias._data if self.bias is not None else None
        out = Q.dynamic_linear(x, self.weight_int8._data,
                               self.weight_scale._data, b)
        return Tensor._wrap(out)

    def _get_name(self):
        return "DynamicQuantizedLinear"

    def extra_repr(self):
        return (f"in_features={self.in_features}, "
                f"out_features={self.out_features}, dtype={self.dtype}, "
                f"qscheme=dtorch.per_channel_symmetric")


def _sigmoid(xp, z):
    return 0.5 * (xp.tanh(0.5 * z) + 1.0)     # no overflow warning


class LSTM(Module):
    """``nn.LSTM`` with int8 weights: the input projection of all time steps
    is one int8 GEMM, the recurrent one an int8 GEMV per step, each with its
    activations quantized on the fly (``torch.ao.nn.quantized.dynamic.LSTM``).
    Gate arithmetic runs in float32."""

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True,
                 batch_first=False, dropout=0.0, bidirectional=False,
                 dtype=qint8):
        super().__init__()
        _check_dtype(dtype, "LSTM")
        _configure(self, input_size, hidden_size, num_layers, bias,
                   batch_first, dropout, bidirectional)
        self.dtype = dtype
        self._names = []
        g = 4 * hidden_size
        for sfx, lin in _layers(num_layers, bidirectional, input_size,
                                hidden_size):
            for kind, k in (("ih", lin), ("hh", hidden_size)):
                self.register_buffer(f"weight_{kind}{sfx}_int8",
                                     _buffer_of(np.zeros((g, k), np.int8)))
                self.register_buffer(f"weight_{kind}{sfx}_scale",
                                     _buffer_of(np.ones(g, np.float32)))
            # b_ih + b_hh: both only add to the gates
            self.register_buffer(f"bias{sfx}", _buffer_of(
                np.zeros(g, np.float32)) if bias else None)
            self._names.append(sfx)

    @classmethod
    def from_float(cls, mod):
        if getattr(mod, "mode", "LSTM") != "LSTM":
            raise TypeError(f"dynamic quantized LSTM converts nn.LSTM, got "
                            f"{type(mod).__name__}")
        if getattr(mod, "proj_size", 0):
            raise NotImplementedError("LSTM proj_size is not supported")
        q = cls(mod.input_size, mod.hidden_size, mod.num_layers, mod.bias,
                mod.batch_first, mod.dropout, mod.bidirectional)
        for sfx in q._names:
            for kind in ("ih", "hh"):
                w = getattr(mod, f"weight_{kind}{sfx}").detach()._data
                qw, s = Q.quantize_weight_per_channel(w)
                setattr(q, f"weight_{kind}{sfx}_int8", Tensor._wrap(qw))
                setattr(q, f"weight_{kind}{sfx}_scale", Tensor._wrap(s))
            if mod.bias:
                b = (getattr(mod, f"bias_ih{sfx}").detach()._data
                     + getattr(mod, f"bias_hh{sfx}").detach()._data)
                setattr(q, f"bias{sfx}", Tensor._wrap(b.astype(np.float32)))
        return q

    def _run(self, xp, x, h, c, sfx, reverse):
        """One direction of one layer: x (T, N, K) -> (T, N, H), h_T, c_T."""
        wi = getattr(self, f"weight_ih{sfx}_int8")._data
        si = getattr(self, f"weight_ih{sfx}_scale")._data
        wh = getattr(self, f"weight_hh{sfx}_int8")._data
        sh = getattr(self, f"weight_hh{sfx}_scale")._data
        b = getattr(self, f"bias{sfx}")
        T, n = x.shape[:2]
        H = self.hidden_size
        xw = Q.dynamic_linear(x, wi, si, None if b is None else b._data)
        out = xp.empty((T, n, H), np.float32)
        steps = range(T - 1, -1, -1) if reverse else range(T)
        for t in steps:
            gates = xw[t] + Q.dynamic_linear(h, wh, sh, None)
            i = _sigmoid(xp, gates[:, :H])
            f = _sigmoid(xp, gates[:, H:2 * H])
            g = xp.tanh(gates[:, 2 * H:3 * H])
            o = _sigmoid(xp, gates[:, 3 * H:])
            c = f * c + i * g
            h = o * xp.tanh(c)
            out[t] = h
        return out, h, c

    def forward(self, input, hx=None):
        from ....nn.utils.rnn import PackedSequence
        if isinstance(input, PackedSequence):
            raise NotImplementedError(
                "dynamic quantized LSTM: PackedSequence input is not "
                "supported; pad the batch instead")
        x = input._data
        if x.ndim not in (2, 3):
            raise ValueError(f"LSTM: Expected input to be 2D or 3D, got "
                             f"{x.ndim}D instead")
        xp = B.get_array_module(x)
        batched = x.ndim == 3
        if not batched:
            x = x[:, None]
        elif self.batch_first:
            x = x.transpose(1, 0, 2)
        if x.shape[-1] != self.input_size:
            raise RuntimeError(
                f"input.size(-1) must be equal to input_size. Expected "
                f"{self.input_size}, got {x.shape[-1]}")
        x = x.astype(np.float32)
        dirs = 2 if self.bidirectional else 1
        n = x.shape[1]
        hshape = (self.num_layers * dirs, n, self.hidden_size)
        if hx is None:
            h0 = c0 = xp.zeros(hshape, np.float32)
        else:
            h0, c0 = (t._data.astype(np.float32) for t in hx)
            if not batched:
                h0, c0 = h0[:, None], c0[:, None]
            for what, a in (("hidden", h0), ("hidden[1]", c0)):
                if a.shape != hshape:
                    raise RuntimeError(f"Expected {what} size {hshape}, "
                                       f"got {list(a.shape)}")
        hn, cn = [], []
        for layer in range(self.num_layers):
            outs = []
            for d in range(dirs):
                k = layer * dirs + d
                sfx = self._names[k]
                y, h, c = self._run(xp, x, h0[k], c0[k], sfx, d == 1)
                outs.append(y)
                hn.append(h)
                cn.append(c)
            x = outs[0] if dirs == 1 else xp.concatenate(outs, -1)
        h_n, c_n = xp.stack(hn), xp.stack(cn)
        if not batched:
            x, h_n, c_n = x[:, 0], h_n[:, 0], c_n[:, 0]
        elif self.batch_first:
            x = x.transpose(1, 0, 2)
        w = Tensor._wrap
        return w(xp.ascontiguousarray(x)), (w(h_n), w(c_n))

    def _get_name(self):
        return "DynamicQuantizedLSTM"

    def extra_repr(self):
        s = f"{self.input_size}, {self.hidden_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if self.batch_first:
            s += ", batch_first=True"
        if self.bidirectional:
            s += ", bidirectional=True"
        return s + f", dtype={self.dtype}"
