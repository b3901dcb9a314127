"""``Function``: the unit of the autograd graph.

A Function instance is both the ``ctx`` that ``forward`` and ``backward`` share
and the graph node that the engine walks (``grad_fn`` of its outputs). Users
write custom ops exactly as in PyTorch::

    class Exp(dtorch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            y = x.exp()
            ctx.save_for_backward(y)
            return y

        @staticmethod
        def backward(ctx, grad):
            y, = ctx.saved_tensors
            return grad * y

dtorch's own primitives (``dtorch/ops``) set ``_array_api = True``: their
forward and backward take and return raw NumPy/CuPy arrays, which keeps the
per-op overhead to a few microseconds.

Autograd sits below ``dtorch.tensor`` and never imports it. It works on
arrays, and knows a tensor only through the small protocol of
``TensorBase`` (below), which ``dtorch.Tensor`` derives from. Every tensor
autograd returns is made by ``_make`` of a tensor it was given (an op's
tensor argument, the leaf whose ``.grad`` it sets, the output a gradient is
for), so nothing needs to be registered with autograd at import.
"""
import functools
import itertools
import threading
import weakref

from .. import _backend as _B
from .grad_mode import _state

_seq = itertools.count()

# While an autocast region is open (in any thread), dtorch.amp sets this to
# its dispatcher: dispatcher(cls, args, kwargs) returns the op's result run
# under the autocast policy, or NotImplemented for an op it leaves alone.
# None otherwise, so the check in Function.apply costs one global lookup.
_autocast = None


# The op recorders (the DTORCH_TIMELINE recorder, the profiler's, the FLOP
# counter's) while any of them records, in any thread: each is called like
# _autocast, records the op and hands it on to the next one (its ``inner``)
# through _pass, the last one to autocast; each wraps the engine's per-node
# call in ``backward_node(run)``, the inner ones' first. _profile is the
# outermost; _set_recorder keeps the chain.
_profile = None
_recorders = {}          # rank (0 outermost) -> recorder
_recorder_lock = threading.Lock()
# The one hook Function.apply checks: the outermost recorder when set, else
# autocast's dispatcher, else None. Whoever sets _autocast or _profile calls
# _update_hook().
_hook = None


# While a saved_tensors_hooks region is open (in any thread), the function
# that packs what an op saved for backward (autograd/graph.py _pack_saved):
# called as _saved_hooks(ctx, args, out) after forward recorded a node.
# None otherwise: recording a node costs one global lookup more.
_saved_hooks = None


# While a selective checkpoint runs (in any thread), its op dispatcher
# (utils/checkpoint.py), called like _autocast after the profiler and
# autocast have passed an op on.
_sac = None


def _update_hook():
    global _hook
    first = _profile if _profile is not None else _autocast
    if _sac is None or first is None:
        _hook = first if first is not None else _sac
        return

    def chained(cls, args, kwargs):
        out = first(cls, args, kwargs)
        return _sac(cls, args, kwargs) if out is NotImplemented else out
    _hook = chained


def _set_recorder(rank, recorder):
    """Install ``recorder`` at ``rank`` of the recorder chain (0: the
    timeline, 1: the profiler, 2: the FLOP counter, 3: the dry run's
    accounting), or remove it (None)."""
    with _recorder_lock:
        _relink(rank, recorder)


_recorder_users = {}     # rank -> open users (profiles, FLOP counters)


def _use_recorder(rank, recorder, delta):
    """One more (+1) or one fewer (-1) user of ``recorder`` at ``rank``
    (open in any thread): it is in the chain while it has any."""
    with _recorder_lock:
        n = _recorder_users[rank] = _recorder_users.get(rank, 0) + delta
        _relink(rank, recorder if n > 0 else None)


def _relink(rank, recorder):
    # with _recorder_lock held
    global _profile
    if recorder is None:
        _recorders.pop(rank, None)
    else:
        _recorders[rank] = recorder
    chain = [_recorders[k] for k in sorted(_recorders)]
    for outer, inner in zip(chain, chain[1:] + [None]):
        outer.inner = inner
    _profile = chain[0] if chain else None
    _update_hook()


def _pass(inner, cls, args, kwargs):
    """What a recorder does with an op it does not record (or has recorded
    around its own ``cls.apply``): the next recorder's, autocast's, or
    NotImplemented (the plain path)."""
    if inner is not None:
        return inner(cls, args, kwargs)
    amp = _autocast
    return amp(cls, args, kwargs) if amp is not None else NotImplemented


