"""``dtorch.compile``: capture a call once at the array level, replay it.

The design, and why:

- **What is captured.** A call of a module's forward (or of a function
  that only computes) is run eagerly twice while the ops it runs are
  recorded (``trace.py``): each op's class, arguments (as slots of an
  array program, or constants) and output slot. If both captures agree
  (``program.build``) the third call with the same guard key replays the
  program: generated Python that calls each op's ``forward(ctx, *arrays)``
  on raw arrays and, when a gradient is asked for, each op's
  ``backward(ctx, grad)`` in reverse order, with no Tensor, Function or
  graph node per op (one node per call, ``CompiledFunctionBackward``). Two
  captures rather than one (tinygrad's TinyJit also runs twice before it
  replays): whatever the trace cannot see (a tensor built from Python
  data, a random draw outside ``array_source``, Python control flow that
  changes between calls) shows up as a difference between them, and the
  call then runs eagerly with that reason recorded. The program is then
  replayed once against the second capture (parameters, buffers, inputs
  and RNG state put back): an array written outside ops without a version
  bump shows up there (CPU; ``_validate``).
- **A training step** (a function that calls ``loss.backward()`` or
  ``optimizer.step()``) is not replayed as a whole: its Python runs each
  call and the modules it calls (found in its globals and closure, DDP
  unwrapped to its module) run compiled. So the optimizer (which reads
  ``lr`` as the scheduler left it), GradScaler's skip, ``clip_grad_norm_``,
  DDP's forward and its gradient-ready hooks (fired by the engine on the
  parameters' own AccumulateGrad nodes, which the compiled node feeds) are
  the eager code itself, not a copy that could drift from it. The cost
  left is per parameter (the optimizer's loop), not per op. torch.compile
  itself breaks the graph at ``loss.backward()`` unless compiled autograd
  is turned on.
- **Guards** (``_Compiled._key``): every input tensor's shape, dtype,
  device, contiguity and requires_grad, Python arguments by value, grad
  mode, autocast state, each submodule's ``training`` and plain
  attributes (numbers, strings: a ``self.scale`` a forward multiplies by
  is baked into the program, so a new value captures again; a function's
  globals and closure are not guarded); and per program:
  the parameters and buffers still registered as the same objects, with
  the same shape, dtype and requires_grad. A new key captures again, up to
  ``dtorch.compiler.config.cache_size_limit`` keys; past it, that call runs
  eagerly. Random numbers come fresh each replay (a source is drawn again
  from the same generator: the same stream as eager); in-place changes of
  buffers (BatchNorm's running statistics, in its op, and
  ``num_batches_tracked``) are replayed.
- **Graph breaks** (``.item()``, ``.tolist()``, ``bool(tensor)``,
  ``.numpy()``, an in-place change outside an op the trace cannot replay,
  a custom autograd.Function): a module with one runs eagerly (reason
  recorded); a function with one runs eagerly with its modules compiled;
  ``fullgraph=True`` raises ``dtorch.compiler.Unsupported`` naming the
  break and its line. ``dtorch.compiler.explain`` lists captures, breaks,
  recaptures and fallbacks.

- **Fusion** (``fuse.py``, after the validation above): runs of
  elementwise ops become one numba kernel (CPU) or one ``cupy.fuse``
  kernel (CUDA) forward and one backward. ``options={"fuse": True}`` (the
  default) fuses transcendental functions too (a few ulp from NumPy's);
  ``"exact"``, and the default under
  ``dtorch.use_deterministic_algorithms(True)``, only ops that round as
  NumPy does (bitwise equal to eager); ``False`` none.

Left out: symbolic shapes (each shape is its own capture), CUDA graphs;
double backward through a compiled call raises (naming it), as for any op
without a second derivative.
"""
import collections
import copy
import sys
import threading
import types
import warnings
import weakref

import numpy as np

from .. import _settings
from .. import random as _random
from ..autograd import function as _fn
from ..autograd.grad_mode import _state
from . import program as _program
from . import trace as _trace
from .trace import Unsupported

__all__ = ["compile", "Unsupported"]


class _Config:
    """``dtorch.compiler.config``: ``cache_size_limit`` (torch._dynamo's
    default, 8) guard keys per compiled callable; ``disable`` runs every
    compiled callable eagerly."""
    cache_size_limit = 8
    disable = False


