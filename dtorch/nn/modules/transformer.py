"""Transformer, TransformerEncoder(Layer), TransformerDecoder(Layer) with
PyTorch's submodule names (so state_dict keys map 1:1), defaults,
post-norm / pre-norm (``norm_first``), ``batch_first`` and masks (boolean or
additive float, key padding, causal).

The layers are compositions of MultiheadAttention, Linear, Dropout and
LayerNorm; PyTorch's fused "fast path" (inference only) computes the same
function and has no counterpart here.
"""
import copy

from .module import Module
from .activation import MultiheadAttention
from .container import ModuleList
from .dropout import Dropout
from .linear import Linear
from .normalization import LayerNorm
from .. import functional as F
from .. import init
from ..._creation import full
from ... import _backend as B

__all__ = ["Transformer", "TransformerEncoder", "TransformerDecoder",
           "TransformerEncoderLayer", "TransformerDecoderLayer"]


def _get_clones(module, n):
    return ModuleList([copy.deepcopy(module) for _ in range(n)])


def _get_activation_fn(activation):
    if activation == "relu":
        return F.relu
    if activation == "gelu":
        return F.gelu
    raise RuntimeError(f"activation should be relu/gelu, not {activation}")


def _generate_square_subsequent_mask(sz, device=None, dtype=None):
    """Float mask with -inf above the diagonal: position i may attend to
    positions <= i."""
    return full((sz, sz), float("-inf"), dtype=dtype or B.get_default_dtype(),
                device=device).triu(1)


def _detect_is_causal_mask(mask, is_causal=None, size=None):
    """True when ``mask`` is exactly the causal mask (PyTorch uses this to
    pick kernels; here it only forwards the hint)."""
    make_causal = is_causal is True
    if is_causal is None and mask is not None:
        sz = size if size is not None else mask.shape[-2]
        causal = _generate_square_subsequent_mask(sz, dtype=mask.dtype) \
            if mask.dtype != B.bool_ else \
            _generate_square_subsequent_mask(sz).isinf()
        if tuple(mask.shape) == tuple(causal.shape):
            make_causal = bool((mask.to(causal.dtype) == causal).all())
        else:
            make_causal = False
    return make_causal


class _TransformerLayer(Module):
    """What encoder and decoder layers share: ``_n`` attention sublayers
    (self-attention, then cross-attention in the decoder), the feed-forward
    block, and one LayerNorm and one Dropout per sublayer plus the
    feed-forward one. Submodules are created in PyTorch's order so
    ``state_dict`` keys and parameter order match."""
    __constants__ = ["norm_first"]
    _n = 2          # sublayers incl. the feed-forward block

    def __init__(self, d_model, nhead, dim_feedforward=2048, dropout=0.1,
                 activation=F.relu, layer_norm_eps=1e-5, batch_first=False,
                 norm_first=False, bias=True, device=None, dtype=None):
        super().__init__()
        fk = {"device": device, "dtype": dtype}
        for name in ("self_attn", "multihead_attn")[:self._n - 1]:
            setattr(self, name, MultiheadAttention(
                d_model, nhead, dropout=dropout, bias=bias,
                batch_first=batch_first, **fk))
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, **fk)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, **fk)
        self.norm_first = norm_first
        for i in range(1, self._n + 1):
            setattr(self, f"norm{i}",
                    LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **fk))
        for i in range(1, self._n + 1):
            setattr(self, f"dropout{i}", Dropout(dropout))
        if isinstance(activation, str):
            activation = _get_activation_fn(activation)
        self.activation = activation

    def _sa_block(self, x, attn_mask, key_padding_mask, is_causal=False):
        x = self.self_attn(x, x, x, attn_mask=attn_mask,
                           key_padding_mask=key_padding_mask,
                           need_weights=False,
                           is_causal=is_causal and attn_mask is None)[0]
        return self.dropout1(x)

    def _ff_block(self, x):
        x = self.linear2(self.dropout(self.activation(self.linear1(x))))
        return getattr(self, f"dropout{self._n}")(x)


