"""Attention: scaled_dot_product_attention, multi_head_attention_forward."""
import math
import threading

import numpy as np

from ... import _backend as B
from ... import ops as N
from ...tensor import Tensor
from ...autograd.function import autocast_op
from .linear import linear
from .activation import softmax
from .dropout import _check_p, dropout
from ._common import _keep_mask


# ============================================================== attention ==

# context parallelism (dtorch.distributed.tensor.experimental's
# context_parallel) puts its attention here while its region is open: per
# thread, so a region of one thread rank (threads backend) never reaches
# another's
_context_parallel = threading.local()


# autocast: one op in PyTorch's lower-precision lists (CPU and CUDA)
@autocast_op("lower")
def scaled_dot_product_attention(query, key, value, attn_mask=None,
                                 dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):
    """softmax(q k^T * scale + mask) v over the last two dims, as one op
    (``dtorch.ops.ScaledDotProductAttention``). A boolean mask marks the
    positions that may attend (True = keep); a float mask is added to the
    scores (and gets a gradient). ``is_causal``: query i sees keys j <= i
    (top-left aligned when L != S). ``enable_gqa``: Hq query heads share
    Hkv key/value heads, each serving Hq / Hkv consecutive query heads.
    Dropout is applied whenever ``dropout_p`` > 0, as in PyTorch."""
    q, k, v = query, key, value
    if not (q.dtype == k.dtype == v.dtype):
        raise RuntimeError(
            f"Expected query, key, and value to have the same dtype, but got "
            f"query.dtype: {_ctype(q)} key.dtype: {_ctype(k)} and "
            f"value.dtype: {_ctype(v)} instead.")
    for t, name in ((k, "key"), (v, "value"), (attn_mask, "attn_mask")):
        if t is not None and t.device != q.device:
            raise RuntimeError(
                f"Expected all tensors to be on the same device, but found "
                f"at least two devices, {q.device} and {t.device}! ({name} "
                f"in scaled_dot_product_attention)")
    if q.ndim < 2 or k.ndim < 2 or v.ndim < 2:
        raise RuntimeError(
            f"scaled_dot_product_attention: query, key and value must have "
            f"at least 2 dimensions, got {q.ndim}, {k.ndim} and {v.ndim}")
    _check_p(dropout_p)
    if attn_mask is not None:
        if is_causal:
            raise RuntimeError(
                "_scaled_dot_product_attention: Explicit attn_mask should "
                "not be set when is_causal=True")
        if attn_mask.dtype != B.bool_ and \
                not attn_mask.dtype.is_floating_point:
            raise RuntimeError(
                f"Expected attn_mask dtype to be bool or float or to match "
                f"query dtype, but got attn_mask.dtype: {_ctype(attn_mask)} "
                f"and  query.dtype: {_ctype(q)} instead.")
        if attn_mask.dtype not in (B.bool_, q.dtype):
            attn_mask = attn_mask.to(q.dtype)
    E, L, S = q.shape[-1], q.shape[-2], k.shape[-2]
    if k.shape[-1] != E or v.shape[-2] != S:
        raise RuntimeError(
            f"scaled_dot_product_attention: expected key (..., S, {E}) and "
            f"value (..., S, Ev) with the same S, got query "
            f"{tuple(q.shape)}, key {tuple(k.shape)}, value "
            f"{tuple(v.shape)}")
    groups = 1
    if q.ndim >= 3 and k.ndim >= 3 and v.ndim >= 3:
        hq, hk, hv = q.shape[-3], k.shape[-3], v.shape[-3]
        if enable_gqa and (hk != hq or hv != hq):
            if hk != hv or hq % hk:
                # PyTorch's words (2.13 cuts them short after "in"), then
                # the numbers
                raise RuntimeError(
                    f"Number of heads in key and value must divide the "
                    f"number of heads in query: enable_gqa=True needs the "
                    f"number of query heads ({hq}) to be a multiple of the "
                    f"key/value heads ({hk}, {hv}), and key and value to "
                    f"have the same number of heads")
            groups = hq // hk
    try:
        batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2],
                                    v.shape[:-2]) if groups == 1 else \
            np.broadcast_shapes(q.shape[:-3], k.shape[:-3], v.shape[:-3]) \
            + (q.shape[-3],)
    except ValueError:
        raise RuntimeError(
            f"scaled_dot_product_attention: the batch dimensions of query "
            f"{tuple(q.shape)}, key {tuple(k.shape)} and value "
            f"{tuple(v.shape)} do not broadcast") from None
    cp = getattr(_context_parallel, "attention", None)
    if cp is not None:
        return cp(q, k, v, attn_mask, float(dropout_p), bool(is_causal),
                  1.0 / math.sqrt(E) if scale is None else float(scale),
                  groups, batch)
    shape = batch + (L, S)
    if attn_mask is not None and not broadcasts_to(attn_mask.shape, shape):
        raise RuntimeError(
            f"scaled_dot_product_attention: attn_mask of shape "
            f"{tuple(attn_mask.shape)} does not broadcast to the "
            f"attention scores' shape {shape}")
    scale = 1.0 / math.sqrt(E) if scale is None else float(scale)
    keep = None
    if dropout_p > 0.0:
        keep = _keep_mask(q, dropout_p, shape=shape)
    return N.ScaledDotProductAttention.apply(
        q, k, v, attn_mask, keep, scale=scale, causal=bool(is_causal),
        p=float(dropout_p), groups=groups)


