"""Attention over a sequence sharded across the ranks of a group: the ring
(K/V blocks passed round, an online softmax) and the all-to-all over heads
(Ulysses). ``_attention.context_parallel`` routes SDPA here.

The layout. The T positions are cut into 2n chunks (n ranks) whose sizes
differ by at most one; rank r holds chunks r and 2n-1-r, in that order.
Under a causal mask chunk c sees chunks 0..c, so every rank's pair sees
2n+1 chunks' worth of keys: the work is even (a plain split would give the
last rank n times the first's).

The block kernel is ``ops.ScaledDotProductAttention`` itself: its forward
with ``lse=True`` returns a block's output and its rows' log-sum-exp, and
blocks merge by

    lse = logaddexp(lse_a, lse_b)
    out = out_a e^(lse_a - lse) + out_b e^(lse_b - lse)

Backward reuses its backward: block b's probabilities are its own P times
w = e^(lse_b - lse) per row, so the op's backward given the gradient
g * w and the merged output (for the row sums rowsum(g * out)) returns the
block's exact dq, dk, dv. Nothing of size T x T is kept: each block's P is
recomputed in backward (flash attention's trade), so a rank holds
O(T/n) activations plus one (T/2n)^2 block at a time. Ulysses, once its
all-to-all has given a rank the whole sequence of its heads, runs the same
op over the same 2n chunks locally (``Plan(local=n)``, no communication).

Dropout draws what one rank would: the keep-mask of element e (flat index
into the (batch..., T, T) scores) is the e-th double of the generator's
stream, reached with PCG64.advance, so a block's mask is a function of its
global positions and the state the ranks agreed on (CP rank 0's).
"""
import numpy as np

from .... import distributed as dist
from ...._backend import get_array_module
from ....ops.attention import ScaledDotProductAttention as _SDPA
from ....autograd.function import once_differentiable
from ....ops.base import Op, float32_compute
from ....tensor import Tensor

_NINF = -np.inf


# ================================================================ layout ==

def chunk_bounds(T, n):
    """(start, stop) of each of the 2n chunks of T positions (the first
    T % 2n chunks one longer)."""
    q, m = divmod(T, 2 * n)
    stops = np.cumsum([q + (c < m) for c in range(2 * n)])
    starts = np.concatenate([[0], stops[:-1]])
    return [(int(a), int(b)) for a, b in zip(starts, stops)]


def rank_chunks(T, n, r):
    """[(chunk id, start, stop)] of the two chunks rank r holds, in its
    order (load-balanced: r and 2n-1-r)."""
    b = chunk_bounds(T, n)
    return [(c,) + b[c] for c in (r, 2 * n - 1 - r)]


def positions(T, n, r):
    """The global positions rank r holds, in its order."""
    return np.concatenate([np.arange(a, z, dtype=np.int64)
                           for _, a, z in rank_chunks(T, n, r)])