class TransformerEncoderLayer(_TransformerLayer):
    """Self-attention then a feed-forward block, each with dropout, a
    residual connection and LayerNorm (after, or before with
    ``norm_first=True``).

    Example::

        layer = nn.TransformerEncoderLayer(d_model=64, nhead=4,
                                           batch_first=True)
        out = layer(torch.randn(8, 10, 64))
    """
    _n = 2

    def forward(self, src, src_mask=None, src_key_padding_mask=None,
                is_causal=False):
        x = src
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask,
                                   src_key_padding_mask, is_causal)
            x = x + self._ff_block(self.norm2(x))
        else:
            x = self.norm1(x + self._sa_block(x, src_mask,
                                              src_key_padding_mask,
                                              is_causal))
            x = self.norm2(x + self._ff_block(x))
        return x


class TransformerDecoderLayer(_TransformerLayer):
    """Self-attention, attention over the encoder's output (``memory``),
    then a feed-forward block; each with dropout, residual and LayerNorm.
    """
    _n = 3

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None,
                tgt_key_padding_mask=None, memory_key_padding_mask=None,
                tgt_is_causal=False, memory_is_causal=False):
        x = tgt
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), tgt_mask,
                                   tgt_key_padding_mask, tgt_is_causal)
            x = x + self._mha_block(self.norm2(x), memory, memory_mask,
                                    memory_key_padding_mask,
                                    memory_is_causal)
            x = x + self._ff_block(self.norm3(x))
        else:
            x = self.norm1(x + self._sa_block(x, tgt_mask,
                                              tgt_key_padding_mask,
                                              tgt_is_causal))
            x = self.norm2(x + self._mha_block(x, memory, memory_mask,
                                               memory_key_padding_mask,
                                               memory_is_causal))
            x = self.norm3(x + self._ff_block(x))
        return x

    def _mha_block(self, x, mem, attn_mask, key_padding_mask,
                   is_causal=False):
        x = self.multihead_attn(x, mem, mem, attn_mask=attn_mask,
                                key_padding_mask=key_padding_mask,
                                is_causal=is_causal and attn_mask is None,
                                need_weights=False)[0]
        return self.dropout2(x)


class TransformerEncoder(Module):
    """A stack of ``num_layers`` deep copies of ``encoder_layer`` (keys
    ``layers.0. ...``), then an optional final ``norm``."""
    __constants__ = ["norm"]

    def __init__(self, encoder_layer, num_layers, norm=None,
                 enable_nested_tensor=True, mask_check=True):
        super().__init__()
        self.layers = _get_clones(encoder_layer, num_layers)
        self.num_layers = num_layers
        self.norm = norm
        # nested tensors are a CUDA inference optimisation in PyTorch
        self.enable_nested_tensor = False
        self.use_nested_tensor = False
        self.mask_check = mask_check

    def forward(self, src, mask=None, src_key_padding_mask=None,
                is_causal=None):
        _check_padding_mask(src_key_padding_mask, "src_key_padding_mask")
        batch_first = self.layers[0].self_attn.batch_first \
            if len(self.layers) else False
        seq_len = src.shape[1 if batch_first and src.dim() == 3 else 0]
        is_causal = _detect_is_causal_mask(mask, is_causal, seq_len)
        out = src
        for mod in self.layers:
            out = mod(out, src_mask=mask, is_causal=is_causal,
                      src_key_padding_mask=src_key_padding_mask)
        if self.norm is not None:
            out = self.norm(out)
        return out


class TransformerDecoder(Module):
    """A stack of ``num_layers`` deep copies of ``decoder_layer``, then an
    optional final ``norm``."""
    __constants__ = ["norm"]

    def __init__(self, decoder_layer, num_layers, norm=None):
        super().__init__()
        self.layers = _get_clones(decoder_layer, num_layers)
        self.num_layers = num_layers
        self.norm = norm

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None,
                tgt_key_padding_mask=None, memory_key_padding_mask=None,
                tgt_is_causal=None, memory_is_causal=False):
        _check_padding_mask(tgt_key_padding_mask, "tgt_key_padding_mask")
        _check_padding_mask(memory_key_padding_mask,
                            "memory_key_padding_mask")
        batch_first = self.layers[0].self_attn.batch_first \
            if len(self.layers) else False
        seq_len = tgt.shape[1 if batch_first and tgt.dim() == 3 else 0]
        tgt_is_causal = _detect_is_causal_mask(tgt_mask, tgt_is_causal,
                                               seq_len)
        out = tgt
        for mod in self.layers:
            out = mod(out, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                      tgt_key_padding_mask=tgt_key_padding_mask,
                      memory_key_padding_mask=memory_key_padding_mask,
                      tgt_is_causal=tgt_is_causal,
                      memory_is_causal=memory_is_causal)
        if self.norm is not None:
            out = self.norm(out)
        return out


