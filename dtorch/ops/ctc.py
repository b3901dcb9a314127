"""CTC loss (Graves et al. 2006), forward and backward side by side.

The forward-backward recursions run in log space over the extended label
sequence (blanks between labels), vectorised over the batch and the label
positions; the loops run over time steps. The gradient is PyTorch's: with
respect to ``log_probs`` it is ``exp(log_probs) - occupation / p``, which
assumes the log-probabilities come from a log_softmax (the gradient through
it is then the exact gradient of the logits), and it is zero past each
sample's input length. The recursions run in NumPy (a CuPy tensor's data is
copied to the host and the gradient back).
"""
import numpy as np

from .._backend import get_array_module
from ..autograd.function import once_differentiable
from .base import Op

_NEG = -np.inf


def _lse(*arrays):
    """Elementwise log(sum(exp(a_i))) with -inf handled."""
    m = arrays[0]
    for a in arrays[1:]:
        m = np.maximum(m, a)
    safe = np.where(np.isfinite(m), m, 0.0)
    s = sum(np.exp(a - safe) for a in arrays)
    with np.errstate(divide="ignore"):
        return np.log(s) + safe


class CTCLoss(Op):
    """Per-sample negative log-likelihoods (N,) of ``targets`` under
    ``log_probs`` (T, N, C)."""
    @staticmethod
    def forward(ctx, log_probs, targets=None, input_lengths=None,
                target_lengths=None, blank=0, zero_infinity=False):
        xp = get_array_module(log_probs)
        lp = np.asarray(log_probs.get() if xp is not np else log_probs,
                        np.float64)
        T, N, C = lp.shape
        tl = np.asarray(target_lengths, np.int64)
        il = np.asarray(input_lengths, np.int64)
        L = int(tl.max()) if tl.size else 0
        S = 2 * L + 1
        ext = np.full((N, S), blank, np.int64)
        ext[:, 1::2] = targets[:, :L] if L else ext[:, 1::2]
        spos = np.arange(S)
        valid = spos[None, :] < (2 * tl + 1)[:, None]
        # the skip transition s-2 -> s: a label differing from s-2's
        skip = np.zeros((N, S), bool)
        skip[:, 2:] = (ext[:, 2:] != blank) & (ext[:, 2:] != ext[:, :-2])
        emit = np.take_along_axis(lp, np.broadcast_to(ext[None], (T, N, S)),
                                  2)                    # (T, N, S)
        alpha = np.full((T, N, S), _NEG)
        alpha[0, :, 0] = emit[0, :, 0]
        alpha[0, :, 1] = np.where(tl > 0, emit[0, :, 1], _NEG) if S > 1 \
            else alpha[0, :, 0]
        alpha[0] = np.where(valid, alpha[0], _NEG)
        for t in range(1, T):
            a = alpha[t - 1]
            a1 = np.concatenate([np.full((N, 1), _NEG), a[:, :-1]], 1)
            a2 = np.concatenate([np.full((N, 2), _NEG), a[:, :-2]], 1)
            a2 = np.where(skip, a2, _NEG)
            alpha[t] = np.where(valid, _lse(a, a1, a2) + emit[t], _NEG)
        last = il - 1
        n_idx = np.arange(N)
        end = alpha[last, n_idx]                          # (N, S)
        s_last = 2 * tl
        ll = _lse(end[n_idx, s_last],
                  np.where(tl > 0, end[n_idx, np.maximum(s_last - 1, 0)],
                           _NEG))
        nll = -ll
        # beta (including the emission at t), from each sample's last step
        beta = np.full((T, N, S), _NEG)
        for t in range(T - 1, -1, -1):
            init = np.full((N, S), _NEG)
            init[n_idx, s_last] = emit[t, n_idx, s_last]
            init[n_idx, np.maximum(s_last - 1, 0)] = np.where(
                tl > 0, emit[t, n_idx, np.maximum(s_last - 1, 0)],
                init[n_idx, np.maximum(s_last - 1, 0)])
            if t + 1 < T:
                b = beta[t + 1]
                b1 = np.concatenate([b[:, 1:], np.full((N, 1), _NEG)], 1)
                b2 = np.concatenate([b[:, 2:], np.full((N, 2), _NEG)], 1)
                skip2 = np.concatenate([skip[:, 2:], np.zeros((N, 2), bool)],
                                       1)
                b2 = np.where(skip2, b2, _NEG)
                rec = _lse(b, b1, b2) + emit[t]
            else:
                rec = np.full((N, S), _NEG)
            here = (t == last)[:, None]
            before = (t < last)[:, None]
            beta[t] = np.where(valid, np.where(here, init, np.where(
                before, rec, _NEG)), _NEG)
        ctx.saved = (lp, alpha, beta, ext, il, nll, zero_infinity)
        # lp may be log_probs itself: registered, an in-place change to it
        # after forward raises at backward (as PyTorch) instead of
        # silently changing the gradient
        ctx.save_for_backward(log_probs)
        ctx.xp, ctx.dtype = xp, log_probs.dtype
        out = nll
        if zero_infinity:
            out = np.where(np.isinf(nll), 0.0, nll)
        return xp.asarray(out.astype(log_probs.dtype))

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        lp, alpha, beta, ext, il, nll, zero_inf = ctx.saved
        xp = ctx.xp
        g = np.asarray(g.get() if xp is not np else g, np.float64)
        T, N, C = lp.shape
        ab = alpha + beta                                   # (T, N, S)
        m = ab.max(2, keepdims=True)
        m = np.where(np.isfinite(m), m, 0.0)
        onehot = np.zeros((N, ext.shape[1], C))
        np.put_along_axis(onehot, ext[:, :, None], 1.0, 2)
        occ = np.einsum("tns,nsc->tnc", np.exp(ab - m), onehot)
        with np.errstate(divide="ignore", invalid="ignore"):
            lcab = np.log(occ) + m
            grad = np.exp(lp) - np.exp(lcab + nll[None, :, None] - lp)
        live = np.arange(T)[:, None] < il[None, :]
        grad = np.where(live[:, :, None], grad, 0.0)
        if zero_inf:
            grad = np.where(np.isinf(nll)[None, :, None], 0.0, grad)
        grad = grad * g[None, :, None]
        return xp.asarray(grad.astype(ctx.dtype))
