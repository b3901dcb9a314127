"""``dtorch.distributed``: torch.distributed's API for dtorch tensors, over
the process groups of ``collectives/``.

Example (under ``mpiexec -n 2``, ``dtorch-launch`` or srun)::

    import dtorch.distributed as dist
    dist.init_process_group()           # backend from the environment
    t = dtorch.ones(4) * dist.get_rank()
    dist.all_reduce(t)                  # in place: the sum over ranks

Ranks given to these functions (src, dst) are global ranks, as in PyTorch.
The default group is per thread when set by ``spawn_threads``, so N ranks
can run as threads in one process (the single-process test mode).
"""
import datetime
import threading

import collectives as _c
from collectives import ReduceOp  # noqa: F401  (dist.ReduceOp.SUM, ...)
from collectives import (CollectiveError, CollectiveTimeoutError,  # noqa
                         CollectiveMismatchError, RankFailureError)

from .. import _rank_local
from . import _accounting
from .._ignored import ignored_argument
from ..tensor import Tensor

__all__ = [
    "init_process_group", "destroy_process_group", "is_initialized",
    "is_available", "get_rank", "get_world_size", "get_backend",
    "new_group", "ReduceOp", "all_reduce", "all_reduce_coalesced",
    "broadcast", "reduce",
    "all_gather", "all_gather_into_tensor", "gather", "scatter",
    "reduce_scatter", "reduce_scatter_tensor", "all_to_all",
    "all_to_all_single", "barrier",
    "send", "recv", "isend", "irecv", "broadcast_object_list",
    "all_gather_object", "spawn_threads", "GroupMember", "group",
    "get_global_rank", "get_group_rank", "get_process_group_ranks",
]

_BACKEND_ALIASES = {"gloo": "tcp", "tcp": "tcp", "mpi": "mpi",
                    "nccl": "nccl", "threads": "threads"}


class _State(threading.local):
    group = None          # a thread's own default group (spawn_threads)
    pending = None        # the group init_process_group joins (deferred)


_local = _State()
_world = [None]           # the process-wide default group


class _WorldMeta(type):
    """``GroupMember.WORLD`` / ``group.WORLD``: the calling thread's default
    group (a ``spawn_threads`` rank's own, else the process's), None before
    ``init_process_group``; as PyTorch's class property of the same name."""

    @property
    def WORLD(cls):
        return _default_or_none()


class GroupMember(metaclass=_WorldMeta):
    NON_GROUP_MEMBER = object()


class group(metaclass=_WorldMeta):
    """``dist.group.WORLD``, PyTorch's other spelling of the default group."""


def is_available():
    return True


def is_initialized():
    return _default_or_none() is not None


def _default_or_none():
    return _local.group if _local.group is not None else _world[0]


def _group(group):
    if group is not None:
        if group is GroupMember.NON_GROUP_MEMBER:
            raise RuntimeError("this rank is not a member of the group")
        return group
    g = _default_or_none()
    if g is None:
        raise RuntimeError(
            "Default process group has not been initialized, please make "
            "sure to call init_process_group.")
    return g


def init_process_group(backend=None, init_method=None, timeout=None,
                       world_size=-1, rank=-1, store=None, group_name="",
                       pg_options=None, device_id=None):
    """Join the job's default process group.

    ``backend``: None takes ``DTORCH_BACKEND`` (set by ``dtorch-launch
    --backend``) or picks nccl when a GPU is there, mpi under an MPI
    launcher, tcp otherwise (and a one-rank group with no launcher at all);
    'gloo' is accepted as PyTorch scripts spell it and means tcp.
    ``init_method``: 'env://' (default) or 'tcp://host:port'.
    """
    if _local.pending is not None:
        return _join_pending(world_size, rank)
    if _default_or_none() is not None:
        raise RuntimeError("trying to initialize the default process group "
                           "twice!")
    _ignored("init_process_group", store=store, group_name=group_name or None,
             pg_options=pg_options, device_id=device_id)
    if isinstance(timeout, datetime.timedelta):
        timeout = timeout.total_seconds()
    b = None
    if backend is None:
        # dtorch-launch --backend passes its choice this way
        env = _c.env_str("DTORCH_BACKEND", "auto")
        backend = None if env == "auto" else env
    if backend is not None:
        b = _BACKEND_ALIASES.get(str(backend).lower())
        if b is None:
            raise ValueError(f"Invalid backend: '{backend}'; dtorch has "
                             f"{sorted(set(_BACKEND_ALIASES))}")
    addr = port = None
    if init_method and init_method.startswith("tcp://"):
        hostport = init_method[len("tcp://"):].split("?")[0]
        addr, _, port = hostport.rpartition(":")
    elif init_method and not init_method.startswith("env://"):
        raise ValueError(f"unsupported init_method {init_method!r}: use "
                         f"'env://' or 'tcp://host:port'")
    from .. import cuda
    info = _c.discover()
    if b is None and cuda.is_available() and info.world_size > 1:
        b = "nccl"
    if b == "nccl" and cuda.is_available():
        # one GPU per local rank (LOCAL_RANK, or MPI's/SLURM's local rank),
        # before the communicator binds to the current device: without this
        # every rank of a node would run on GPU 0
        cuda.set_device(info.local_rank % max(cuda.device_count(), 1))
    kw = {}
    if rank is not None and rank >= 0:
        kw["rank"] = rank
    if world_size is not None and world_size > 0:
        kw["world_size"] = world_size
    g = _c.init(b, timeout=timeout, master_addr=addr or None,
                master_port=port or None, **kw)
    _world[0] = g
    if g._timeline is not None:     # DTORCH_TIMELINE (collectives/timeline)
        from . import _timeline
        _timeline.attach(g)
    _accounting.join(g)             # DTORCH_DRY_RUN_REPORT
    return g


