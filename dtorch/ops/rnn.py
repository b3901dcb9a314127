"""Whole recurrent layers, one direction each: Elman RNN, LSTM and GRU. The
input projections of all time steps are computed by the caller
(``dtorch/nn/modules/rnn.py``) before the loop; forward and backward loop
over time in preallocated buffers (``LSTMLayer``'s docstring has the
layout choices and their figures).
"""
import numpy as np

from .._backend import get_array_module
from .base import Op
from .movement import stack
from .recompute import backward_by_recompute, pin_all


def _sigmoid(xp, x):
    # exp(-x) may overflow to inf for very negative x: 1 / inf is 0, fine
    with np.errstate(over="ignore"):
        return 1 / (1 + xp.exp(-x))


# ---------------------------------------------------------------- CUDA ----
# On a GPU every ufunc call is a kernel launch, and at RNN sizes the launch
# (~5-10 us) costs more than the arithmetic: the CPU loops below would
# launch 11 elementwise kernels per LSTM step forward and 21 backward (GRU
# 16 and 23; counted on the CuPy stand-in). So on CUDA each time step's pointwise work, forward
# and backward, is ONE kernel made by cupy.fuse from the functions below,
# which write their results into the preallocated buffers with ``out=``
# (CuPy's fusion supports out= and in-place updates of its arguments);
# the recurrent matmul stays a GEMM. Sigmoid is written with tanh, as on
# the CPU path. The NumPy path keeps its own in-place loops: the same step
# functions run by NumPy allocate their temporaries and measured slower
# (LSTM forward T=64, N=32, H=256, float32, one thread: 33.4 ms against
# 30.4 ms, best of 9).

_FUSED = {}


def _fused(xp):
    """The step kernels for array module ``xp`` (cupy), built once."""
    k = _FUSED.get(xp)
    if k is not None:
        return k

    def sig(x):
        return 0.5 * xp.tanh(0.5 * x) + 0.5

    def lstm_fwd(xi, xf, xg, xo, hi, hf, hg, ho, bi, bf, bg, bo, c,
                 i, f, g, o, cn, tc, h):
        # gate pre-activations x + h @ w_hh.T + b_hh; cell and output
        xp.add(sig(xi + hi + bi), 0, out=i)
        xp.add(sig(xf + hf + bf), 0, out=f)
        xp.tanh(xg + hg + bg, out=g)
        xp.add(sig(xo + ho + bo), 0, out=o)
        xp.add(f * c, i * g, out=cn)
        xp.tanh(cn, out=tc)
        xp.multiply(o, tc, out=h)
        return h

    def lstm_bwd(dhm, gt, fn, i, f, g, o, tc, cp, dc, di, df, dg, do):
        # dh = dgates[t + 1] @ w_hh (dhm) + the output's gradient; dc
        # carries through f of step t + 1 (fn); then the gate gradients
        dh = dhm + gt
        xp.add(dc * fn, dh * o * (1 - tc * tc), out=dc)
        xp.multiply(dc * g, i * (1 - i), out=di)
        xp.multiply(dc * cp, f * (1 - f), out=df)
        xp.multiply(dc * i, 1 - g * g, out=dg)
        xp.multiply(dh * tc, o * (1 - o), out=do)
        return do

    def gru_fwd(xr, xz, xn, hr, hz, hn, br, bz, bn, h,
                r, z, n, hns, hout):
        xp.add(sig(xr + hr + br), 0, out=r)
        xp.add(sig(xz + hz + bz), 0, out=z)
        xp.add(hn, bn, out=hns)
        xp.tanh(xn + r * hns, out=n)
        xp.add(n, z * (h - n), out=hout)
        return hout

    def gru_bwd(dhz, dhm, gt, r, z, n, hp, hns, dr, dz, dn, hr, hz, hn):
        # dh = dh_{t+1} * z_{t+1} (dhz) + dhh[t + 1] @ w_hh (dhm) + g[t];
        # dhz becomes dh * z for the next step
        dh = dhz + dhm + gt
        xp.multiply(dh * (1 - z), 1 - n * n, out=dn)
        xp.multiply(dh * (hp - n), z * (1 - z), out=dz)
        xp.multiply(dn * hns, r * (1 - r), out=dr)
        xp.add(dr, 0, out=hr)
        xp.add(dz, 0, out=hz)
        xp.multiply(dn, r, out=hn)
        xp.multiply(dh, z, out=dhz)
        return dhz

    def rnn_tanh_fwd(x, hh, b, h):
        xp.tanh(x + hh + b, out=h)
        return h

    def rnn_relu_fwd(x, hh, b, h):
        xp.maximum(x + hh + b, 0, out=h)
        return h

    def rnn_tanh_bwd(dhm, gt, h, da):
        xp.multiply(dhm + gt, 1 - h * h, out=da)
        return da

    def rnn_relu_bwd(dhm, gt, h, da):
        # PyTorch's threshold_backward: dh where h > 0 (a 0/1 product
        # would turn an infinite dh into NaN)
        xp.add(xp.where(h <= 0, 0, dhm + gt), 0, out=da)
        return da

    k = {f.__name__: xp.fuse(kernel_name="dtorch_" + f.__name__)(f)
         for f in (lstm_fwd, lstm_bwd, gru_fwd, gru_bwd, rnn_tanh_fwd,
                   rnn_relu_fwd, rnn_tanh_bwd, rnn_relu_bwd)}
    _FUSED[xp] = k
    return k


