"""Helpers shared by the nn.functional families: argument tuples,
reductions, dropout masks, 3-d window indices."""
import functools

import numpy as np

from ... import _backend as B
from ...tensor import Tensor
from ...autograd._capture import array_source
from ...random import draw
from .padding import pad


# ============================================================ helpers ==

def fresh_result(fn):
    """Decorator for a functional op that ends in a view of its own
    temporary (conv1d squeezes conv2d's output): for the caller the result
    is a new tensor, as PyTorch's, so an in-place op on it (Conv1d ->
    ReLU(inplace=True)) is legal. A view of an argument stays a view."""
    @functools.wraps(fn)
    def op(*args, **kwargs):
        out = fn(*args, **kwargs)
        base = getattr(out, "_base", None)
        if base is not None and not any(
                base is a or base is getattr(a, "_base", None)
                for a in args + tuple(kwargs.values())):
            out._base = None
        return out
    return op


def _ntuple(v, n, name="argument"):
    if isinstance(v, (tuple, list)):
        if len(v) == 1:
            return tuple(v) * n
        if len(v) != n:
            raise ValueError(f"{name} must be an int or a tuple of {n} ints, "
                             f"got {v}")
        return tuple(int(a) for a in v)
    return (int(v),) * n


def _pair(v, name="argument"):
    return _ntuple(v, 2, name)


def _reduce(loss, reduction):
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    if reduction == "none":
        return loss
    raise ValueError(f"{reduction} is not a valid value for reduction")


def _legacy_reduction(size_average, reduce, reduction):
    if size_average is None and reduce is None:
        return reduction
    size_average = True if size_average is None else size_average
    reduce = True if reduce is None else reduce
    if not reduce:
        return "none"
    return "mean" if size_average else "sum"


@array_source
def _keep_mask(x, p, generator=None, shape=None):
    """A boolean array of ``shape`` (default x's), True with probability
    1 - p, on x's device."""
    shape = x.shape if shape is None else shape
    # drawn on x's device, by its generator (float32 on a GPU)
    u = draw("random", size=shape, device=x.device, generator=generator)
    with B.device_guard(u):
        return u >= p


def _wrap(a):
    return Tensor._wrap(a)


# ===================================================== 3-d conv and pooling ==
# Windows are gathered with one index_select over the flattened, padded
# volume (columns (N, C, K, L)); the convolution is one einsum over them.
# Gradients come from index_select's backward (a sorted segment sum).
def _triple(v, name):
    return _ntuple(v, 3, name)


def _window_index(sizes, k, s, d):
    """Flat positions (K, L) read by each kernel offset at each output
    position, in a volume of ``sizes`` (already padded)."""
    out = [(n - (dd * (kk - 1) + 1)) // ss + 1
           for n, kk, ss, dd in zip(sizes, k, s, d)]
    if any(o <= 0 for o in out):
        raise RuntimeError(f"Output size is too small (calculated output "
                           f"size {out} from input of padded size "
                           f"{list(sizes)})")
    strides = [sizes[1] * sizes[2], sizes[2], 1]
    koff = np.zeros(1, np.int64)
    opos = np.zeros(1, np.int64)
    for ax in range(3):
        koff = (koff[:, None] + (np.arange(k[ax]) * d[ax]
                                 * strides[ax])[None, :]).reshape(-1)
        opos = (opos[:, None] + (np.arange(out[ax]) * s[ax]
                                 * strides[ax])[None, :]).reshape(-1)
    return koff[:, None] + opos[None, :], out


def _columns(x, k, s, p, d, fill=0.0):
    if any(p):
        x = pad(x, (p[2], p[2], p[1], p[1], p[0], p[0]), value=fill)
    n, c = x.shape[:2]
    idx, out = _window_index(tuple(x.shape[2:]), k, s, d)
    flat = x.reshape(n, c, -1)
    cols = flat.index_select(2, Tensor._wrap(x._xp().asarray(
        idx.reshape(-1))))
    return cols.reshape(n, c, idx.shape[0], idx.shape[1]), out
