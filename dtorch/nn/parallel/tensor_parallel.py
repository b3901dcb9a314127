"""Tensor parallelism, Megatron style: one layer's weight split over the
ranks of a tensor-parallel (TP) group.

Four autograd-aware regions move activations between the "replicated" and
"sharded on the last dim" layouts; each is the other's transpose, so the
backward of one is the forward of its partner:

    region                 forward               backward
    copy_to_tp_region      identity              all-reduce (sum)
    reduce_from_tp_region  all-reduce (sum)      identity
    scatter_to_tp_region   keep my slice         all-gather
    gather_from_tp_region  all-gather            keep my slice

``ColumnParallelLinear`` splits the output features (weight rows),
``RowParallelLinear`` the input features (weight columns). A Column layer
with ``gather_output=False`` feeding a Row layer with
``input_is_parallel=True`` is an MLP with one all-reduce forward and one
backward, and no communication in between::

    tp = ...                                   # a group from new_group
    mlp = nn.Sequential(
        ColumnParallelLinear(64, 256, gather_output=False, process_group=tp),
        nn.ReLU(),
        RowParallelLinear(256, 64, input_is_parallel=True, process_group=tp))

A layer built with the same seed on every rank equals the plain layer
built with that seed (each rank initialises the full weight, then keeps
its shard, as Megatron's CPU initialisation does); ``from_linear`` shards
an existing layer. ``gather_state_dict`` / ``shard_state_dict`` (and the
optimizer variants) convert between sharded and full checkpoints, so a
checkpoint does not depend on the TP size.

DP x TP: ``make_dp_tp_groups(tp_size)`` returns this rank's data-parallel
and tensor-parallel groups; wrap the model in
``DistributedDataParallel(model, process_group=dp_group)``.
"""
from ... import distributed as dist
from ...autograd.grad_mode import no_grad
from ..._backend import get_array_module
from ...tensor import Tensor
from .. import functional as F
from ..modules.linear import Linear, _weight_and_bias
from ..modules.module import Module
from ..modules.sparse import Embedding
from ..parameter import Parameter
from ._functions import (CopyToTP, ReduceFromTP, ScatterToTP,  # noqa: F401
                         GatherFromTP, gather_along, resolve_group)

__all__ = [
    "ColumnParallelLinear", "RowParallelLinear", "VocabParallelEmbedding",
    "copy_to_tp_region", "reduce_from_tp_region", "scatter_to_tp_region",
    "gather_from_tp_region", "make_dp_tp_groups", "gather_state_dict",
    "shard_state_dict", "gather_optimizer_state_dict",
    "shard_optimizer_state_dict",
]


def copy_to_tp_region(x, group=None):
    return CopyToTP.apply(x, group=resolve_group(group))


def reduce_from_tp_region(x, group=None):
    return ReduceFromTP.apply(x, group=resolve_group(group))


def scatter_to_tp_region(x, group=None):
    return ScatterToTP.apply(x, group=resolve_group(group))


def gather_from_tp_region(x, group=None):
    return GatherFromTP.apply(x, group=resolve_group(group))


# ================================================================ layers ==

def _divide(n, size, what, cls):
    if n % size:
        raise ValueError(
            f"{cls}: {what}={n} is not divisible by the tensor-parallel "
            f"size {size}")
    return n // size


def _shard(full, dim, group):
    """This rank's slice of ``full`` along ``dim`` (an array)."""
    k = full.shape[dim] // dist.get_world_size(group)
    r = dist.get_rank(group)
    idx = [slice(None)] * full.ndim
    idx[dim] = slice(r * k, (r + 1) * k)
    return get_array_module(full).array(full[tuple(idx)], order="C")


def _unshard(arr, dim, group):
    """The full array from every rank's slice along ``dim``."""
    return gather_along(group, arr, dim)


class _OneRank:
    """The group of a layer built with no process group initialised."""
    rank, size, ranks, name = 0, 1, [0], "single"


