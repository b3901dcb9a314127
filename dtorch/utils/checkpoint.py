"""``dtorch.utils.checkpoint``: activation checkpointing (PyTorch's API).

``checkpoint(fn, *args, use_reentrant=False)`` runs ``fn`` keeping only its
inputs (and the RNG and autocast state); backward runs ``fn`` again and
takes the values it saved from that recomputation. Two variants, as
PyTorch's:

- non-reentrant (``use_reentrant=False``, recommended): ``fn`` runs under
  ``autograd.graph.saved_tensors_hooks`` whose pack keeps an empty holder
  in place of each saved value. The first unpack in backward re-runs
  ``fn`` (grad mode on, the RNG and autocast state of the forward) under
  hooks that fill the holders in order, stopping once every holder that is
  still needed is filled. The graph is the forward's own, so gradients
  reach parameters through their usual nodes (DDP's gradient-ready hooks
  fire once per parameter), ``create_graph=True`` and ``autograd.grad``
  work, and a recomputation that saves values of other shapes, dtypes or
  devices raises ``CheckpointError``.
- reentrant (``use_reentrant=True``): an autograd Function whose forward
  runs ``fn`` without a graph and whose backward recomputes it and calls
  ``autograd.backward`` inside the outer backward (FSDP's units work the
  same way, with the same ``ForwardState``).

Selective checkpointing: ``context_fn=functools.partial(
create_selective_checkpoint_contexts, policy)`` keeps the outputs of the ops
the policy saves and recomputes the rest. dtorch has no ``torch.ops``
namespace: the policy receives the op's class from ``dtorch.ops`` (for
example ``dtorch.ops.MatMul``, ``dtorch.ops.Linear``), the unit dtorch
dispatches, autocasts and profiles (``dtorch::MatMul`` in a trace), so a
list or a policy names exactly what runs.

Like PyTorch, BatchNorm's running statistics move again in the
recomputation; on CUDA, capturing a device's RNG state re-keys its stream
(``dtorch.random``), so the draws after a checkpoint differ from a run
without one (within it they are replayed exactly).
"""
import contextlib
import enum
import threading
import warnings
import weakref
from collections import defaultdict

from .. import random as _random
from ..amp import autocast as _autocast
from ..amp.autocast_mode import get_autocast_dtype, is_autocast_enabled
from ..autograd import backward as _backward
from ..autograd import engine as _engine
from ..autograd import function as _function
from ..autograd import graph as _graph
from ..autograd.function import Function, TensorBase
from ..autograd.grad_mode import _state as _grad_state
from ..autograd.grad_mode import enable_grad

__all__ = ["checkpoint", "checkpoint_sequential", "CheckpointError",
           "CheckpointFunction", "check_backward_validity",
           "detach_variable", "get_device_states", "set_device_states",
           "noop_context_fn", "set_checkpoint_early_stop",
           "set_checkpoint_debug_enabled", "CheckpointPolicy",
           "SelectiveCheckpointContext",
           "create_selective_checkpoint_contexts"]


class CheckpointError(RuntimeError):
    pass


def noop_context_fn():
    return contextlib.nullcontext(), contextlib.nullcontext()


def detach_variable(inputs):
    if not isinstance(inputs, tuple):
        raise RuntimeError(
            f"Only tuple of tensors is supported. Got Unsupported input "
            f"type: {type(inputs).__name__}")
    out = []
    for a in inputs:
        if isinstance(a, TensorBase):
            x = a.detach()
            x.requires_grad = a.requires_grad
            a = x
        out.append(a)
    return tuple(out)


def check_backward_validity(inputs):
    if not any(a.requires_grad for a in inputs
               if isinstance(a, TensorBase)):
        warnings.warn("None of the inputs have requires_grad=True. "
                      "Gradients will be None", stacklevel=2)


