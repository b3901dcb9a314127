"""DDP communication hooks: gradient compression on the wire.

``model.register_comm_hook(None, fp16_compress_hook)`` halves the bytes each
bucket's all-reduce moves: the bucket is divided by the world size, cast to
float16 (bfloat16 for ``bf16_compress_hook``), summed over ranks, and cast
back into the bucket.
"""
import numpy as np

from ....nn.parallel.distributed import _Future
from ...._backend import bfloat16


def allreduce_hook(group, bucket):
    t = bucket.buffer()
    group.all_reduce(t._data, "sum")
    t._data /= group.size
    return _Future(value=t)


def _compress_hook(group, bucket, np_dtype):
    t = bucket.buffer()
    flat = t._data
    low = (flat / group.size).astype(np_dtype)
    if np_dtype == bfloat16.np:
        # MPI has no bfloat16 sum: reduce in float32, round to bfloat16
        # afterwards so the result is what a bfloat16 wire would give
        wide = low.astype(np.float32)
        group.all_reduce(wide, "sum")
        low = wide.astype(np_dtype)
    else:
        group.all_reduce(low, "sum")
    flat[...] = low.astype(flat.dtype)
    return _Future(value=t)


def fp16_compress_hook(group, bucket):
    """All-reduce the bucket in float16."""
    return _compress_hook(group, bucket, np.float16)


def bf16_compress_hook(group, bucket):
    """All-reduce the bucket in bfloat16 (through float32 on MPI)."""
    return _compress_hook(group, bucket, bfloat16.np)