config = _Config()
counters = collections.Counter()   # captures, replays, recaptures, ...
_all = weakref.WeakSet()           # every _Compiled, for reset()
_lock = threading.Lock()
_BACKENDS = ("inductor", "eager", "aot_eager", "cudagraphs")
_MODES = (None, "default", "reduce-overhead", "max-autotune",
          "max-autotune-no-cudagraphs")
_dynamic_warned = [False]


def compile(model=None, *, fullgraph=False, dynamic=None, backend="inductor",
            mode=None, options=None, disable=False):
    """``torch.compile``: ``model`` (a module or a function) captured and
    replayed as an array program (see this module's docstring). As a
    decorator with or without arguments. ``backend="eager"`` (torch's
    "capture, then run eagerly") runs the captured code eagerly;
    ``disable=True`` returns ``model`` itself."""
    if backend not in _BACKENDS:
        raise RuntimeError(
            f"dtorch.compile: backend {backend!r} is not available: dtorch "
            f"replays its own array programs (backends: "
            f"{', '.join(map(repr, _BACKENDS))})")
    if mode not in _MODES:
        raise RuntimeError(f"Unrecognized mode={mode}, should be one of: "
                           f"{', '.join(str(m) for m in _MODES[1:])}")
    fuse = _fuse_option(options)
    if dynamic and not _dynamic_warned[0]:
        _dynamic_warned[0] = True
        warnings.warn("dtorch.compile(dynamic=True): dtorch has no symbolic "
                      "shapes; each input shape is captured on its own, as "
                      "with dynamic=False", UserWarning, stacklevel=2)

    def wrap(m):
        if disable:
            return m
        eager = backend == "eager"
        if _is_module(m):
            comp = _compile_module(m, fullgraph, eager, fuse=fuse)
            return _optimized_module(type(m))(m, comp)
        if not callable(m):
            raise RuntimeError(f"dtorch.compile: expected a callable or a "
                               f"Module, got {type(m).__name__}")
        return _Compiled(m, None, fullgraph, eager,
                         getattr(m, "__qualname__", repr(m)), fuse)
    return wrap if model is None else wrap(model)


def compile_in_place(module, fullgraph=False, dynamic=None,
                     backend="inductor", mode=None, options=None,
                     disable=False):
    """``Module.compile()``: this module's calls run compiled."""
    compile(lambda m: m, fullgraph=fullgraph, dynamic=dynamic,
            backend=backend, mode=mode, options=options)   # validation
    if not disable:
        _compile_module(module, fullgraph, backend == "eager", True,
                        _fuse_option(options))


def _fuse_option(options):
    """``options={"fuse": True | "exact" | False}`` (fuse.py): elementwise
    fusion on (the default), only where it is bitwise equal to eager, or
    off. Other keys are inductor's, which dtorch has not."""
    options = dict(options or {})
    fuse = options.pop("fuse", True)
    if options:
        raise RuntimeError(
            f"dtorch.compile: options are inductor's and dtorch has none "
            f"but 'fuse' (got {sorted(options)})")
    if fuse not in (True, False, "exact"):
        raise RuntimeError(f"dtorch.compile: options['fuse'] must be True, "
                           f"False or 'exact', got {fuse!r}")
    return fuse


def _compile_module(m, fullgraph, eager, in_place=False, fuse=True):
    """What a call of the compiled ``m`` runs: the compiled call of ``m``
    (hooks included, as torch's OptimizedModule), or, in place, a compiled
    forward in ``m.__dict__``. DDP's own forward stays eager (it prepares
    its reducer for the backward to come): the module it wraps gets the
    compiled forward, in place."""
    inner = _unwrap(m)
    if inner is not m or in_place:
        c = inner.__dict__.get("forward")
        if not isinstance(c, _Compiled):
            c = inner.__dict__["forward"] = _Compiled(
                type(inner).forward.__get__(inner), inner, fullgraph, eager,
                type(inner).__name__, fuse)
        return m if inner is not m else c
    return _Compiled(m, m, fullgraph, eager, type(m).__name__, fuse)


def reset():
    """``dtorch.compiler.reset()``: every compiled callable forgets what
    it captured (its next calls capture again); counters start at zero."""
    with _lock:
        for c in list(_all):
            c._reset()
        counters.clear()