def get_device_states(*args):
    """(the CUDA device indices of the tensors in ``args``, each device's
    RNG state), as PyTorch's."""
    ids = []
    for a in args:
        if isinstance(a, TensorBase) and a.device.type == "cuda" \
                and a.device.index not in ids:
            ids.append(a.device.index)
    return ids, [_random.cuda_get_rng_state(i) for i in ids]


def set_device_states(devices, states, *, device_type=None):
    for i, s in zip(devices, states):
        _random.cuda_set_rng_state(s, i)


class _Settings(threading.local):
    early_stop = True
    debug = None


_settings = _Settings()


@contextlib.contextmanager
def set_checkpoint_early_stop(enable):
    """Within the block, non-reentrant checkpoints stop recomputing once
    every saved value is back (``enable=True``, the default) or run the
    whole function."""
    prev, _settings.early_stop = _settings.early_stop, enable
    try:
        yield
    finally:
        _settings.early_stop = prev


@contextlib.contextmanager
def set_checkpoint_debug_enabled(enabled):
    """Within the block, checkpoints behave as with ``debug=enabled``
    (None: each call's own ``debug``)."""
    prev, _settings.debug = _settings.debug, enabled
    try:
        yield
    finally:
        _settings.debug = prev


# ---------------------------------------------------------------------------
# What a recomputation replays. Shared by both variants and by FSDP's units.

_DEVICE_TYPES = ("cpu", "cuda")


class ForwardState:
    """The state a forward ran under, to run a recomputation under it:
    the CPU generator and the CUDA generators of the devices of the tensors
    in ``args`` (when ``preserve_rng_state``), each device type's autocast
    state. ``with state.replay():`` sets them (and grad mode on), and puts
    the RNG state of the moment back when the block ends."""

    def __init__(self, args, preserve_rng_state=True):
        self.preserve = preserve_rng_state
        if preserve_rng_state:
            self.cpu_rng = _random.get_rng_state()
            self.devices, self.device_rng = get_device_states(*args)
        self.autocast = [(d, is_autocast_enabled(d), get_autocast_dtype(d))
                         for d in _DEVICE_TYPES]

    @contextlib.contextmanager
    def replay(self):
        if self.preserve:
            now_cpu = _random.get_rng_state()
            now_dev = [_random.cuda_get_rng_state(i) for i in self.devices]
            _random.set_rng_state(self.cpu_rng)
            set_device_states(self.devices, self.device_rng)
        try:
            with contextlib.ExitStack() as stack:
                for dev, on, dtype in self.autocast:
                    stack.enter_context(_autocast(dev, dtype=dtype,
                                                  enabled=on))
                stack.enter_context(enable_grad())
                yield
        finally:
            if self.preserve:
                _random.set_rng_state(now_cpu)
                set_device_states(self.devices, now_dev)


# ---------------------------------------------------------------------------
# Reentrant

class CheckpointFunction(Function):
    @staticmethod
    def forward(ctx, run_function, preserve_rng_state, *args):
        check_backward_validity(args)
        ctx.run_function = run_function
        ctx.state = ForwardState(args, preserve_rng_state)
        ctx.inputs = [None if isinstance(a, TensorBase) else a
                      for a in args]
        ctx.save_for_backward(*[a for a in args
                                if isinstance(a, TensorBase)])
        return run_function(*args)      # grad mode is off in forward

    @staticmethod
    def backward(ctx, *grads):
        if not _engine.is_checkpoint_valid():
            raise RuntimeError(
                "When use_reentrant=True, torch.utils.checkpoint is "
                "incompatible with .grad() or passing an `inputs` parameter"
                " to .backward(). To resolve this error, you can either set "
                "use_reentrant=False, or call .backward() without passing "
                "the `inputs` argument.")
        saved = iter(ctx.saved_tensors)
        inputs = detach_variable(tuple(
            next(saved) if a is None else a for a in ctx.inputs))
        with ctx.state.replay():
            outputs = ctx.run_function(*inputs)
        if isinstance(outputs, TensorBase):
            outputs = (outputs,)
        pairs = [(o, g) for o, g in zip(outputs, grads)
                 if isinstance(o, TensorBase) and o.requires_grad]
        if not pairs:
            raise RuntimeError("none of output has requires_grad=True, "
                               "this checkpoint() is not necessary")
        _backward([o for o, _ in pairs], [g for _, g in pairs])
        return (None, None) + tuple(
            a.grad if isinstance(a, TensorBase) else None for a in inputs)