def _gates(a, k):
    """The k (N, H) column blocks of an (N, k*H) array."""
    H = a.shape[-1] // k
    return [a[..., j * H:(j + 1) * H] for j in range(k)]


def _fused_hh(xp, xw, h0, w_hh, b_hh, k):
    """What the fused LSTM/GRU forward loops reuse every step: the buffer
    for h @ w_hh.T and its k gate views, b_hh's gate views (array zeros
    without bias: the fusion gets no Python scalars), and w_hh.T."""
    hw = xp.empty((h0.shape[0], w_hh.shape[0]), xw.dtype)
    bs = [xp.zeros((), xw.dtype)] * k if b_hh is None else _gates(b_hh, k)
    return hw, _gates(hw, k), bs, w_hh.T


class Recurrent(Op):
    """The family of whole recurrent layers, one direction (RNN, LSTM,
    GRU): each a time loop in preallocated buffers whose fused kernels
    work in place, step by step (the figures are in LSTMLayer's
    docstring). A member's ``_grads_np(ctx, g)`` is its gradient on NumPy
    arrays, ``_backward_fused(ctx, xp, g)`` on CuPy's (fused kernels);
    under create_graph the shell pins those values to the graph of the
    member's composite recomputed (``_recompute``, ops/recompute.py)."""
    @classmethod
    def backward(cls, ctx, g):
        if ctx._gmake is None:
            return cls._grads(ctx, g)
        return pin_all(cls._recompute(ctx, g), cls._grads(ctx, g._data))

    @classmethod
    def _grads(cls, ctx, g):
        xp = get_array_module(g)
        if xp is not np:
            return cls._backward_fused(ctx, xp, g)
        return cls._grads_np(ctx, g)


