"""Gradient clipping by the true global norm when gradients are split over
ranks: tensor-parallel shards, pipeline stages, ZeRO-2 / FSDP shards.

Each rank reduces the gradient elements it is responsible for to one
partial value (the sum of ``|g|**p``, or the max / min of ``|g|`` for the
infinity norms); the partials are all-reduced over every group across
which the model is split, and the p-th root is taken once. Every element
of the model must be counted by exactly one rank of those groups: a
parameter that is *replicated* over one of them (the bias of a
``RowParallelLinear``, a LayerNorm in a tensor-parallel block) is counted
on that group's rank 0 only. (Counting it on every rank is PyTorch's
issue #156842: the norm of a TP model grows with the TP size.) Data-parallel
replicas are not a group to reduce over: every replica already holds the
same gradients.

Example (tensor parallel x pipeline)::

    norm = dist.clip_grad_norm_(
        stage.parameters(), 1.0, groups=(tp_group, pp_group),
        replicated={tp_group: [p for p in stage.parameters()
                                if not is_tp_sharded(p)]})

NaN and inf behave as in ``nn.utils.clip_grad_norm_``: a NaN anywhere
makes the global norm NaN on every rank (and the gradients NaN after the
branch-free scaling); ``error_if_nonfinite=True`` raises on every rank.
"""
import math

import numpy as np

from .. import distributed as dist
from .._backend import get_array_module
from .._settings import are_deterministic_algorithms_enabled
from ..tensor import Tensor


def _params(parameters):
    if isinstance(parameters, Tensor):
        return [parameters]
    return list(parameters)


def _acc_dtype(dt):
    # half precision accumulates in float32, as the single-process version
    return np.promote_types(np.dtype(dt), np.float32)


def partial_norm(arrays, norm_type):
    """This rank's partial of the ``norm_type`` norm over ``arrays`` (the
    gradient elements it counts), as a float64 NumPy pair (value, NaN
    seen) ready for ``reduce_partials``."""
    p = float(norm_type)
    val = 0.0 if p != -math.inf else math.inf
    nan = 0.0
    for a in arrays:
        if a.size == 0:
            continue
        xp = get_array_module(a)
        a = a.reshape(-1)
        if p == math.inf or p == -math.inf:
            m = xp.abs(a)
            bad = bool(xp.isnan(m).any())
            nan = max(nan, float(bad))
            if bad:
                m = m[~xp.isnan(m)]
                if m.size == 0:
                    continue
            v = float(m.max() if p == math.inf else m.min())
            val = max(val, v) if p == math.inf else min(val, v)
        elif p == 0:
            val += float(bool((a != 0).any()))
        else:
            a = a.astype(_acc_dtype(a.dtype), copy=False)
            if p == 2:
                val += float(xp.dot(a, a))
            elif p == 1:
                val += float(xp.abs(a).sum())
            else:
                val += float((xp.abs(a) ** p).sum())
    return np.array([val, nan], np.float64)


def reduce_partials(part, norm_type, groups):
    """The global norm from every rank's ``partial_norm`` (a collective over
    each group of ``groups``, in order), as a Python float."""
    p = float(norm_type)
    part = part.copy()
    sizes = [g for g in groups if dist.get_world_size(g) > 1]
    if p == 0 and sizes:
        # PyTorch's 0-"norm" is the norm of per-tensor norms: the number
        # of tensors with a nonzero gradient, which a split tensor cannot
        # tell from its pieces' counts
        raise ValueError(
            "clip_grad_norm_: norm_type=0 (PyTorch counts the tensors whose "
            "gradient is nonzero) is not defined when parameters are split "
            "over ranks; use a p-norm with p > 0 or inf")
    if p == -math.inf:
        part[0] = -part[0]          # min as a max, so one op does both
    for g in sizes:
        t = Tensor._wrap(part)
        if p in (math.inf, -math.inf):
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=g)
        else:
            # a NaN partial stays NaN through a sum
            dist.all_reduce(t, op=dist.ReduceOp.SUM, group=g)
    val = float(part[0])
    if p in (math.inf, -math.inf):
        if part[1] > 0:
            return math.nan
        return val if p == math.inf else -val
    if p == 0 or p == 1:
        return val
    return val ** (1.0 / p)