def _join_pending(world_size, rank):
    """A simulated rank of ``spawn_threads(deferred=True)`` (the dry
    run) calls init_process_group: it joins the group its thread was
    given, as a process joins its job's."""
    g = _local.pending
    for what, given, have in (("world_size", world_size, g.size),
                              ("rank", rank, g.rank)):
        if given is not None and given >= 0 and given != have:
            raise ValueError(f"init_process_group({what}={given}) in "
                             f"simulated rank {g.rank} of {g.size}: the "
                             f"dry run's {what} is {have}")
    _local.pending, _local.group = None, g
    _accounting.join(g)
    return g


def destroy_process_group(group=None):
    g = group or _default_or_none()
    if g is None:
        return
    g.destroy()
    if g is _local.group:
        _local.group = None
    if g is _world[0]:
        _world[0] = None


def get_rank(group=None):
    return _initialized(group).rank


def get_world_size(group=None):
    return _initialized(group).size


def get_peer_wait(group=None):
    """dtorch's: the seconds this rank has blocked waiting for each peer's
    data in ``group``'s collectives so far (a list indexed by group rank;
    straggler detection reads its growth), or None where the backend does
    not measure it (MPI's own collectives)."""
    return getattr(_group(group), "peer_wait", None)


def _initialized(group):
    # PyTorch's get_rank / get_world_size raise ValueError before
    # init_process_group (not 0 / 1: a script that forgot to initialise
    # fails here as there)
    g = group if group is not None else _default_or_none()
    if g is None:
        raise ValueError(
            "Default process group has not been initialized, please make "
            "sure to call init_process_group.")
    return g


def get_process_group_ranks(group):
    """The global ranks of ``group``'s members, in group-rank order."""
    return list(_group(group).ranks)


def get_global_rank(group, group_rank):
    """The global rank of ``group``'s member number ``group_rank``."""
    ranks = _group(group).ranks
    if not 0 <= int(group_rank) < len(ranks):
        raise ValueError(f"group rank {group_rank} is out of range for a "
                         f"group of size {len(ranks)}")
    return ranks[int(group_rank)]


def get_group_rank(group, global_rank):
    """``global_rank``'s rank within ``group``."""
    return _local_rank(_group(group), global_rank, "global rank")


def get_backend(group=None):
    return _group(group).backend


def new_group(ranks=None, timeout=None, backend=None, pg_options=None):
    # a subgroup always uses its parent's backend
    _ignored("new_group", backend=backend, pg_options=pg_options)
    g = _group(None)
    if ranks is None:
        ranks = list(g.ranks)
    sub = g.new_group(list(ranks), timeout=timeout)
    return sub if sub is not None else GroupMember.NON_GROUP_MEMBER


def _ignored(owner, **args):
    """Warn once for each of PyTorch's arguments given a value here that
    dtorch does not act on (None: not given)."""
    for name, value in args.items():
        if value is not None:
            ignored_argument(owner, name, value, stacklevel=4)


def _local_rank(g, global_rank, what):
    try:
        return g.ranks.index(int(global_rank))
    except ValueError:
        raise ValueError(f"{what} {global_rank} is not a member of group "
                         f"{g.name!r} (global ranks {g.ranks})") from None


def _arr(t, what="tensor"):
    if not isinstance(t, Tensor):
        raise TypeError(f"{what} must be a dtorch.Tensor, got "
                        f"{type(t).__name__}")
    if not t._data.flags.c_contiguous:
        raise ValueError(f"{what} must be contiguous (shape "
                         f"{list(t.shape)}, strides {t.stride()}): call "
                         f".contiguous() first")
    return t._data


def _bump(*tensors):
    for t in tensors:
        t._bump_version()