class RNNLayer(Recurrent):
    """A whole Elman RNN layer, one direction: h_t = act(xw[t] + h_{t-1}
    @ w_hh.T + b_hh). ``xw`` (T, N, H) holds the input projections for all
    steps. Returns (T + 1, N, H): the outputs, then h_T again as h_n's slot."""
    @staticmethod
    def forward(ctx, xw, h0, w_hh, b_hh=None, reverse=False,
                nonlinearity="tanh"):
        xp = get_array_module(xw)
        T = xw.shape[0]
        out = xp.empty((T + 1,) + h0.shape, xw.dtype)
        h = h0
        steps = range(T - 1, -1, -1) if reverse else range(T)
        wt = w_hh.T
        if xp is not np:
            return RNNLayer._forward_fused(ctx, xp, xw, h0, w_hh, b_hh,
                                           reverse, nonlinearity, out)
        for t in steps:
            a = xw[t] + h @ wt
            if b_hh is not None:
                a += b_hh
            h = xp.tanh(a) if nonlinearity == "tanh" else xp.maximum(a, 0)
            out[t] = h
        out[T] = h
        ctx.save_for_backward(h0, w_hh)
        ctx.out, ctx.reverse, ctx.act = out, reverse, nonlinearity
        return out

    @staticmethod
    def _forward_fused(ctx, xp, xw, h0, w_hh, b_hh, reverse, act, out):
        T = xw.shape[0]
        step = _fused(xp)["rnn_%s_fwd" % act]
        hh = xp.empty(h0.shape, xw.dtype)
        wt = w_hh.T
        # no Python scalars as kernel arguments: their dtype would be the
        # fusion's to guess (an int64 0 next to float16 arrays)
        b = xp.zeros((), xw.dtype) if b_hh is None else b_hh
        h = h0
        for t in (range(T - 1, -1, -1) if reverse else range(T)):
            xp.matmul(h, wt, out=hh)
            h = step(xw[t], hh, b, out[t])
        out[T] = h
        ctx.save_for_backward(h0, w_hh)
        ctx.out, ctx.reverse, ctx.act = out, reverse, act
        return out

    @staticmethod
    def _backward_fused(ctx, xp, g):
        h0, w_hh = ctx.to_save
        out, reverse = ctx.out, ctx.reverse
        T = out.shape[0] - 1
        step = _fused(xp)["rnn_%s_bwd" % ctx.act]
        da = xp.empty(out[:T].shape, g.dtype)
        dhm = g[T].astype(g.dtype, copy=True)   # dh from the later step
        for t in (range(T) if reverse else range(T - 1, -1, -1)):
            step(dhm, g[t], out[t], da[t])
            xp.matmul(da[t], w_hh, out=dhm)
        return _rnn_grads(ctx, xp, da, dhm, (out[:T], h0, reverse))

    @staticmethod
    def _grads_np(ctx, g):
        h0, w_hh = ctx.to_save
        xp = np
        out, reverse = ctx.out, ctx.reverse
        T = out.shape[0] - 1
        da = xp.empty(out[:T].shape, g.dtype)
        dh = g[T].copy()
        steps = range(T) if reverse else range(T - 1, -1, -1)
        zero = xp.zeros((), g.dtype)
        for t in steps:
            dh += g[t]
            h = out[t]
            # relu: PyTorch's threshold_backward, g where h > 0 (a 0/1
            # product would turn an infinite dh into NaN)
            da[t] = dh * (1 - h * h) if ctx.act == "tanh" else \
                xp.where(h <= 0, zero, dh)
            dh = da[t] @ w_hh
        return _rnn_grads(ctx, xp, da, dh, (out[:T], h0, reverse))

    @staticmethod
    def _recompute(ctx, g):
        # by recomputation (ops/recompute.py); xw is not kept by forward:
        # the pre-activations come back from the outputs, and xw + b_hh
        # from them (the layer sees xw and b_hh only through their sum)
        h0, w_hh = ctx.to_save
        out, reverse, act = ctx.out, ctx.reverse, ctx.act
        xp = get_array_module(out)
        T = out.shape[0] - 1
        hs = out[:T]
        if act == "tanh":
            a = _pre_tanh(xp, hs)
        else:
            a = xp.where(hs > 0, hs, xp.asarray(-1, hs.dtype))
        xw = a - _prev_states(xp, hs, h0, reverse) @ w_hh.T
        b = xp.zeros(w_hh.shape[:1], xw.dtype)
        return backward_by_recompute(
            ctx, g, _rnn_composite(reverse, act),
            [xw, h0, w_hh, b if len(ctx.needs_input_grad) > 3 else None])


def _prev_states(xp, hs, h0, reverse):
    """h_{t-1} for every t, in time order, as one (T, N, H) array."""
    if hs.shape[0] == 0:
        return hs
    if reverse:
        return xp.concatenate([hs[1:], h0[None]], axis=0)
    return xp.concatenate([h0[None], hs[:-1]], axis=0)


def _hh_weight_grad(dgates, hs, h0, reverse):
    """sum_t dgates[t].T @ h_{t-1}, the h_{t-1} being h0 then hs[:-1]
    (reversed: hs[1:] then h0), without copying them into one array: one
    GEMM over the T - 1 steps whose h_{t-1} is an output, one for h0."""
    T, G, H = dgates.shape[0], dgates.shape[-1], hs.shape[-1]
    if T == 0:      # no step: a zero gradient, of the right shape
        return dgates.reshape(-1, G).T @ hs.reshape(-1, H)
    if reverse:
        body, hb, first = dgates[:T - 1], hs[1:], dgates[T - 1]
    else:
        body, hb, first = dgates[1:], hs[:T - 1], dgates[0]
    gw = first.T @ h0
    if T > 1:
        gw += body.reshape(-1, G).T @ hb.reshape(-1, H)
    return gw


