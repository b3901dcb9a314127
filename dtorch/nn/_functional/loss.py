"""Loss functions."""
import math
import warnings

import numpy as np

from ... import _backend as B
from ... import ops as P
from ... import ops as N
from ...tensor import Tensor
from ...autograd.function import autocast_op
from ._common import _legacy_reduction, _reduce
from .activation import log_softmax, logsigmoid
from .distance import pairwise_distance


# ================================================================= losses ==

def _check_same_size(input, target, name):
    if tuple(input.shape) != tuple(target.shape):
        warnings.warn(
            f"Using a target size ({target.shape}) that is different to the "
            f"input size ({input.shape}). This will likely lead to incorrect "
            f"results due to broadcasting. Please ensure they have the same "
            f"size.", stacklevel=3)


@autocast_op("fp32")
def mse_loss(input, target, size_average=None, reduce=None,
             reduction="mean", weight=None):
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_same_size(input, target, "mse_loss")
    d = input - target
    if weight is None:
        return _reduce(d * d, reduction)
    # PyTorch's weighted form: the mean divides by the sum of the weights
    if tuple(weight.shape) != tuple(input.shape):
        raise ValueError("Weights and input must have the same size.")
    loss = d * d * weight
    if reduction == "mean":
        return loss.sum() / weight.sum()
    return _reduce(loss, reduction)


@autocast_op("fp32")
def l1_loss(input, target, size_average=None, reduce=None,
            reduction="mean"):
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_same_size(input, target, "l1_loss")
    return _reduce((input - target).abs(), reduction)


@autocast_op("fp32")
def smooth_l1_loss(input, target, size_average=None, reduce=None,
                   reduction="mean", beta=1.0):
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_same_size(input, target, "smooth_l1_loss")
    if beta == 0:      # PyTorch runs l1_loss then
        return _reduce((input - target).abs(), reduction)
    return _reduce(N.SmoothL1.apply(input, target, beta=beta), reduction)


@autocast_op("fp32")
def huber_loss(input, target, reduction="mean", delta=1.0):
    return _reduce(N.Huber.apply(input, target, delta=delta), reduction)


@B.on_own_device   # direct CuPy checks: on input's device
def _check_targets(t, c, ignore_index):
    """Class indices must lie in [0, C) (ignore_index excepted)."""
    a = t._data
    if a.dtype.kind not in "iu":
        raise RuntimeError(
            f"expected scalar type Long but found {B.from_np(a.dtype)}")
    if not a.size:
        return
    bad = (a < 0) | (a >= c)
    if ignore_index is not None:
        bad &= a != ignore_index

    def error():
        v = int(a[bad].reshape(-1)[0])
        return IndexError(f"Target {v} is out of bounds: the input has {c} "
                          f"classes, so class indices must be in "
                          f"[0, {c - 1}]")
    # no host sync on a device (raised at the next one)
    B.check_or_defer(bad.any(), error)


@autocast_op("fp32")
def nll_loss(input, target, weight=None, size_average=None,
             ignore_index=-100, reduce=None, reduction="mean"):
    reduction = _legacy_reduction(size_average, reduce, reduction)
    return _nll(N.NllLoss, input, target, weight, ignore_index, reduction)


def _nll(op, input, target, weight, ignore_index, reduction):
    """nll_loss's checks, then ``op`` (NllLoss, or CrossEntropy on
    logits)."""
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(f"{reduction} is not a valid value for reduction")
    unbatched = input.ndim == 1
    if unbatched:
        input, target = input.unsqueeze(0), target.unsqueeze(0)
    if input.ndim < 2:
        raise ValueError(f"Expected 2 or more dimensions (got {input.ndim})")
    if input.shape[0] != target.shape[0] or \
            tuple(input.shape[2:]) != tuple(target.shape[1:]):
        raise ValueError(
            f"Expected input batch_size ({input.shape[0]}) to match target "
            f"batch_size ({target.shape[0]}).")
    c = input.shape[1]
    _check_targets(target, c, ignore_index)
    if weight is not None and tuple(weight.shape) != (c,):
        raise RuntimeError(
            f"weight tensor should be defined either for all {c} classes or "
            f"no classes but got weight tensor of shape: "
            f"{list(weight.shape)}")
    out = op.apply(input, target._data,
                   None if weight is None else weight._data,
                   ignore_index=ignore_index, reduction=reduction)
    return out.squeeze(0) if unbatched and reduction == "none" else out