def _op(op):
    return op.value if isinstance(op, ReduceOp) else op


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False):
    """In place: every rank's ``tensor`` becomes the reduction over ranks."""
    g = _group(group)
    w = g.all_reduce(_arr(tensor), _op(op), async_op=async_op)
    _bump(tensor)
    return w


def all_reduce_coalesced(tensors, op=ReduceOp.SUM, group=None,
                         async_op=False):
    """In place, as one collective: every tensor in the list becomes the
    reduction over ranks (one dtype and device for all)."""
    g = _group(group)
    w = g.all_reduce_coalesced([_arr(t, "tensors[i]") for t in tensors],
                               _op(op), async_op=async_op)
    _bump(*tensors)
    return w


def broadcast(tensor, src=0, group=None, async_op=False):
    g = _group(group)
    w = g.broadcast(_arr(tensor), _local_rank(g, src, "src"),
                    async_op=async_op)
    _bump(tensor)
    return w


def reduce(tensor, dst=0, op=ReduceOp.SUM, group=None, async_op=False):
    g = _group(group)
    return g.reduce(_arr(tensor), _local_rank(g, dst, "dst"), _op(op),
                    async_op=async_op)


def all_gather(tensor_list, tensor, group=None, async_op=False):
    """``tensor_list[r]`` <- rank r's ``tensor``."""
    g = _group(group)
    if len(tensor_list) != g.size:
        raise ValueError(f"all_gather: tensor_list has {len(tensor_list)} "
                         f"tensors for a group of size {g.size}")
    outs = [_arr(t, "tensor_list[i]") for t in tensor_list]
    w = g.all_gather(outs, _arr(tensor), async_op=async_op)
    _bump(*tensor_list)
    return w


def all_gather_into_tensor(output_tensor, input_tensor, group=None,
                           async_op=False):
    """``output_tensor`` (size * input rows) <- every rank's input,
    concatenated along dim 0."""
    g = _group(group)
    out, inp = _arr(output_tensor), _arr(input_tensor)
    w = g.all_gather(_rows_per_rank(g, out, inp, "all_gather_into_tensor",
                                    "output", "input"), inp,
                     async_op=async_op)
    _bump(output_tensor)
    return w


def _rows_per_rank(g, big, one, op, big_name, one_name):
    """``big`` (world_size x ``one``'s elements) as [size, *one.shape]."""
    if big.size != one.size * g.size:
        raise ValueError(
            f"{op}: {big_name} has {big.size} elements, expected "
            f"world_size ({g.size}) x {one_name} ({one.size})")
    return big.reshape((g.size,) + one.shape)


def _root_list(g, root, tensors, op, role, name):
    """The root rank's list of one tensor per rank, as arrays; None on the
    other ranks, which ignore it."""
    if g.rank != root:
        return None
    if tensors is None or len(tensors) != g.size:
        raise ValueError(f"{op}: rank {g.rank} is {role} and needs a "
                         f"{name} of {g.size} tensors")
    return [_arr(t, f"{name}[i]") for t in tensors]


def gather(tensor, gather_list=None, dst=0, group=None, async_op=False):
    g = _group(group)
    d = _local_rank(g, dst, "dst")
    outs = _root_list(g, d, gather_list, "gather", "dst", "gather_list")
    w = g.gather(outs, _arr(tensor), d, async_op=async_op)
    if outs is not None:
        _bump(*gather_list)
    return w


def scatter(tensor, scatter_list=None, src=0, group=None, async_op=False):
    g = _group(group)
    s = _local_rank(g, src, "src")
    inp = _root_list(g, s, scatter_list, "scatter", "src", "scatter_list")
    w = g.scatter(_arr(tensor), inp, s, async_op=async_op)
    _bump(tensor)
    return w


def reduce_scatter(output, input_list, op=ReduceOp.SUM, group=None,
                   async_op=False):
    g = _group(group)
    w = g.reduce_scatter(_arr(output), [_arr(t, "input_list[i]")
                                        for t in input_list], _op(op),
                         async_op=async_op)
    _bump(output)
    return w


def reduce_scatter_tensor(output, input, op=ReduceOp.SUM, group=None,
                          async_op=False):
    g = _group(group)
    out, inp = _arr(output), _arr(input)
    w = g.reduce_scatter(out, _rows_per_rank(g, inp, out,
                                             "reduce_scatter_tensor",
                                             "input", "output"), _op(op),
                         async_op=async_op)
    _bump(output)
    return w


def all_to_all(output_tensor_list, input_tensor_list, group=None,
               async_op=False):
    g = _group(group)
    w = g.all_to_all([_arr(t) for t in output_tensor_list],
                     [_arr(t) for t in input_tensor_list],
                     async_op=async_op)
    _bump(*output_tensor_list)
    return w