def autocast_op(policy):
    """Decorator: a composite function (a loss made of several ops) is one
    op for autocast, with ``policy`` ('fp32', 'lower' or 'promote', or a
    dict of them by device type: {'cpu': ..., 'cuda': ...}) for its tensor
    arguments while a region is open. Outside one it costs the
    same global lookup as Function.apply."""
    def wrap(fn):
        @functools.wraps(fn)
        def op(*args, **kwargs):
            if _autocast is not None:
                out = _autocast(op, args, kwargs)
                if out is not NotImplemented:
                    return out
            return fn(*args, **kwargs)
        op._autocast_policy = policy
        return op
    return wrap


class TensorBase:
    """What autograd needs of a tensor; ``dtorch.Tensor`` derives from it.

    A subclass stores, in these attribute names: ``_data`` (the NumPy/CuPy
    array), ``requires_grad``, ``grad_fn`` (the Function that made it, or
    None), ``_output_nr`` (which output of grad_fn), ``_vc`` (a one-element
    list, the version counter that views share), ``_base`` (the tensor a
    view looks into), ``_accum`` (a leaf's AccumulateGrad node), ``_grad``,
    ``_hooks`` (array -> array callables: a leaf's gradient hooks) and
    ``_post_hooks`` (called with the leaf after accumulation); node hooks
    live in ``grad_fn._hooks[output_nr]`` as array -> array callables too.
    It provides ``_make(data, requires_grad, grad_fn)``, which returns a new
    plain tensor over ``data``, and ``dtype``/``_xp()``/``_alias()`` for
    custom Functions' outputs.
    """
    __slots__ = ()

_FREED_MSG = (
    "Trying to backward through the graph a second time (or directly access "
    "saved tensors after they have already been freed). Saved intermediate "
    "values of the graph are freed when you call .backward() or "
    "autograd.grad(). Specify retain_graph=True if you need to backward "
    "through the graph a second time or if you need to access saved tensors "
    "after calling backward.")