def _rnn_grads(ctx, xp, dgates, dh0, prev, dc0=None):
    """``prev``: the (T, N, H) states h_{t-1}, or (hs, h0, reverse) to
    take them from the outputs without a copy (``_hh_weight_grad``)."""
    need = ctx.needs_input_grad
    G = dgates.shape[-1]
    d2 = dgates.reshape(-1, G)
    gw = None
    if need[-2]:
        gw = _hh_weight_grad(dgates, *prev) if isinstance(prev, tuple) \
            else d2.T @ prev.reshape(-1, prev.shape[-1])
    gb = d2.sum(axis=0) if need[-1] else None
    if dc0 is None:
        return dgates, dh0, gw, gb
    return dgates, dh0, dc0, gw, gb


def _lstm_grads(ctx, xp, dgates, dc, prev):
    """The end of LSTMLayer's backward loop (both paths): dh0 and dc0
    through the last step visited, ``prev`` (None: T == 0, zeros), then
    the gradients of the inputs (``_rnn_grads``)."""
    h0, c0, w_hh = ctx.to_save
    if prev is None:
        dh0 = xp.zeros(h0.shape, dgates.dtype)
    else:
        dh0 = dgates[prev] @ w_hh
        dc *= ctx.acts[prev, 1]
    prevs = (ctx.out[:ctx.out.shape[0] - 1], h0, ctx.reverse)
    return _rnn_grads(ctx, xp, dgates, dh0, prevs, dc)