def broadcasts_to(shape, target):
    """Whether an array of ``shape`` broadcasts to ``target`` (a mask to
    the scores)."""
    try:
        return np.broadcast_shapes(target, shape) == tuple(target)
    except ValueError:
        return False


def _ctype(t):
    # PyTorch's C++ type names in its dtype error messages
    return {"float32": "float", "float64": "double", "float16": "c10::Half",
            "bfloat16": "c10::BFloat16", "int64": "long int",
            "int32": "int", "bool": "bool"}.get(str(t.dtype).split(".")[-1],
                                                str(t.dtype))


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


def _sdpa_mask(attn_mask, key_padding_mask, bsz, heads, L, S, dtype, xp):
    """MultiheadAttention's masks (True = masked out, or additive floats)
    as one mask for scaled_dot_product_attention over (N, H, L, S): a
    boolean keep-mask when both are boolean, else an additive float mask;
    each shaped to broadcast, never expanded to (N, H, L, S)."""
    parts = []
    if attn_mask is not None:
        m = attn_mask._data
        parts.append(m.reshape((1, 1, L, S) if m.ndim == 2
                               else (bsz, heads, L, S)))
    if key_padding_mask is not None:
        parts.append(key_padding_mask._data.reshape(bsz, 1, 1, S))
    if not parts:
        return None
    if all(p.dtype == np.bool_ for p in parts):
        drop = parts[0] if len(parts) == 1 else parts[0] | parts[1]
        return Tensor._wrap(~drop)
    mask = None
    for p in parts:
        p = xp.where(p, -np.inf, 0.0).astype(dtype) if p.dtype == np.bool_ \
            else p.astype(dtype, copy=False)
        mask = p if mask is None else mask + p
    return Tensor._wrap(mask)


def _pad_mask(m):
    """A mask with one more key column that masks nothing (False / 0)."""
    if m is None:
        return None
    return N.Cat.apply(m, m.new_zeros(tuple(m.shape[:-1]) + (1,)), dim=-1)


def multi_head_attention_forward(
        query, key, value, embed_dim_to_check, num_heads, in_proj_weight,
        in_proj_bias, bias_k, bias_v, add_zero_attn, dropout_p,
        out_proj_weight, out_proj_bias, training=True, key_padding_mask=None,
        need_weights=True, attn_mask=None, use_separate_proj_weight=False,
        q_proj_weight=None, k_proj_weight=None, v_proj_weight=None,
        static_k=None, static_v=None, average_attn_weights=True,
        is_causal=False):
    """PyTorch's multi-head attention on (L, N, E) inputs."""
    if static_k is not None or static_v is not None:
        raise NotImplementedError(
            "multi_head_attention_forward: static_k/static_v are not "
            "supported")
    if (bias_k is None) != (bias_v is None):     # PyTorch's texts
        raise AssertionError("bias_v is set but bias_k is None" if bias_k
                             is None else "bias_k is set but bias_v is None")
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
    # extra key/value positions, as PyTorch: the learnt bias_k/bias_v,
    # then a zero one (add_zero_attn: zero per head = a zero row here);
    # the masks grow by a column that masks nothing
    extra = ([(bias_k, bias_v)] if bias_k is not None else []) + \
        ([None] if add_zero_attn else [])
    for kv in extra:
        bk, bv = (k.new_zeros((1, 1, E)),) * 2 if kv is None else kv
        k = N.Cat.apply(k, bk.reshape(1, 1, E).expand(1, bsz, E), dim=0)
        v = N.Cat.apply(v, bv.reshape(1, 1, E).expand(1, bsz, E), dim=0)
        attn_mask = _pad_mask(attn_mask)
        key_padding_mask = _pad_mask(key_padding_mask)
    S = k.shape[0]
    if not need_weights:
        # PyTorch's fast path: attention as one op, on (N, H, L, hd)
        q, k, v = (t.reshape(n, bsz, num_heads, hd).permute(1, 2, 0, 3)
                   for t, n in ((q, L), (k, S), (v, S)))
        xp = query._xp()
        causal = is_causal and attn_mask is None
        if causal and key_padding_mask is not None:
            attn_mask = Tensor._wrap(xp.triu(xp.ones((L, S), bool), 1))
            causal = False
        mask = _sdpa_mask(attn_mask, key_padding_mask, bsz, num_heads, L,
                          S, query._data.dtype, xp)
        out = scaled_dot_product_attention(
            q, k, v, mask, dropout_p if training else 0.0, is_causal=causal)
        out = out.permute(2, 0, 1, 3).reshape(L, bsz, E)
        return linear(out, out_proj_weight, out_proj_bias), None
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
