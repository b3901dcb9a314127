"""The byte ledger of one rank: what ``dtorch-launch --dry-run`` predicts
(distributed/dry_run.py, ranks as threads) and what a real rank measures
under ``DTORCH_DRY_RUN_REPORT=DIR`` (each rank writes ``DIR/rank<R>.json``
after every optimizer step). One code counts both, so that a prediction
and a measurement can be compared figure for figure.

What a step's record holds (a step ends when the rank's first optimizer
finishes a ``step()``; the global step hooks of ``dtorch.optim``):

- ``parameter_bytes``: the parameters of the optimizers that stepped;
- ``gradient_bytes``: their ``.grad`` when the step began;
- ``optimizer_state_bytes``: the tensors in every optimizer's ``state``
  after the step (a ZeroRedundancyOptimizer's inner one included);
- ``activation_bytes``: what the autograd graph held for backward when a
  backward began (the arrays its nodes saved, walked from the roots), the
  largest backward of the step (``activation_bytes_total``: all of them,
  e.g. every micro-batch of a pipeline schedule);
- ``collective_bytes`` / ``collective_calls`` per kind: each call's payload
  is the buffer the rank hands in (PyTorch's ``in_msg_nelems``): the
  buffer of all_reduce, broadcast, reduce, send and recv, the input of
  all_gather and gather, the whole input (group size x output) of
  reduce_scatter and all_to_all, the output of scatter. Object collectives
  and barriers count as calls of 0 bytes. Counted where every backend's
  op passes (``collectives.group.ProcessGroup._run``), so DDP's
  communication thread is counted for its rank.

Tensors are counted by the memory block they live in (a view and its base,
or two tied parameters, once); saved arrays that are a parameter's memory
are not activations. What activation checkpointing keeps outside the graph
(each region's inputs) is not counted.
"""
import itertools
import json
import os
import threading

import numpy as np
import collectives as _c

from .. import _backend as _B
from .. import _rank_local
from ..autograd import function as _function
from ..autograd.function import AccumulateGrad, Packed, TensorBase
from ..optim import optimizer as _optim

_current = _rank_local.RankLocal(lambda: None)    # this rank's Ledger
_lock = threading.Lock()
_users = [0]
_handles = []

# the kinds a table shows, in this order; others follow by name
KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast",
         "reduce", "gather", "scatter", "all_to_all", "send", "recv")
_KIND = {"all_reduce_coalesced": "all_reduce"}
_WHOLE_INPUT = ("reduce_scatter", "all_to_all")


class StopDryRun(BaseException):
    """Raised by a dry-run rank's last counted optimizer step: it unwinds
    the script (a BaseException, so that its ``except Exception`` does not
    catch it) to the dry run, which ends the rank there."""


def current():
    """The calling rank's ledger, or None."""
    return _current.get()


# --------------------------------------------------------------- sizes

def _owner(a):
    """The array whose memory ``a`` views (``a`` itself if it owns it)."""
    while True:
        b = getattr(a, "base", None)
        if b is None or type(b) is not type(a):
            return a
        a = b


def _block_bytes(arrays, exclude=()):
    """Bytes of the memory blocks under ``arrays``, each counted once."""
    seen = {}
    for a in arrays:
        o = _owner(a)
        if id(o) not in exclude:
            seen[id(o)] = o.nbytes
    return sum(seen.values())


def _tensor_arrays(tensors):
    return [t._data for t in tensors if isinstance(t, TensorBase)]


def _is_array(v):
    t = type(v)
    return t is np.ndarray or (_B._cupy is not None
                               and t is _B._cupy.ndarray)


def _saved(v, out):
    """Collect the arrays in a node attribute: an array, a tensor (a custom
    Function's ``to_save``), what a saved-tensors hook packed, and tuples,
    lists and dicts (``_packed``) of them."""
    if _is_array(v):
        out.append(v)
    elif isinstance(v, TensorBase):
        out.append(v._data)
    elif type(v) is Packed:
        _saved(v.obj, out)
    elif type(v) in (tuple, list):
        for e in v:
            _saved(e, out)
    elif type(v) is dict:
        for e in v.values():
            _saved(e, out)


def _walk(node, seen, saved, leaves):
    """Add the arrays saved by the nodes reachable from ``node`` (not yet
    ``seen``) to ``saved`` {id: nbytes}, the leaves' memory to ``leaves``."""
    stack = [node]
    seen.add(node)
    while stack:
        n = stack.pop()
        if type(n) is AccumulateGrad:
            leaves.add(id(_owner(n.variable._data)))
            continue
        arrays = []
        for v in n.__dict__.values():
            _saved(v, arrays)
        for a in arrays:
            o = _owner(a)
            saved[id(o)] = o.nbytes
        for e in n.next_edges:
            if e is not None and e[0] not in seen:
                seen.add(e[0])
                stack.append(e[0])


class _Recorder:
    """Rank 3 of autograd's recorder chain (function._set_recorder): it
    passes every op on and wraps the engine's node calls, so that the
    graph is walked before its first node runs (nothing is freed yet)."""
    inner = None

    def __call__(self, cls, args, kwargs):
        return _function._pass(self.inner, cls, args, kwargs)

    def backward_node(self, run):
        if self.inner is not None:
            run = self.inner.backward_node(run)
        led = current()
        if led is None:
            return run
        seen, saved, leaves = set(), {}, set()
        nth = next(_backwards)

        def counted(node, *rest):
            # a node not reached from the first is another root's: its
            # part of the graph is all there still (it runs later)
            if node not in seen:
                _walk(node, seen, saved, leaves)
                led._backward(nth, sum(b for i, b in saved.items()
                                       if i not in leaves))
            return run(node, *rest)
        return counted