_ONE = _OneRank()


class _TPLayer(Module):
    """What the sharded layers share: the group, and which parameter is
    split along which dim (``_shard_dims``; absent: replicated)."""
    _shard_dims = {}

    def _set_group(self, process_group):
        if process_group is None and not dist.is_initialized():
            g = _ONE       # no launcher: one rank holds the whole layer
        else:
            g = resolve_group(process_group)
        # plain attributes: not a submodule, not in the state_dict
        object.__setattr__(self, "process_group", g)
        self.tp_rank, self.tp_size = dist.get_rank(g), dist.get_world_size(g)
        return g

    def _load_full(self, **full):
        """Copy this rank's shard of each full tensor into the parameter
        of that name."""
        g = self.process_group
        with no_grad():
            for name, t in full.items():
                p = getattr(self, name)
                if p is None or t is None:
                    continue
                a = t._data if isinstance(t, Tensor) else t
                want = list(p.shape)
                dim = self._shard_dims.get(name)
                if dim is not None:
                    a = _shard(a, dim, g)
                if list(a.shape) != want:
                    raise ValueError(
                        f"{type(self).__name__}.{name}: rank {self.tp_rank} "
                        f"of {self.tp_size} expects a shard of shape {want}, "
                        f"got {list(a.shape)}")
                p._data[...] = a
                p._bump_version()

    def full_tensors(self):
        """{name: full array} of the parameters, gathered over the group
        (a collective: every rank of the group must call it)."""
        out = {}
        for name, p in self._parameters.items():
            if p is None:
                continue
            dim = self._shard_dims.get(name)
            a = p._data
            out[name] = a if dim is None else _unshard(a, dim,
                                                       self.process_group)
        return out


class _TPLinear(_TPLayer):
    """What Column- and RowParallelLinear share: conversion from and to a
    full ``nn.Linear``."""

    @classmethod
    def _from_full(cls, linear, process_group, **flags):
        w = linear.weight
        m = cls(linear.in_features, linear.out_features,
                linear.bias is not None, process_group=process_group,
                device=w.device, dtype=w.dtype, _init=False, **flags)
        m._load_full(weight=w, bias=linear.bias)
        return m

    def to_linear(self):
        """The full ``nn.Linear`` (a collective over the group)."""
        return _to_linear(self)


class ColumnParallelLinear(_TPLinear):
    """y = x A^T + b with A's rows (output features) split over the group.

    Args:
        in_features, out_features, bias: as ``nn.Linear``; out_features
            must be divisible by the group size.
        gather_output: all-gather the output to the full ``out_features``
            (default); False leaves each rank its ``out_features / size``
            slice, ready for a ``RowParallelLinear(input_is_parallel=True)``.
        process_group: the tensor-parallel group (default: the world).

    Shape: input (*, in_features), replicated; output (*, out_features) or
    (*, out_features / size).
    """
    _shard_dims = {"weight": 0, "bias": 0}

    def __init__(self, in_features, out_features, bias=True,
                 gather_output=True, process_group=None, device=None,
                 dtype=None, _init=True):
        super().__init__()
        g = self._set_group(process_group)
        self.in_features, self.out_features = in_features, out_features
        self.gather_output = gather_output
        self.out_per_rank = _divide(out_features, self.tp_size, "out_features",
                                    type(self).__name__)
        _weight_and_bias(self, (self.out_per_rank, in_features), bias,
                         {"device": device, "dtype": dtype})
        if _init:
            self.reset_parameters()

    def reset_parameters(self):
        # the full layer's initialisation, then this rank's shard: the same
        # seed gives the same model whatever the TP size
        w = self.weight
        full = Linear(self.in_features, self.out_features,
                      self.bias is not None, device=w.device, dtype=w.dtype)
        self._load_full(weight=full.weight, bias=full.bias)

    @classmethod
    def from_linear(cls, linear, process_group=None, gather_output=True):
        """This rank's shard of an ``nn.Linear`` (same values)."""
        return cls._from_full(linear, process_group,
                              gather_output=gather_output)

    def forward(self, input):
        g = self.process_group
        if input.shape[-1] != self.in_features:
            raise RuntimeError(
                f"{type(self).__name__}: input of shape {list(input.shape)}"
                f" does not end in in_features={self.in_features}")
        x = CopyToTP.apply(input, group=g) if self.tp_size > 1 else input
        y = F.linear(x, self.weight, self.bias)
        if self.gather_output and self.tp_size > 1:
            y = GatherFromTP.apply(y, group=g)
        return y

    def extra_repr(self):
        return (f"in_features={self.in_features}, "
                f"out_features={self.out_features} ({self.out_per_rank} on "
                f"rank {self.tp_rank} of {self.tp_size}), "
                f"bias={self.bias is not None}, "
                f"gather_output={self.gather_output}")


