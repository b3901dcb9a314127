"""Capture: one eager run of compiled code, recorded at the array level.

While a thread captures, every op it runs reaches ``_Recorder`` (rank 4, the
innermost, of autograd's recorder chain): what autocast or another
dispatcher does to the op has happened by then, so the recorded op is the
one that really ran (a ``Cast`` autocast inserted is an op of its own). Each
array gets a slot: the compiled call's input tensors first, then every op's
output; a tensor an op reads that is neither (a parameter, a buffer, a
constant the code made) is a *live* slot, matched between two captures in
``program.build``. What happens outside ops reaches the tracer through
``autograd._capture.active``: a host read (``.item()``, ``bool()``) is a
graph break, an in-place change outside an op is replayed when it is one
NumPy ufunc (``BatchNorm``'s ``num_batches_tracked.add_(1)``) or a copy of
an op's result (``_inplace``), a break otherwise; a random draw marked
``array_source`` (dropout's mask) is drawn again by each replay. A backward
pass or an optimizer step ends the recording: such code (a training step)
runs eagerly, with its modules compiled (``dtorch/_compile/__init__.py``).
"""
import os
import sys
import threading

import numpy as np

from .. import _backend as B
from ..autograd import _capture
from ..autograd import function as _fn

_T = _fn.TensorBase
_PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Unsupported(RuntimeError):
    """A graph break under ``fullgraph=True`` (torch._dynamo's
    ``Unsupported``): the message names the break and where it is."""


class _Local(threading.local):
    trace = None     # the Trace this thread records, or None
    plain = None     # the op class the recorder is running itself


_tls = _Local()


def _is_array(a):
    return type(a) is np.ndarray or B.is_cupy_array(a)


def user_frame():
    """'file:line (function)' of the innermost caller outside dtorch."""
    f = sys._getframe(1)
    while f is not None and f.f_code.co_filename.startswith(_PKG):
        f = f.f_back
    if f is None:
        return "?"
    return f"{f.f_code.co_filename}:{f.f_lineno} ({f.f_code.co_name})"