# ---------------------------------------------------------------------------
# Non-reentrant

class _StopRecomputation(Exception):
    pass


class _Holder:
    """What the graph keeps of one saved value: filled by a recomputation,
    emptied by the unpack that hands the value on."""
    __slots__ = ("value", "__weakref__")

    def __init__(self):
        self.value = None


def _metadata(t):
    return {"shape": tuple(t.shape), "dtype": t.dtype, "device": t.device}


_debug_tip = (
    "\nTip: To see a more detailed error message, either pass `debug=True` "
    "to\n`torch.utils.checkpoint.checkpoint(...)` or wrap the code block\n"
    "with `with torch.utils.checkpoint.set_checkpoint_debug_enabled(True):`"
    " to\nenable checkpoint-debug mode globally.\n")


class _Frame:
    """One non-reentrant checkpoint call: the function and its inputs,
    the holders its forward left in the graph, their metadata."""

    def __init__(self, fn, args, kwargs, state, recompute_ctx, check,
                 early_stop, debug):
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.state, self.recompute_ctx = state, recompute_ctx
        self.check, self.early_stop, self.debug = check, early_stop, debug
        self.holders, self.meta, self.ops = [], [], []
        # the inputs' versions: a recomputation from an input changed in
        # place since would give silently wrong gradients
        self.versions = [(a._vc, a._vc[0], weakref.ref(a), f"input {i}")
                         for i, a in enumerate(args)
                         if isinstance(a, TensorBase)]

    def pack(self, t):
        h = _Holder()
        self.holders.append(weakref.ref(h))
        if self.check:
            self.meta.append(_metadata(t))
        if self.debug:
            self.ops.append(_graph.current_op())
        return h

    def unpack(self, h):
        if h.value is None:
            self.recompute()
        v, h.value = h.value, None
        if v is None:
            raise CheckpointError(
                "torch.utils.checkpoint: Unpack is being triggered for a "
                "tensor that was already unpacked once. If you are calling "
                "ctx.saved_tensors in backward, make sure to do so only "
                "once. Otherwise please open an issue with details on your "
                "use case.")
        return v

    def recompute(self):
        n = len(self.holders)
        got, ops = [], []

        def pack(t):
            i = len(got)
            if i >= n:
                raise CheckpointError(
                    "torch.utils.checkpoint: trying to save more tensors "
                    "during recomputation than during the original forward "
                    "pass.\n" + self._tip(ops))
            got.append(_metadata(t) if self.check else None)
            if self.debug:
                ops.append(_graph.current_op())
            h = self.holders[i]()
            if h is not None:
                h.value = t._make(t._data, False, None)
            if self.early_stop and len(got) == n:
                raise _StopRecomputation
            return None

        _engine.check_versions(self.versions, "a checkpointed function")
        args = detach_variable(tuple(self.args))
        try:
            with self.state.replay(), \
                    _graph.saved_tensors_hooks(pack, _unused), \
                    self.recompute_ctx:
                self.fn(*args, **self.kwargs)
        except _StopRecomputation:
            pass
        if len(got) != n:
            raise CheckpointError(
                "torch.utils.checkpoint: A different number of tensors was "
                "saved during the original forward and recomputation.\n"
                f"Number of tensors saved during forward: {n}\n"
                f"Number of tensors saved during recomputation: "
                f"{len(got)}.\n" + self._tip(ops))
        if self.check:
            bad = "".join(
                f"tensor at position {i}:\nsaved metadata: {a}\n"
                f"recomputed metadata: {b}\n"
                for i, (a, b) in enumerate(zip(self.meta, got))
                if a != b and self.holders[i]() is not None)
            if bad:
                raise CheckpointError(
                    "torch.utils.checkpoint: Recomputed values for the "
                    "following tensors have different metadata than during "
                    f"the forward pass.\n{bad}.\n" + self._tip(ops))

    def _tip(self, ops):
        if not self.debug:
            return _debug_tip
        return ("Operators that saved values, in order:\n"
                f"original forward: {self.ops}\nrecomputation: {ops}\n")