class RowParallelLinear(_TPLinear):
    """y = x A^T + b with A's columns (input features) split over the group:
    each rank multiplies its slice of the input, the partial products are
    summed (one all-reduce), then the replicated bias is added.

    Args:
        in_features, out_features, bias: as ``nn.Linear``; in_features
            must be divisible by the group size.
        input_is_parallel: the input is already this rank's slice
            (``in_features / size`` wide, e.g. from a
            ``ColumnParallelLinear(gather_output=False)``); otherwise the
            full input is split here.
        process_group: the tensor-parallel group (default: the world).

    Shape: input (*, in_features) or (*, in_features / size); output
    (*, out_features), replicated.
    """
    _shard_dims = {"weight": 1}

    def __init__(self, in_features, out_features, bias=True,
                 input_is_parallel=False, process_group=None, device=None,
                 dtype=None, _init=True):
        super().__init__()
        g = self._set_group(process_group)
        self.in_features, self.out_features = in_features, out_features
        self.input_is_parallel = input_is_parallel
        self.in_per_rank = _divide(in_features, self.tp_size, "in_features",
                                   type(self).__name__)
        _weight_and_bias(self, (out_features, self.in_per_rank), bias,
                         {"device": device, "dtype": dtype})
        if _init:
            self.reset_parameters()

    reset_parameters = ColumnParallelLinear.reset_parameters

    @classmethod
    def from_linear(cls, linear, process_group=None,
                    input_is_parallel=False):
        """This rank's shard of an ``nn.Linear`` (same values)."""
        return cls._from_full(linear, process_group,
                              input_is_parallel=input_is_parallel)

    def forward(self, input):
        g = self.process_group
        want = self.in_per_rank if self.input_is_parallel \
            else self.in_features
        if input.shape[-1] != want:
            what = (f"this rank's slice of in_features={self.in_features} "
                    f"({want} = {self.in_features} / {self.tp_size})"
                    if self.input_is_parallel
                    else f"in_features={self.in_features}")
            raise RuntimeError(
                f"{type(self).__name__} on rank {self.tp_rank}: input of "
                f"shape {list(input.shape)} does not end in {what}")
        x = input
        if not self.input_is_parallel and self.tp_size > 1:
            x = ScatterToTP.apply(x, group=g)
        y = F.linear(x, self.weight)
        if self.tp_size > 1:
            y = ReduceFromTP.apply(y, group=g)
        # after the reduction: the bias is added once, not size times
        return y + self.bias if self.bias is not None else y

    def extra_repr(self):
        return (f"in_features={self.in_features} ({self.in_per_rank} on "
                f"rank {self.tp_rank} of {self.tp_size}), "
                f"out_features={self.out_features}, "
                f"bias={self.bias is not None}, "
                f"input_is_parallel={self.input_is_parallel}")