class LSTMLayer(Recurrent):
    """A whole LSTM layer, one direction, PyTorch's gate order (i, f, g, o).

    ``xw`` (T, N, 4H) are the input projections (x @ w_ih.T + b_ih) for all
    steps. Returns (T + 1, N, H): the outputs h_1..h_T, then c_T.

    The loops run in preallocated buffers with ``out=``, no per-step
    temporaries. Two layout choices, both measured at N=32, H=256, float32,
    one thread (OpenBLAS):
    - the recurrent matmul is computed transposed, (4H, H) @ (H, N) into a
      (4H, N) buffer: 188-203 us per step against 258-271 us for
      (N, H) @ (H, 4H); adding that buffer's transposed view to xw[t] costs
      ~30 us, still a net 3 ms per layer forward;
    - the activations are kept gate-major, (T, 4, N, H), so that i, f, g, o
      and every per-gate product run over one contiguous (N, H) block (a
      column slice of an (N, 4H) row costs 3-4x as much per ufunc call).
    Backward carries dh and dc through the loop: per step one matmul and a
    dozen small products; the gate gradients are written, per step, into
    the (T, N, 4H) layout that xw and the weight-gradient GEMM need."""
    @staticmethod
    def forward(ctx, xw, h0, c0, w_hh, b_hh=None, reverse=False):
        xp = get_array_module(xw)
        T, n = xw.shape[:2]
        H = h0.shape[-1]
        dt = xw.dtype
        out = xp.empty((T + 1, n, H), dt)
        acts = xp.empty((T, 4, n, H), dt)      # i, f, g, o after activation
        cs = xp.empty((T, n, H), dt)
        tcs = xp.empty((T, n, H), dt)          # tanh(c_t), for backward
        if xp is not np:
            LSTMLayer._forward_fused(xp, xw, h0, c0, w_hh, b_hh, reverse,
                                     out, acts, cs, tcs)
            ctx.save_for_backward(h0, c0, w_hh)
            ctx.out, ctx.acts, ctx.cs, ctx.tcs = out, acts, cs, tcs
            ctx.reverse = reverse
            return out
        ig = xp.empty((n, H), dt)
        hw = xp.empty((4 * H, n), dt)          # w_hh @ h.T, one step
        # all four activations in one tanh over the whole gate block:
        # sigmoid(x) = (1 + tanh(x / 2)) / 2, with NumPy's vectorised tanh
        # (scipy's expit measured 4x slower, 1 / (1 + exp(-x)) 2x). The
        # halving is folded into w_hh and b_hh once (exact: a power of 2).
        half = xp.full((4, 1, H), 0.5, dt)
        half[2] = 1
        shift = xp.full((4, 1, H), 0.5, dt)
        shift[2] = 0
        w = w_hh * half.reshape(4 * H, 1)
        bh = None if b_hh is None else b_hh.reshape(4, 1, H) * half
        hw4 = hw.reshape(4, H, n).transpose(0, 2, 1)      # (4, N, H) views
        xw4 = xw.reshape(T, n, 4, H).transpose(0, 2, 1, 3)
        h, c = h0, c0
        steps = range(T - 1, -1, -1) if reverse else range(T)
        for t in steps:
            a = acts[t]
            xp.matmul(w, h.T, out=hw)
            xp.multiply(xw4[t], half, out=a)
            a += hw4
            if bh is not None:
                a += bh
            xp.tanh(a, out=a)
            a *= half
            a += shift
            i, f, g, o = a
            cn = cs[t]
            xp.multiply(f, c, out=cn)
            xp.multiply(i, g, out=ig)
            cn += ig
            xp.tanh(cn, out=tcs[t])
            xp.multiply(o, tcs[t], out=out[t])
            h, c = out[t], cn
        out[T] = c
        ctx.save_for_backward(h0, c0, w_hh)
        ctx.out, ctx.acts, ctx.cs, ctx.tcs = out, acts, cs, tcs
        ctx.reverse = reverse
        return out

    @staticmethod
    def _forward_fused(xp, xw, h0, c0, w_hh, b_hh, reverse, out, acts, cs,
                       tcs):
        T = xw.shape[0]
        step = _fused(xp)["lstm_fwd"]
        hw, hws, bs, wt = _fused_hh(xp, xw, h0, w_hh, b_hh, 4)
        h, c = h0, c0
        for t in (range(T - 1, -1, -1) if reverse else range(T)):
            xp.matmul(h, wt, out=hw)
            a = acts[t]
            h = step(*_gates(xw[t], 4), *hws, *bs, c, a[0], a[1], a[2],
                     a[3], cs[t], tcs[t], out[t])
            c = cs[t]
        out[T] = c

    @staticmethod
    def _backward_fused(ctx, xp, g):
        h0, c0, w_hh = ctx.to_save
        acts, cs, tcs, reverse = ctx.acts, ctx.cs, ctx.tcs, ctx.reverse
        T, _, n, H = acts.shape
        dt = g.dtype
        step = _fused(xp)["lstm_bwd"]
        dgates = xp.empty((T, n, 4 * H), dt)
        dhm = xp.empty((n, H), dt)             # dgates[t + 1] @ w_hh
        dc = g[T].astype(dt, copy=True)
        zero, one = xp.zeros((), dt), xp.ones((), dt)
        prev = None
        for t in (range(T) if reverse else range(T - 1, -1, -1)):
            if prev is None:                   # the last step: no t + 1
                dh_in, fn = zero, one
            else:
                xp.matmul(dgates[prev], w_hh, out=dhm)
                dh_in, fn = dhm, acts[prev, 1]
            tp = t + 1 if reverse else t - 1
            cp = c0 if (tp < 0 or tp >= T) else cs[tp]
            a = acts[t]
            step(dh_in, g[t], fn, a[0], a[1], a[2], a[3], tcs[t], cp, dc,
                 *_gates(dgates[t], 4))
            prev = t
        return _lstm_grads(ctx, xp, dgates, dc, prev)

    @staticmethod
    def _grads_np(ctx, g):
        h0, c0, w_hh = ctx.to_save
        xp = np
        acts, cs, tcs, reverse = ctx.acts, ctx.cs, ctx.tcs, ctx.reverse
        T, _, n, H = acts.shape
        dt = g.dtype
        dgates = xp.empty((T, n, 4 * H), dt)
        dg4 = dgates.reshape(T, n, 4, H)
        d = xp.empty((4, n, H), dt)            # local factors, gate-major
        dh = xp.empty((n, H), dt)
        s1 = xp.empty((n, H), dt)
        dc = g[T].astype(dt, copy=True)
        # the h_n view of the output has its gradient folded into g[last];
        # per step everything stays in small cache-resident blocks (one pass
        # over whole (T, N, 4H) arrays for these factors measured slower)
        steps = range(T) if reverse else range(T - 1, -1, -1)
        prev = None
        for t in steps:
            a = acts[t]
            i, f, gt, o = a
            if prev is None:
                dh[...] = g[t]
            else:
                xp.matmul(dgates[prev], w_hh, out=dh)
                dh += g[t]
                dc *= acts[prev, 1]                   # f of step t + 1
            tc = tcs[t]
            xp.multiply(tc, tc, out=s1)               # dc += dh o (1 - tc^2)
            xp.subtract(1, s1, out=s1)
            s1 *= o
            s1 *= dh
            dc += s1
            xp.multiply(a, a, out=d)                  # s (1 - s); 1 - g^2
            xp.subtract(a, d, out=d)
            xp.multiply(gt, gt, out=d[2])
            xp.subtract(1, d[2], out=d[2])
            tp = t + 1 if reverse else t - 1
            d[0] *= gt
            d[1] *= c0 if (tp < 0 or tp >= T) else cs[tp]
            d[2] *= i
            d[3] *= tc
            xp.multiply(d[3], dh, out=dg4[t, :, 3])   # o: times dh
            xp.multiply(d[:3], dc,                    # i, f, g: times dc
                        out=dg4[t, :, :3].transpose(1, 0, 2))
            prev = t
        return _lstm_grads(ctx, xp, dgates, dc, prev)

    @staticmethod
    def _recompute(ctx, g):
        # by recomputation, the gate pre-activations rebuilt from the saved
        # activations (as RNNLayer's)
        h0, c0, w_hh = ctx.to_save
        out, acts, reverse = ctx.out, ctx.acts, ctx.reverse
        xp = get_array_module(out)
        T = out.shape[0] - 1
        pre = xp.concatenate([_pre_sigmoid(xp, acts[:, 0]),
                              _pre_sigmoid(xp, acts[:, 1]),
                              _pre_tanh(xp, acts[:, 2]),
                              _pre_sigmoid(xp, acts[:, 3])], axis=-1)
        xw = pre - _prev_states(xp, out[:T], h0, reverse) @ w_hh.T
        b = xp.zeros(w_hh.shape[:1], xw.dtype)
        return backward_by_recompute(
            ctx, g, _lstm_composite(reverse),
            [xw, h0, c0, w_hh, b if len(ctx.needs_input_grad) > 4 else None])


