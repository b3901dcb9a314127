"""``dtorch.profiler``: where the time of a step goes (``torch.profiler``).

::

    from dtorch.profiler import profile, record_function, ProfilerActivity
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as p:
        with record_function("model_inference"):
            model(x).sum().backward()
    print(p.key_averages().table(sort_by="self_cpu_time_total"))
    p.export_chrome_trace("trace.json")     # chrome://tracing, Perfetto

What is timed: every op's forward (each ``Function.apply``: dtorch's
primitives are named ``dtorch::<Op>``, user Functions by their class), every
backward node (``autograd::engine::evaluate_function: <Node>``),
``record_function`` scopes and, with ``with_modules=True``, each module's
forward (``nn.Module: <Class>``). Times are host wall-clock: on CUDA they
measure the launch, not the kernel (dtorch does not read CUDA events), so
``ProfilerActivity.CUDA`` is accepted and records the same host events.

Recording is per thread (as PyTorch's profiler), so each rank of a job - a
process, or a thread under ``spawn_threads`` - profiles itself; its rank is
stored with the events and in the Chrome trace (``distributedInfo``).

Cost: while no profile records, ``Function.apply`` checks one module global
(shared with autocast) and the backward engine one per backward call; a
recording op costs a few microseconds more.
"""
import enum
import json
import os
import sys
import threading
import time

from .._ignored import ignored_argument
from ..autograd import function as _function
from ..autograd.function import TensorBase
from ._events import EventList, FunctionEvent, FunctionEventAvg  # noqa

__all__ = ["profile", "record_function", "ProfilerActivity",
           "ProfilerAction", "schedule", "tensorboard_trace_handler",
           "EventList", "FunctionEvent", "FunctionEventAvg"]


class ProfilerActivity(enum.Enum):
    CPU = 0
    CUDA = 1


class ProfilerAction(enum.Enum):
    NONE = 0
    WARMUP = 1
    RECORD = 2
    RECORD_AND_SAVE = 3


def schedule(*, wait, warmup, active, repeat=0, skip_first=0):
    """PyTorch's step schedule: skip ``skip_first`` steps, then cycles of
    ``wait`` idle, ``warmup`` (recorded, discarded) and ``active`` recorded
    steps, ``repeat`` times (0: forever)."""
    if wait < 0 or warmup < 0 or active <= 0 or repeat < 0 or skip_first < 0:
        raise ValueError("Invalid profiler schedule arguments")

    def fn(step):
        if step < skip_first:
            return ProfilerAction.NONE
        step -= skip_first
        cycle = wait + warmup + active
        if repeat > 0 and step // cycle >= repeat:
            return ProfilerAction.NONE
        pos = step % cycle
        if pos < wait:
            return ProfilerAction.NONE
        if pos < wait + warmup:
            return ProfilerAction.WARMUP
        return (ProfilerAction.RECORD if pos < cycle - 1
                else ProfilerAction.RECORD_AND_SAVE)
    return fn


def _always(step):
    return ProfilerAction.RECORD


# ------------------------------------------------------------ recording --

class _Thread(threading.local):
    rec = None          # the _Recording of this thread's open profile
    inside = None       # the op class being timed (re-entry guard)


_tls = _Thread()


class _Recording:
    """The raw events of one profiler session in one thread."""

    def __init__(self, record_shapes, rank):
        self.record_shapes = record_shapes
        self.rank = rank
        self.thread = threading.get_native_id()
        self.events = []      # FunctionEvent, in start order
        self.stack = []       # open events
        self.t0 = time.perf_counter_ns()

    def begin(self, name, shapes=None, kind="op"):
        if shapes is None and self.record_shapes:
            shapes = []          # scopes have no inputs (PyTorch shows [])
        now = (time.perf_counter_ns() - self.t0) / 1e3
        ev = FunctionEvent(len(self.events), name, self.thread, now, now,
                           shapes, kind, self.rank)
        if self.stack:
            parent = self.stack[-1]
            ev.cpu_parent = parent
            parent.cpu_children.append(ev)
        self.events.append(ev)
        self.stack.append(ev)
        return ev

    def end(self, ev):
        ev.end_us = (time.perf_counter_ns() - self.t0) / 1e3
        # close what an exception left open above ev, then ev itself
        while self.stack:
            top = self.stack.pop()
            if top is ev:
                break
            top.end_us = ev.end_us


def _shapes(args):
    return [list(a.shape) if isinstance(a, TensorBase) else []
            for a in args]