_recorder = _Recorder()
_backwards = itertools.count()


# --------------------------------------------------------------- ledger

class Ledger:
    """One rank's figures (see the module doc). ``stop_after``: raise
    StopDryRun when that many steps are done (the dry run); ``report``: a
    file rewritten after every step (DTORCH_DRY_RUN_REPORT)."""

    def __init__(self, rank, world_size, stop_after=None, report=None):
        self.rank, self.world_size = rank, world_size
        self.stop_after, self.report = stop_after, report
        self.steps = []           # one record per finished step
        self.ended = None         # how the dry run's rank ended
        self.backend = None       # of the group the rank joined
        self._lock = threading.Lock()   # DDP's comm thread tallies too
        self._depth = 0           # nested steps (ZeRO's inner optimizer)
        self._main = None         # the optimizer whose steps count
        self._outer, self._all = {}, {}    # id -> optimizer
        self._open()

    def _open(self):
        self._bytes, self._calls = {}, {}
        self._walks = {}          # backward number -> bytes it held
        self._grads = 0

    # ---- collectives (ProcessGroup._run calls this)
    def tally(self, op, arr, size):
        kind = _KIND.get(op, op)
        if arr is None:
            n = 0
        elif isinstance(arr, list):
            n = sum(a.nbytes for a in arr)
        else:
            n = arr.nbytes * (size if kind in _WHOLE_INPUT else 1)
        with self._lock:
            self._bytes[kind] = self._bytes.get(kind, 0) + int(n)
            self._calls[kind] = self._calls.get(kind, 0) + 1

    # ---- backward (the recorder)
    def _backward(self, nth, nbytes):
        # backward number ``nth`` of the step holds ``nbytes`` so far (it
        # grows when another root is walked)
        with self._lock:
            self._walks[nth] = nbytes

    # ---- optimizer steps (the global step hooks)
    def _params(self):
        ps = {id(p): p for o in self._outer.values()
              for g in o.param_groups for p in g["params"]}
        return list(ps.values())

    def pre_step(self, opt):
        self._depth += 1
        self._all.setdefault(id(opt), opt)
        if self._depth > 1:
            return
        self._outer.setdefault(id(opt), opt)
        if self._main is None:
            self._main = opt
        if opt is self._main:
            self._grads = _block_bytes(
                _tensor_arrays(p.grad for p in self._params()))

    def post_step(self, opt):
        self._depth -= 1
        if self._depth or opt is not self._main:
            return
        params = _tensor_arrays(self._params())
        state = _tensor_arrays(v for o in self._all.values()
                               for st in o.state.values()
                               for v in st.values())
        with self._lock:
            rec = {"step": len(self.steps) + 1,
                   "parameter_bytes": _block_bytes(params),
                   "gradient_bytes": self._grads,
                   "optimizer_state_bytes": _block_bytes(state),
                   "activation_bytes": max(self._walks.values(),
                                           default=0),
                   "activation_bytes_total": sum(self._walks.values()),
                   "collective_bytes": dict(self._bytes),
                   "collective_calls": dict(self._calls)}
            self.steps.append(rec)
            self._open()
        if self.report:
            self.write(self.report)
        if self.stop_after is not None and len(self.steps) >= \
                self.stop_after:
            raise StopDryRun

    # ---- results
    def summary(self):
        """The last step's record, with rank, world size and step count
        (every step's record under ``per_step``)."""
        last = dict(self.steps[-1]) if self.steps else {}
        last.pop("step", None)
        return dict({"rank": self.rank, "world_size": self.world_size,
                     "backend": self.backend, "steps": len(self.steps),
                     "ended": self.ended},
                    **last, per_step=list(self.steps))

    def write(self, path):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(self.summary(), f, indent=1)
        os.replace(tmp, path)


def _pre(opt, args, kwargs):
    led = current()
    if led is not None:
        led.pre_step(opt)


def _post(opt, args, kwargs):
    led = current()
    if led is not None:
        led.post_step(opt)


def start(ledger):
    """Count for the calling rank (thread rank or process) into
    ``ledger``; the hooks are installed while any ledger is open."""
    with _lock:
        _users[0] += 1
        if _users[0] == 1:
            _handles[:] = [_optim.register_optimizer_step_pre_hook(_pre),
                           _optim.register_optimizer_step_post_hook(_post)]
            _function._set_recorder(3, _recorder)
    _current.set(ledger)


def stop():
    """Undo one ``start`` (the calling rank counts no more)."""
    _current.set(None)
    with _lock:
        _users[0] -= 1
        if _users[0] == 0:
            for h in _handles:
                h.remove()
            _handles.clear()
            _function._set_recorder(3, None)


def join(group):
    """``init_process_group`` gave this rank ``group``: its collectives go
    to the rank's ledger (a dry run's), or, with DTORCH_DRY_RUN_REPORT=DIR
    in a real rank, to a new one that writes DIR/rank<R>.json."""
    led = current()
    if led is None:
        where = _c.env_str("DTORCH_DRY_RUN_REPORT", None)
        if where is None:
            return
        led = Ledger(group.rank, group.size,
                     report=os.path.join(where, f"rank{group.rank}.json"))
        start(led)
    group._tally = led.tally
    led.backend = group.backend