class Function:
    """Base class of differentiable operations (``dtorch.autograd.Function``)."""
    # Engine bookkeeping lives in slots so that freeing a node's saved state
    # is one ``__dict__.clear()``, whatever attributes forward stored on ctx.
    __slots__ = ("next_edges", "_seq", "_versions",
                 "_hooks", "_freed", "_out_meta", "_dirty", "_non_diff",
                 "_materialize", "__dict__", "__weakref__")
    _array_api = False
    _is_view = False
    # forward may read this even when no graph is recorded
    needs_input_grad = (False,) * 8

    # ------------------------------------------------------------ ctx API --
    def save_for_backward(self, *tensors):
        self.to_save = tensors

    @property
    def saved_tensors(self):
        if self._freed:
            raise RuntimeError(_FREED_MSG)
        d = self.__dict__
        if "to_save" not in d and "to_save" in d.get("_packed", ()):
            return self.to_save     # packed by a hook: __getattr__ below
        return d.get("to_save", ())

    def __getattr__(self, name):
        # Only reached for a name that is not set: what a saved-tensors
        # hook packed (autograd/graph.py) is unpacked at its first use in
        # backward, and kept there until the node is freed.
        packed = self.__dict__.get("_packed")
        if packed is not None and name in packed:
            value = _unpack_saved(packed[name])
            self.__dict__[name] = value
            return value
        raise AttributeError(f"{type(self).__name__!r} object has no "
                             f"attribute {name!r}")

    def mark_dirty(self, *tensors):
        self._dirty = tensors

    def mark_non_differentiable(self, *tensors):
        self._non_diff = tensors

    def set_materialize_grads(self, value):
        self._materialize = bool(value)

    @staticmethod
    def forward(ctx, *args, **kwargs):
        raise NotImplementedError(
            "You must implement the forward function for custom "
            "autograd.Function.")

    @staticmethod
    def backward(ctx, *grad_outputs):
        raise NotImplementedError(
            "You must implement either the backward or vjp method for your "
            "custom autograd.Function to use it with backward mode AD.")

    def name(self):
        n = type(self).__name__
        return n if n.endswith("Backward") else n + "Backward"

    def __repr__(self):
        return f"<{self.name()} object at {id(self):#x}>"

    @property
    def next_functions(self):
        return tuple(e if e is not None else (None, 0)
                     for e in self.next_edges)

    # -------------------------------------------------------------- apply --
    @classmethod
    def apply(cls, *args, **kwargs):
        if _hook is not None:
            out = _hook(cls, args, kwargs)
            if out is not NotImplemented:
                return out
        # CuPy runs kernels on the current device, not the operands': run
        # forward on the device of the first CUDA input (as PyTorch's device
        # guard). Free on the CPU while CuPy was never loaded.
        if _B._cupy is not None:
            idx = _cuda_index(args, kwargs)
            if idx is not None:
                rt = _B._cupy.cuda.runtime
                prev = rt.getDevice()
                if prev != idx:
                    rt.setDevice(idx)
                    try:
                        if cls._array_api:
                            return _apply_array(cls, args, kwargs)
                        return _apply_tensor(cls, args, kwargs)
                    finally:
                        rt.setDevice(prev)
        if cls._array_api:
            if len(args) == 2 and not kwargs:     # a binary op
                return _apply_array2(cls, args)
            return _apply_array(cls, args, kwargs)
        return _apply_tensor(cls, args, kwargs)

    # called by the engine; returns one gradient array (or None) per input
    def _run_backward(self, grads):
        if self._array_api:
            out = type(self).backward(self, *grads)
            return out if type(out) is tuple else (out,)
        return self._custom_backward(grads, self._make_tensor, False)

    def _custom_backward(self, grads, make, graph):
        """A user Function's backward: gradients padded to one per output
        and zeros where PyTorch materialises them, given as tensors (made
        by ``make``), grad mode ``graph``; one gradient per input comes
        back, as arrays, or as tensors under create_graph (``graph``)."""
        T = TensorBase
        tgrads = []
        grads = list(grads) + [None] * (len(self._out_meta) - len(grads))
        for g, meta in zip(grads, self._out_meta):
            if g is None and self._materialize and meta is not None:
                xp, shape, dt = meta
                g = xp.zeros(shape, dt)
            if g is not None and not isinstance(g, T):
                g = make(g, False, None)
            tgrads.append(g)
        prev = _state.enabled
        _state.enabled = graph
        try:
            out = type(self).backward(self, *tgrads)
        finally:
            _state.enabled = prev
        if type(out) is not tuple:
            out = (out,)
        if graph:
            res = [g if g is None or isinstance(g, T)
                   else make(g, False, None) for g in out]
        else:
            res = [g._data if isinstance(g, T) else g for g in out]
        n = len(self.next_edges)
        if len(res) < n:
            res.extend([None] * (n - len(res)))
        elif len(res) > n and any(g is not None for g in res[n:]):
            raise RuntimeError(
                f"function {self.name()} returned an incorrect number of "
                f"gradients (expected {n}, got {len(res)})")
        return res

    # ---------------------------------------------- create_graph=True --
    # The engine calls _run_backward_graph instead of _run_backward: the
    # gradients are tensors and grad mode is on, so what backward computes
    # is recorded and can be differentiated again.
    #
    # An array op's ``backward`` runs here on tensors (below), unless
    # marked ``@once_differentiable`` (then its gradient is a tensor whose
    # own backward raises, naming the op: never a silent zero). Returning
    # NotImplemented under create_graph means the same for one call (an
    # argument combination it does not cover). A legacy ``backward_graph``
    # (tensors in, tensors out) still takes precedence where one is left.
    # A body whose fast path does what no tensor can (a compiled kernel,
    # in-place ``out=`` buffers) branches on ``ctx._gmake is None`` and,
    # under create_graph, pins its tensor form to the fast path's values
    # (ops/recompute.py ``pin_all``).

    # One derivative per op (issue 30): an array op's ``backward`` is one
    # body for both paths, computing with ``xp = ops.base.grad_xp(g)``
    # (ops/_tnp.py). What forward saved enters it through these three:
    # the array itself on the fast path (``_gmake`` is None), a tensor
    # under create_graph.
    _gmake = None

    def input(self, i, data):
        """Saved input i: ``data`` on the fast path, a tensor whose
        gradient flows to input i under create_graph. A Python number
        or None stays itself."""
        if self._gmake is None or data is None or type(data) in _NUMBERS:
            return data
        return self.graph_input(i, data)

    def output(self, data, nr=0):
        """Saved output nr: ``data``, or under create_graph a tensor whose
        gradient flows back through this node."""
        if self._gmake is None:
            return data
        return self.graph_output(data, nr)

    def const(self, data):
        """A saved array the derivative treats as a constant (a mask, an
        index, a count): ``data``, or a constant tensor under
        create_graph."""
        if self._gmake is None or data is None or type(data) in _NUMBERS:
            return data
        return self._gmake(data, False, None)

    def graph_input(self, i, data):
        """``data`` (input i's array, as forward saw it) as a tensor whose
        gradient flows to input i."""
        e = self.next_edges[i]
        if e is None:
            return self._gmake(data, False, None)
        t = self._gmake(data, True, e[0])
        t._output_nr = e[1]
        return t

    def graph_output(self, data, nr=0):
        """``data`` (this node's output nr, saved by forward) as a tensor
        whose gradient flows back through this node."""
        t = self._gmake(data, True, self)
        t._output_nr = nr
        return t

    def _run_backward_graph(self, grads):
        make = next(g for g in grads if g is not None)._make
        if self._array_api:
            cls = type(self)
            bg = getattr(cls, "backward_graph", None)
            if bg is None:
                bg = cls.backward
                if getattr(bg, "_once_differentiable", False):
                    return _first_order_only(self, grads, make)
            self._gmake = make
            try:
                out = bg(self, *grads)
            finally:
                # a later plain backward through this node (retain_graph)
                # takes the fast path again
                self._gmake = None
            if out is NotImplemented:    # not for these arguments
                return _first_order_only(self, grads, make)
            return out if type(out) is tuple else (out,)
        if getattr(type(self).backward, "_once_differentiable", False):
            return _first_order_only(self, grads, make)
        return self._custom_backward(grads, make, True)