class _OpRecorder:
    """Installed as ``autograd.function._profile`` while any thread
    records: times ops of threads with an open profile, passes the rest on
    to autocast (or to the plain path)."""

    inner = None      # the next recorder in the chain

    def __call__(self, cls, args, kwargs):
        st = _tls
        rec = st.rec
        if rec is None or st.inside is cls:
            return _function._pass(self.inner, cls, args, kwargs)
        name = ("dtorch::" + cls.__name__) if cls._array_api \
            else cls.__name__
        ev = rec.begin(name, _shapes(args) if rec.record_shapes else None)
        prev, st.inside = st.inside, cls
        try:
            return cls.apply(*args, **kwargs)
        finally:
            st.inside = prev
            rec.end(ev)

    def backward_node(self, run):
        """Wrap the engine's per-node call for one backward pass."""
        if self.inner is not None:
            run = self.inner.backward_node(run)
        rec = _tls.rec
        if rec is None:
            return run

        def timed(node, *rest):
            ev = rec.begin("autograd::engine::evaluate_function: "
                           + node.name(), None, "backward")
            try:
                return run(node, *rest)
            finally:
                rec.end(ev)
        return timed


_recorder = _OpRecorder()


def _install(delta):
    # rank 1: inside a DTORCH_TIMELINE recorder (which stays outermost),
    # outside the FLOP counter
    _function._use_recorder(1, _recorder, delta)


def _current_rank():
    # only if the job already loaded dtorch.distributed: the profiler never
    # loads distribution code itself
    dist = sys.modules.get("dtorch.distributed")
    try:
        if dist is not None and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size(), \
                str(dist.get_backend())
    except Exception:        # a world being torn down: no rank to report
        pass
    return None


# ------------------------------------------------------------ profile --

class profile:
    """``torch.profiler.profile`` for dtorch (see the module docstring).

    Args (PyTorch's): activities, schedule, on_trace_ready, record_shapes,
    profile_memory, with_stack, with_flops, with_modules. profile_memory,
    with_stack and with_flops record nothing extra (a warning says so
    once).
    """

    def __init__(self, *, activities=None, schedule=None,
                 on_trace_ready=None, record_shapes=False,
                 profile_memory=False, with_stack=False, with_flops=False,
                 with_modules=False, experimental_config=None,
                 acc_events=False, use_cuda=None):
        acts = set(activities) if activities is not None else \
            {ProfilerActivity.CPU}
        for a in acts:
            if not isinstance(a, ProfilerActivity):
                raise TypeError(f"activities must be ProfilerActivity "
                                f"values, got {a!r}")
        self.activities = acts
        for name, value, why in (
                ("profile_memory", profile_memory, "no memory events"),
                ("with_stack", with_stack, "no Python stacks"),
                ("with_flops", with_flops, "no FLOP counts"),
                ("experimental_config", experimental_config, ""),
                ("use_cuda", use_cuda, "CUDA ops are timed as host "
                 "launches")):
            if value:
                ignored_argument("dtorch.profiler.profile", name, value,
                                 why)
        if ProfilerActivity.CUDA in acts:
            ignored_argument(
                "dtorch.profiler.profile", "activities",
                ProfilerActivity.CUDA, "no kernel timings: CUDA ops are "
                "timed as host launches like CPU ones")
        self.schedule = schedule if schedule is not None else _always
        self.on_trace_ready = on_trace_ready
        self.record_shapes = bool(record_shapes)
        self.with_modules = bool(with_modules)
        self.acc_events = acc_events
        self.step_num = 0
        self._rec = None           # the recording now open
        self._done = []            # recordings kept for events()
        self._action = ProfilerAction.NONE
        self._module_hooks = None
        self._thread = None
        self._dist = None

    # ---- lifecycle
    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()
        return False

    def start(self):
        if self._thread is not None:
            raise RuntimeError("profiler already started")
        self._thread = threading.get_ident()
        self._dist = _current_rank()
        self._action = self.schedule(self.step_num)
        self._enter_action(self._action)

    def stop(self):
        if self._thread is None:
            return
        if self._rec is not None:
            self._close(save=True)
        self._thread = None

    def step(self):
        """Tell the schedule a training step ended."""
        if self._thread is None:
            return
        prev = self._action
        self.step_num += 1
        self._action = self.schedule(self.step_num)
        recording = (ProfilerAction.RECORD,
                     ProfilerAction.RECORD_AND_SAVE)
        if prev == ProfilerAction.RECORD_AND_SAVE:
            self._close(save=True)
        elif prev == ProfilerAction.WARMUP and \
                self._action in recording:
            self._rec.events.clear()      # warm-up events are discarded
            return
        elif prev in recording and self._action in recording:
            return
        elif prev in (ProfilerAction.WARMUP,) + recording:
            self._close(save=False)
        self._enter_action(self._action)

    def _enter_action(self, action):
        if action != ProfilerAction.NONE and self._rec is None:
            self._open()

    def _open(self):
        if _tls.rec is not None:
            raise RuntimeError("a profiler is already recording in this "
                               "thread; nested profiles are not supported")
        rank = self._dist[0] if self._dist else None
        self._rec = _tls.rec = _Recording(self.record_shapes, rank)
        if self.with_modules:
            self._hook_modules()
        _install(+1)

    def _close(self, save):
        _install(-1)
        self._unhook_modules()
        rec, self._rec = self._rec, None
        _tls.rec = None
        while rec.stack:                       # scopes left open
            rec.end(rec.stack[-1])
        if save:
            if not self.acc_events:
                self._done = []
            self._done.append(rec)
            if self.on_trace_ready is not None:
                self.on_trace_ready(self)

    # ---- module scopes
    def _hook_modules(self):
        from ..nn.modules import module as M
        rec = self._rec
        key = ("dtorch.profiler", id(self))

        def pre(mod, args):
            if _tls.rec is rec:
                mod.__dict__.setdefault("_profiler_events", []).append(
                    rec.begin("nn.Module: " + type(mod).__name__,
                              None, "module"))

        def post(mod, args, out):
            evs = mod.__dict__.get("_profiler_events")
            if evs and _tls.rec is rec:
                rec.end(evs.pop())
        M._global_forward_pre_hooks[key] = (pre, False)
        M._global_forward_hooks[key] = (post, False)
        self._module_hooks = key

    def _unhook_modules(self):
        if self._module_hooks is None:
            return
        from ..nn.modules import module as M
        M._global_forward_pre_hooks.pop(self._module_hooks, None)
        M._global_forward_hooks.pop(self._module_hooks, None)
        self._module_hooks = None

    # ---- results
    def events(self):
        """Every recorded event (EventList of FunctionEvent)."""
        out = EventList()
        for rec in self._done:
            out.extend(rec.events)
        return out

    def key_averages(self, group_by_input_shape=False, group_by_stack_n=0):
        return self.events().key_averages(group_by_input_shape)

    @property
    def rank(self):
        return self._dist[0] if self._dist else None

    def export_chrome_trace(self, path):
        """Write the events as Chrome trace JSON (chrome://tracing,
        Perfetto): one complete ("X") event per range."""
        pid = os.getpid()
        trace = []
        for ev in self.events():
            e = {"ph": "X", "cat": "cpu_op" if ev.kind == "op" else
                 "user_annotation" if ev.kind == "user" else ev.kind,
                 "name": ev.name, "pid": pid, "tid": ev.thread,
                 "ts": ev.start_us, "dur": ev.cpu_time_total, "args": {}}
            if ev.input_shapes is not None:
                e["args"]["Input Dims"] = ev.input_shapes
            if ev.rank is not None:
                e["args"]["rank"] = ev.rank
            trace.append(e)
        doc = {"schemaVersion": 1, "traceEvents": trace,
               "displayTimeUnit": "ms"}
        if self._dist:
            rank, world, backend = self._dist
            doc["distributedInfo"] = {"backend": backend, "rank": rank,
                                      "world_size": world}
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(doc, f)
        os.replace(tmp, path)      # a reader never sees half a trace
        return path

    def table(self, *args, **kwargs):
        return self.key_averages().table(*args, **kwargs)