def _unused(_):
    raise CheckpointError("torch.utils.checkpoint: the graph recorded "
                          "during a recomputation was backpropagated")


def _checkpoint_without_reentrant(function, preserve, context_fn,
                                  determinism_check, debug, early_stop,
                                  args, kwargs):
    if _settings.debug is not None:
        debug = _settings.debug
    if debug and context_fn is not noop_context_fn:
        raise ValueError("debug=True is incompatible with non-default "
                         "context_fn")
    if determinism_check not in ("default", "none"):
        raise ValueError(f"determinism_check should be one of ['default', "
                         f"'none'], but got {determinism_check}")
    fwd_ctx, recompute_ctx = context_fn()
    frame = _Frame(function, args, kwargs, ForwardState(args, preserve),
                   recompute_ctx, determinism_check == "default",
                   early_stop and _settings.early_stop, debug)
    with _graph.saved_tensors_hooks(frame.pack, frame.unpack), fwd_ctx:
        return function(*args, **kwargs)


def checkpoint(function, *args, use_reentrant=None,
               context_fn=noop_context_fn, determinism_check="default",
               debug=False, early_stop=True, **kwargs):
    """``fn(*args, **kwargs)``, keeping only the inputs for backward,
    which recomputes what ``fn`` saved (PyTorch's ``checkpoint``; see the
    module doc). ``preserve_rng_state=False`` skips replaying the RNG.

    Example::

        h = checkpoint(block, h, use_reentrant=False)
    """
    if use_reentrant is None:
        warnings.warn(
            "torch.utils.checkpoint: the use_reentrant parameter should be "
            "passed explicitly. Starting in PyTorch 2.9, calling checkpoint "
            "without use_reentrant will raise an exception. "
            "use_reentrant=False is recommended, but if you need to "
            "preserve the current default behavior, you can pass "
            "use_reentrant=True. Refer to docs for more details on the "
            "differences between the two variants.", stacklevel=2)
        use_reentrant = True
    preserve = kwargs.pop("preserve_rng_state", True)
    if kwargs and use_reentrant:
        raise ValueError("Unexpected keyword arguments: "
                         + ",".join(arg for arg in kwargs))
    if use_reentrant:
        if context_fn is not noop_context_fn or debug is not False:
            raise ValueError("Passing `context_fn` or `debug` is only "
                             "supported when use_reentrant=False.")
        return CheckpointFunction.apply(function, preserve, *args)
    return _checkpoint_without_reentrant(
        function, preserve, context_fn, determinism_check, debug,
        early_stop, args, kwargs)


