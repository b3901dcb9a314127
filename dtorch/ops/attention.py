"""Attention: ``scaled_dot_product_attention`` as one op, forward and
backward side by side.

Composed from matmul, masked_fill, softmax and dropout, attention keeps
every intermediate (B, H, L, S) array alive until backward: the scores,
the masked scores, the probabilities, the dropout mask and the dropped
probabilities. Here forward works in place on one (B, H, L, S) buffer
(scores -> masked -> probabilities) and backward keeps only q, k, v, the
output and the probabilities. The dropout mask costs no memory at all: a
dropped probability is saved with its sign bit set (probabilities are
>= 0), so backward reads the mask back from the sign.

Grouped-query attention never repeats key/value heads: the query is viewed
as (..., Hkv, G * L, E), so each key/value head meets its G query heads in
one GEMM, and the key/value gradients of a group sum inside that GEMM.
"""
import numpy as np

from .._backend import get_array_module
from .base import Op, unbroadcast, float32_compute


def _grouped(x, groups):
    """(..., Hkv * G, L, D) -> (..., Hkv, G * L, D): a view when x is
    contiguous per head group."""
    if groups == 1:
        return x
    s = x.shape
    return x.reshape(s[:-3] + (s[-3] // groups, groups * s[-2], s[-1]))


def _heads(x, groups, n_rows):
    """Inverse of ``_grouped``: (..., Hkv, G * L, D) -> (..., Hq, L, D)."""
    if groups == 1:
        return x
    s = x.shape
    return x.reshape(s[:-3] + (s[-3] * groups, n_rows, s[-1]))


def _mT(x):
    return x.swapaxes(-1, -2)


@float32_compute
class ScaledDotProductAttention(Op):
    """softmax(q k^T * scale + mask) (dropout) v over the last two dims.

    Arrays: ``q`` (..., Hq, L, E), ``k`` (..., Hkv, S, E), ``v``
    (..., Hkv, S, Ev) with Hq = groups * Hkv; ``mask`` None, boolean
    (True = may attend) or additive float, broadcasting to the scores
    (..., Hq, L, S); ``keep`` None or the boolean dropout keep-mask of the
    scores' shape, drawn by the caller. ``causal``: PyTorch's top-left
    causal mask (query i sees keys j <= i, also when L != S). A row that
    can attend to nothing gives 0 and a zero gradient (PyTorch's
    _safe_softmax), not NaN.
    """
    @staticmethod
    def forward(ctx, q, k, v, mask=None, keep=None, scale=1.0,
                causal=False, p=0.0, groups=1):
        xp = get_array_module(q)
        L = q.shape[-2]
        qg = _grouped(q, groups)
        # the scale goes on q (L x E) rather than on the L x S scores
        s = xp.matmul(qg * q.dtype.type(scale), _mT(k))
        sh = _heads(s, groups, L)                  # a view of s
        if causal:
            xp.copyto(sh, -np.inf,
                      where=xp.triu(xp.ones(sh.shape[-2:], bool), 1))
        if mask is not None:
            if mask.dtype == np.bool_:
                xp.copyto(sh, -np.inf, where=~mask)
            else:
                sh += mask.astype(s.dtype, copy=False)
        if s.size:
            _softmax_(xp, s)
        sd = 0.0
        if keep is not None:
            sd = 1.0 / (1.0 - p) if p < 1.0 else 0.0
            keep = keep.reshape(s.shape)
            out = xp.matmul(s * keep, v)
            out *= out.dtype.type(sd)
            # the mask lives on in the sign bit of the saved probabilities
            drop = ~keep
            if xp is np:
                np.negative(s, out=s, where=drop)
            else:
                xp.copyto(s, -s, where=drop)
        else:
            out = xp.matmul(s, v)
        out = _heads(out, groups, L)
        ctx.save_for_backward(q, k, v, s, out)
        ctx.scale, ctx.sd, ctx.groups = scale, sd, groups
        ctx.dropped = keep is not None
        ctx.mask_shape = None if mask is None else mask.shape
        return out

    @staticmethod
    def backward(ctx, g):
        q, k, v, P, out = ctx.to_save
        xp = get_array_module(g)
        G, need = ctx.groups, ctx.needs_input_grad
        L = q.shape[-2]
        dt = P.dtype.type
        gg = _grouped(g, G)
        # rowsum(dP * P) from the output (..., L, Ev), not the L x S arrays
        delta = _grouped((g * out).sum(axis=-1, keepdims=True), G)
        dv = None
        if not ctx.dropped:
            if need[2]:
                dv = xp.matmul(_mT(P), gg)
            dS = xp.matmul(gg, _mT(v))
            dS -= delta
            dS *= P
        else:
            sd = dt(ctx.sd)
            kept = xp.maximum(P, dt(0))           # P * keep
            if need[2]:
                dv = xp.matmul(_mT(kept), gg)
                dv *= sd
            dPd = xp.matmul(gg, _mT(v))
            # dS = P * (dPd * keep * sd - delta)
            kept *= dPd
            kept *= sd
            xp.abs(P, out=dPd)
            dPd *= delta
            kept -= dPd
            dS = kept
        dq = dk = dmask = None
        if need[0]:
            dq = xp.matmul(dS, k)
            dq *= dt(ctx.scale)
            dq = unbroadcast(_heads(dq, G, L), q.shape)
        if need[1]:
            dk = xp.matmul(_mT(dS), _grouped(q, G))
            dk *= dt(ctx.scale)
            dk = unbroadcast(dk, k.shape)
        if dv is not None:
            dv = unbroadcast(dv, v.shape)
        if need[3] and ctx.mask_shape is not None:
            dmask = unbroadcast(_heads(dS, G, L), ctx.mask_shape)
        return dq, dk, dv, dmask, None


def _softmax_(xp, s):
    """Softmax over the last axis of ``s``, in place. A row that is -inf
    throughout becomes 0 (PyTorch's _safe_softmax): its max is taken as 0,
    its exp sums to 0, and the reciprocal of that sum is set to 0."""
    m = s.max(axis=-1, keepdims=True)
    if s.dtype.kind == "f":
        xp.copyto(m, 0, where=m == -np.inf)
    s -= m
    xp.exp(s, out=s)
    tot = s.sum(axis=-1, keepdims=True)
    xp.copyto(tot, np.inf, where=tot == 0)
    s *= xp.reciprocal(tot)