def tensorboard_trace_handler(dir_name, worker_name=None, use_gzip=False):
    """An ``on_trace_ready`` that writes each trace as
    ``<dir>/<worker>.<step>.pt.trace.json`` (worker: host_pid, or
    rank<N> under dtorch.distributed)."""
    def handler(prof):
        os.makedirs(dir_name, exist_ok=True)
        name = worker_name
        if name is None:
            name = (f"rank{prof.rank}" if prof.rank is not None
                    else f"{os.uname().nodename}_{os.getpid()}")
        path = os.path.join(
            dir_name, f"{name}.{prof.step_num}.pt.trace.json")
        prof.export_chrome_trace(path)
        if use_gzip:
            import gzip
            import shutil
            with open(path, "rb") as src, gzip.open(path + ".gz", "wb") as g:
                shutil.copyfileobj(src, g)
            os.remove(path)
    return handler


class record_function:
    """A named range in the profile (context manager or decorator); free
    when no profile records in this thread."""

    def __init__(self, name, args=None):
        if not isinstance(name, str):
            raise TypeError(f"record_function name must be a str, got "
                            f"{type(name).__name__}")
        self.name = name
        self.args = args
        self._ev = None
        self._rec = None

    def __enter__(self):
        rec = _tls.rec
        if rec is not None:
            self._rec = rec
            self._ev = rec.begin(self.name, None, "user")
        return self

    def __exit__(self, *exc):
        if self._ev is not None:
            self._rec.end(self._ev)
            self._ev = self._rec = None
        return False

    def __call__(self, fn):
        import functools

        @functools.wraps(fn)
        def wrapper(*a, **k):
            with record_function(self.name, self.args):
                return fn(*a, **k)
        return wrapper
