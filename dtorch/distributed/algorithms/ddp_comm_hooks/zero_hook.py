"""ZeRO stage 2 for DDP: ``ddp.register_comm_hook(zero, reduce_scatter_hook)``
with ``zero`` a ``ZeroRedundancyOptimizer`` over the same group.

Each bucket is reduce-scattered instead of all-reduced: the bucket's flat
gradient is cut into ``world_size`` equal chunks (the last padded) and rank
r receives only the average of chunk r, the part whose optimizer state it
owns (the optimizer lays its shards out by these buckets from its first
step on). That halves the gradient traffic of an all-reduce; the
optimizer's all-gather of the updated parameters completes the exchange.
The rest of the bucket is returned as zeros, so after backward ``p.grad``
is the averaged gradient on this rank's chunk and zero elsewhere: clip with
``zero.clip_grad_norm_``.
"""
from .... import distributed as dist
from ....futures import Future
from ....tensor import Tensor

__all__ = ["reduce_scatter_hook"]


def reduce_scatter_hook(zero, bucket):
    """DDP communication hook (``state``: the ZeroRedundancyOptimizer)."""
    if not hasattr(zero, "_note_bucket"):
        raise TypeError("reduce_scatter_hook: the hook's state must be the "
                        "ZeroRedundancyOptimizer of the model, got "
                        f"{type(zero).__name__}")
    group = zero.process_group
    n = dist.get_world_size(group)
    r = dist.get_rank(group)
    zero._note_bucket(bucket.index(), bucket.parameters())
    buf = bucket.buffer()
    flat, xp = buf._data, buf._xp()
    chunk = -(-flat.size // n)
    if flat.size == chunk * n:
        send = flat                      # no padding needed: no copy
    else:
        send = xp.zeros(chunk * n, flat.dtype)
        send[:flat.size] = flat
    mine = xp.empty(chunk, flat.dtype)
    dist.reduce_scatter_tensor(Tensor._wrap(mine), Tensor._wrap(send),
                               group=group)
    mine /= n
    # the result in the bucket's own buffer: DDP then writes it back
    # without another copy
    lo, hi = min(r * chunk, flat.size), min((r + 1) * chunk, flat.size)
    flat[...] = 0
    flat[lo:hi] = mine[:hi - lo]
    fut = Future()
    fut.set_result(buf)
    return fut