class Plan:
    """What every block of one attention call needs: the group, the
    layout and SDPA's arguments. ``local=n``: no group, the whole sequence
    here in sequence order, attended block by block over the 2n chunks
    (Ulysses' attention, memory as the ring's); ``keep_index``: the flat
    batch indices of the dropout mask's rows (None: the head is padding,
    all kept)."""

    def __init__(self, group, T, batch, causal, scale, groups, p=0.0,
                 keep=None, gather=False, local=None, keep_index=None):
        self.group, self.T, self.batch = group, T, tuple(batch)
        self.local = local is not None
        self.n, self.r = (local, 0) if self.local else (
            dist.get_world_size(group), dist.get_rank(group))
        self.causal, self.scale, self.groups, self.p = causal, scale, \
            groups, p
        self.keep = keep                 # a KeepMask, or None
        self.keep_index = range(int(np.prod(batch))) if keep_index is None \
            else keep_index
        self.gather = gather             # all-gather K/V in forward
        self.lengths = [len(positions(T, self.n, s)) for s in range(self.n)]

    def pieces(self, s):
        """Rank s's pieces [(chunk id, local slice, global positions)]: one
        piece (both chunks) without a causal mask, one per chunk with (and
        every chunk, in order, when local)."""
        if self.local:
            return [(c, slice(a, z), np.arange(a, z))
                    for c, (a, z) in enumerate(chunk_bounds(self.T, self.n))]
        ch = rank_chunks(self.T, self.n, s)
        if not self.causal:
            return [(None, slice(0, self.lengths[s]),
                     positions(self.T, self.n, s))]
        n0 = ch[0][2] - ch[0][1]
        return [(c, slice(o, o + z - a), np.arange(a, z))
                for (c, a, z), o in zip(ch, (0, n0))]

    def blocks(self, s):
        """(q piece, kv piece, causal) for the query pieces of this rank
        against the key/value pieces of rank s: a key chunk after a query
        chunk is skipped, the same chunk is the causal diagonal."""
        for qp in self.pieces(self.r):
            for kp in self.pieces(s):
                if len(qp[2]) == 0 or len(kp[2]) == 0:
                    continue
                if self.causal and kp[0] > qp[0]:
                    continue
                yield qp, kp, self.causal and kp[0] == qp[0]

    def kv_shape(self, a, s):
        return a.shape[:-2] + (self.lengths[s], a.shape[-1])

    def peer(self, d):
        """The global rank d steps further round the ring."""
        return dist.get_global_rank(self.group, (self.r + d) % self.n)


def _take(m, pos, axis):
    if m is None or m.shape[axis] == 1:
        return m
    xp = get_array_module(m)
    return xp.take(m, xp.asarray(pos), axis=axis)


# ======================================================= the dropout mask ==

class KeepMask:
    """The dropout keep-mask (True = kept) of one attention call at any
    (rows, cols) of its global (batch..., T, T) scores: the values
    ``generator.random(batch + (T, T)) >= p`` gives on one rank, from
    ``state`` (a ``Generator.get_state()``), drawn piece by piece."""

    def __init__(self, state, nbatch, T, p):
        self.state, self.nbatch, self.T, self.p = state, nbatch, T, p

    def _bits(self):
        bg = np.random.PCG64()
        st = self.state
        bg.state = {"bit_generator": "PCG64",
                    "state": {"state": int(st["state"]),
                              "inc": int(st["inc"])},
                    "has_uint32": 0, "uinteger": 0}
        return bg

    def state_after(self):
        """The generator state after one rank's draw of the whole mask
        (one 64-bit step per double)."""
        st = self._bits().advance(self.nbatch * self.T * self.T).state
        return dict(self.state, state=str(st["state"]["state"]),
                    inc=str(st["state"]["inc"]))

    def draw(self, batch_index, rows, cols):
        """bool (len(batch_index), len(rows), len(cols)) at the flat batch
        indices, global rows and global cols given (a Python loop over
        batch x rows: one advance and one draw per contiguous run)."""
        bg = self._bits()
        gen, T, at = np.random.Generator(bg), self.T, 0
        cols = np.asarray(cols)
        cut = np.flatnonzero(np.diff(cols) != 1) + 1
        runs = [(int(c[0]), len(c)) for c in np.split(cols, cut) if len(c)]
        out = np.ones((len(batch_index), len(rows), len(cols)), np.bool_)
        for bi, b in enumerate(batch_index):
            for ii, i in enumerate(rows if b is not None else ()):
                o = 0
                for j0, w in runs:
                    e = (int(b) * T + int(i)) * T + j0
                    bg.advance((e - at) % (1 << 128))
                    out[bi, ii, o:o + w] = gen.random(w) >= self.p
                    o, at = o + w, e + w
        return out


# ==================================================================== ring ==