class Trace:
    """What one capture saw, in order (see the module docstring)."""

    def __init__(self, inputs, fullgraph, name):
        self.name = name
        self.fullgraph = fullgraph
        self.slot_of = {}        # id(array) -> slot
        self.keep = []           # every array seen: ids stay unique
        self.nslots = 0
        self.meta = {}           # slot -> (shape, dtype, array type)
        self.live = []           # (slot, tensor) read from outside
        self.steps = []
        self.graph = set()       # slots of op outputs that require grad
        self.breaks = []         # graph breaks: "what at where"
        self.effects = []        # backward passes, optimizer steps
        self.fail = None         # why this code cannot be replayed
        self.done = False        # recording stopped (an effect, a failure)
        self.inputs = [self._new(t._data) for t in inputs]

    # ------------------------------------------------------------ slots --
    def _new(self, a):
        s = self.nslots
        self.nslots += 1
        self.slot_of[id(a)] = s
        self.keep.append(a)
        self.meta[s] = (getattr(a, "shape", None), getattr(a, "dtype", None),
                        type(a))
        return s

    def tensor_slot(self, t):
        s = self.slot_of.get(id(t._data))
        if s is None:
            s = self._new(t._data)
            self.live.append((s, t))
        return s

    def spec(self, a):
        """An op argument: ('s', slot) for a tensor's array, ('r', slot)
        for an array the program knows handed over raw (a buffer an op
        updates in place), ('c', value) for the rest (compared between the
        two captures)."""
        if isinstance(a, _T):
            return ("s", self.tensor_slot(a))
        if _is_array(a):
            s = self.slot_of.get(id(a))
            if s is not None:
                return ("r", s)
            self.keep.append(a)
        return ("c", a)

    # ------------------------------------------------------------ events --
    def stop(self, reason):
        if self.fail is None:
            self.fail = reason
        self.done = True

    def op(self, cls, args, kwargs, out):
        if not isinstance(out, _T):
            return self.stop(f"{cls.__name__} returned {type(out).__name__}")
        specs = tuple(self.spec(a) for a in args)
        kw = tuple((k, self.spec(v)) for k, v in kwargs.items())
        fn = out.grad_fn
        graph = out.requires_grad and type(fn) is cls
        needs = tuple(bool(n) for n in fn.needs_input_grad) if graph else None
        slot = self._new(out._data)
        if graph:
            self.graph.add(slot)
        self.steps.append(("op", cls, specs, kw, slot, needs,
                           out._data.ndim == 0))

    def source(self, fn, args, kwargs):
        specs = tuple(self.spec(a) for a in args)
        kw = tuple((k, self.spec(v)) for k, v in kwargs.items())
        self.done = True        # what fn does inside is fn's
        try:
            out = fn(*args, **kwargs)
        finally:
            self.done = False
        t = isinstance(out, _T)
        if t and out.requires_grad:
            self.stop(f"{fn.__name__} made a tensor that requires grad "
                      f"inside compiled code")
        else:
            self.steps.append(("src", fn, specs, kw,
                               self._new(out._data if t else out), t))
        return out

    def copied(self, a, out, requires_grad):
        s = self.slot_of.get(id(a))
        if s is None:
            return          # an outside array: its copy is an outside tensor
        slot = self._new(out)
        if requires_grad:
            self.graph.add(slot)
            self.steps.append(("op", Clone, (("s", s),), (), slot, (True,),
                               False))
        else:
            self.steps.append(("op", Clone, (("s", s),), (), slot, None,
                               False))

    def mutated(self, t):
        f = sys._getframe(3)   # mutated <- _Hooks.mutated <- _bump_version
        name = f.f_code.co_name
        loc = f.f_locals
        if name == "_ufunc_" and loc.get("self") is t:
            ufunc = getattr(B.get_array_module(t._data), loc["name"])
            self.steps.append(("ufunc", ufunc, self.tensor_slot(t),
                               self.spec(loc["oa"])))
            return
        res = loc.get("res")
        if (name in ("_inplace", "_rebase") and loc.get("self") is t
                and isinstance(res, _T)
                and id(res._data) in self.slot_of):
            src = self.slot_of[id(res._data)]
            self.steps.append(("copy", self.tensor_slot(t), src))
            # later reads of t read the op's result (same values), and a
            # gradient through them reaches that op (t took its grad_fn)
            self.slot_of[id(t._data)] = src
            return
        i = len(self.steps) - 1
        while i >= 0 and self.steps[i][0] == "bump":
            i -= 1
        last = self.steps[i] if i >= 0 else None
        if last is not None and last[0] == "op":
            last = self._adopt(i, t)
        s = self.slot_of.get(id(t._data))
        if s is not None and last is not None and last[0] == "op" and (
                ("r", s) in last[2] or any(p == ("r", s) for _, p in last[3])):
            # the op just recorded changed it (BatchNorm's running
            # statistics) and its caller counts the version: so does the
            # replay
            self.steps.append(("bump", s))
            return
        self.brk(f"an in-place change by {name}() outside an op")

    def _adopt(self, i, t):
        """The last op step with t's array, which it was given raw (a
        buffer an op updates in place), read as the live tensor t."""
        d = t._data
        st = self.steps[i]

        def fix(p):
            return ("r", self.tensor_slot(t)) if p[0] == "c" and p[1] is d \
                else p
        st = st[:2] + (tuple(map(fix, st[2])),
                       tuple((k, fix(p)) for k, p in st[3])) + st[4:]
        self.steps[i] = st
        return st

    def brk(self, what):
        msg = f"{what} at {user_frame()}"
        if self.fullgraph:
            raise Unsupported(
                f"dtorch.compile(fullgraph=True): graph break in "
                f"{self.name}: {msg}. Data-dependent Python (or an effect "
                f"the compiler cannot replay) needs fullgraph=False, where "
                f"this code runs eagerly")
        self.breaks.append(msg)
        self.stop(f"graph break: {msg}")

    def effect(self, what):
        self.effects.append(what)
        self.done = True