# ------------------------------------------------------------ modules --

_Module = [None]
_Optimized = {}


def _is_module(o):
    M = _Module[0]
    if M is not None:
        return isinstance(o, M)
    for c in type(o).__mro__:
        if c.__name__ == "Module" and c.__module__ == \
                "dtorch.nn.modules.module":
            _Module[0] = c
            return True
    return False


def _unwrap(m):
    # DDP's forward prepares its reducer for the backward to come (Python
    # state): it stays eager, and the module it wraps is compiled
    while type(m).__name__ == "DistributedDataParallel" and \
            _is_module(getattr(m, "module", None)):
        m = m.module
    return m


def _optimized_module(_cls):
    """torch's ``OptimizedModule``: the compiled module, whose state_dict
    keys carry the ``_orig_mod.`` prefix and whose other attributes are the
    original module's. Built on first use (``dtorch.nn`` imports this
    package for ``Module.compile``, so it is not imported here)."""
    cls = _Optimized.get("cls")
    if cls is not None:
        return cls
    Module = _Module[0]

    class OptimizedModule(Module):
        def __init__(self, mod, call):
            super().__init__()
            self._orig_mod = mod
            self.__dict__["_compiled_call"] = call

        def forward(self, *args, **kwargs):
            return self.__dict__["_compiled_call"](*args, **kwargs)

        def __getattr__(self, name):
            try:
                return Module.__getattr__(self, name)
            except AttributeError:
                mods = self.__dict__.get("_modules")
                if mods is None or "_orig_mod" not in mods:
                    raise
                return getattr(mods["_orig_mod"], name)

    OptimizedModule.__module__ = __name__
    _Optimized["cls"] = OptimizedModule
    return OptimizedModule


def _referenced_modules(fn):
    """The modules a function names: its globals, closure and self."""
    objs = []
    code = getattr(fn, "__code__", None)
    if code is not None:
        g = getattr(fn, "__globals__", {})
        names = set(code.co_names)
        for c in code.co_consts:     # comprehensions, nested functions
            if hasattr(c, "co_names"):
                names.update(c.co_names)
        objs += [g[n] for n in sorted(names) if n in g]
        objs += [c.cell_contents for c in (fn.__closure__ or ())
                 if _has_contents(c)]
    self = getattr(fn, "__self__", None)
    if self is not None:
        objs.append(self)
    # one attribute deep (trainer.model, self.net)
    objs += [v for o in objs if not _is_module(o)
             and not isinstance(o, (type, types.ModuleType))
             and hasattr(o, "__dict__") for v in vars(o).values()]
    seen, out = set(), []
    for o in objs:
        if not _is_module(o) or id(o) in seen:
            continue
        seen.add(id(o))
        if type(o).__name__ == "OptimizedModule" or \
                isinstance(o.__dict__.get("forward"), _Compiled):
            continue                     # compiled already
        out.append(_unwrap(o))
    return out


def _referenced_all(fn):
    code = getattr(fn, "__code__", None)
    if code is None:
        return []
    g = getattr(fn, "__globals__", {})
    objs = [g[n] for n in code.co_names if n in g]
    objs += [c.cell_contents for c in (fn.__closure__ or ())
             if _has_contents(c)]
    return [o for o in objs if _is_module(o)]


def _has_contents(cell):
    try:
        cell.cell_contents
        return True
    except ValueError:
        return False


# ---------------------------------------------------------- the cache --

class _Entry:
    __slots__ = ("trace", "outs", "tree", "program", "reason", "meta",
                 "reg")

    def __init__(self):
        self.trace = self.outs = self.tree = self.program = None
        self.reason = None
        self.meta = self.reg = ()


_ndarray = np.ndarray
_TLEAF = "T"
_PLEAF = "P"


def _flatten(obj, leaves):
    """A hashable tree of ``obj`` (tuples, lists, dicts, namedtuples)
    with its leaves appended to ``leaves``."""
    if isinstance(obj, _fn.TensorBase):
        leaves.append(obj)
        return _TLEAF
    t = type(obj)
    if t is tuple or t is list:
        return (t, tuple(_flatten(x, leaves) for x in obj))
    if t is dict:
        return (dict, tuple((k, _flatten(v, leaves)) for k, v in obj.items()))
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return (t, tuple(_flatten(x, leaves) for x in obj))
    leaves.append(obj)
    return _PLEAF