def checkpoint_sequential(functions, segments, input, use_reentrant=None,
                          **kwargs):
    """Run ``functions`` (an nn.Sequential or a list of modules) in
    ``segments`` chunks, each but the last under ``checkpoint``."""
    if use_reentrant is None:
        warnings.warn(
            "torch.utils.checkpoint.checkpoint_sequential: the "
            "use_reentrant parameter should be passed explicitly. In "
            "version 2.9 we will raise an exception if use_reentrant is not "
            "passed. use_reentrant=False is recommended, but if you need to "
            "preserve the current default behavior, you can pass "
            "use_reentrant=True. Refer to docs for more details on the "
            "differences between the two variants.", stacklevel=2)
        use_reentrant = True
    preserve = kwargs.pop("preserve_rng_state", True)
    if kwargs:
        raise ValueError("Unexpected keyword arguments: "
                         + ",".join(arg for arg in kwargs))
    if hasattr(functions, "children") and not isinstance(functions, list):
        functions = list(functions.children())

    def run(start, end):
        def forward(x):
            for j in range(start, end + 1):
                x = functions[j](x)
            return x
        return forward

    size = len(functions) // segments
    end = -1
    for start in range(0, size * (segments - 1), size):
        end = start + size - 1
        input = checkpoint(run(start, end), input,
                           use_reentrant=use_reentrant,
                           preserve_rng_state=preserve)
    return run(end + 1, len(functions) - 1)(input)


# ---------------------------------------------------------------------------
# Selective checkpointing. Its dispatcher sits in Function.apply's hook
# (autograd.function._sac), after the profiler and autocast.

class CheckpointPolicy(enum.Enum):
    """Per op: keep its output (``*_SAVE``) or recompute it
    (``*_RECOMPUTE``). MUST and PREFER mean the same in eager mode."""
    MUST_SAVE = 0
    PREFER_SAVE = 1
    MUST_RECOMPUTE = 2
    PREFER_RECOMPUTE = 3


_SAVE = (CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_SAVE)


class SelectiveCheckpointContext:
    """What a policy function receives first: ``is_recompute`` (always
    False: the policy runs in the forward only, as PyTorch's) and
    ``op_output``, the op's result."""

    def __init__(self, *, is_recompute, op_output=None):
        self.is_recompute = is_recompute
        self.op_output = op_output


_RECOMPUTE = object()
_CONSUMED = object()
_SAC_MISMATCH = ("This can happen if the operations in the checkpointed "
                 "region are nondeterministic or depend on global state "
                 "that changed between forward and backward.")


class _SacState(threading.local):
    mode = None          # the _Caching or _Cached context now active


_sac_tls = _SacState()
_sac_open = [0]
_sac_lock = threading.Lock()


def _sac_install(delta):
    with _sac_lock:
        _sac_open[0] += delta
        _function._sac = _sac_dispatch if _sac_open[0] > 0 else None
        _function._update_hook()


def _sac_dispatch(cls, args, kwargs):
    mode = _sac_tls.mode
    if mode is None or mode.busy or not cls._array_api:
        return NotImplemented
    mode.busy = True
    try:
        return mode.run(cls, args, kwargs)
    finally:
        mode.busy = False


class _SacMode:
    def __init__(self, storage):
        self.storage, self.counter = storage, defaultdict(int)
        self.busy = False

    def __enter__(self):
        self.counter.clear()
        self.prev, _sac_tls.mode = _sac_tls.mode, self
        _sac_install(1)
        return self

    def __exit__(self, *exc):
        _sac_tls.mode = self.prev
        _sac_install(-1)
        return False

    def index(self, cls):
        i = self.counter[cls]
        self.counter[cls] = i + 1
        return i


class _Caching(_SacMode):
    """The forward: run each op with its saved values kept as they are,
    then ask the policy; a saved op's output goes to the storage, the
    others' saved values to the checkpoint's pack hook."""

    def __init__(self, policy_fn, storage):
        super().__init__(storage)
        self.policy_fn = policy_fn

    def run(self, cls, args, kwargs):
        with _graph.keep_saved():
            out = cls.apply(*args, **kwargs)
        i = self.index(cls)
        policy = self.policy_fn(
            SelectiveCheckpointContext(is_recompute=False, op_output=out),
            cls, *args, **kwargs)
        if isinstance(policy, bool):
            policy = (CheckpointPolicy.MUST_SAVE if policy
                      else CheckpointPolicy.PREFER_RECOMPUTE)
        if policy in _SAVE:
            # the saved values that are inputs are recomputed all the
            # same (the recomputation makes them): packed, and packed
            # again in the recomputation from its own inputs
            taken = []
            if out.grad_fn is not None:
                _graph.pack_saved_now(out.grad_fn, args, out, taken)
            self.storage[cls][i] = (out._data, out._vc, out._vc[0],
                                    out.requires_grad, taken)
        else:
            self.storage[cls][i] = _RECOMPUTE
            if out.grad_fn is not None:
                _graph.pack_saved_now(out.grad_fn, args, out)
        return out


