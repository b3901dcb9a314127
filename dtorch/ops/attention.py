"""Attention: ``scaled_dot_product_attention`` as one op, forward and
backward side by side.

Composed from matmul, masked_fill, softmax and dropout, attention keeps
every intermediate (B, H, L, S) array alive until backward: the scores,
the masked scores, the probabilities, the dropout mask and the dropped
probabilities. Here forward works in place on one (B, H, L, S) buffer
(scores -> masked -> probabilities) and backward keeps only q, k, v, the
output and the probabilities. The dropout mask costs no memory at all: a
dropped probability is saved negated (probabilities are >= 0), so backward
reads the mask back from the sign; a dropped 0 reads as kept, which
changes nothing (its gradient is 0 either way).

Grouped-query attention never repeats key/value heads: the query is viewed
as (..., Hkv, G * L, E), so each key/value head meets its G query heads in
one GEMM, and the key/value gradients of a group sum inside that GEMM.
"""
import numpy as np

from .. import _kernels
from .._backend import get_array_module
from .activation import Softmax
from .base import Op, unbroadcast, float32_compute
from .recompute import pin_all


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
    _safe_softmax), not NaN. ``lse=True`` keeps the rows' log-sum-exp in
    ``ctx.lse``: the block kernel of context-parallel attention.
    """
    @staticmethod
    def forward(ctx, q, k, v, mask=None, keep=None, scale=1.0,
                causal=False, p=0.0, groups=1, lse=False):
        xp = get_array_module(q)
        L = q.shape[-2]
        qg = _grouped(q, groups)
        # the scale goes on q (L x E) rather than on the L x S scores
        s = xp.matmul(qg * q.dtype.type(scale), _mT(k))
        sh = _heads(s, groups, L)                  # a view of s
        # masks are added as 0 / -inf, as PyTorch's math path does; an add
        # is a plain vector pass, where copyto(where=) of a broadcast bool
        # mask took 8x as long (0.79 against 0.10 ms on 32x128x128 float32)
        ninf = s.dtype.type(-np.inf)
        if causal:
            sh += xp.triu(xp.full(sh.shape[-2:], ninf), 1)
        if mask is not None:
            if mask.dtype == np.bool_:
                mask = xp.where(mask, s.dtype.type(0), ninf)
            sh += mask.astype(s.dtype, copy=False)
        # lse: the rows' log-sum-exp (..., Hkv, G * L, 1), kept on ctx for a
        # caller that merges this block into a longer softmax (context
        # parallel attention); its backward then takes the row sums from
        # the merged output it puts in place of ``out``
        rows_lse = _softmax_(xp, s) if s.size else \
            xp.full(s.shape[:-1] + (1,), -np.inf, s.dtype)
        ctx.lse = rows_lse if lse else None
        sd = 0.0
        if keep is not None:
            sd = 1.0 / (1.0 - p) if p < 1.0 else 0.0
            kept = s * keep.reshape(s.shape)
            out = xp.matmul(kept, v)
            out *= out.dtype.type(sd)
            # the mask lives on in the sign bit of the saved probabilities:
            # s = 2 kept - s is P where kept, -P where dropped (exactly;
            # two plain passes, where np.negative(where=) took 6x as long)
            xp.subtract(kept, s, out=s)
            s += kept
            del kept
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
        if ctx._gmake is None:
            return _grads(ctx, g)
        if ctx.__dict__.get("_lowp"):
            return NotImplemented      # float16/bfloat16: first order only
        # create_graph: the array body works in place on its (.., L, S)
        # buffers and in the fused kernel, which no tensor can; its values
        # are pinned to the differentiable form's graph
        return pin_all(_graph_grads(ctx, g), _grads(ctx, g._data))


def _grads(ctx, g):
    """The gradients on arrays (the fast path)."""
    q, k, v, P, out = ctx.to_save
    xp = get_array_module(g)
    G, need = ctx.groups, ctx.needs_input_grad
    L = q.shape[-2]
    dt = P.dtype.type
    gg = _grouped(g, G)
    dv = None
    if not ctx.dropped:
        if need[2]:
            dv = xp.matmul(_mT(P), gg)
        dS = xp.matmul(gg, _mT(v))
        # (a merged block's row sums come from the merged output: the
        # fused kernel would take them from this block's P alone)
        kern = _kernels.kernels(P, dS) if xp is np and \
            ctx.lse is None else None
        if kern is not None:
            # dS = P (dP - rowsum(dP P)) in one fused pass (measured
            # 0.25 against NumPy's 0.51 ms on 4096x128 float32)
            kern.softmax_bwd(_rows(P), _rows(dS), _rows(dS))
        else:
            dS -= _delta(g, out, G)
            dS *= P
    else:
        gs = gg * dt(ctx.sd)      # the dropout scale, on (.., L, Ev)
        kept = xp.maximum(P, dt(0))           # P * keep
        if need[2]:
            dv = xp.matmul(_mT(kept), gs)
        dPd = xp.matmul(gs, _mT(v))
        # dS = P * (dPd * keep * sd - delta)
        kept *= dPd
        xp.abs(P, out=dPd)
        dPd *= _delta(g, out, G)
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


def _graph_grads(ctx, g):
    """The same gradients from differentiable tensor ops (double
    backward). The probabilities are recomputed as softmax(s + c) with
    s = q k^T * scale from the graph's q and k and the constant
    c = log P - s: equal to the saved P, with the softmax's derivative
    in s, and no need to keep the mask (a masked score has P = 0 and
    c = -inf)."""
    q, k, v, Pa, _ = ctx.to_save
    xp = get_array_module(Pa)
    G, need, L = ctx.groups, ctx.needs_input_grad, q.shape[-2]
    qt, kt, vt = (ctx.graph_input(i, a) for i, a in enumerate((q, k, v)))

    def grouped(t):
        return t.reshape(_grouped(t._data, G).shape)

    def heads(t):
        return t.reshape(_heads(t._data, G, L).shape)
    s = (grouped(qt) * ctx.scale) @ kt.transpose(-1, -2)
    with np.errstate(divide="ignore"):
        c = xp.log(xp.abs(Pa)) - s._data
    s = s + ctx.const(c)
    if need[3] and ctx.mask_shape is not None:
        # the float mask's own derivative: it enters s like q k^T
        m = ctx.graph_input(3, xp.zeros(ctx.mask_shape, Pa.dtype))
        s = grouped(heads(s) + m)
    Pt = Softmax.apply(s, dim=s.ndim - 1, safe=True)
    gg = grouped(g)
    A, dP = Pt, gg @ vt.transpose(-1, -2)
    if ctx.dropped:
        kd = ctx.const(xp.where(xp.signbit(Pa), Pa.dtype.type(0),
                               Pa.dtype.type(ctx.sd)))
        A, dP = Pt * kd, dP * kd
    dS = Pt * (dP - (dP * Pt).sum(-1, keepdim=True))
    dq = dk = dv = dmask = None
    if need[0]:
        dq = unbroadcast(heads(dS @ kt) * ctx.scale, q.shape)
    if need[1]:
        dk = unbroadcast((dS.transpose(-1, -2) @ grouped(qt))
                           * ctx.scale, k.shape)
    if need[2]:
        dv = unbroadcast(A.transpose(-1, -2) @ gg, v.shape)
    if need[3] and ctx.mask_shape is not None:
        dmask = unbroadcast(heads(dS), ctx.mask_shape)
    return dq, dk, dv, dmask, None


def _rows(a):
    return a.reshape(-1, a.shape[-1])


def _delta(g, out, G):
    # rowsum(dP * P) = rowsum(g * out): from (..., L, Ev), not L x S arrays
    return _grouped((g * out).sum(axis=-1, keepdims=True), G)


def _softmax_(xp, s):
    """Softmax over the last axis of ``s``, in place. A row that is -inf
    throughout becomes 0 (PyTorch's _safe_softmax): its max is taken as 0,
    its exp sums to 0, and the reciprocal of that sum is set to 0.
    (dtorch._kernels' fused softmax_fwd is no faster here: measured 0.99
    against NumPy's 0.97 ms on 4096x128 float32, and 13 ms in place.)"""
    m = s.max(axis=-1, keepdims=True)
    if s.dtype.kind == "f":
        xp.copyto(m, 0, where=m == -np.inf)
    s -= m
    xp.exp(s, out=s)
    tot = s.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        lse = m + xp.log(tot)       # -inf for a row that sees nothing
    xp.copyto(tot, np.inf, where=tot == 0)
    s *= xp.reciprocal(tot)
    return lse