def all_to_all_single(output, input, output_split_sizes=None,
                      input_split_sizes=None, group=None, async_op=False):
    """Equal splits: ``input``'s r-th block along dim 0 goes to rank r,
    and rank r's block for this rank lands in ``output``'s r-th block."""
    if output_split_sizes is not None or input_split_sizes is not None:
        raise NotImplementedError("all_to_all_single: uneven splits "
                                  "(output/input_split_sizes) are not "
                                  "supported")
    g = _group(group)
    out, inp = _arr(output, "output"), _arr(input, "input")
    if out.size != inp.size or inp.size % g.size:
        raise ValueError(
            f"all_to_all_single: input ({inp.size} elements) and output "
            f"({out.size}) must have the same size, divisible by the group "
            f"size {g.size}")
    w = g.all_to_all(out.reshape((g.size, -1)), inp.reshape((g.size, -1)),
                     async_op=async_op)
    _bump(output)
    return w


def barrier(group=None, async_op=False, device_ids=None):
    _ignored("barrier", device_ids=device_ids)
    return _group(group).barrier(async_op=async_op)


def send(tensor, dst, group=None, tag=0):
    g = _group(group)
    g.send(_arr(tensor), _local_rank(g, dst, "dst"), tag)


def recv(tensor, src=None, group=None, tag=0):
    """Receive into ``tensor`` from global rank ``src``; returns src."""
    if src is None:
        raise NotImplementedError("recv from any source is not supported; "
                                  "pass src")
    g = _group(group)
    g.recv(_arr(tensor), _local_rank(g, src, "src"), tag)
    _bump(tensor)
    return src


def isend(tensor, dst, group=None, tag=0):
    g = _group(group)
    return g.isend(_arr(tensor), _local_rank(g, dst, "dst"), tag)


def irecv(tensor, src=None, group=None, tag=0):
    if src is None:
        raise NotImplementedError("irecv from any source is not "
                                  "supported; pass src")
    g = _group(group)
    return g.irecv(_arr(tensor), _local_rank(g, src, "src"), tag)


def broadcast_object_list(object_list, src=0, group=None, device=None):
    """In place: ``object_list`` on every rank becomes src's list."""
    _ignored("broadcast_object_list", device=device)
    g = _group(group)
    res = g.broadcast_object(list(object_list), _local_rank(g, src, "src"))
    object_list[:] = res


def all_gather_object(object_list, obj, group=None):
    g = _group(group)
    if len(object_list) != g.size:
        raise ValueError(f"all_gather_object: object_list has "
                         f"{len(object_list)} slots for a group of size "
                         f"{g.size}")
    object_list[:] = g.all_gather_object(obj)


def spawn_threads(fn, world_size, timeout=None, deferred=False):
    """Run ``fn(rank, world_size)`` in ``world_size`` threads of this
    process, each with its own default process group (threads backend), so
    that multi-rank code (DDP, tensor parallel) is unit-tested without a
    launcher. Each rank also has its own RNG state, default dtype and
    deterministic flag (``dtorch._rank_local``), as a process would: a rank
    starts from the defaults of a fresh process. Returns the list of
    results; re-raises the first failure. ``deferred``: the group becomes
    the rank's default group when the rank calls ``init_process_group()``,
    not before, so a script written for processes runs unchanged (the dry
    run, ``dtorch-launch --dry-run``)."""
    def body(group):
        if deferred:
            _local.pending = group
        else:
            _local.group = group
        if group._timeline is not None:     # DTORCH_TIMELINE
            from . import _timeline
            _timeline.attach(group)
        try:
            with _rank_local.rank_scope():
                return fn(group.rank, group.size)
        finally:
            _local.group = _local.pending = None
    return _c.spawn_threads(body, world_size, timeout=timeout)


def get_default_backend_for_device(device):
    """PyTorch's answer: 'nccl' for CUDA devices, 'gloo' (dtorch's tcp
    backend) for the CPU."""
    from .. import _backend as B
    dev = B.to_device(device) if not isinstance(device, B.device) else device
    if dev.type == "cuda":
        return "nccl"
    if dev.type == "cpu":
        return "gloo"
    raise ValueError(f"no default backend for device type {dev.type!r}")


__all__ += ["DeviceMesh", "init_device_mesh", "get_peer_wait"]


def __getattr__(name):
    # device_mesh is built on this module's API: it loads on first use, so
    # that the two modules do not import each other at import time
    if name in ("DeviceMesh", "init_device_mesh"):
        from . import device_mesh
        return getattr(device_mesh, name)
    if name == "metrics":    # built on this module's API too
        import importlib
        return importlib.import_module(".metrics", __name__)
    raise AttributeError(f"module 'dtorch.distributed' has no attribute "
                         f"{name!r}")