def _unflatten(tree, it):
    if tree is _TLEAF or tree is _PLEAF:
        return next(it)
    t, items = tree
    if t is dict:
        return {k: _unflatten(v, it) for k, v in items}
    vals = [_unflatten(x, it) for x in items]
    return t(*vals) if t not in (tuple, list) else t(vals)


def _leaf_key(x):
    if isinstance(x, _fn.TensorBase):
        d = x._data
        if type(d) is _ndarray:
            return (d.shape, d.dtype, x.requires_grad, d.flags.c_contiguous)
        return (d.shape, d.dtype, type(d), x.requires_grad,
                getattr(d, "flags", None) is None or d.flags.c_contiguous,
                getattr(getattr(d, "data", None), "device_id", None))
    try:
        hash(x)
        return (type(x), x)
    except TypeError:
        return ("id", id(x))


def _autocast_key():
    if _fn._autocast is None:
        return None
    amp = sys.modules.get("dtorch.amp.autocast_mode")
    mode = getattr(getattr(amp, "_tls", None), "mode", None) or {}
    return tuple(sorted((k, bool(v[0]), str(v[1]), bool(v[2]))
                        for k, v in mode.items()))


class _Compiled:
    """A compiled callable: a cache of guard key -> captured program."""

    def __init__(self, fn, module, fullgraph, eager, name, fuse=True):
        self.fn = fn
        self.fuse = fuse
        self.module = module
        self.fullgraph = fullgraph
        self.eager = eager
        self.name = name
        self._modlist = None       # module.modules(), at the first call
        self._getters = ()
        self.segment = None        # a training step: its modules, compiled
        self.cache = collections.OrderedDict()
        self.log = []              # what explain() shows
        self.stats = collections.Counter()
        _all.add(self)
        try:
            self.__wrapped__ = fn
            self.__name__ = getattr(fn, "__name__", name)
            self.__doc__ = getattr(fn, "__doc__", None)
        except AttributeError:
            pass

    @property
    def _mods(self):
        if self._modlist is None:
            self._modlist = list(self.module.modules()) \
                if self.module is not None else []
            self._getters = [_plain_getter(m) for m in self._modlist]
        return self._modlist

    def __get__(self, obj, objtype=None):
        # a compiled method (decorated in a class body) binds like one
        if obj is None:
            return self
        return _bind(self, obj)

    def _reset(self):
        self.cache.clear()
        self.segment = None
        self.log.clear()
        self.stats.clear()

    def _note(self, what, msg):
        self.stats[what] += 1
        counters[what] += 1
        if msg is not None and len(self.log) < 64:
            self.log.append(f"{what}: {msg}")

    def __call__(self, *args, **kwargs):
        if config.disable or _trace._tls.trace is not None:
            # inside another capture: inlined into it
            return self.fn(*args, **kwargs)
        if self.segment is not None:
            return self._run_segment(args, kwargs)
        modes = _module_key(self._mods, self._getters)
        if modes is None:
            # a forward hook's Python would not run in a replay
            if not self.stats["hooked"]:
                self._note("fallbacks", f"{self.name} has forward hooks: "
                           f"it runs eagerly while they are registered")
            self.stats["hooked"] += 1
            return self.fn(*args, **kwargs)
        T = _fn.TensorBase
        if not kwargs and all([isinstance(a, T) for a in args]):
            tensors = args           # the common call: tensors only
            tree = len(args)
            leaf_keys = tuple(map(_leaf_key, args))
        else:
            leaves = []
            tree = _flatten((args, kwargs), leaves)
            tensors = [x for x in leaves if isinstance(x, T)]
            leaf_keys = tuple(map(_leaf_key, leaves))
        key = (tree, leaf_keys, _state.enabled, _autocast_key(), modes,
               _settings.are_deterministic_algorithms_enabled())
        e = self.cache.get(key)
        if e is None:
            if len(self.cache) >= config.cache_size_limit:
                self._note("fallbacks", f"cache_size_limit "
                           f"({config.cache_size_limit}) reached: this call "
                           f"runs eagerly")
                return self.fn(*args, **kwargs)
            if self.cache:
                self._note("recaptures", "a guard changed (input shapes, "
                           "dtypes, requires_grad, grad mode, autocast, "
                           "training or a module's plain attribute)")
            e = self.cache[key] = _Entry()
        p = e.program
        if p is not None:
            if p.guard(e.meta) and all(d.get(k) is t for d, k, t in e.reg):
                self.stats["replays"] += 1
                counters["replays"] += 1
                return _unflatten(e.tree, iter(p.run(tensors)))
            self._note("recaptures", "a parameter or buffer was replaced "
                       "or changed shape, dtype or requires_grad")
            e.__init__()
        if e.reason is not None or self.eager:
            return self.fn(*args, **kwargs)
        return self._capture(e, tensors, args, kwargs)

    def _capture(self, e, tensors, args, kwargs):
        snap = _snapshot(e.trace, tensors) if e.trace is not None else None
        out, tr = _trace.capture(self.fn, args, kwargs, tensors,
                                 self.fullgraph, self.name)
        self._note("captures", None)
        if tr.effects or (tr.fail is not None and self.module is None):
            if self.module is not None:
                e.reason = (f"{', '.join(tr.effects)} inside the forward of "
                            f"{self.name}: it runs eagerly")
                self._note("fallbacks", e.reason)
                return out
            # a training step (or a function with a break): its Python
            # runs each call, the modules it calls run compiled
            mods = _referenced_modules(self.fn)
            self.segment = [(m, _Compiled(type(m).forward.__get__(m), m,
                                          self.fullgraph, False,
                                          type(m).__name__, self.fuse))
                            for m in mods if "forward" not in m.__dict__]
            self.cache.clear()
            why = ", ".join(tr.effects) or tr.fail
            self._note("segments", f"{why} in {self.name}: its Python runs "
                       f"eagerly, its modules compiled: "
                       f"{[type(m).__name__ for m in mods] or 'none found'}")
            for b in tr.breaks:
                self._note("breaks", b)
            return out
        for b in tr.breaks:
            self._note("breaks", b)
        leaves = []
        tree = _flatten(out, leaves)
        spec = _program.out_spec(tr, leaves, tensors)
        if tr.fail is not None:
            e.reason = tr.fail
            self._note("fallbacks", f"{self.name}: {tr.fail}")
        elif e.trace is None:
            e.trace, e.outs, e.tree = tr, spec, tree
        else:
            res = (_program.build(e.trace, tr, e.outs, spec, self.name)
                   if tree == e.tree else
                   f"{self.name} returned different structures")
            e.trace = e.outs = None
            if not isinstance(res, str) and snap is not None:
                res = _validate(res, snap, tensors, leaves) or res
            if isinstance(res, str):
                e.reason = res
                self._note("fallbacks", f"{self.name}: {res}")
            else:
                self._fuse(res)
                e.program, e.tree = res, tree
                e.meta = [(t, t._data.shape, t._data.dtype, type(t._data),
                           t.requires_grad) for t in res.live_tensors]
                e.reg = self._registrations(res.live_tensors)
                self._note("programs", f"{self.name}: {res.n_ops} ops")
        return out

    def _fuse(self, prog):
        # after the validation: that replay is the unfused program's, bit
        # for bit; the fused one differs only where fuse.py says it may
        if not self.fuse:
            return
        exact = self.fuse == "exact" or \
            _settings.are_deterministic_algorithms_enabled()
        n = prog.fuse(exact)
        if n:
            self._note("fused", f"{self.name}: {n} groups of "
                       f"{sum(g.n_ops for g in prog.groups)} ops")

    def __deepcopy__(self, memo):
        # a copied module gets a compiled forward of its own (copy.deepcopy
        # has put the module's copy in memo before copying its __dict__)
        return _Compiled(copy.deepcopy(self.fn, memo),
                         memo.get(id(self.module), self.module),
                         self.fullgraph, self.eager, self.name, self.fuse)

    def _registrations(self, tensors):
        where = {}
        for m in self._mods:
            for table in (m._parameters, m._buffers):
                for k, t in table.items():
                    if t is not None:
                        where.setdefault(id(t), (table, k, t))
        return [where[id(t)] for t in tensors if id(t) in where]

    def _run_segment(self, args, kwargs):
        put = []
        for m, c in self.segment:
            d = m.__dict__
            if "forward" not in d:
                d["forward"] = c
                put.append(d)
        try:
            return self.fn(*args, **kwargs)
        finally:
            for d in put:
                d.pop("forward", None)