_NUMBERS = (int, float, bool)


def once_differentiable(fn):
    """Marks a Function's ``backward`` as first-order only (PyTorch's
    ``torch.autograd.function.once_differentiable``): under
    create_graph=True it runs on plain values with grad mode off, and
    differentiating its result again raises naming the function. An
    array op (``dtorch/ops``) without this mark has one backward body for
    both orders."""
    @functools.wraps(fn)
    def once(ctx, *grads):       # a new function: fn itself stays unmarked
        return fn(ctx, *grads)
    once._once_differentiable = True
    return once


def _first_order_only(node, grads, make):
    """The gradients of a primitive that has no backward_graph: computed on
    arrays as usual, returned as tensors whose backward raises."""
    prev = _state.enabled
    _state.enabled = False
    try:
        out = node._run_backward([None if g is None else g._data
                                  for g in grads])
    finally:
        _state.enabled = prev
    edges = [e for e in node.next_edges if e is not None]
    edges += [_edge(g) for g in grads if g is not None and g.requires_grad]
    res = []
    for a in out:
        if a is None:
            res.append(None)
            continue
        stop = _NoDoubleBackward(node.name(), edges)
        res.append(make(a, True, stop))
    return res


class _NoDoubleBackward(Function):
    """Stands for the gradient of a primitive without backward_graph:
    reaching it in a backward pass is an error that names the primitive."""
    _array_api = True

    def __init__(self, op, edges):
        self.op = op
        self.next_edges = tuple(edges)
        self._seq = next(_seq)
        self._freed = False
        self._hooks = None
        self._versions = None

    def name(self):
        return f"{self.op}GradBackward"

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(
            f"double backward is not implemented for {ctx.op}: the "
            f"gradient it computed under create_graph=True cannot be "
            f"differentiated again in dtorch (gradient penalties and "
            f"higher-order gradients need every op on the path to "
            f"support it)")


def _cuda_index(args, kwargs):
    """The device index of the first CuPy array (or CUDA tensor) among an
    op's arguments, or None."""
    nd = _B._cupy.ndarray
    T = TensorBase
    for a in args:
        if isinstance(a, T):
            a = a._data
        if isinstance(a, nd):
            return a.data.device_id
    for a in kwargs.values():
        if isinstance(a, T):
            a = a._data
        if isinstance(a, nd):
            return a.data.device_id
    return None


def _edge(t):
    """The graph edge that a gradient for tensor t flows along."""
    fn = t.grad_fn
    if fn is not None:
        return (fn, t._output_nr)
    acc = t._accum
    if acc is None:
        acc = t._accum = AccumulateGrad(t)
    return (acc, 0)