def _shift(plan, arrays, src, tag):
    """Start sending ``arrays`` to the next rank and receiving the previous
    rank's arrays of rank ``src``'s shapes; returns a wait() giving them.
    Empty arrays travel as no message (both ends know their shapes)."""
    xp = get_array_module(arrays[0])
    outs, works = [], []
    nxt, prv = plan.peer(1), plan.peer(-1)
    for i, a in enumerate(arrays):
        o = xp.empty(plan.kv_shape(a, src), a.dtype)
        if a.size:
            works.append(dist.isend(Tensor._wrap(xp.ascontiguousarray(a)),
                                    nxt, group=plan.group, tag=tag + i))
        if o.size:
            works.append(dist.irecv(Tensor._wrap(o), prv, group=plan.group,
                                    tag=tag + i))
        outs.append(o)

    def wait():
        for w in works:
            w.wait()
        return outs
    return wait


def _gathered(plan, arrays):
    """Every rank's ``arrays`` at once (all-gather, padded to the longest
    local length): set_rotate_method('allgather')."""
    xp = get_array_module(arrays[0])
    most = max(plan.lengths)
    res = []
    for a in arrays:
        pad = xp.zeros(a.shape[:-2] + (most, a.shape[-1]), a.dtype)
        pad[..., :a.shape[-2], :] = a
        out = xp.empty((plan.n,) + pad.shape, a.dtype)
        dist.all_gather_into_tensor(Tensor._wrap(out), Tensor._wrap(pad),
                                    group=plan.group)
        res.append([out[s][..., :plan.lengths[s], :] for s in range(plan.n)])
    return [list(kv) for kv in zip(*res)]


def _kv_by_step(plan, k, v):
    """(s, k_s, v_s) for the n ranks s, starting with this one: by the
    ring (the next block in flight while the caller computes on this one)
    or from one all-gather."""
    if plan.local:
        yield None, k, v
        return
    if plan.gather:
        allkv = _gathered(plan, [k, v])
        for t in range(plan.n):
            s = (plan.r - t) % plan.n
            yield (s,) + tuple(allkv[s])
        return
    kv = [k, v]
    for t in range(plan.n):
        s = (plan.r - t) % plan.n
        wait = _shift(plan, kv, (s - 1) % plan.n, 0) \
            if t < plan.n - 1 else None
        yield s, kv[0], kv[1]
        if wait is not None:
            kv = wait()


def _block(plan, q, k, v, mask, qp, kp, diag):
    """One block through SDPA's forward: (out, lse (..., Hq, L, 1), the
    op's ctx, ready for its backward)."""
    m = _take(_take(mask, qp[2], -2), kp[2], -1)
    keep = None
    if plan.keep is not None:
        keep = plan.keep.draw(plan.keep_index, qp[2], kp[2]).reshape(
            plan.batch + (len(qp[2]), len(kp[2])))
    ctx = _SDPA.__new__(_SDPA)
    qb = q[..., qp[1], :]
    out = _SDPA.forward(ctx, qb, k[..., kp[1], :], v[..., kp[1], :], m,
                        keep, scale=plan.scale, causal=diag, p=plan.p,
                        groups=plan.groups, lse=True)
    g = ctx.lse.shape          # grouped: (..., Hkv, G * L, 1)
    lse = ctx.lse.reshape(g[:-3] + (g[-3] * plan.groups, qb.shape[-2], 1))
    return out, lse, ctx


def _merge(acc, out, lse):
    if acc is None:
        return [out, lse]
    xp = get_array_module(out)
    o, s = acc
    new = xp.logaddexp(s, lse)
    ref = xp.where(new == _NINF, 0, new)      # rows that see nothing yet
    return [o * xp.exp(s - ref) + out * xp.exp(lse - ref), new]