def exact_norm(arrays, norm_type, groups):
    """Deterministic mode's p-norm (0 < p < inf) of every rank's
    ``arrays``: the sum of ``|g|**p`` is exact on a two-word fixed-point
    grid (integers below 2^53 in float64, which add exactly in any order),
    so it does not depend on how the elements are split over ranks (ZeRO-2
    or FSDP shards on any world size, TP on any TP size). The grid's unit
    follows the global largest term and element count (one MAX all-reduce
    per group); the sums are one SUM all-reduce per group. Two words keep
    2 (52 - log2 n) bits of the largest term: more than float64's own
    rounding of a sum for any n below 2^20."""
    p = float(norm_type)
    sizes = [g for g in groups if dist.get_world_size(g) > 1]
    terms, top = [], np.zeros(4, np.float64)   # exponent, count, nan, inf
    for a in arrays:
        if a.size == 0:
            continue
        xp = get_array_module(a)
        a = xp.abs(a.reshape(-1).astype(xp.float64))
        t = a * a if p == 2 else (a if p == 1 else a ** p)
        m = float(t.max())
        if not math.isfinite(m):
            top[2] = max(top[2], float(bool(xp.isnan(t).any())))
            top[3] = max(top[3], float(bool(xp.isinf(t).any())))
            t = xp.where(xp.isfinite(t), t, 0.0)
            m = float(t.max())
        top[0] = max(top[0], math.frexp(m)[1] if m > 0 else -1100)
        top[1] = max(top[1], t.size)
        terms.append(t)
    if not terms:
        top[0] = -1100
    world = 1
    for g in sizes:
        dist.all_reduce(Tensor._wrap(top), op=dist.ReduceOp.MAX, group=g)
        world *= dist.get_world_size(g)
    if top[2] or top[3]:
        return math.nan if top[2] else math.inf
    if top[0] <= -1100:
        return 0.0
    prec = 52 - max(1, math.ceil(math.log2(top[1] * world + 1)))
    unit = max(int(top[0]) - prec, -1023)
    sums = np.zeros(2, np.float64)
    for t in terms:
        xp = get_array_module(t)
        x = t * math.ldexp(1.0, -unit)      # exact: a power of two
        hi = xp.rint(x)
        lo = xp.rint((x - hi) * math.ldexp(1.0, prec))
        sums += [float(hi.sum()), float(lo.sum())]
    for g in sizes:
        dist.all_reduce(Tensor._wrap(sums), group=g)
    total = sums[0] * math.ldexp(1.0, unit) + \
        sums[1] * math.ldexp(1.0, unit - prec)
    return total if p == 1 else total ** (1.0 / p)


def global_norm(arrays, norm_type, groups, dtype, device,
                error_if_nonfinite=False):
    """The norm of every rank's ``arrays`` together, as a 0-d tensor of
    ``dtype`` on ``device`` (``dtype``/``device``: the gradients'). Under
    ``use_deterministic_algorithms(True)`` a p-norm is ``exact_norm``."""
    from .._creation import tensor
    p = float(norm_type)
    if are_deterministic_algorithms_enabled() and 0 < p < math.inf:
        total = exact_norm(arrays, p, groups)
    else:
        total = reduce_partials(partial_norm(arrays, norm_type), norm_type,
                                groups)
    if error_if_nonfinite and not math.isfinite(total):
        raise RuntimeError(
            f"The total norm of order {float(norm_type)} for gradients from "
            f"`parameters` is non-finite, so it cannot be clipped. To "
            f"disable this error and scale the gradients by the non-finite "
            f"norm anyway, set `error_if_nonfinite=False`")
    return tensor(total, dtype=dtype, device=device)


def _check_groups(groups, replicated):
    groups = list(groups or ())
    for g in groups:
        if g is None:
            raise ValueError("clip_grad_norm_: groups holds None; pass the "
                             "process groups the model is split over")
    for g in (replicated or {}):
        if not any(g is h for h in groups):
            raise ValueError(
                "clip_grad_norm_: a group in `replicated` is not one of "
                "`groups`: a parameter replicated over a group that is not "
                "reduced over must be counted on every rank of it")
    return groups


def get_total_norm(parameters, norm_type=2.0, error_if_nonfinite=False,
                   *, groups=(), replicated=None):
    """The global gradient norm of a model split over ``groups``.

    ``parameters``: this rank's parameters; ``groups``: the process groups
    across which the model's parameters are split (each rank of them holds
    different elements: TP shards, pipeline stages); ``replicated``:
    ``{group: parameters}``, parameters identical on every rank of that
    group, counted on its rank 0 only. Returns a 0-d tensor, the same on
    every rank. A collective over each group."""
    params = _params(parameters)
    groups = _check_groups(groups, replicated)
    skip = set()
    for g, ps in (replicated or {}).items():
        if dist.get_rank(g) != 0:
            skip.update(id(p) for p in _params(ps))
    arrays = [p.grad._data for p in params
              if p.grad is not None and id(p) not in skip]
    dtype, device = _dtype_device(params)
    return global_norm(arrays, norm_type, groups, dtype, device,
                       error_if_nonfinite)


def _dtype_device(params):
    from .. import float32
    for p in params:
        if p.grad is not None:
            return p.grad.dtype, p.grad.device
    for p in params:
        return p.dtype, p.device
    return float32, "cpu"


def clip_grad_norm_(parameters, max_norm, norm_type=2.0,
                    error_if_nonfinite=False, foreach=None, *, groups=(),
                    replicated=None):
    """``nn.utils.clip_grad_norm_`` with the global norm of a model split
    over ``groups`` (see ``get_total_norm``): every rank scales its
    gradients by the same factor. Returns the global norm (before
    clipping)."""
    from ..nn.utils.clip_grad import clip_grads_with_norm_
    params = _params(parameters)
    total = get_total_norm(params, norm_type, error_if_nonfinite,
                           groups=groups, replicated=replicated)
    clip_grads_with_norm_(params, max_norm, total)
    return total