class VocabParallelEmbedding(_TPLayer):
    """``nn.Embedding`` with the vocabulary (rows) split over the group.

    Rank r holds rows [r V/size, (r+1) V/size). Each rank looks up the ids
    in its range, writes zeros for the others, and one all-reduce sums the
    ranks' results, so every rank gets the full (*, embedding_dim) output.
    num_embeddings must be divisible by the group size.
    """
    _shard_dims = {"weight": 0}

    def __init__(self, num_embeddings, embedding_dim, process_group=None,
                 device=None, dtype=None, _init=True):
        super().__init__()
        g = self._set_group(process_group)
        self.num_embeddings, self.embedding_dim = (num_embeddings,
                                                   embedding_dim)
        self.rows_per_rank = _divide(num_embeddings, self.tp_size,
                                     "num_embeddings", type(self).__name__)
        self.vocab_start = self.tp_rank * self.rows_per_rank
        self.vocab_end = self.vocab_start + self.rows_per_rank
        self.weight = Parameter(_empty((self.rows_per_rank, embedding_dim),
                                       device=device, dtype=dtype))
        if _init:
            self.reset_parameters()

    def reset_parameters(self):
        w = self.weight
        full = Embedding(self.num_embeddings, self.embedding_dim,
                         device=w.device, dtype=w.dtype)
        self._load_full(weight=full.weight)

    @classmethod
    def from_embedding(cls, embedding, process_group=None):
        """This rank's shard of an ``nn.Embedding`` (same values)."""
        if embedding.padding_idx is not None or \
                embedding.max_norm is not None:
            raise NotImplementedError(
                "VocabParallelEmbedding: padding_idx and max_norm are not "
                "supported")
        w = embedding.weight
        m = cls(embedding.num_embeddings, embedding.embedding_dim,
                process_group, device=w.device, dtype=w.dtype, _init=False)
        m._load_full(weight=w)
        return m

    def forward(self, input):
        g = self.process_group
        if self.tp_size == 1:
            return F.embedding(input, self.weight)
        ids = input._data
        xp = get_array_module(ids)
        outside = (ids < self.vocab_start) | (ids >= self.vocab_end)
        local = xp.where(outside, 0, ids - self.vocab_start)
        out = F.embedding(Tensor._wrap(local), self.weight)
        # zero the rows another rank owns: their gradient is zero too, so
        # row 0's stand-in lookups leave no trace in this rank's gradient
        keep = (~outside).astype(self.weight._data.dtype)[..., None]
        out = out * Tensor._wrap(keep)
        return ReduceFromTP.apply(out, group=g)

    def extra_repr(self):
        return (f"{self.num_embeddings}, {self.embedding_dim} (rows "
                f"{self.vocab_start}:{self.vocab_end} on rank {self.tp_rank} "
                f"of {self.tp_size})")


def _empty(shape, device=None, dtype=None):
    from ..._creation import empty
    return empty(shape, device=device, dtype=dtype)


def _to_linear(layer):
    full = layer.full_tensors()
    w = full["weight"]
    lin = Linear(layer.in_features, layer.out_features, "bias" in full,
                 device=layer.weight.device, dtype=layer.weight.dtype)
    with no_grad():
        lin.weight._data[...] = w
        if "bias" in full:
            lin.bias._data[...] = full["bias"]
    return lin


# ================================================================ groups ==

def make_dp_tp_groups(tp_size, group=None):
    """(dp_group, tp_group) of the calling rank in a DP x TP layout.

    Consecutive ranks share a TP group (ranks 0..tp-1, tp..2tp-1, ...: keep
    TP inside a node, it talks every layer); ranks with the same position
    in their TP group form a DP group (0, tp, 2tp, ...). A collective:
    every rank of ``group`` (default: the world) calls it, in the same
    order. World 4, tp 2: TP groups [0, 1], [2, 3]; DP groups [0, 2],
    [1, 3].
    """
    g = resolve_group(group)
    tp_size = int(tp_size)
    size, rank = dist.get_world_size(g), dist.get_rank(g)
    if tp_size < 1 or size % tp_size:
        raise ValueError(
            f"make_dp_tp_groups: tp_size {tp_size} does not divide the "
            f"world size {size}")
    ranks = dist.get_process_group_ranks(g)
    dp_size = size // tp_size
    tp_group = dp_group = None
    # every rank creates every group (new_group is collective over the
    # parent) and keeps the ones it belongs to. Always new groups, even
    # one equal to the parent: DDP reduces on its own thread while
    # backward runs TP collectives, so the two must not share a group.
    for i in range(dp_size):
        sub = g.new_group(ranks[i * tp_size:(i + 1) * tp_size])
        if rank // tp_size == i:
            tp_group = sub
    for j in range(tp_size):
        sub = g.new_group(ranks[j::tp_size])
        if rank % tp_size == j:
            dp_group = sub
    return dp_group, tp_group


