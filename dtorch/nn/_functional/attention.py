"""Attention: scaled_dot_product_attention, multi_head_attention_forward."""
import math

import numpy as np

from ... import _backend as B
from ... import ops as N
from ...tensor import Tensor
from .linear import linear
from .activation import softmax
from .dropout import dropout


# ============================================================== attention ==

def scaled_dot_product_attention(query, key, value, attn_mask=None,
                                 dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):
    """softmax(q k^T * scale + mask) v over the last two dims; a boolean
    mask marks the positions that may attend (True = keep)."""
    L, S = query.shape[-2], key.shape[-2]
    if enable_gqa and query.ndim >= 3 and key.shape[-3] != query.shape[-3]:
        # grouped-query attention: each key/value head serves a group of
        # consecutive query heads
        hq, hkv = query.shape[-3], key.shape[-3]
        if hq % hkv or value.shape[-3] != hkv:
            raise RuntimeError(
                f"scaled_dot_product_attention(enable_gqa=True): the number "
                f"of query heads ({hq}) must be a multiple of the key/value "
                f"heads ({hkv}, {value.shape[-3]})")
        key = key.repeat_interleave(hq // hkv, dim=-3)
        value = value.repeat_interleave(hq // hkv, dim=-3)
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    att = (query @ key.transpose(-2, -1)) * scale
    xp = query._xp()
    if is_causal:
        keep = xp.tril(xp.ones((L, S), dtype=bool))
        att = att.masked_fill(Tensor._wrap(~keep), float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == B.bool_:
            att = att.masked_fill(attn_mask.logical_not(), float("-inf"))
        else:
            att = att + attn_mask
    # a fully masked row attends to nothing: 0, not NaN (PyTorch's
    # _safe_softmax)
    att = N.Softmax.apply(att, dim=att.ndim - 1, safe=True)
    if dropout_p > 0.0:
        att = dropout(att, dropout_p)
    return att @ value


def _mha_masks(attn_mask, key_padding_mask, bsz, heads, L, S, dtype):
    """One float mask (adds -inf where attention is not allowed), shaped to
    broadcast over (N * heads, L, S), or None."""
    mask = None
    if attn_mask is not None:
        if attn_mask.dtype == B.bool_:
            m = attn_mask._data
            mask = attn_mask._xp().where(m, -np.inf, 0.0).astype(dtype)
        else:
            mask = attn_mask._data.astype(dtype, copy=False)
        if mask.ndim == 2:
            mask = mask[None]
    if key_padding_mask is not None:
        k = key_padding_mask._data
        if k.dtype == np.bool_:
            k = key_padding_mask._xp().where(k, -np.inf, 0.0).astype(dtype)
        k = key_padding_mask._xp().broadcast_to(
            k.reshape(bsz, 1, 1, S), (bsz, heads, 1, S)).reshape(
                bsz * heads, 1, S)
        mask = k if mask is None else mask + k
    return mask


def multi_head_attention_forward(
        query, key, value, embed_dim_to_check, num_heads, in_proj_weight,
        in_proj_bias, bias_k, bias_v, add_zero_attn, dropout_p,
        out_proj_weight, out_proj_bias, training=True, key_padding_mask=None,
        need_weights=True, attn_mask=None, use_separate_proj_weight=False,
        q_proj_weight=None, k_proj_weight=None, v_proj_weight=None,
        static_k=None, static_v=None, average_attn_weights=True,
        is_causal=False):
    """PyTorch's multi-head attention on (L, N, E) inputs."""
    if bias_k is not None or bias_v is not None or add_zero_attn or \
            static_k is not None or static_v is not None:
        raise NotImplementedError(
            "multi_head_attention_forward: bias_k/bias_v, add_zero_attn and "
            "static_k/static_v are not supported")
    L, bsz, E = query.shape
    S = key.shape[0]
    if E != embed_dim_to_check:
        raise AssertionError(
            f"was expecting embedding dimension of {embed_dim_to_check}, "
            f"but got {E}")
    hd = E // num_heads
    if use_separate_proj_weight:
        bq = bk = bv = None
        if in_proj_bias is not None:
            bq, bk, bv = in_proj_bias.chunk(3)
        q = linear(query, q_proj_weight, bq)
        k = linear(key, k_proj_weight, bk)
        v = linear(value, v_proj_weight, bv)
    else:
        wq, wk, wv = in_proj_weight.chunk(3)
        bq = bk = bv = None
        if in_proj_bias is not None:
            bq, bk, bv = in_proj_bias.chunk(3)
        if query is key and key is value:
            q, k, v = linear(query, in_proj_weight, in_proj_bias).chunk(3, -1)
        else:
            q = linear(query, wq, bq)
            k = linear(key, wk, bk)
            v = linear(value, wv, bv)
    q = q.reshape(L, bsz * num_heads, hd).transpose(0, 1)
    k = k.reshape(S, bsz * num_heads, hd).transpose(0, 1)
    v = v.reshape(S, bsz * num_heads, hd).transpose(0, 1)
    att = (q @ k.transpose(1, 2)) * (1.0 / math.sqrt(hd))
    if is_causal and attn_mask is None:
        xp = query._xp()
        attn_mask = Tensor._wrap(~xp.tril(xp.ones((L, S), dtype=bool)))
    mask = _mha_masks(attn_mask, key_padding_mask, bsz, num_heads, L, S,
                      query._data.dtype)
    if mask is not None:
        att = att + Tensor._wrap(mask)
    att = softmax(att, -1)
    if dropout_p > 0.0 and training:
        att = dropout(att, dropout_p)
    out = (att @ v).transpose(0, 1).reshape(L, bsz, E)
    out = linear(out, out_proj_weight, out_proj_bias)
    if not need_weights:
        return out, None
    w = att.reshape(bsz, num_heads, L, S)
    if average_attn_weights:
        w = w.mean(1)
    return out, w
