"""Activation modules and MultiheadAttention."""

from .module import Module
from .linear import NonDynamicallyQuantizableLinear
from ..parameter import Parameter
from .. import functional as F
from .. import init
from ..._creation import empty
from ._more import ELU, Hardtanh, Softplus, Softmax, LogSoftmax, \
    Softmin  # noqa: F401 (one functional call each: _more._simple)


class ReLU(Module):
    def __init__(self, inplace=False):
        super().__init__()
        self.inplace = inplace

    def forward(self, input):
        return F.relu(input, inplace=self.inplace)

    def extra_repr(self):
        return "inplace=True" if self.inplace else ""


class ReLU6(ReLU):
    def forward(self, input):
        return F.relu6(input, inplace=self.inplace)


class LeakyReLU(Module):
    def __init__(self, negative_slope=1e-2, inplace=False):
        super().__init__()
        self.negative_slope = negative_slope
        self.inplace = inplace

    def forward(self, input):
        return F.leaky_relu(input, self.negative_slope, self.inplace)

    def extra_repr(self):
        s = f"negative_slope={self.negative_slope}"
        return s + (", inplace=True" if self.inplace else "")


class GELU(Module):
    def __init__(self, approximate="none"):
        super().__init__()
        self.approximate = approximate

    def forward(self, input):
        return F.gelu(input, approximate=self.approximate)

    def extra_repr(self):
        return f"approximate={self.approximate!r}"


class SiLU(Module):
    def __init__(self, inplace=False):
        super().__init__()
        self.inplace = inplace

    def forward(self, input):
        return F.silu(input, self.inplace)

    def extra_repr(self):
        return "inplace=True" if self.inplace else ""


class Mish(SiLU):
    def forward(self, input):
        return F.mish(input, self.inplace)


class Sigmoid(Module):
    def forward(self, input):
        return input.sigmoid()


class Tanh(Module):
    def forward(self, input):
        return input.tanh()


class LogSigmoid(Module):
    def forward(self, input):
        return F.logsigmoid(input)


class MultiheadAttention(Module):
    """Multi-head attention with PyTorch's parameters (``in_proj_weight``,
    ``in_proj_bias``, ``out_proj``; ``q/k/v_proj_weight`` when kdim or vdim
    differ from embed_dim) and its (L, N, E) layout unless batch_first.

    Example::

        mha = nn.MultiheadAttention(16, 4, batch_first=True)
        out, weights = mha(x, x, x)
    """

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True,
                 add_bias_kv=False, add_zero_attn=False, kdim=None,
                 vdim=None, batch_first=False, device=None, dtype=None):
        super().__init__()
        if embed_dim <= 0 or num_heads <= 0:
            raise ValueError(
                f"embed_dim and num_heads must be greater than 0, got "
                f"embed_dim={embed_dim} and num_heads={num_heads} instead")
        fk = {"device": device, "dtype": dtype}
        self.embed_dim = embed_dim
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self._qkv_same_embed_dim = (self.kdim == embed_dim
                                    and self.vdim == embed_dim)
        self.num_heads = num_heads
        self.dropout = dropout
        self.batch_first = batch_first
        self.head_dim = embed_dim // num_heads
        if self.head_dim * num_heads != embed_dim:
            raise AssertionError("embed_dim must be divisible by num_heads")
        if not self._qkv_same_embed_dim:
            self.q_proj_weight = Parameter(empty((embed_dim, embed_dim),
                                                 **fk))
            self.k_proj_weight = Parameter(empty((embed_dim, self.kdim),
                                                 **fk))
            self.v_proj_weight = Parameter(empty((embed_dim, self.vdim),
                                                 **fk))
            self.register_parameter("in_proj_weight", None)
        else:
            self.in_proj_weight = Parameter(empty((3 * embed_dim, embed_dim),
                                                  **fk))
            self.register_parameter("q_proj_weight", None)
            self.register_parameter("k_proj_weight", None)
            self.register_parameter("v_proj_weight", None)
        if bias:
            self.in_proj_bias = Parameter(empty(3 * embed_dim, **fk))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = NonDynamicallyQuantizableLinear(
            embed_dim, embed_dim, bias=bias, **fk)
        if add_bias_kv:
            self.bias_k = Parameter(empty((1, 1, embed_dim), **fk))
            self.bias_v = Parameter(empty((1, 1, embed_dim), **fk))
        else:
            self.bias_k = self.bias_v = None
        self.add_zero_attn = add_zero_attn
        self._reset_parameters()

    def _reset_parameters(self):
        if self._qkv_same_embed_dim:
            init.xavier_uniform_(self.in_proj_weight)
        else:
            init.xavier_uniform_(self.q_proj_weight)
            init.xavier_uniform_(self.k_proj_weight)
            init.xavier_uniform_(self.v_proj_weight)
        if self.in_proj_bias is not None:
            init.constant_(self.in_proj_bias, 0.0)
            init.constant_(self.out_proj.bias, 0.0)
        if self.bias_k is not None:
            init.xavier_normal_(self.bias_k)
        if self.bias_v is not None:
            init.xavier_normal_(self.bias_v)

    def forward(self, query, key, value, key_padding_mask=None,
                need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        batched = query.dim() == 3
        if self.batch_first and batched:
            query, key, value = (t.transpose(1, 0)
                                 for t in (query, key, value))
        if not batched:
            query, key, value = (t.unsqueeze(1) for t in (query, key, value))
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        out, w = F.multi_head_attention_forward(
            query, key, value, self.embed_dim, self.num_heads,
            self.in_proj_weight, self.in_proj_bias, self.bias_k,
            self.bias_v, self.add_zero_attn,
            self.dropout, self.out_proj.weight, self.out_proj.bias,
            training=self.training, key_padding_mask=key_padding_mask,
            need_weights=need_weights, attn_mask=attn_mask,
            use_separate_proj_weight=not self._qkv_same_embed_dim,
            q_proj_weight=self.q_proj_weight,
            k_proj_weight=self.k_proj_weight,
            v_proj_weight=self.v_proj_weight,
            average_attn_weights=average_attn_weights, is_causal=is_causal)
        if not batched:
            out = out.squeeze(1)
            if w is not None:
                w = w.squeeze(0)
        elif self.batch_first:
            out = out.transpose(1, 0)
        return out, w