# =========================================================== checkpoints ==

def _sharded_params(module):
    """{parameter name: (dim, group)} of the sharded parameters."""
    out = {}
    for prefix, m in module.named_modules():
        if isinstance(m, _TPLayer):
            for name, dim in m._shard_dims.items():
                if m._parameters.get(name) is not None:
                    key = f"{prefix}.{name}" if prefix else name
                    out[key] = (dim, m.process_group)
    return out


def gather_state_dict(module):
    """``module.state_dict()`` with every sharded parameter gathered to its
    full shape: the state dict of the same model without tensor
    parallelism (``nn.Linear`` / ``nn.Embedding`` in place of the parallel
    layers). A collective over each TP group; every rank gets it."""
    sd = module.state_dict()
    for key, (dim, g) in _sharded_params(module).items():
        sd[key] = Tensor._wrap(_unshard(sd[key]._data, dim, g))
    return sd


def shard_state_dict(module, state_dict):
    """The inverse of ``gather_state_dict``: a full state dict cut to this
    rank's shards, ready for ``module.load_state_dict`` (any TP size)."""
    sd = dict(state_dict)
    for key, (dim, g) in _sharded_params(module).items():
        if key in sd:
            sd[key] = Tensor._wrap(_shard(_check_full(module, key, sd[key],
                                                      dim, g), dim, g))
    return sd


def _check_full(module, key, t, dim, g):
    a = t._data if isinstance(t, Tensor) else t
    local = module.get_parameter(key).shape[dim]
    size = dist.get_world_size(g)
    if a.shape[dim] != local * size:
        raise ValueError(
            f"shard_state_dict: {key} has shape {list(a.shape)}; rank "
            f"{dist.get_rank(g)} of a TP group of {size} expects dim {dim} = "
            f"{local} x {size}")
    return a


def _map_optimizer_state(module, state_dict, fn):
    # the optimizer's state is keyed by parameter index: the order of
    # module.parameters(), as when the optimizer was built from it
    names = [n for n, _ in module.named_parameters()]
    sharded = _sharded_params(module)
    out = dict(state_dict)
    out["state"] = {}
    for idx, st in state_dict["state"].items():
        spec = sharded.get(names[int(idx)])
        if spec is None:
            out["state"][idx] = st
            continue
        out["state"][idx] = {
            k: (Tensor._wrap(fn(v, names[int(idx)], *spec))
                if isinstance(v, Tensor) and v.dim() > 0 else v)
            for k, v in st.items()}
    return out


def gather_optimizer_state_dict(module, optimizer):
    """``optimizer.state_dict()`` with the state of sharded parameters
    (Adam's moments, momentum buffers) gathered to full shapes. The
    optimizer must have been built from ``module.parameters()``."""
    return _map_optimizer_state(
        module, optimizer.state_dict(),
        lambda v, key, dim, g: _unshard(v._data, dim, g))


def shard_optimizer_state_dict(module, state_dict):
    """The inverse of ``gather_optimizer_state_dict``, for
    ``optimizer.load_state_dict``."""
    return _map_optimizer_state(
        module, state_dict,
        lambda v, key, dim, g: _shard(_check_full(module, key, v, dim, g),
                                      dim, g))