_PLAIN = (int, float, bool, str, type(None))


# ------------------------------------------------------- validation --
# The second capture is checked once against a replay of itself: the
# outside tensors' arrays (parameters, buffers) and the inputs are put back
# as they were before it, with the RNG state, the program replays the same
# call, and its outputs and the arrays it changed must equal the eager
# run's bit for bit. What the trace cannot see (an array written outside
# ops without a version bump) shows up here, and the call runs eagerly.
# On the CPU with the default generator only: elsewhere it is skipped.

def _snapshot(tr, tensors):
    arrays = [t._data for _, t in tr.live] + [t._data for t in tensors]
    if any(type(a) is not _ndarray for a in arrays) or any(
            st[0] == "src" and any(k == "generator" and p[1] is not None
                                   for k, p in st[3]) for st in tr.steps):
        return None
    return [(a, a.copy()) for a in arrays], _random.get_rng_state()


def _validate(prog, snap, tensors, leaves):
    """None if replaying the call just captured gives what it gave, else
    the reason."""
    saved, rng = snap
    after = [(a, a.copy()) for a, _ in saved]
    rng_after = _random.get_rng_state()
    outs = [x._data.copy() if isinstance(x, _fn.TensorBase) else x
            for x in leaves]
    for a, c in saved:
        a[...] = c
    _random.set_rng_state(rng)
    try:
        res = prog.run(tensors)
    except Exception as err:       # noqa: BLE001 - reported as the reason
        res = err
    ok = not isinstance(res, Exception) and len(res) == len(outs) and all(
        _program.same(r._data if isinstance(r, _fn.TensorBase) else r, o)
        for r, o in zip(res, outs)) and all(
        _program.same(a, c) for a, c in after) and _program.same(
        _random.get_rng_state(), rng_after)
    if ok:
        return None
    for a, c in after:
        a[...] = c
    _random.set_rng_state(rng_after)
    return (f"a replay of {prog.name} does not reproduce its eager call "
            f"({res!r} )" if isinstance(res, Exception) else
            f"a replay of {prog.name} does not reproduce its eager call bit "
            f"for bit: something changes arrays outside ops without a "
            f"version bump, or is not deterministic")