@float32_compute
class RingAttention(Op):
    """SDPA of this rank's queries against every rank's keys/values by the
    ring (see the module docstring). Arrays are the local shards in the
    layout's order; ``mask`` is None or the global mask (broadcasting to
    (batch..., T, T)), which gets no gradient."""

    @staticmethod
    def forward(ctx, q, k, v, mask=None, plan=None):
        xp = get_array_module(q)
        pieces = plan.pieces(plan.r)
        acc = {qp[1].start: None for qp in pieces}
        for s, kb, vb in _kv_by_step(plan, k, v):
            for qp, kp, diag in plan.blocks(s):
                out, lse, _ = _block(plan, q, kb, vb, mask, qp, kp, diag)
                acc[qp[1].start] = _merge(acc[qp[1].start], out, lse)
        batch = plan.batch
        outs, lses = [], []
        for qp in pieces:
            a = acc[qp[1].start]
            L = len(qp[2])
            if a is None:           # an empty piece
                a = [xp.zeros(batch + (L, v.shape[-1]), q.dtype),
                     xp.full(batch + (L, 1), _NINF, q.dtype)]
            outs.append(a[0])
            lses.append(a[1])
        out = xp.concatenate(outs, axis=-2)
        lse = xp.concatenate(lses, axis=-2)
        ctx.save_for_backward(q, k, v, out, lse, mask)
        ctx.plan = plan
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        q, k, v, out, lse, mask = ctx.to_save
        plan = ctx.plan
        xp = get_array_module(g)
        dq = xp.zeros(q.shape, q.dtype)
        ref = xp.where(lse == _NINF, 0, lse)
        kb, vb = k, v
        dkb, dvb = xp.zeros(k.shape, k.dtype), xp.zeros(v.shape, v.dtype)
        n = 1 if plan.local else plan.n
        for t in range(n):
            s = (plan.r - t) % n
            src = (s - 1) % n
            # the next K/V travel while this block computes; the gradient
            # accumulators follow once it is done (the last hop takes
            # them home: this rank then holds its own dk, dv)
            wait_kv = _shift(plan, [kb, vb], src, 0) if t < n - 1 else None
            for qp, kp, diag in plan.blocks(s):
                sl = qp[1]
                _, lse_b, bctx = _block(plan, q, kb, vb, mask, qp, kp, diag)
                w = xp.exp(lse_b - ref[..., sl, :])
                bq, bk, bv, P, _ = bctx.to_save
                bctx.to_save = (bq, bk, bv, P, out[..., sl, :])
                bctx.needs_input_grad = (True, True, True, False, False)
                gq, gk, gv, _, _ = _SDPA.backward(bctx, g[..., sl, :] * w)
                dq[..., sl, :] += gq
                dkb[..., kp[1], :] += gk
                dvb[..., kp[1], :] += gv
            wait_dkv = _shift(plan, [dkb, dvb], src, 2) if n > 1 else None
            if wait_kv is not None:
                kb, vb = wait_kv()
            if wait_dkv is not None:
                dkb, dvb = wait_dkv()
        return dq, dkb, dvb, None


# ================================================================ Ulysses ==

def _a2a(x, group, split, cat):
    """All-to-all: ``x``'s dim ``split`` cut into n equal parts, part j to
    rank j; the parts received are concatenated along dim ``cat``."""
    n = dist.get_world_size(group)
    xp = get_array_module(x)
    send = xp.ascontiguousarray(xp.stack(xp.split(x, n, axis=split)))
    recv = xp.empty_like(send)
    if send.size:
        dist.all_to_all_single(Tensor._wrap(recv), Tensor._wrap(send),
                               group=group)
    return xp.concatenate(list(recv), axis=cat)


class HeadsToSequence(Op):
    """Ulysses' exchange: (..., H, L, E) sharded by sequence in, (...,
    H/n, n*L, E) sharded by heads out (dims ``split`` and ``cat`` swap
    roles for the way back); backward is the exchange reversed."""

    @staticmethod
    def forward(ctx, x, group=None, split=-3, cat=-2):
        ctx.args = group, split, cat
        return _a2a(x, group, split, cat)

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        group, split, cat = ctx.args
        return _a2a(g, group, cat, split)