def _apply_array(cls, args, kwargs):
    """Fast path for dtorch's primitives: arrays in, arrays out.

    This runs for every op, so it is written for speed (measured on tiny
    tensors, where it dominates): one pass over the arguments gathers
    their arrays and, when a graph is recorded, each input's gradient edge
    (_edge inlined), and forward is called without ``**kwargs`` when there
    are none (a star-call with an empty dict costs ~50 ns)."""
    if len(args) == 2 and not kwargs:
        return _apply_array2(cls, args)
    T = TensorBase
    ctx = cls.__new__(cls)
    arrays = []
    src = None       # a tensor argument: its _make builds the result
    edges = None     # set once an argument requires grad (and mode is on)
    if _state.enabled:
        needs = []
        elist = []
        for a in args:
            if isinstance(a, T):
                arrays.append(a._data)
                src = a
                if a.requires_grad:
                    fn = a.grad_fn
                    if fn is None:
                        fn = a._accum
                        if fn is None:
                            fn = a._accum = AccumulateGrad(a)
                        elist.append((fn, 0))
                    else:
                        elist.append((fn, a._output_nr))
                    needs.append(True)
                    edges = elist
                    continue
            else:
                arrays.append(a)
            needs.append(False)
            elist.append(None)
    else:
        for a in args:
            if isinstance(a, T):
                arrays.append(a._data)
                src = a
            else:
                arrays.append(a)
    if src is None:
        raise TypeError(f"{cls.__name__}.apply() expects at least one "
                        f"tensor argument")
    if edges is None:
        out = (cls.forward(ctx, *arrays, **kwargs) if kwargs
               else cls.forward(ctx, *arrays))
        res = src._make(out, False, None)
        if cls._is_view:
            src = args[0]
            res._vc = src._vc
            res._base = src if src._base is None else src._base
        return res
    ctx.needs_input_grad = needs
    out = (cls.forward(ctx, *arrays, **kwargs) if kwargs
           else cls.forward(ctx, *arrays))
    ctx.next_edges = edges
    ctx._seq = next(_seq)
    ctx._freed = False
    ctx._hooks = None
    res = src._make(out, True, ctx)
    if cls._is_view:
        src = args[0]
        res._vc = src._vc
        res._base = src if src._base is None else src._base
    saved = ctx.__dict__.get("to_save")
    if saved:
        _record_versions(ctx, saved, args, res)
    else:
        ctx._versions = None
    if _saved_hooks is not None:
        _saved_hooks(ctx, args, res)
    return res


def _apply_array2(cls, args):
    """_apply_array for the binary ops (two arguments, no keywords), the
    most common call: no argument lists to build, no star-calls."""
    T = TensorBase
    ctx = cls.__new__(cls)
    x, y = args
    if isinstance(x, T):
        xa = x._data
        src = x
        rx = x.requires_grad
    else:
        xa = x
        src = None
        rx = False
    if isinstance(y, T):
        ya = y._data
        src = y
        ry = y.requires_grad
    else:
        ya = y
        ry = False
        if src is None:
            raise TypeError(f"{cls.__name__}.apply() expects at least one "
                            f"tensor argument")
    if not (rx or ry) or not _state.enabled:
        res = src._make(cls.forward(ctx, xa, ya), False, None)
        if cls._is_view:
            res._vc = x._vc
            res._base = x if x._base is None else x._base
        return res
    if rx:
        fn = x.grad_fn
        if fn is None:
            fn = x._accum
            if fn is None:
                fn = x._accum = AccumulateGrad(x)
            ex = (fn, 0)
        else:
            ex = (fn, x._output_nr)
    else:
        ex = None
    if ry:
        fn = y.grad_fn
        if fn is None:
            fn = y._accum
            if fn is None:
                fn = y._accum = AccumulateGrad(y)
            ey = (fn, 0)
        else:
            ey = (fn, y._output_nr)
    else:
        ey = None
    ctx.needs_input_grad = [rx, ry]
    out = cls.forward(ctx, xa, ya)
    ctx.next_edges = [ex, ey]
    ctx._seq = next(_seq)
    ctx._freed = False
    ctx._hooks = None
    res = src._make(out, True, ctx)
    if cls._is_view:
        res._vc = x._vc
        res._base = x if x._base is None else x._base
    saved = ctx.__dict__.get("to_save")
    if saved:
        _record_versions(ctx, saved, args, res)
    else:
        ctx._versions = None
    if _saved_hooks is not None:
        _saved_hooks(ctx, args, res)
    return res