class Clone(_fn.Function):
    """The copy Tensor._rebase keeps of a tensor it changes in place, as a
    step of the program: its gradient is the incoming one."""
    _array_api = True

    @staticmethod
    def forward(ctx, a):
        return a.copy()

    @staticmethod
    def backward(ctx, g):
        return g


def _active():
    tr = _tls.trace
    return tr if tr is not None and not tr.done else None


class _Hooks:
    """``autograd._capture.active`` while any thread captures: each call
    goes to this thread's Trace, if it records."""

    @staticmethod
    def host_read(t, what):
        tr = _active()
        tr and tr.brk(what)

    @staticmethod
    def copied(a, out, requires_grad):
        tr = _active()
        tr and tr.copied(a, out, requires_grad)

    @staticmethod
    def mutated(t):
        tr = _active()
        tr and tr.mutated(t)

    @staticmethod
    def source(fn, args, kwargs):
        tr = _active()
        return tr.source(fn, args, kwargs) if tr else fn(*args, **kwargs)


class _Recorder:
    """Rank 4 of the recorder chain while any thread captures."""
    inner = None

    def __call__(self, cls, args, kwargs):
        st = _tls
        tr = st.trace
        if tr is None or tr.done:
            return _fn._pass(self.inner, cls, args, kwargs)
        if st.plain is cls:            # the recorder's own call, below
            st.plain = None
            return NotImplemented
        if _fn._sac is not None or _fn._saved_hooks is not None:
            tr.stop("activation checkpointing (saved-tensor hooks) inside "
                    "compiled code")
            return _fn._pass(self.inner, cls, args, kwargs)
        out = _fn._pass(self.inner, cls, args, kwargs)
        if out is not NotImplemented:
            # autocast (or another dispatcher) ran it as other ops, which
            # came through here and are recorded
            return out
        if not cls._array_api:
            tr.stop(f"custom autograd.Function {cls.__name__}")
            return NotImplemented
        st.plain = cls
        try:
            out = cls.apply(*args, **kwargs)
        finally:
            st.plain = None
        tr.op(cls, args, kwargs, out)
        return out

    def backward_node(self, run):
        if self.inner is not None:
            run = self.inner.backward_node(run)
        tr = _tls.trace
        if tr is not None and not tr.done:
            tr.effect("loss.backward()")
        return run


_recorder = _Recorder()
_lock = threading.Lock()
_open = [0, None]      # captures open in all threads, the step hook


def _step_hook(opt, args, kwargs):
    tr = _tls.trace
    if tr is not None and not tr.done:
        tr.effect(f"{type(opt).__name__}.step()")


def _install(delta):
    with _lock:
        _open[0] += delta
        on = _open[0] > 0
        _capture.active = _Hooks if on else None
        # optimizers exist only if dtorch.optim is loaded (no import here:
        # optim sits beside the compiler and imports nn, which imports it)
        optim = sys.modules.get("dtorch.optim.optimizer")
        if on and _open[1] is None and optim is not None:
            _open[1] = optim.register_optimizer_step_pre_hook(_step_hook)
        elif not on and _open[1] is not None:
            _open[1].remove()
            _open[1] = None
    _fn._use_recorder(4, _recorder, delta)


def capture(fn, args, kwargs, inputs, fullgraph, name):
    """Run ``fn(*args, **kwargs)`` once, eagerly, recording it: (its
    result, the Trace)."""
    tr = Trace(inputs, fullgraph, name)
    prev = _tls.trace
    _install(+1)
    _tls.trace = tr
    try:
        out = fn(*args, **kwargs)
    finally:
        _tls.trace = prev
        _install(-1)
    return out, tr


def capturing():
    """True while this thread records a capture."""
    return _tls.trace is not None
