"""Distance functions: cosine_similarity, pairwise_distance, pdist."""
import numpy as np

from ._common import _wrap


# ======================================================= distances ========

def cosine_similarity(x1, x2, dim=1, eps=1e-8):
    """x1 . x2 / max(||x1|| ||x2||, eps), along dim (broadcasting)."""
    w12 = (x1 * x2).sum(dim)
    n1 = (x1 * x1).sum(dim)
    n2 = (x2 * x2).sum(dim)
    # PyTorch clamps each squared norm product: sqrt(clamp(n1 * n2, eps^2))
    return w12 / (n1 * n2).clamp(min=eps * eps).sqrt()


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