def _check_padding_mask(mask, name):
    if mask is not None and mask.dtype != B.bool_ and \
            not mask.dtype.is_floating_point:
        raise AssertionError(f"only bool and floating types of {name} are "
                             f"supported")


class Transformer(Module):
    """The encoder-decoder model of "Attention Is All You Need", with
    PyTorch's defaults (d_model 512, 8 heads, 6 + 6 layers, feed-forward
    2048, dropout 0.1) and Xavier-uniform initialisation of every matrix.

    Example::

        model = nn.Transformer(d_model=32, nhead=4, num_encoder_layers=2,
                               num_decoder_layers=2, batch_first=True)
        mask = nn.Transformer.generate_square_subsequent_mask(tgt.size(1))
        out = model(src, tgt, tgt_mask=mask)
    """

    def __init__(self, d_model=512, nhead=8, num_encoder_layers=6,
                 num_decoder_layers=6, dim_feedforward=2048, dropout=0.1,
                 activation=F.relu, custom_encoder=None, custom_decoder=None,
                 layer_norm_eps=1e-5, batch_first=False, norm_first=False,
                 bias=True, device=None, dtype=None):
        super().__init__()
        fk = {"device": device, "dtype": dtype}
        for side, custom, Layer, Stack, n in (
                ("encoder", custom_encoder, TransformerEncoderLayer,
                 TransformerEncoder, num_encoder_layers),
                ("decoder", custom_decoder, TransformerDecoderLayer,
                 TransformerDecoder, num_decoder_layers)):
            if custom is None:
                layer = Layer(d_model, nhead, dim_feedforward, dropout,
                              activation, layer_norm_eps, batch_first,
                              norm_first, bias, **fk)
                norm = LayerNorm(d_model, eps=layer_norm_eps, bias=bias,
                                 **fk)
                custom = Stack(layer, n, norm)
            setattr(self, side, custom)
        self._reset_parameters()
        self.d_model = d_model
        self.nhead = nhead
        self.batch_first = batch_first

    def forward(self, src, tgt, src_mask=None, tgt_mask=None,
                memory_mask=None, src_key_padding_mask=None,
                tgt_key_padding_mask=None, memory_key_padding_mask=None,
                src_is_causal=None, tgt_is_causal=None,
                memory_is_causal=False):
        batched = src.dim() == 3
        if not self.batch_first and src.shape[1] != tgt.shape[1] and batched:
            raise RuntimeError("the batch number of src and tgt must be "
                               "equal")
        if self.batch_first and src.shape[0] != tgt.shape[0] and batched:
            raise RuntimeError("the batch number of src and tgt must be "
                               "equal")
        if src.shape[-1] != self.d_model or tgt.shape[-1] != self.d_model:
            raise RuntimeError("the feature number of src and tgt must be "
                               "equal to d_model")
        memory = self.encoder(src, mask=src_mask,
                              src_key_padding_mask=src_key_padding_mask,
                              is_causal=src_is_causal)
        return self.decoder(tgt, memory, tgt_mask=tgt_mask,
                            memory_mask=memory_mask,
                            tgt_key_padding_mask=tgt_key_padding_mask,
                            memory_key_padding_mask=memory_key_padding_mask,
                            tgt_is_causal=tgt_is_causal,
                            memory_is_causal=memory_is_causal)

    @staticmethod
    def generate_square_subsequent_mask(sz, device=None, dtype=None):
        return _generate_square_subsequent_mask(sz, device, dtype)

    def _reset_parameters(self):
        for p in self.parameters():
            if p.dim() > 1:
                init.xavier_uniform_(p)