@B.on_own_device   # direct CuPy code: on input's device
@autocast_op("fp32")
def cross_entropy(input, target, weight=None, size_average=None,
                  ignore_index=-100, reduce=None, reduction="mean",
                  label_smoothing=0.0):
    """log_softmax over dim 1 then nll; targets are class indices (N, ...)
    or class probabilities shaped like the input."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    if not 0.0 <= label_smoothing <= 1.0:
        raise RuntimeError(f"label_smoothing must be between 0.0 and 1.0. "
                           f"Got: {label_smoothing}")
    cdim = 0 if input.ndim == 1 else 1
    c = input.shape[cdim]
    if not target.is_floating_point() and label_smoothing <= 0:
        return _nll(N.CrossEntropy, input, target, weight, ignore_index,
                    reduction)
    logp = log_softmax(input, cdim)
    if target.is_floating_point():
        if tuple(target.shape) != tuple(input.shape):
            raise RuntimeError(
                f"Expected target size {list(input.shape)}, got "
                f"{list(target.shape)}")
        if label_smoothing > 0:
            target = target * (1 - label_smoothing) + label_smoothing / c
        prod = logp * target
        if weight is not None:
            shape = [1] * input.ndim
            shape[cdim] = c
            prod = prod * weight.reshape(shape)
        loss = -prod.sum(cdim)
        if reduction == "mean":
            n = max(input.numel() // c, 1) if input.ndim > 1 else 1
            return loss.sum() / n
        return _reduce(loss, reduction)
    nll = nll_loss(logp, target, weight, ignore_index=ignore_index,
                   reduction=reduction)
    if label_smoothing <= 0:
        return nll
    if weight is not None:
        shape = [1] * input.ndim
        shape[cdim] = c
        smooth = -(logp * weight.reshape(shape)).sum(cdim)
    else:
        smooth = -logp.sum(cdim)
    keep = target._data != ignore_index
    # masked_fill, not a product with the mask: an ignored row may hold
    # -inf log-probabilities, and inf * 0 is NaN
    smooth = P.Where.apply(keep, smooth, 0.0)
    if reduction == "none":
        red = smooth
    elif reduction == "sum":
        red = smooth.sum()
    elif weight is not None:
        t = target._data[keep]
        red = smooth.sum() / weight[Tensor._wrap(t)].sum()
    else:
        red = smooth.sum() / int(keep.sum())
    return nll * (1 - label_smoothing) + red * (label_smoothing / c)


@B.on_own_device   # direct CuPy checks: on input's device
def binary_cross_entropy(input, target, weight=None, size_average=None,
                         reduce=None, reduction="mean"):
    reduction = _legacy_reduction(size_average, reduce, reduction)
    if tuple(target.shape) != tuple(input.shape):
        raise ValueError(
            f"Using a target size ({target.shape}) that is different to the "
            f"input size ({input.shape}) is deprecated. Please ensure they "
            f"have the same size.")
    a = input._data
    # NaN is out of range too (PyTorch checks 0 <= x <= 1)
    # (no host sync on a device: raised at the next one)
    if a.size:
        B.check_or_defer(~((a >= 0) & (a <= 1)).all(), lambda: RuntimeError(
            "all elements of input should be between 0 and 1"))
    b = target._data
    if b.size:
        B.check_or_defer(~((b >= 0) & (b <= 1)).all(), lambda: RuntimeError(
            "all elements of target should be between 0 and 1"))
    if weight is not None and tuple(weight.shape) != tuple(input.shape):
        weight = weight.expand(input.shape)
    return _reduce(N.BinaryCrossEntropy.apply(input, target, weight),
                   reduction)


@autocast_op("fp32")
def binary_cross_entropy_with_logits(input, target, weight=None,
                                     size_average=None, reduce=None,
                                     reduction="mean", pos_weight=None):
    reduction = _legacy_reduction(size_average, reduce, reduction)
    if tuple(target.shape) != tuple(input.shape):
        raise ValueError(
            f"Target size ({target.shape}) must be the same as input size "
            f"({input.shape})")
    return _reduce(N.BinaryCrossEntropyWithLogits.apply(
        input, target, weight, pos_weight), reduction)


@autocast_op("fp32")
def kl_div(input, target, size_average=None, reduce=None, reduction="mean",
           log_target=False):
    reduction = _legacy_reduction(size_average, reduce, reduction)
    if log_target:
        loss = target.exp() * (target - input)
    else:
        # PyTorch's xlogy(t, t) - t * x: 0 where t == 0, NaN where t < 0,
        # and differentiable in the target too
        loss = P.Xlogy.apply(target, target) - target * input
    if reduction == "batchmean":
        return loss.sum() / input.shape[0]
    return _reduce(loss, reduction)


# ============================================================ losses ======

@autocast_op("fp32")
def margin_ranking_loss(input1, input2, target, margin=0.0, size_average=None,
                        reduce=None, reduction="mean"):
    reduction = _legacy_reduction(size_average, reduce, reduction)
    return _reduce((-target * (input1 - input2) + margin).clamp(min=0),
                   reduction)


@autocast_op("fp32")
def hinge_embedding_loss(input, target, margin=1.0, size_average=None,
                         reduce=None, reduction="mean"):
    reduction = _legacy_reduction(size_average, reduce, reduction)
    # PyTorch's: x where target != -1, the margin term where target != 1
    # (both for a target that is neither)
    pos = input.where(target != -1, input.new_zeros(()))
    neg = (margin - input).clamp(min=0).where(target != 1,
                                              input.new_zeros(()))
    return _reduce(pos + neg, reduction)


@autocast_op("fp32")
def soft_margin_loss(input, target, size_average=None, reduce=None,
                     reduction="mean"):
    reduction = _legacy_reduction(size_average, reduce, reduction)
    return _reduce(N.SoftMargin.apply(input, target), reduction)


@autocast_op("fp32")
def cosine_embedding_loss(input1, input2, target, margin=0.0,
                          size_average=None, reduce=None, reduction="mean"):
    reduction = _legacy_reduction(size_average, reduce, reduction)
    eps = float(np.float32(1e-12))      # PyTorch's EPSILON is a float
    prod = (input1 * input2).sum(-1)
    m1 = (input1 * input1).sum(-1) + eps
    m2 = (input2 * input2).sum(-1) + eps
    cos = prod / (m1 * m2).sqrt()
    zero = cos.new_zeros(())
    loss = (1 - cos).where(target == 1, zero) + \
        (cos - margin).clamp(min=0).where(target == -1, zero)
    return _reduce(loss, reduction)


@autocast_op("fp32")
def triplet_margin_loss(anchor, positive, negative, margin=1.0, p=2.0,
                        eps=1e-6, swap=False, size_average=None, reduce=None,
                        reduction="mean"):
    reduction = _legacy_reduction(size_average, reduce, reduction)
    d_pos = pairwise_distance(anchor, positive, p, eps)
    d_neg = pairwise_distance(anchor, negative, p, eps)
    if swap:
        d_neg = d_neg.minimum(pairwise_distance(positive, negative, p, eps))
    return _reduce((d_pos - d_neg + margin).clamp(min=0), reduction)


def triplet_margin_with_distance_loss(anchor, positive, negative, *,
                                      distance_function=None, margin=1.0,
                                      swap=False, reduction="mean"):
    dist = distance_function or pairwise_distance
    d_pos = dist(anchor, positive)
    d_neg = dist(anchor, negative)
    if swap:
        d_neg = d_neg.minimum(dist(positive, negative))
    return _reduce((d_pos - d_neg + margin).clamp(min=0), reduction)


@autocast_op("fp32")
def poisson_nll_loss(input, target, log_input=True, full=False,
                     size_average=None, eps=1e-8, reduce=None,
                     reduction="mean"):
    reduction = _legacy_reduction(size_average, reduce, reduction)
    if log_input:
        loss = input.exp() - target * input
    else:
        loss = input - target * (input + eps).log()
    if full:
        # Stirling's term for log(target!), only where target > 1; as in
        # PyTorch it is differentiable in target
        t = target
        stirling = t * t.log() - t + 0.5 * (2 * math.pi * t).log()
        loss = loss + stirling.masked_fill(t <= 1, 0)
    return _reduce(loss, reduction)


def gaussian_nll_loss(input, target, var, full=False, eps=1e-6,
                      reduction="mean"):
    if var.ndim == input.ndim - 1 or (var.shape[-1] == 1
                                      and input.shape[-1] != 1
                                      and var.ndim == input.ndim):
        if var.ndim == input.ndim - 1:
            var = var.unsqueeze(-1)
    if bool((var < 0).any()):
        raise ValueError("var has negative entry/entries")
    v = var.clamp(min=eps) if not var.requires_grad else \
        var + (var.clamp(min=eps) - var).detach()
    loss = 0.5 * (v.log() + (input - target) ** 2 / v)
    if full:
        loss = loss + 0.5 * math.log(2 * math.pi)
    return _reduce(loss, reduction)


@autocast_op({"cuda": "fp32"})   # a composite on CPU: not in its list
def multilabel_soft_margin_loss(input, target, weight=None,
                                size_average=None, reduce=None,
                                reduction="mean"):
    reduction = _legacy_reduction(size_average, reduce, reduction)
    loss = -(target * logsigmoid(input) + (1 - target) * logsigmoid(-input))
    if weight is not None:
        loss = loss * weight
    loss = loss.mean(-1)
    return _reduce(loss, reduction)


@autocast_op("fp32")
def multi_margin_loss(input, target, p=1, margin=1.0, weight=None,
                      size_average=None, reduce=None, reduction="mean"):
    reduction = _legacy_reduction(size_average, reduce, reduction)
    if p not in (1, 2):
        raise ValueError("only p == 1 and p == 2 supported")
    x = input if input.ndim == 2 else input.unsqueeze(0)
    loss = N.MultiMargin.apply(x, target.reshape(-1)._data,
                               None if weight is None else weight._data,
                               p=p, margin=margin)
    if input.ndim == 1:
        loss = loss.reshape(())
    return _reduce(loss, reduction)


@autocast_op("fp32")
def multilabel_margin_loss(input, target, size_average=None, reduce=None,
                           reduction="mean"):
    raise NotImplementedError("multilabel_margin_loss is not supported by "
                              "dtorch")


# =================================================================== CTC ==

@autocast_op("fp32")
def ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0,
             reduction="mean", zero_infinity=False):
    """Connectionist temporal classification loss of (T, N, C)
    log-probabilities (or unbatched (T, C)) against padded (N, S) or
    concatenated targets. 'mean' divides each sample's loss by its target
    length, then averages, as PyTorch."""

    def arr(v):
        if isinstance(v, Tensor):
            return np.asarray(v.detach().cpu()._data, np.int64).reshape(-1)
        return np.asarray(v, np.int64).reshape(-1)
    batched = log_probs.ndim == 3
    lp = log_probs if batched else log_probs.unsqueeze(1)
    T, n, _ = lp.shape
    il, tl = arr(input_lengths), arr(target_lengths)
    if il.size != n or tl.size != n:
        raise RuntimeError(f"input_lengths and target_lengths must have "
                           f"size {n} (the batch), got {il.size} and "
                           f"{tl.size}")
    if (il > T).any():
        raise RuntimeError(f"Expected input_lengths to have value at most "
                           f"{T}, but got value {int(il.max())}")
    t = arr(targets) if not isinstance(targets, Tensor) or \
        targets.ndim < 2 else None
    if t is not None and (targets.ndim if isinstance(targets, Tensor)
                          else np.ndim(targets)) <= 1 and batched:
        # concatenated targets -> padded rows
        L = int(tl.max()) if tl.size else 0
        pad = np.zeros((n, L), np.int64)
        starts = np.concatenate([[0], np.cumsum(tl)[:-1]])
        pos = np.arange(L)[None, :]
        take = pos < tl[:, None]
        src = (starts[:, None] + pos)[take]
        pad[take] = t[src]
        tgt = pad
    elif t is not None:
        tgt = t.reshape(1, -1)
    else:
        tgt = np.asarray(targets.detach().cpu()._data, np.int64)
    if tgt.shape[1] < (tl.max() if tl.size else 0):
        raise RuntimeError("target_lengths exceed the targets' length")
    loss = N.CTCLoss.apply(lp, targets=tgt, input_lengths=il,
                         target_lengths=tl, blank=blank,
                         zero_infinity=zero_infinity)
    if reduction == "none":
        return loss if batched else loss.squeeze(0)
    if reduction == "sum":
        return loss.sum()
    if reduction == "mean":
        den = Tensor._wrap(lp._xp().asarray(np.maximum(tl, 1).astype(
            lp._data.dtype)))
        return (loss / den).mean()
    raise ValueError(f"{reduction} is not a valid value for reduction")