def _module_key(mods, getters):
    """Each module's ``training`` and plain attributes (numbers, strings:
    a forward may read them into an op's arguments, which a replay has
    baked in), or None where a forward hook is registered (on one of
    them, or globally). ``getters``: per module, what reads them."""
    if not mods:
        return ()
    nn = sys.modules.get("dtorch.nn.modules.module")
    if nn._global_forward_hooks or nn._global_forward_pre_hooks:
        return None
    key = []
    for m, get in zip(mods, getters):
        d = m.__dict__
        if d["_forward_hooks"] or d["_forward_pre_hooks"]:
            return None
        key.append(get(d))
    return tuple(key)


def _plain_getter(m):
    names = [k for k, v in vars(m).items() if type(v) in _PLAIN]
    if len(names) == 1:
        k = names[0]
        return lambda d: (d.get(k),)
    return lambda d, names=tuple(names): tuple([d.get(k) for k in names])


def _bind(c, obj):
    key = "_dtorch_compiled_" + getattr(c.fn, "__name__", "method")
    d = getattr(obj, "__dict__", None)
    bound = d.get(key) if d is not None else None
    if bound is None:
        bound = _Compiled(c.fn.__get__(obj), obj if _is_module(obj) else
                          None, c.fullgraph, c.eager, c.name, c.fuse)
        if d is not None:
            d[key] = bound
    return bound


def is_compiling():
    """True while this thread captures (``torch.compiler.is_compiling``)."""
    return _trace._tls.trace is not None


