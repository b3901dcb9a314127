"""Context parallelism (PyTorch's ``torch.distributed.tensor.experimental.
context_parallel``): the sequence of a batch sharded over the ranks of a
mesh, and ``scaled_dot_product_attention`` computed across them.

    mesh = init_device_mesh("cpu", (dp, cp), mesh_dim_names=("dp", "cp"))
    with context_parallel(mesh["cp"], buffers=[tokens, targets, pos_ids],
                          buffer_seq_dims=[1, 1, 0]):
        loss = loss_fn(model(tokens), targets)   # SDPA runs context-parallel
        loss.backward()

On entry each buffer is replaced in place by this rank's shard along its
sequence dim (restored on exit, except ``no_restore_buffers``); inside,
``nn.functional.scaled_dot_product_attention`` takes local queries, keys
and values and returns the local rows of the attention over the whole
sequence, with their gradients. Position ids belong in ``buffers``: they
follow the shard.

As in PyTorch:
- the shard is load-balanced: the sequence is cut into 2 x CP chunks and
  rank r holds chunks r and 2 CP - 1 - r (so causal work is even); gather
  results back with ``context_parallel_unshard``;
- ``set_rotate_method("allgather")`` (the default) gathers every rank's
  K/V at once in forward, ``"alltoall"`` passes them round the ring, one
  block in flight while the current one computes; backward passes K/V and
  their gradients round the ring in both cases.

Where dtorch differs, and why:
- ``algorithm="ulysses"`` (a dtorch keyword): the all-to-all over heads
  (DeepSpeed Ulysses) instead of the ring: sequence-sharded in, each rank
  attends over the whole sequence with 1/CP of the heads (block by block,
  with the ring's kernel: nothing T x T is kept), back again. Head
  counts that do not divide CP are padded with zero heads (at most CP - 1
  heads of extra work); key/value heads of GQA that do not divide CP are
  repeated per query head.
- Lengths need not divide 2 x CP: the chunks differ by at most one position
  (PyTorch requires a multiple).
- The region is per thread (PyTorch patches the SDPA function process
  wide): the threads backend runs several ranks in one process.
- ``attn_mask`` is allowed (PyTorch's ring refuses one): the mask of the
  whole sequence (broadcasting to (batch..., T, T)), the same on every
  rank; it gets no gradient (a float mask that requires grad is refused).
- Dropout draws the mask one rank would draw (the generator state of CP
  rank 0, then every rank's generator moves on as that draw would), so the
  result equals single-rank SDPA under the same seed. CPU generator only.
"""
import contextlib

import numpy as np

from .... import distributed as dist
from .... import random as _random
from ...._backend import bfloat16, float16
from ....autograd.grad_mode import no_grad
from ...._creation import cat
from ....nn import functional as F
from ....nn._functional import attention as _fa
from ....tensor import Tensor
from . import _ring as R

__all__ = ["context_parallel", "context_parallel_unshard",
           "set_rotate_method"]

_options = {"rotate_method": "allgather"}      # PyTorch's default


def set_rotate_method(rotate_method):
    """How K/V shards reach the other ranks in forward: ``"allgather"``
    (all at once) or ``"alltoall"`` (round the ring, overlapped with
    compute)."""
    if rotate_method not in ("allgather", "alltoall"):
        raise NotImplementedError(
            f"Context Parallel does not support using {rotate_method} for "
            f"kv shards rotation")
    _options["rotate_method"] = rotate_method


def _cp_group(mesh):
    if getattr(mesh, "ndim", None) != 1:
        raise ValueError(f"context_parallel needs the 1-d mesh of the "
                         f"context-parallel ranks (mesh['cp']), got {mesh!r}")
    return mesh.get_group(), mesh.size(), mesh.get_local_rank()


