"""Distance functions: cosine_similarity, pairwise_distance, pdist."""
import numpy as np

from ... import _backend as B
from ...functional import broadcast_tensors
from ._common import _wrap


# ======================================================= distances ========

def cosine_similarity(x1, x2, dim=1, eps=1e-8):
    """sum(x1 / max(||x1||, eps) * x2 / max(||x2||, eps)) along dim, after
    broadcasting. As PyTorch, each norm is clamped on its own, and the
    clamp is not differentiated (torch clamps in place under no_grad): a
    zero or tiny vector's gradient is the unclamped norm's."""
    x1, x2 = broadcast_tensors(x1, x2)
    if not x1.dtype.is_floating_point:
        x1 = x1.to(B.get_default_dtype())
    if not x2.dtype.is_floating_point:
        x2 = x2.to(B.get_default_dtype())

    def unit(x):
        n = x.norm(2, dim, keepdim=True)
        return x / (n + (n.clamp(min=eps) - n).detach())
    return (unit(x1) * unit(x2)).sum(dim)


def pairwise_distance(x1, x2, p=2.0, eps=1e-6, keepdim=False):
    d = x1 - x2 + eps
    if p == float("inf"):
        return d.abs().amax(-1, keepdim)
    if p == 0:
        return (d != 0).sum(-1, keepdim).to(x1.dtype)
    return d.norm(p, -1, keepdim)


def pdist(input, p=2.0):
    n = input.shape[0]
    i, j = np.triu_indices(n, 1)
    xp = input._xp()
    a = input[_wrap(xp.asarray(i))]
    b = input[_wrap(xp.asarray(j))]
    return (a - b).norm(p, -1)