def explain(obj):
    """What a compiled callable did: captures, programs (with their op
    counts), graph breaks, recaptures and eager fallbacks, with reasons.
    On a callable not compiled yet, returns a function that compiles it,
    calls it once with the given arguments and explains that call (as
    torch._dynamo.explain)."""
    c = _compiled_of(obj)
    if c is not None:
        return _explain(c)

    def run(*args, **kwargs):
        cc = _compiled_of(compile(obj))
        prev, config.cache_size_limit = config.cache_size_limit, 1 << 30
        try:
            cc(*args, **kwargs)
        finally:
            config.cache_size_limit = prev
        return _explain(cc)
    return run


def _compiled_of(obj):
    if isinstance(obj, _Compiled):
        return obj
    if _is_module(obj):
        call = obj.__dict__.get("_compiled_call") or obj.__dict__.get(
            "forward")
        if isinstance(call, _Compiled):
            return call
        inner = _unwrap(obj)
        mod = obj._modules.get("_orig_mod") if type(obj).__name__ == \
            "OptimizedModule" else None
        for m in (inner, mod and _unwrap(mod)):
            c = m.__dict__.get("forward") if m is not None else None
            if isinstance(c, _Compiled):
                return c
        # a method compiled in the class body, bound to this instance
        return next((v for k, v in obj.__dict__.items()
                     if k.startswith("_dtorch_compiled_")), None)
    return None


class ExplainOutput:
    """``explain``'s answer (torch._dynamo's ExplainOutput's names where
    they mean the same): ``graph_count`` programs, ``graph_break_count``,
    ``break_reasons``, ``op_count``, plus ``fused_groups`` and
    ``fused_ops`` (elementwise fusion), ``captures``, ``recaptures``,
    ``replays``, ``fallbacks`` (with reasons) and ``log``."""

    def __init__(self, c):
        stats = collections.Counter(c.stats)
        subs = [s for _, s in (c.segment or ())] + [
            s for s in map(_compiled_of, _referenced_all(c.fn))
            if s is not None] if c.segment is not None else []
        for s in subs:
            stats.update(s.stats)
        self.name = c.name
        self.graph_count = stats["programs"]
        self.graph_break_count = stats["breaks"]
        self.log = list(c.log) + [line for s in subs for line in s.log]
        self.break_reasons = [x[len("breaks: "):] for x in self.log
                              if x.startswith("breaks: ")]
        self.fallback_reasons = [x[len("fallbacks: "):] for x in self.log
                                 if x.startswith("fallbacks: ")]
        progs = [e.program for cc in [c] + subs for e in cc.cache.values()
                 if e.program is not None]
        self.op_count = sum(p.n_ops for p in progs)
        self.fused_groups = sum(len(p.groups) for p in progs)
        self.fused_ops = sum(g.n_ops for p in progs for g in p.groups)
        self.captures = stats["captures"]
        self.recaptures = stats["recaptures"]
        self.replays = stats["replays"]
        self.fallbacks = stats["fallbacks"]
        self.segmented = c.segment is not None

    def __str__(self):
        lines = [f"dtorch.compile explain: {self.name}",
                 f"Graph Count: {self.graph_count}",
                 f"Graph Break Count: {self.graph_break_count}",
                 f"Op Count: {self.op_count}",
                 f"Fused: {self.fused_groups} groups of {self.fused_ops} "
                 f"ops",
                 f"Captures: {self.captures}, recaptures: {self.recaptures}, "
                 f"replays: {self.replays}, eager fallbacks: "
                 f"{self.fallbacks}"]
        if self.log:
            lines.append("Events:")
            lines += [f"  {x}" for x in self.log]
        return "\n".join(lines)

    __repr__ = __str__


def _explain(c):
    return ExplainOutput(c)


def disable(fn=None, recursive=True):
    """``torch.compiler.disable``: ``fn`` runs eagerly. Called while a
    capture records, it is a graph break (the capturing code runs eagerly;
    under fullgraph=True it raises), so what ``fn`` calls is eager too,
    whatever ``recursive`` says."""
    def wrap(f):
        def eager(*args, **kwargs):
            tr = _trace._tls.trace
            if tr is not None and not tr.done:
                tr.brk(f"dtorch.compiler.disable({getattr(f, '__name__', f)})")
            return f(*args, **kwargs)
        eager.__wrapped__ = f
        eager.__name__ = getattr(f, "__name__", "disabled")
        return eager
    return wrap if fn is None else wrap(fn)