def _gru_grads(ctx, xp, dx, dhh, dh, prev):
    """GRULayer's gradients from its gate grads: (xw, h0, w_hh, b_hh).
    The h-side gates' grads ``dhh`` give w_hh's (against the previous
    states) and b_hh's."""
    H = dh.shape[-1]
    prev = _prev_states(xp, *prev)
    need = ctx.needs_input_grad
    d2 = dhh.reshape(-1, 3 * H)
    gw = d2.T @ prev.reshape(-1, H) if need[2] else None
    gb = d2.sum(axis=0) if len(need) > 3 and need[3] else None
    return dx, dh, gw, gb


class GRULayer(Recurrent):
    """A whole GRU layer, one direction, PyTorch's gates (r, z, n):
    n = tanh(xn + r * (h @ w_hn.T + b_hn)), h' = (1 - z) * n + z * h.
    Returns (T + 1, N, H): the outputs, then h_T again."""
    @staticmethod
    def forward(ctx, xw, h0, w_hh, b_hh=None, reverse=False):
        xp = get_array_module(xw)
        T, n = xw.shape[:2]
        H = h0.shape[-1]
        out = xp.empty((T + 1, n, H), xw.dtype)
        acts = xp.empty((T, n, 3 * H), xw.dtype)     # r, z, n
        hns = xp.empty((T, n, H), xw.dtype)          # h @ w_hn.T + b_hn
        if xp is not np:
            GRULayer._forward_fused(xp, xw, h0, w_hh, b_hh, reverse, out,
                                    acts, hns)
            ctx.save_for_backward(h0, w_hh)
            ctx.out, ctx.acts, ctx.hns, ctx.reverse = out, acts, hns, reverse
            return out
        h = h0
        wt = w_hh.T
        steps = range(T - 1, -1, -1) if reverse else range(T)
        for t in steps:
            hh = h @ wt
            if b_hh is not None:
                hh += b_hh
            x = xw[t]
            rz = _sigmoid(xp, x[:, :2 * H] + hh[:, :2 * H])
            hns[t] = hh[:, 2 * H:]
            nt = xp.tanh(x[:, 2 * H:] + rz[:, :H] * hh[:, 2 * H:])
            acts[t, :, :2 * H] = rz
            acts[t, :, 2 * H:] = nt
            z = rz[:, H:]
            h = nt + z * (h - nt)
            out[t] = h
        out[T] = h
        ctx.save_for_backward(h0, w_hh)
        ctx.out, ctx.acts, ctx.hns, ctx.reverse = out, acts, hns, reverse
        return out

    @staticmethod
    def _forward_fused(xp, xw, h0, w_hh, b_hh, reverse, out, acts, hns):
        T = xw.shape[0]
        step = _fused(xp)["gru_fwd"]
        hh, hhs, bs, wt = _fused_hh(xp, xw, h0, w_hh, b_hh, 3)
        h = h0
        for t in (range(T - 1, -1, -1) if reverse else range(T)):
            xp.matmul(h, wt, out=hh)
            h = step(*_gates(xw[t], 3), *hhs, *bs, h, *_gates(acts[t], 3),
                     hns[t], out[t])
        out[T] = h

    @staticmethod
    def _backward_fused(ctx, xp, g):
        h0, w_hh = ctx.to_save
        out, acts, hns, reverse = ctx.out, ctx.acts, ctx.hns, ctx.reverse
        T = out.shape[0] - 1
        step = _fused(xp)["gru_bwd"]
        dx = xp.empty(acts.shape, g.dtype)     # grads of x-side gates
        dhh = xp.empty(acts.shape, g.dtype)    # grads of h-side gates
        dhz = g[T].astype(g.dtype, copy=True)  # dh_{t+1} * z_{t+1}
        dhm = xp.zeros(h0.shape, g.dtype)      # dhh[t + 1] @ w_hh
        for t in (range(T) if reverse else range(T - 1, -1, -1)):
            tp = t + 1 if reverse else t - 1
            hp = h0 if (tp < 0 or tp >= T) else out[tp]
            step(dhz, dhm, g[t], *_gates(acts[t], 3), hp, hns[t],
                 *_gates(dx[t], 3), *_gates(dhh[t], 3))
            xp.matmul(dhh[t], w_hh, out=dhm)
        dh = dhz + dhm
        return _gru_grads(ctx, xp, dx, dhh, dh, (out[:T], h0, reverse))

    @staticmethod
    def _grads_np(ctx, g):
        h0, w_hh = ctx.to_save
        xp = np
        out, acts, hns, reverse = ctx.out, ctx.acts, ctx.hns, ctx.reverse
        T = out.shape[0] - 1
        H = h0.shape[-1]
        dx = xp.empty(acts.shape, g.dtype)     # grads of x-side gates
        dhh = xp.empty(acts.shape, g.dtype)    # grads of h-side gates
        dh = g[T].copy()
        steps = range(T) if reverse else range(T - 1, -1, -1)
        for t in steps:
            dh += g[t]
            a = acts[t]
            r, z, nt = a[:, :H], a[:, H:2 * H], a[:, 2 * H:]
            tp = t + 1 if reverse else t - 1
            hprev = h0 if (tp < 0 or tp >= T) else out[tp]
            dn = dh * (1 - z) * (1 - nt * nt)
            dz = dh * (hprev - nt) * z * (1 - z)
            dr = dn * hns[t] * r * (1 - r)
            dx[t, :, :H] = dr
            dx[t, :, H:2 * H] = dz
            dx[t, :, 2 * H:] = dn
            dhh[t, :, :2 * H] = dx[t, :, :2 * H]
            dhh[t, :, 2 * H:] = dn * r
            dh = dh * z + dhh[t] @ w_hh
        return _gru_grads(ctx, xp, dx, dhh, dh, (out[:T], h0, reverse))

    @staticmethod
    def _recompute(ctx, g):
        # by recomputation: r and z pre-activations fold b_hh's r, z part
        # into xw; b_hh's n part is multiplied by r, so it is rebuilt from
        # the saved h @ w_hn.T + b_hn
        h0, w_hh = ctx.to_save
        out, acts, hns, reverse = ctx.out, ctx.acts, ctx.hns, ctx.reverse
        xp = get_array_module(out)
        T = out.shape[0] - 1
        H = h0.shape[-1]
        prev = _prev_states(xp, out[:T], h0, reverse)
        hw = prev @ w_hh.T                                  # (T, N, 3H)
        b = xp.zeros(w_hh.shape[:1], out.dtype)
        if T:
            b[2 * H:] = (hns - hw[..., 2 * H:]).reshape(-1, H).mean(0)
        rz = acts[..., :2 * H]
        xw = xp.concatenate([
            _pre_sigmoid(xp, rz) - hw[..., :2 * H],
            _pre_tanh(xp, acts[..., 2 * H:]) - rz[..., :H] * hns], axis=-1)
        return backward_by_recompute(
            ctx, g, _gru_composite(reverse),
            [xw, h0, w_hh, b if len(ctx.needs_input_grad) > 3 else None])