class _Region:
    """SDPA inside one ``context_parallel`` region of one rank."""

    def __init__(self, group, n, r, T, algorithm):
        self.group, self.n, self.r, self.T = group, n, r, T
        self.algorithm = algorithm

    def _check(self, q, k, v, mask, batch):
        if self.T is None:        # no buffers: the ranks' lengths add up
            lens = [None] * self.n
            dist.all_gather_object(lens, q.shape[-2], group=self.group)
            self.T = sum(lens)
        T = self.T
        want = len(R.positions(T, self.n, self.r))
        for t, name in ((q, "query"), (k, "key"), (v, "value")):
            if t.shape[-2] != want:
                raise ValueError(
                    f"context_parallel: rank {self.r} of {self.n} holds "
                    f"{want} of the sequence's {T} positions, but the "
                    f"{name} {tuple(t.shape)} has {t.shape[-2]}: attention "
                    f"inside the region is self-attention over inputs "
                    f"sharded by context_parallel(buffers=...)")
        if mask is not None:
            if mask.requires_grad:
                raise NotImplementedError(
                    "context_parallel: an attn_mask that requires grad is "
                    "not supported (the mask gets no gradient)")
            full = tuple(batch) + (T, T)
            if not _fa.broadcasts_to(mask.shape, full):
                raise RuntimeError(
                    f"context_parallel: attn_mask of shape "
                    f"{tuple(mask.shape)} must be the mask of the whole "
                    f"sequence, broadcasting to {full} (batch..., T, T), "
                    f"the same on every rank")

    def _keep(self, q, p, nbatch):
        """The dropout mask's generator state, agreed on (CP rank 0's);
        this rank's generator moves on as one rank's draw would."""
        if q.device.type != "cpu":
            raise NotImplementedError(
                "context_parallel: dropout draws its mask from the CPU "
                "generator's stream; on a CUDA device it is not supported")
        st = [_random.default_generator.get_state()]
        dist.broadcast_object_list(
            st, src=dist.get_global_rank(self.group, 0), group=self.group)
        keep = R.KeepMask(st[0], nbatch, self.T, p)
        _random.default_generator.set_state(keep.state_after())
        return keep

    def __call__(self, q, k, v, mask, p, causal, scale, groups, batch):
        self._check(q, k, v, mask, batch)
        keep = self._keep(q, p, int(np.prod(batch))) if p > 0 else None
        if self.algorithm == "ulysses":
            return self._ulysses(q, k, v, mask, p, causal, scale, groups,
                                 batch, keep)
        plan = R.Plan(self.group, self.T, batch, causal, scale, groups, p,
                      keep, gather=_options["rotate_method"] == "allgather")
        return R.RingAttention.apply(q, k, v, mask, plan=plan)

    def _ulysses(self, q, k, v, mask, p, causal, scale, groups, batch,
                 keep):
        n, r, T = self.n, self.r, self.T
        if q.ndim < 3 or k.ndim < 3:
            raise ValueError(
                f"context_parallel(algorithm='ulysses') splits the heads: "
                f"query and key need a heads dim (..., H, L, E), got "
                f"{tuple(q.shape)} and {tuple(k.shape)}")
        dtype = q.dtype
        if dtype in (bfloat16, float16):      # exchanged and merged in fp32
            q, k, v = q.float(), k.float(), v.float()
        hq = q.shape[-3]
        if groups > 1 and k.shape[-3] % n:
            # the key/value heads do not split over the ranks: one per
            # query head instead
            k = k.repeat_interleave(groups, dim=-3)
            v = v.repeat_interleave(groups, dim=-3)
            groups = 1
        hkp = -(-k.shape[-3] // n) * n          # heads padded to n's
        hqp = hkp * groups
        lens = [len(R.positions(T, n, s)) for s in range(n)]
        most, L = max(lens), q.shape[-2]
        xp = q._xp()
        # the exchanged rows are rank-major, each rank's padded to `most`:
        # `order` picks the sequence in global order, `back` the reverse
        # (the padding reads a zero row appended at T)
        slot = np.concatenate([s * most + np.arange(lens[s])
                               for s in range(n)])
        glob = np.concatenate([R.positions(T, n, s) for s in range(n)])
        order = np.empty(T, np.int64)
        order[glob] = slot
        back = np.full(n * most, T, np.int64)
        back[slot] = glob

        def there(x, heads):
            x = F.pad(x, (0, 0, 0, most - x.shape[-2], 0,
                          heads - x.shape[-3]))
            x = R.HeadsToSequence.apply(x, group=self.group, split=-3,
                                        cat=-2)
            return x.index_select(-2, Tensor._wrap(xp.asarray(order)))
        qh, kh, vh = there(q, hqp), there(k, hkp), there(v, hkp)
        mine = np.arange(r * hqp // n, (r + 1) * hqp // n)
        m = mask
        if m is not None and m.ndim >= 3 and m.shape[-3] > 1:
            m = Tensor._wrap(xp.take(m._data, xp.asarray(
                np.minimum(mine, hq - 1)), axis=-3))
        # attention block by block over the 2n chunks (the ring's kernel,
        # no communication): nothing T x T is kept
        lead = tuple(batch[:-1])
        index = [a * hq + h if h < hq else None
                 for a in range(int(np.prod(lead))) for h in mine]
        plan = R.Plan(None, T, lead + (len(mine),), causal, scale, groups,
                      p, keep, local=n, keep_index=index)
        y = R.RingAttention.apply(qh, kh, vh, m, plan=plan)
        zero = y.new_zeros(y.shape[:-2] + (1, y.shape[-1]))
        y = cat([y, zero], -2).index_select(-2, Tensor._wrap(
            xp.asarray(back)))
        out = R.HeadsToSequence.apply(y, group=self.group, split=-2, cat=-3)
        out = out[..., :hq, :L, :]
        return out.to(dtype) if out.dtype != dtype else out


@contextlib.contextmanager
def context_parallel(mesh, *, buffers=None, buffer_seq_dims=None,
                     no_restore_buffers=None, algorithm="ring"):
    """Shard ``buffers`` along ``buffer_seq_dims`` over the 1-d ``mesh``
    and run SDPA context-parallel inside (see the module docstring);
    ``algorithm``: ``"ring"`` or ``"ulysses"``."""
    group, n, r = _cp_group(mesh)
    buffers = [] if buffers is None else list(buffers)
    dims = [] if buffer_seq_dims is None else list(buffer_seq_dims)
    keep_out = [] if no_restore_buffers is None else list(no_restore_buffers)
    if len(buffers) != len(dims):
        raise ValueError("`seq_dims` must have the same number of elements "
                         "as `buffers`.")
    if any(not any(b is x for x in buffers) for b in keep_out):
        raise ValueError("`no_restore_buffers` must be a subset of "
                         "`buffers`.")
    if algorithm not in ("ring", "ulysses"):
        raise ValueError(f"context_parallel: algorithm must be 'ring' or "
                         f"'ulysses', got {algorithm!r}")
    dims = [d % b.ndim for b, d in zip(buffers, dims)]
    lens = [b.shape[d] for b, d in zip(buffers, dims)]
    if len(set(lens)) > 1:
        raise ValueError(f"context_parallel: the buffers' sequence dims "
                         f"have different lengths {lens}")
    T = lens[0] if lens else None
    saved = [None if any(b is x for x in keep_out) else b.clone()
             for b in buffers]
    if buffers:
        with no_grad():
            for b, d in zip(buffers, dims):
                idx = Tensor._wrap(b._xp().asarray(R.positions(T, n, r)))
                shard = b.index_select(d, idx)
                b.resize_(shard.shape).copy_(shard)
    state = _fa._context_parallel
    prev = getattr(state, "attention", None)
    state.attention = _Region(group, n, r, T, algorithm)
    try:
        yield
    finally:
        state.attention = prev
        with no_grad():
            for b, orig in zip(buffers, saved):
                if orig is not None:
                    b.resize_(orig.shape).copy_(orig)


def context_parallel_unshard(mesh, buffers, seq_dims, load_balancer=None):
    """The whole tensors, in sequence order, from every rank's shard of
    ``buffers`` along ``seq_dims`` (a collective over ``mesh``)."""
    if load_balancer is not None:
        raise NotImplementedError(
            "context_parallel_unshard: dtorch has one layout (chunks r and "
            "2 CP - 1 - r); load_balancer objects are not supported")
    group, n, r = _cp_group(mesh)
    res = []
    with no_grad():
        for b, d in zip(buffers, seq_dims):
            d %= b.ndim
            lens = [None] * n
            dist.all_gather_object(lens, b.shape[d], group=group)
            T, most = sum(lens), max(lens)
            for s in range(n):
                if lens[s] != len(R.positions(T, n, s)):
                    raise ValueError(
                        f"context_parallel_unshard: rank {s}'s shard has "
                        f"{lens[s]} positions, not its part of {T} ({lens})")
            xp = b._xp()
            a = xp.moveaxis(b._data, d, 0)
            pad = xp.zeros((most,) + a.shape[1:], a.dtype)
            pad[:a.shape[0]] = a
            out = xp.empty((n,) + pad.shape, a.dtype)
            dist.all_gather_into_tensor(Tensor._wrap(out), Tensor._wrap(pad),
                                        group=group)
            full = xp.empty((T,) + a.shape[1:], a.dtype)
            for s in range(n):
                full[xp.asarray(R.positions(T, n, s))] = out[s][:lens[s]]
            res.append(Tensor._wrap(xp.moveaxis(full, 0, d)))
    return res