class _Cached(_SacMode):
    """The recomputation: a saved op's output comes from the storage (the
    op does not run), the others run."""

    def __init__(self, storage, allow_mutation):
        super().__init__(storage)
        self.allow_mutation = allow_mutation

    def run(self, cls, args, kwargs):
        i = self.index(cls)
        entries = self.storage.get(cls)
        if entries is None:
            raise RuntimeError(f"{cls.__name__} encountered during backward "
                               f"but not found in storage. {_SAC_MISMATCH}")
        entry = entries.get(i)
        if entry is None:
            raise RuntimeError(
                f"{cls.__name__} invocation index {i} encountered during "
                f"backward but not found in storage. {_SAC_MISMATCH}")
        if entry is _CONSUMED:
            raise RuntimeError(
                "Trying to backward an extra time. You are only allowed to "
                "backward once on any region computed under selective "
                "activation checkpoint.")
        if entry is _RECOMPUTE:
            return cls.apply(*args, **kwargs)
        entries[i] = _CONSUMED
        data, vc, version, req, taken = entry
        if vc[0] != version and not self.allow_mutation:
            raise RuntimeError("Tensor cached during selective activation "
                               "checkpoint has been mutated")
        for j in taken:
            _graph.pack_now(args[j])
        src = next(a for a in args if isinstance(a, TensorBase))
        # a leaf: the recomputed graph is never backpropagated, but the
        # ops after this one must record (and save) as in the forward
        return src._make(data, req and _grad_state.enabled, None)


def create_selective_checkpoint_contexts(policy_fn_or_list,
                                         allow_cache_entry_mutation=False):
    """The ``(forward, recomputation)`` contexts of selective
    checkpointing, for ``checkpoint(..., use_reentrant=False,
    context_fn=functools.partial(create_selective_checkpoint_contexts,
    policy))``. ``policy_fn_or_list``: a list of op classes of
    ``dtorch.ops`` to save (every other op is recomputed), or
    ``policy(ctx, op, *args, **kwargs)`` returning a ``CheckpointPolicy``
    (or a bool: True saves), where ``op`` is the op class.

    Example (keep matmul outputs, recompute the pointwise ops)::

        ops = [dtorch.ops.MatMul, dtorch.ops.Linear]
        ctx_fn = functools.partial(create_selective_checkpoint_contexts,
                                   ops)
        y = checkpoint(block, x, use_reentrant=False, context_fn=ctx_fn)
    """
    if isinstance(policy_fn_or_list, list):
        ops = policy_fn_or_list
        for op in ops:
            if not (isinstance(op, type) and issubclass(op, Function)
                    and op._array_api):
                raise ValueError(
                    f"Expected op in `op_list` to be an op class of "
                    f"dtorch.ops (such as dtorch.ops.MatMul) but got: {op} "
                    f"of type {type(op)}.")

        def policy_fn(ctx, op, *args, **kwargs):
            return (CheckpointPolicy.MUST_SAVE if op in ops
                    else CheckpointPolicy.PREFER_RECOMPUTE)
    elif callable(policy_fn_or_list):
        policy_fn = policy_fn_or_list
    else:
        raise TypeError("policy_fn_or_list must be either a function or a "
                        "list of ops.")
    storage = defaultdict(dict)
    return (_Caching(policy_fn, storage),
            _Cached(storage, allow_cache_entry_mutation))