def _record_versions(ctx, saved, args, out):
    # Saved arrays are matched to the tensors that own them, so that an
    # in-place change to any of them after forward is caught at backward.
    T = TensorBase
    vers = []
    od = out._data
    for s in saved:
        if s is None:
            continue
        if s is od:
            # a weak reference: out.grad_fn is ctx, and a strong one would
            # make a cycle that keeps every saved array alive until the
            # cyclic GC runs (measured: RSS +150 MB and thousands of page
            # faults per CNN step)
            vc = out._vc
            vers.append((vc, vc[0], weakref.ref(out), "output"))
            continue
        for a in args:
            if isinstance(a, T) and a._data is s:
                vc = a._vc
                vers.append((vc, vc[0], a, "input"))
                break
    ctx._versions = vers or None


def _apply_tensor(cls, args, kwargs):
    """Custom (user) Functions: Tensors in, Tensors out, as in PyTorch."""
    T = TensorBase
    ctx = cls()
    ctx._freed = False
    ctx._materialize = True
    tensors = [a for a in args if isinstance(a, T)]
    req = _state.enabled and any(t.requires_grad for t in tensors)
    ctx.needs_input_grad = tuple(
        isinstance(a, T) and a.requires_grad for a in args)
    prev = _state.enabled
    _state.enabled = False
    try:
        out = cls.forward(ctx, *args, **kwargs)
    finally:
        _state.enabled = prev
    single = not isinstance(out, tuple)
    outs = (out,) if single else out
    if not req:
        return out
    ctx.next_edges = tuple(_edge(a) if (isinstance(a, T) and a.requires_grad)
                           else None for a in args)
    ctx._seq = next(_seq)
    ctx._hooks = None
    # backward hands the user's backward tensors made like its inputs
    ctx._make_tensor = tensors[0]._make
    dirty = getattr_slot(ctx, "_dirty")
    non_diff = getattr_slot(ctx, "_non_diff") or ()
    wrapped, meta = [], []
    for i, o in enumerate(outs):
        if not isinstance(o, T):
            wrapped.append(o)
            meta.append(None)
            continue
        if dirty and any(o is d for d in dirty):
            o._bump_version()
        elif any(o is a for a in tensors):
            o = o._alias()     # returning an input: a new tensor, same data
        diff = (o.dtype.is_floating_point
                and not any(o is n for n in non_diff))
        if diff:
            o.requires_grad = True
            o.grad_fn = ctx
            o._output_nr = i
        meta.append((o._xp(), o._data.shape, o._data.dtype))
        wrapped.append(o)
    ctx._out_meta = meta
    saved = ctx.__dict__.get("to_save")
    vers = []
    for s in saved or ():
        if isinstance(s, T):
            vers.append((s._vc, s._vc[0], s, "saved tensor"))
    ctx._versions = vers or None
    if _saved_hooks is not None:
        _saved_hooks(ctx, args, None)
    return wrapped[0] if single else tuple(wrapped)


class Packed:
    """A saved value that a saved-tensors hook packed: ``unpack(obj)``
    gives it back as a tensor; ``array`` says the op saved the tensor's
    array (a primitive), not the tensor (a custom Function)."""
    __slots__ = ("unpack", "obj", "array")

    def __init__(self, unpack, obj, array):
        self.unpack, self.obj, self.array = unpack, obj, array


def _unpack_saved(v):
    """A packed ctx attribute back as what forward stored: a Packed, or a
    tuple/list holding some."""
    if type(v) is Packed:
        t = v.unpack(v.obj)
        if not isinstance(t, TensorBase):
            raise TypeError(f"the unpack hook of saved_tensors_hooks must "
                            f"return a tensor, got {type(t).__name__}")
        return t._data if v.array else t
    return type(v)(_unpack_saved(e) if type(e) is Packed else e for e in v)


def getattr_slot(obj, name):
    try:
        return getattr(obj, name)
    except AttributeError:
        return None


class AccumulateGrad(Function):
    """Graph sink of a leaf tensor: adds the incoming gradient to ``.grad``."""
    _array_api = True

    def __init__(self, tensor):
        self.variable = tensor
        self.next_edges = ()
        # leaves run as soon as they are ready, before any other node,
        # which is when DDP wants to hear about them
        self._seq = float("inf")
        self._freed = False
        self._hooks = None
        self._versions = None

    def name(self):
        return "AccumulateGrad"