def _pre_sigmoid(xp, s):
    """x with sigmoid(x) = s (a saved activation); a saturated 0 or 1
    gives -+800, whose sigmoid (and derivatives) are exactly 0 and 1."""
    with np.errstate(divide="ignore", invalid="ignore"):
        a = xp.log(s) - xp.log1p(-s)
    big = xp.asarray(800, s.dtype)
    return xp.where(s >= 1, big, xp.where(s <= 0, -big, a))


def _pre_tanh(xp, t):
    """x with tanh(x) = t; -+1 exactly gives -+800."""
    with np.errstate(divide="ignore", invalid="ignore"):
        a = xp.arctanh(t)
    big = xp.asarray(800, t.dtype)
    return xp.where(t >= 1, big, xp.where(t <= -1, -big, a))


def _time_steps(T, reverse):
    return range(T - 1, -1, -1) if reverse else range(T)


def _rnn_composite(reverse, act):
    """RNNLayer as differentiable tensor ops (its create_graph=True
    backward recomputes it)."""
    def fn(xw, h0, w, b):
        T = xw.shape[0]
        h, hs, wt = h0, [None] * T, w.t()
        for t in _time_steps(T, reverse):
            a = xw[t] + h @ wt
            if b is not None:
                a = a + b
            h = a.tanh() if act == "tanh" else a.relu()
            hs[t] = h
        return stack(*hs, h, dim=0)
    return fn


