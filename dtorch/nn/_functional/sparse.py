"""Sparse functions: embedding, embedding_bag, one_hot."""
import numpy as np

from ... import _backend as B
from ..._ignored import ignored_argument
from ... import ops as N
from ...tensor import Tensor
from ...autograd.grad_mode import no_grad


def _dense_gradient(owner):
    # dtorch has no sparse tensors: weight.grad is the dense gradient (the
    # same values; optimizers treat it as any dense one)
    ignored_argument(owner, "sparse", True, "weight.grad is a dense tensor "
                     "(dtorch has no sparse tensors)", stacklevel=4)


# ============================================================== embedding ==

@B.on_own_device
def embedding(input, weight, padding_idx=None, max_norm=None,
              norm_type=2.0, scale_grad_by_freq=False, sparse=False):
    idx = input._data if isinstance(input, Tensor) else np.asarray(input)
    if idx.dtype.kind not in "iu":
        raise RuntimeError(
            f"Expected tensor for argument #1 'indices' to have one of the "
            f"following scalar types: Long, Int; but got "
            f"{B.from_np(idx.dtype)} instead (while checking arguments for "
            f"embedding)")
    n = weight.shape[0]
    if idx.size:    # no host sync on a device (raised at the next one)
        B.check_or_defer(((idx < 0) | (idx >= n)).any(),
                         lambda: IndexError("index out of range in self"))
    if padding_idx is not None and padding_idx < 0:
        padding_idx += n
    if max_norm is not None:
        with no_grad():
            rows = weight._data[idx.reshape(-1)]
            norms = (np.abs(rows) ** norm_type).sum(-1) ** (1 / norm_type) \
                if B.get_array_module(rows) is np else \
                (abs(rows) ** norm_type).sum(-1) ** (1 / norm_type)
            scale = (max_norm / (norms + 1e-7)).clip(max=1.0)
            weight._data[idx.reshape(-1)] = rows * scale[:, None]
            weight._bump_version()
    if sparse:
        _dense_gradient("embedding")
    return N.Embedding.apply(weight, idx, padding_idx=padding_idx,
                             scale_grad_by_freq=scale_grad_by_freq)


@B.on_own_device
def one_hot(tensor, num_classes=-1):
    a = tensor._data
    if a.dtype.kind not in "iu":
        raise RuntimeError("one_hot is only applicable to index tensor of "
                           "type LongTensor.")
    xp = tensor._xp()
    if num_classes == -1:
        num_classes = int(a.max()) + 1 if a.size else 0
    if a.size and (int(a.min()) < 0 or int(a.max()) >= num_classes):
        raise RuntimeError("Class values must be smaller than num_classes."
                           if a.min() >= 0 else
                           "Class values must be non-negative.")
    out = (a[..., None] == xp.arange(num_classes)).astype(np.int64)
    return Tensor._wrap(out)


# ========================================================= embedding bags ==

def embedding_bag(input, weight, offsets=None, max_norm=None, norm_type=2,
                  scale_grad_by_freq=False, mode="mean", sparse=False,
                  per_sample_weights=None, include_last_offset=False,
                  padding_idx=None):
    """Sum, mean or max of the embeddings of each bag: the rows of a 2-D
    ``input``, or the slices of a 1-D ``input`` that ``offsets`` start."""
    if mode not in ("sum", "mean", "max"):
        raise ValueError(f"mode has to be one of sum, mean or max, got "
                         f"{mode}")
    if sparse:
        _dense_gradient("embedding_bag")
    if per_sample_weights is not None and mode != "sum":
        raise NotImplementedError(
            f"embedding_bag: per_sample_weights was not None. "
            f"per_sample_weights is only supported for mode='sum' (got "
            f"mode='{mode}'). Please open a feature request on GitHub.")
    xp = input._xp()
    if input.ndim == 2:
        if offsets is not None:
            raise ValueError("if input is 2D, then offsets has to be None, "
                             "as input is treated is a mini-batch of fixed "
                             "length sequences.")
        nb, L = input.shape
        off = np.arange(nb) * L
        idx = input.reshape(-1)
        if per_sample_weights is not None:
            per_sample_weights = per_sample_weights.reshape(-1)
    elif input.ndim == 1:
        if offsets is None:
            raise ValueError("offsets has to be a 1D Tensor but got None")
        off = np.asarray(offsets.detach().cpu()._data, np.int64)
        if include_last_offset:
            off = off[:-1]
        idx = input
    else:
        raise ValueError(f"input has to be 1D or 2D Tensor, but got Tensor "
                         f"of dimension {input.ndim}")
    nb = len(off)
    n = idx.shape[0]
    seg = np.searchsorted(off, np.arange(n), side="right") - 1
    keep = np.ones(n, bool)
    if padding_idx is not None:
        pi = padding_idx % weight.shape[0]
        keep = np.asarray(idx.cpu()._data) != pi
    rows = embedding(idx, weight, None, max_norm, norm_type,
                     scale_grad_by_freq)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.unsqueeze(1)
    sel = np.flatnonzero(keep)
    seg_k = seg[sel]
    rows = rows.index_select(0, Tensor._wrap(xp.asarray(sel)))
    d = weight.shape[1]
    segt = Tensor._wrap(xp.asarray(seg_k.astype(np.int64)))
    if mode in ("sum", "mean"):
        out = rows.new_zeros((nb, d)).index_add(0, segt, rows)
        if mode == "mean":
            cnt = np.bincount(seg_k, minlength=nb).astype(np.float64)
            out = out / Tensor._wrap(xp.asarray(np.maximum(cnt, 1)[:, None]
                                                 .astype(out._data.dtype)))
        return out
    # max: place each bag's rows in a dense (bags, longest, D) block
    counts = np.bincount(seg_k, minlength=nb)
    L = max(int(counts.max()) if counts.size else 0, 1)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    pos = np.arange(seg_k.size) - starts[seg_k]
    dense = rows.new_full((nb * L, d), float("-inf")).index_copy(
        0, Tensor._wrap(xp.asarray((seg_k * L + pos).astype(np.int64))),
        rows)
    out = dense.reshape(nb, L, d).amax(1)
    empty = Tensor._wrap(xp.asarray((counts == 0)[:, None]))
    return out.masked_fill(empty, 0.0)
