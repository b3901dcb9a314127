"""dtorch's part of the timeline (``DTORCH_TIMELINE=DIR``, see
``collectives/timeline.py``): autograd ops and backward nodes of a rank,
recorded into the timeline of its process group.

``attach(group)`` is called where a job joins its group (init_process_group,
DDP) and only when the variable is set: it synchronises the clocks (a
collective, so every rank calls it at the same point), binds the calling
thread to the rank's timeline and installs the recorder as
``autograd.function._profile`` - the slot the profiler uses, so
``Function.apply`` keeps its single hook check and nothing is installed
while no timeline is on. A profile that records at the same time still sees
every op: the timeline's recorder stays outermost in the recorder chain
(``autograd.function._set_recorder``) and hands each op on to the next.

Events: ``<Op>`` (forward, args: input shapes) on the thread that ran it,
``<Node>Backward`` for each backward node; rank threads of one process
(``spawn_threads``) each record into their own rank's file.
"""
import threading
import time

from collectives import timeline as _ctl
from ..autograd import function as _function
from ..autograd.function import TensorBase

_now = time.perf_counter_ns
_lock = threading.Lock()


class _Local(threading.local):
    tl = None         # the timeline of the rank this thread works for
    inside = None     # the op class being recorded (re-entry guard)
    tid_of = None     # the timeline `tid` was registered with
    tid = None


_tls = _Local()
_process = [None, 0]   # the process's one timeline (process ranks), count


def requested():
    return _ctl.requested() is not None


def _shapes(args):
    return [a._data.shape for a in args if isinstance(a, TensorBase)]


class _Recorder:
    """``autograd.function._profile`` while a timeline records: records
    the op, then hands it on to the profiler (``inner``) or autocast."""
    inner = None

    def __call__(self, cls, args, kwargs):
        st = _tls
        tl = st.tl or _process[0]
        if tl is None or st.inside is cls or tl.closed:
            return _function._pass(self.inner, cls, args, kwargs)
        if st.tid_of is not tl:
            st.tid, st.tid_of = tl.tid(), tl
        prev, st.inside = st.inside, cls
        t0 = _now()
        try:
            return cls.apply(*args, **kwargs)
        finally:
            st.inside = prev
            # the hot path: a tuple (args: the input shapes), no dict
            ev = tl._events
            ev.append(('X', cls.__name__, 'op', st.tid, t0, _now(),
                       _shapes(args)))
            if len(ev) >= _ctl.FLUSH_EVERY:
                tl.flush()

    def backward_node(self, run):
        """Wrap the engine's per-node call for one backward pass."""
        if self.inner is not None:
            run = self.inner.backward_node(run)
        tl = _tls.tl or _process[0]
        if tl is None or tl.closed:
            return run

        def timed(node, *rest):
            t0 = _now()
            try:
                return run(node, *rest)
            finally:
                tl.complete(node.name(), 'backward', t0, _now())
        return timed


_recorder = _Recorder()
_on = [False]


def _install(on):
    with _lock:
        _on[0] = on
        # rank 0: the outermost recorder, around the profiler's
        _function._set_recorder(0, _recorder if on else None)


def attach(group):
    """Start the timeline of ``group``'s rank (clock sync on first use) and
    record this thread's autograd ops into it. Returns the timeline, or
    None when ``DTORCH_TIMELINE`` is unset."""
    tl = getattr(group, "_timeline", None)
    if tl is None:
        return None
    if not tl.synced and group.size == tl.size:
        # the clock sync needs every rank: a sub-group (DDP over a DP group)
        # leaves it to the world's first collective
        tl.start(group)
    _tls.tl = tl
    with _lock:
        if _process[0] is not tl:
            # one timeline per process: any thread's ops are its rank's;
            # several (thread ranks): only threads bound by attach record
            _process[1] += 1
            _process[0] = tl if _process[1] == 1 else None
    if not _on[0]:
        _install(True)
    return tl


def close():
    """Write every open timeline of this process and remove the hook."""
    paths = _ctl.close_all()
    with _lock:
        _process[0], _process[1] = None, 0
    _tls.tl = None
    if _on[0]:
        _install(False)
    return paths