def _lstm_composite(reverse):
    """LSTMLayer as differentiable tensor ops (gates i, f, g, o)."""
    def fn(xw, h0, c0, w, b):
        T, H = xw.shape[0], h0.shape[-1]
        h, c, hs, wt = h0, c0, [None] * T, w.t()
        for t in _time_steps(T, reverse):
            a = xw[t] + h @ wt
            if b is not None:
                a = a + b
            i, f = a[:, :H].sigmoid(), a[:, H:2 * H].sigmoid()
            gg, o = a[:, 2 * H:3 * H].tanh(), a[:, 3 * H:].sigmoid()
            c = f * c + i * gg
            h = o * c.tanh()
            hs[t] = h
        return stack(*hs, c, dim=0)
    return fn


def _gru_composite(reverse):
    """GRULayer as differentiable tensor ops (gates r, z, n)."""
    def fn(xw, h0, w, b):
        T, H = xw.shape[0], h0.shape[-1]
        h, hs, wt = h0, [None] * T, w.t()
        for t in _time_steps(T, reverse):
            hh = h @ wt
            if b is not None:
                hh = hh + b
            x = xw[t]
            r = (x[:, :H] + hh[:, :H]).sigmoid()
            z = (x[:, H:2 * H] + hh[:, H:2 * H]).sigmoid()
            n = (x[:, 2 * H:] + r * hh[:, 2 * H:]).tanh()
            h = n + z * (h - n)
            hs[t] = h
        return stack(*hs, h, dim=0)
    return fn
