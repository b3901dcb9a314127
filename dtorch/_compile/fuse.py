"""Elementwise fusion of a replayed program: runs of consecutive
elementwise ops become one compiled kernel forward and one backward.

The design, and why:

- **Where.** A pass over the recorded steps of a validated Program
  (``plan``): a run of consecutive op steps whose ops have an elementwise
  rule (below), whose outputs all have one shape (the group's: inputs from
  outside the run may broadcast to it) and one of the dtypes float32,
  float64, int32, int64 (bool operands too: dropout's mask) becomes one
  ``("fused", Group)`` step. A step outside ops between two ops (a random
  draw) ends a run. A run's
  values that later steps or the program's outputs read are written out;
  so are the values its backward reads (tanh's output, mul's other
  operand); the rest live in registers only. One op alone stays as it is.
- **What an op computes, taken from the op itself.** The kernel is built
  from a symbolic run of the op's own array body on ``Sym`` values (a
  scalar expression with a dtype, written into an SSA ``Block``) through
  ``XP``, an array namespace whose functions emit statements: the
  ``Unary`` family's ``f(xp, x)`` and ``grad(xp, g, x, out)``, dropout's
  ``_mask_scale`` and backward, and the
  arithmetic ops' own ``backward(ctx, g)`` (``unbroadcast`` included: on a
  Sym it returns a ``Deferred``, whose sum over the broadcast dimensions
  runs after the kernel, with NumPy, as eager does). Only the forward of
  the binary arithmetic (cast both operands to the result dtype, apply the
  operator: what ``promote`` then NumPy do) and relu (the compiled
  kernel's formula) are stated here. No op's maths is written twice.
- **Same bits.** Each statement is computed in its own NumPy dtype
  (NumPy 2's promotion, a Python number weak, casts where NumPy casts), so
  +, -, *, /, sqrt, comparisons and selections round as NumPy's per-op
  passes do: bit for bit the same. Gradients reach each slot in the order
  the unfused backward adds them. Transcendental functions (exp, log,
  tanh, sin ...) come from LLVM's libm instead of NumPy's SIMD loops: a
  few ulp apart (within 1e-6 relative in float32), NaN and inf where
  NumPy has them. ``dtorch.compile(options={"fuse": "exact"})`` fuses only
  the correctly rounded ops (bitwise equal to eager), and so does the
  default under ``dtorch.use_deterministic_algorithms(True)``;
  ``{"fuse": False}`` keeps every op's own NumPy pass.
- **Kernels and their cache.** The Block emits a numba function (one loop
  over the elements, ``prange`` in the parallel variant, used from
  ``dtorch._kernels.PARALLEL_MIN`` elements when ``dtorch.set_num_threads``
  allows more than one thread) or, for CuPy arrays, a ``cupy.fuse``
  function (one kernel launch; CuPy broadcasts and caches by dtypes and
  ndim itself). The numba source depends on the op sequence, the dtypes,
  the (collapsed) number of dimensions and which dimensions of each input
  broadcast, never on the sizes: ``_KERNELS`` maps source text to the
  compiled function, shared by every program and shape. With
  ``DTORCH_COMPILE_CACHE=<dir>`` the sources are module files there and
  numba caches their machine code beside them (a later process skips the
  compile: 5-12 s for the 300-op chain's two kernels on this machine).
- **Backward.** A group's backward is a second Block, built on first use
  for the pattern of gradients that reach it (which of its values get one,
  in which dtype): an op whose output gets no gradient is skipped as the
  unfused backward skips it, so NaN * 0 never appears where eager has none.

Measured (benchmarks/compile.py, 2 busy cores): the 300-op chain forward
+ backward is one kernel each way, 0.03-0.05x torch eager per call (it was
0.35-0.58x unfused); the numba compile of its two kernels takes 3-9 s
once (``DTORCH_COMPILE_CACHE``: 0.3 s in a later process).

Left out: reductions ending a chain (they stay NumPy's pairwise sums),
ops outside the rules (gelu, silu, where, pow, clamp ...), float16, a
draw of random numbers hoisted out of a run.
"""
import math
import os
import sys
import threading

import numpy as np

from .. import _backend as B
from .. import _kernels
from ..ops import arith as _arith
from ..ops import elementwise as _ew
from ..ops import base as _base
from ..ops import norm as _norm

_DTYPES = frozenset(map(np.dtype, ("float32", "float64", "int32", "int64")))
_SCALARS = (int, float)


class NotFusable(Exception):
    """A symbolic run met something the kernels cannot express."""


# ================================================================ Sym ==

class Block:
    """Straight-line code of one kernel: leaves (inputs), statements
    ``(name, dtype, kind, args)`` and outputs."""

    def __init__(self, shape):
        self.shape = shape
        self.leaves = {}         # key -> Sym
        self.stmts = []
        self.inexact = False     # a transcendental function was used
        self.casts = False       # a value changed dtype
        self._n = 0

    def leaf(self, key, dt):
        s = self.leaves.get(key)
        if s is None:
            s = self.leaves[key] = Sym(self, f"x{len(self.leaves)}", dt)
        return s

    def emit(self, dt, kind, *args):
        dt = np.dtype(dt)
        if dt not in _DTYPES and dt != np.bool_:
            raise NotFusable(f"dtype {dt}")
        name = f"t{self._n}"
        self._n += 1
        self.stmts.append((name, dt, kind, args))
        return Sym(self, name, dt)


class Const:
    """A number in a kernel, already in the dtype it enters with (NumPy
    casts a Python number to the array's dtype)."""
    __slots__ = ("value", "dt")

    def __init__(self, value, dt):
        self.dt = np.dtype(dt)
        self.value = self.dt.type(value)


def _dt(v):
    return v.dt if isinstance(v, (Sym, Const)) else None


def _result(a, b):
    """NumPy 2's result dtype of a binary ufunc (Python numbers weak)."""
    da, db = _dt(a), _dt(b)
    if da is not None and db is not None:
        return np.result_type(da, db)
    if da is None and db is None:
        raise NotFusable("two numbers")
    d, v = (da, b) if da is not None else (db, a)
    if type(v) not in _SCALARS and not isinstance(v, np.generic):
        raise NotFusable(f"operand {type(v).__name__}")
    return np.result_type(d, v)


def _operand(b, v, dt):
    """``v`` as dtype ``dt`` inside block ``b``."""
    if isinstance(v, Sym):
        return v.astype(dt)
    if isinstance(v, Const):
        return v if v.dt == dt else Const(v.value, dt)
    return Const(v, dt)


def _binary(a, b, op):
    blk = (a if isinstance(a, Sym) else b).b
    dt = _result(a, b)
    if op == "/" and dt.kind in "iu":
        dt = np.dtype(np.float64)         # NumPy's true_divide
    if op in ("<", "<=", ">", ">=", "==", "!="):
        return blk.emit(np.bool_, "bin", op, _operand(blk, a, dt),
                        _operand(blk, b, dt))
    if dt == np.bool_:
        raise NotFusable("bool arithmetic")
    return blk.emit(dt, "bin", op, _operand(blk, a, dt), _operand(blk, b, dt))


class Sym:
    """One scalar value of a kernel: a name in a Block and a NumPy dtype.
    Arithmetic on it emits statements, with NumPy's dtypes."""
    __array_ufunc__ = None        # NumPy scalars defer to Sym's operators

    def __init__(self, b, name, dt):
        self.b, self.name, self.dt = b, name, np.dtype(dt)

    @property
    def dtype(self):
        return self.dt

    @property
    def shape(self):
        return self.b.shape

    @property
    def ndim(self):
        return len(self.b.shape)

    def astype(self, dt, copy=True):
        dt = np.dtype(dt)
        if dt == self.dt:
            return self
        self.b.casts = True
        return self.b.emit(dt, "cast", self)

    def sum(self, axis=None, keepdims=False, **kw):
        # unbroadcast's sum over broadcast dimensions: after the kernel
        return Deferred(self).sum(axis, keepdims)

    def __add__(self, o):
        return _binary(self, o, "+")

    def __radd__(self, o):
        return _binary(o, self, "+")

    def __sub__(self, o):
        return _binary(self, o, "-")

    def __rsub__(self, o):
        return _binary(o, self, "-")

    def __mul__(self, o):
        return _binary(self, o, "*")

    def __rmul__(self, o):
        return _binary(o, self, "*")

    def __truediv__(self, o):
        return _binary(self, o, "/")

    def __rtruediv__(self, o):
        return _binary(o, self, "/")

    def __lt__(self, o):
        return _binary(self, o, "<")

    def __le__(self, o):
        return _binary(self, o, "<=")

    def __gt__(self, o):
        return _binary(self, o, ">")

    def __ge__(self, o):
        return _binary(self, o, ">=")

    def __eq__(self, o):
        return _binary(self, o, "==")

    def __ne__(self, o):
        return _binary(self, o, "!=")

    __hash__ = object.__hash__

    def __neg__(self):
        if self.dt == np.bool_:
            raise NotFusable("bool negation")
        return self.b.emit(self.dt, "neg", self)

    def __pos__(self):
        return self

    def __abs__(self):
        return XP.abs(self)

    def __bool__(self):
        raise NotFusable("a value read in Python")


class Deferred:
    """What ``unbroadcast`` makes of a Sym whose operand was broadcast: the
    full-shape value, summed down after the kernel (``finish``)."""

    def __init__(self, sym):
        self.sym = sym
        self.dtype = sym.dt
        self.shape = None

    def sum(self, axis=None, keepdims=False, **kw):
        self.shape = ()        # unbroadcast reshapes when it differs
        return self

    def reshape(self, shape):
        self.shape = tuple(shape)
        return self

    def astype(self, dt, copy=True):
        return self


# math functions: (numba's spelling, CuPy's, exact?)
_FUNCS = {
    "exp": False, "log": False, "tanh": False, "sin": False, "cos": False,
    "tan": False, "arcsin": False, "arccos": False, "arctan": False,
    "sinh": False, "cosh": False, "arcsinh": False, "arccosh": False,
    "arctanh": False, "expm1": False, "log1p": False, "exp2": False,
    "log2": False, "log10": False, "sqrt": True, "abs": True,
    "trunc": True, "floor": True, "ceil": True,
}


class _XP:
    """The array namespace an op body sees in a symbolic run: its
    functions emit kernel statements."""
    pi, e, inf, nan = math.pi, math.e, math.inf, math.nan
    float32, float64 = np.float32, np.float64

    def __getattr__(self, name):
        alias = {"absolute": "abs"}.get(name, name)
        if alias not in _FUNCS:
            raise NotFusable(f"xp.{name}")

        def f(x):
            if not isinstance(x, Sym):
                raise NotFusable(f"xp.{name} of {type(x).__name__}")
            if x.dt.kind not in "f" and alias not in ("abs",):
                raise NotFusable(f"xp.{name} of {x.dt}")
            if not _FUNCS[alias]:
                x.b.inexact = True
            return x.b.emit(x.dt, "call", alias, x)
        return f

    @staticmethod
    def maximum(a, b):
        return _select2(a, b, "max")

    @staticmethod
    def minimum(a, b):
        return _select2(a, b, "min")

    @staticmethod
    def where(c, a, b):
        if not isinstance(c, Sym) or c.dt != np.bool_:
            raise NotFusable("where with a constant condition")
        blk = c.b
        dt = _result(a, b) if (isinstance(a, Sym) or isinstance(b, Sym)) \
            else np.result_type(a, b)
        return blk.emit(dt, "where", c, _operand(blk, a, dt),
                        _operand(blk, b, dt))


def _select2(a, b, which):
    blk = (a if isinstance(a, Sym) else b).b
    dt = _result(a, b)
    return blk.emit(dt, which, _operand(blk, a, dt), _operand(blk, b, dt))


XP = _XP()


# =============================================================== rules ==
# rule(cls) -> (forward(block, args, out_dtype), backward(block, g, args,
# out, needs, metas)) or None. ``args`` are Syms (tensors) or numbers.

class _Ctx:
    """The ctx an op's backward reads, filled as its forward fills it."""
    _gmake = None


def _unary_fwd(cls):
    def fwd(blk, args, dt):
        x, = args
        x = x.astype(dt)             # _float_input: ints to the default
        return cls.f(XP, x).astype(dt)

    def bwd(blk, g, args, out, needs, metas):
        x, = args
        return (cls.grad(XP, g, x.astype(out.dt), out),)
    return fwd, bwd


def _arith_rule(cls, op):
    def fwd(blk, args, dt):
        x, y = (_operand(blk, v, dt) if isinstance(v, Sym) else v
                for v in args)
        return _binary(x, y, op)

    def bwd(blk, g, args, out, needs, metas):
        x, y = args
        ctx = _Ctx()
        (ctx.xs, ctx.xd), (ctx.ys, ctx.yd) = metas
        ctx.needs_input_grad = needs
        if cls is _arith.Mul:
            ctx.to_save = (x if needs[1] else None, y if needs[0] else None)
        elif cls is _arith.Div:
            ctx.to_save = tuple(_operand(blk, v, out.dt) if not isinstance(
                v, _SCALARS) else v for v in args)
        return cls.backward(ctx, g)
    return fwd, bwd


def _neg_rule():
    def fwd(blk, args, dt):
        return -args[0].astype(dt)

    def bwd(blk, g, args, out, needs, metas):
        return (_ew.Neg.backward(None, g),)
    return fwd, bwd


def _relu_rule():
    # the formula of dtorch._kernels' relu_fwd / relu_bwd, which the eager
    # op runs whenever numba (so fusion) is there
    def fwd(blk, args, dt):
        x = args[0]
        return XP.where((x > 0) | (x != x), x, 0)

    def bwd(blk, g, args, out, needs, metas):
        return (g * XP.where(out <= 0, 0, 1).astype(g.dt),)
    return fwd, bwd


def _dropout_rule():
    # the op's own body, x * keep * scale in NumPy's order (the compiled
    # kernel's too), forward and backward
    def fwd(blk, args, dt):
        x, keep, p = args
        scale = dt.type(1.0 / (1.0 - p))
        return _norm._mask_scale(x, keep, scale)

    def bwd(blk, g, args, out, needs, metas):
        x, keep, p = args
        ctx = _Ctx()
        ctx.keep, ctx.scale = keep, g.dt.type(1.0 / (1.0 - p))
        ctx.const = lambda a: a
        return _norm.Dropout.backward(ctx, g)
    return fwd, bwd


def _or(a, b):
    return a.b.emit(np.bool_, "or", a, b)


Sym.__or__ = _or

_RULES = {}


def rule(cls):
    r = _RULES.get(cls, 0)
    if r != 0:
        return r
    r = None
    if cls in (_arith.Add, _arith.Sub):
        r = _arith_rule(cls, "+" if cls is _arith.Add else "-")
    elif cls is _arith.Mul:
        r = _arith_rule(cls, "*")
    elif cls is _arith.Div:
        r = _arith_rule(cls, "/")
    elif cls is _ew.Neg:
        r = _neg_rule()
    elif cls is _ew.Relu:
        r = _relu_rule()
    elif cls is _norm.Dropout:
        r = _dropout_rule()
    elif (isinstance(cls, type) and issubclass(cls, _ew.Unary)
          and getattr(cls.forward, "__func__", None)
          is _ew.Unary.forward.__func__):
        r = _unary_fwd(cls)
    _RULES[cls] = r
    return r


# ================================================================ plan ==

_KW = {_norm.Dropout: ("keep", "p")}     # keywords a rule takes, in order


def _args(st):
    """An op step's argument specs, keywords after the positional ones."""
    return st[2] + tuple(p for _, p in st[3]) if st[3] else st[2]


def _fusable(st, meta, exact, cache={}):
    """Whether op step ``st`` can join a group: its rule runs
    symbolically forward and backward on its dtypes (once per kind)."""
    _, cls, specs, kw, slot, needs, scalar = st
    if scalar or rule(cls) is None:
        return False
    if kw:
        names = tuple(k for k, _ in kw)
        if _KW.get(cls, ())[-len(names):] != names or \
                len(specs) + len(names) != len(_KW[cls]) + 1:
            return False
        specs = _args(st)
    odt = meta[slot][1]
    if odt not in _DTYPES or not meta[slot][0]:
        return False
    sig = [cls, odt, needs, exact]
    for p in specs:
        if p[0] in "sr":
            shp, dt, typ = meta[p[1]]
            if dt not in _DTYPES and dt != np.bool_:
                return False
            sig.append(dt)
        elif p[0] == "c" and type(p[1]) in _SCALARS:
            sig.append(type(p[1]))
        else:
            return False
    sig = tuple(sig)
    ok = cache.get(sig)
    if ok is None:
        ok = cache[sig] = _trial(st, meta, exact)
    return ok


def _trial(st, meta, exact):
    _, cls, _, _, slot, needs, _ = st
    specs = _args(st)
    fwd, bwd = rule(cls)
    shape = meta[slot][0]
    blk = Block(shape)
    try:
        args = [blk.leaf(k, meta[p[1]][1]) if p[0] in "sr" else p[1]
                for k, p in enumerate(specs)]
        out = fwd(blk, args, meta[slot][1])
        if not isinstance(out, Sym) or out.dt != meta[slot][1]:
            return False
        if needs is not None:
            g = blk.leaf("g", out.dt)
            r = bwd(blk, g, args, out, needs, [
                meta[p[1]][:2] if p[0] in "sr" else (None, None)
                for p in specs])
            r = r if type(r) is tuple else (r,)
            for p, n, x in zip(specs, needs, r):
                if n and p[0] == "s" and not isinstance(x, (Sym, Deferred)):
                    return False
    except NotFusable:
        return False
    except Exception:           # noqa: BLE001 - a body the rules cannot run
        return False
    return not (exact and blk.inexact)


def plan(steps, meta, keep, reads, exact):
    """``steps`` with each run of fusable consecutive ops of one output
    shape (two ops or more) replaced by one ``("fused", Group)`` step.
    ``keep``: slots the program returns; ``reads(step)``: the slots a step
    reads; ``exact``: only ops that round as NumPy does."""
    runs, cur = [], []
    cpu = _kernels.enabled()        # numba there and not switched off
    for i, st in enumerate(steps):
        ok = st[0] == "op" and _fusable(st, meta, exact) and (
            cpu if meta[st[4]][2] is np.ndarray else B._cupy is not None)
        if ok and cur:
            first = steps[cur[0]]
            same = (meta[st[4]][0] == meta[first[4]][0]
                    and meta[st[4]][2] is meta[first[4]][2]
                    and all(meta[p[1]][2] is meta[first[4]][2]
                            for p in _args(st) if p[0] in "sr"))
            if not same:
                runs.append(cur)
                cur = []
        if ok:
            cur.append(i)
        elif cur:
            runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    runs = [r for r in runs if len(r) >= 2]
    if not runs:
        return steps, []
    owner = {}
    for k, r in enumerate(runs):
        for i in r:
            owner[i] = k
    read_by = {}              # slot -> runs (or -1: a step outside runs)
    for i, st in enumerate(steps):
        for s in reads(st):
            read_by.setdefault(s, set()).add(owner.get(i, -1))
    groups, out = [], []
    starts = {r[0]: k for k, r in enumerate(runs)}
    for i, st in enumerate(steps):
        k = owner.get(i)
        if k is None:
            out.append(st)
        elif i in starts:
            r = runs[k]
            slots = [steps[j][4] for j in r]
            outside = [s for s in slots if s in keep
                       or read_by.get(s, set()) - {k}]
            try:
                g = Group([steps[j] for j in r], meta, outside)
            except NotFusable:
                out.extend(steps[j] for j in r)
                continue
            groups.append(g)
            out.append(("fused", g))
    return out, groups


# =============================================================== group ==

def _metas(specs, meta):
    return [meta[p[1]][:2] if p[0] in "sr" else (None, None) for p in specs]


class Group:
    """A fused run of ops: its forward Block, what it writes out (values
    read outside it, values its backward reads) and its backward Blocks
    (one per pattern of incoming gradients)."""

    def __init__(self, ops, meta, outside):
        self.ops = ops
        self.meta = meta
        self.shape = meta[ops[0][4]][0]
        self.gpu = meta[ops[0][4]][2] is not np.ndarray
        self.slots = [st[4] for st in ops]
        mine = set(self.slots)
        self.graph = [st for st in ops if st[5] is not None]
        # the inputs from outside, in order of first use
        self.ext = []
        for st in ops:
            for p in _args(st):
                if p[0] in "sr" and p[1] not in mine and p[1] not in self.ext:
                    self.ext.append(p[1])
        # the gradients that may come from outside: values read outside
        self.entries = [st[4] for st in self.graph if st[4] in outside]
        # the contributions to outside slots, in the unfused backward's order
        self.contribs = [(st[4], j, p[1]) for st in reversed(self.graph)
                         for j, (p, n) in enumerate(zip(st[2], st[5]))
                         if n and p[0] == "s" and p[1] not in mine]
        # forward: which values the backward reads (all gradients present)
        saved = []
        if self.graph:
            bb = self._backward_block(tuple(meta[s][1] for s in
                                            self.entries), probe=True)
            saved = [k[1] for k in _live_leaves(bb) if k[0] == "v"]
        self.saved = saved
        fb = Block(self.shape)
        val = {s: fb.leaf(("v", s), meta[s][1]) for s in self.ext}
        for st in ops:
            fwd, _ = rule(st[1])
            args = [val[p[1]] if p[0] in "sr" else p[1] for p in _args(st)]
            val[st[4]] = fwd(fb, args, meta[st[4]][1])
        written = [s for s in self.slots if s in outside or s in saved]
        self.outside = outside
        self.fwd = Kernel(fb, [("v", s) for s in self.ext],
                          [val[s] for s in written], self.gpu)
        self.written = written
        self.out_locs = [(j, self.fwd.loc[j]) for j in
                         (written.index(s) for s in outside)]
        self.inexact = fb.inexact
        self._bwd = {}
        self.n_ops = len(ops)

    def _backward_block(self, gdts, probe=False):
        meta = self.meta
        mine = set(self.slots)
        bb = Block(self.shape)

        def v(s):
            return bb.leaf(("v", s), meta[s][1])
        g = {s: bb.leaf(("g", s), dt) for s, dt in zip(self.entries, gdts)
             if dt is not None}
        res = {}
        for st in reversed(self.graph):
            _, cls, _, _, slot, needs, _ = st
            specs = _args(st)
            gs = g.get(slot)
            if gs is None:
                continue
            args = [v(p[1]) if p[0] in "sr" else p[1] for p in specs]
            r = rule(cls)[1](bb, gs, args, v(slot), needs,
                             _metas(specs, meta))
            r = r if type(r) is tuple else (r,)
            for j, (p, n) in enumerate(zip(specs, needs)):
                x = r[j] if j < len(r) else None
                if not (n and p[0] == "s") or x is None:
                    continue
                t = p[1]
                if t in mine:
                    if isinstance(x, Deferred):
                        raise NotFusable("a broadcast inside a group")
                    g[t] = x if g.get(t) is None else g[t] + x
                else:
                    res[(slot, j)] = x
        self_outs = []
        for slot, j, t in self.contribs:
            x = res.get((slot, j))
            self_outs.append(x)
        bb.results = self_outs
        return bb

    # ----------------------------------------------------------- replay --
    def forward(self, *ins):
        """The values read outside (``self.outside`` order), then, with a
        graph, what the backward reads: the kernel's buffers and ins."""
        k = self.fwd
        res = k.run(ins)
        shape = k.shape
        vals = [res[loc[1]][loc[2]].reshape(shape) if loc[0] == "buf"
                else k.get(res, ins, j) for j, loc in self.out_locs]
        if self.graph:
            vals.append((res, ins))
        return vals

    def backward(self, saved, entries):
        """The contributions to outside slots (``self.contribs`` order),
        None where no gradient reaches; ``entries``: the gradients of
        ``self.entries`` (None where none came)."""
        key = tuple(None if x is None else x.dtype for x in entries)
        k = self._bwd.get(key)
        if k is None:
            k = self._bwd[key] = self._backward_kernel(key)
        kern, src, fin = k
        res_f, ins_f = saved
        ins = [entries[i] if w == "g" else ins_f[i] if w == "ext"
               else res_f[i] for w, i in src]
        res = kern.run(ins, res_f if kern.stacked else ())
        out = []
        j = 0
        for f in fin:
            if f is None:
                out.append(None)
                continue
            a = kern.get(res, ins, j)
            j += 1
            out.append(a if f is True else _base.unbroadcast(a, *f))
        return out

    def _backward_kernel(self, key):
        bb = self._backward_block(key)
        outs, fin = [], []
        for (slot, j, t), x in zip(self.contribs, bb.results):
            if x is None:
                fin.append(None)
            elif isinstance(x, Deferred):
                outs.append(x.sym)
                fin.append(self.meta[t][:2])
            else:
                outs.append(x)
                fin.append(True)
        normal, src, stacked = [], [], {}
        for lk in _live_leaves(bb, outs):
            kind, s = lk
            if kind == "g":
                normal.append(lk)
                src.append(("g", self.entries.index(s)))
            elif s in self.ext:
                normal.append(lk)
                src.append(("ext", self.ext.index(s)))
            else:
                loc = self.fwd.loc[self.written.index(s)]
                if loc[0] == "buf":
                    stacked[lk] = loc[1:]
                else:                      # GPU: one array per output
                    normal.append(lk)
                    src.append(("res", loc[1]))
        kern = Kernel(bb, normal, outs, self.gpu, stacked,
                      len(self.fwd.dts))
        return kern, src, fin


def _live_leaves(bb, outs=None):
    """The leaf keys the outputs depend on, in leaf order."""
    if outs is None:
        outs = [x.sym if isinstance(x, Deferred) else x
                for x in bb.results if x is not None]
    need = {o.name for o in outs}
    for name, dt, kind, args in reversed(bb.stmts):
        if name in need:
            need.update(a.name for a in args if isinstance(a, Sym))
    return [k for k, s in bb.leaves.items() if s.name in need]


# ============================================================= kernels ==

_KERNELS = {}          # (source, parallel) -> compiled function
_PARALLEL_MIN = _kernels.PARALLEL_MIN
_compile_lock = threading.Lock()
_tls = threading.local()
_BINOPS = {"+", "-", "*", "/", "<", "<=", ">", ">=", "==", "!="}
stats = {"kernels": 0, "compile_s": 0.0}    # numba compiles, their time


class Kernel:
    """One Block as a callable on arrays. ``run(ins, stacks)``: ``ins``
    the arrays of ``leaf_keys`` in order, ``stacks`` the buffers of another
    kernel whose rows the ``stacked`` leaves are (a backward reading its
    forward's values: one argument per buffer, not per value); ``get(res,
    ins, j)``: output j with the Block's shape (a leaf returned as it is
    passes its array through)."""

    def __init__(self, blk, leaf_keys, outs, gpu, stacked=None, nstacks=0):
        self.shape = tuple(blk.shape)
        self.gpu = gpu
        stacked = stacked or {}
        need = {o.name for o in outs}
        for name, dt, kind, args in reversed(blk.stmts):
            if name in need:
                need.update(a.name for a in args if isinstance(a, Sym))
        self.stmts = [st for st in blk.stmts if st[0] in need]
        self.in_syms = [blk.leaves[k] for k in leaf_keys]
        self.st_syms = [(blk.leaves[k], sr) for k, sr in stacked.items()
                        if blk.leaves[k].name in need]
        self.stacked = bool(self.st_syms)
        self.nstacks = nstacks if self.stacked else 0
        leaf_at = {s.name: i for i, s in enumerate(self.in_syms)}
        self.outs = outs
        self.computed = [o for o in outs if o.name not in leaf_at]
        self.dts = sorted({o.dt.str for o in self.computed})
        self.loc = []
        rows = {}
        for n, o in enumerate(outs):
            if o.name in leaf_at:
                self.loc.append(("pass", leaf_at[o.name]))
            elif gpu:
                self.loc.append(("arr", len([x for x in self.loc
                                             if x[0] == "arr"])))
            else:
                k = self.dts.index(o.dt.str)
                self.loc.append(("buf", k, rows.get(k, 0)))
                rows[k] = rows.get(k, 0) + 1
        self.rows = [(np.dtype(dt), rows.get(k, 0))
                     for k, dt in enumerate(self.dts)]
        self._prep = {}
        self._fused = None

    def run(self, ins, stacks=()):
        if not self.computed:
            return None
        return self._run_gpu(ins, stacks) if self.gpu else \
            self._run_cpu(ins, stacks)

    def get(self, res, ins, j):
        loc = self.loc[j]
        if loc[0] == "pass":
            return ins[loc[1]]
        if loc[0] == "arr":
            return res[loc[1]]
        return res[loc[1]][loc[2]].reshape(self.shape)

    # ------------------------------------------------------------- CPU --
    def _run_cpu(self, ins, stacks):
        # by shapes: an input whose layout changed is still read right
        # (reshape copies it, numba's 'A' layout strides it), maybe slower
        key = tuple([a.shape for a in ins])
        prep = self._prep.get(key)
        if prep is None:
            prep = self._prep[key] = self._prepare(ins)
        shapes, bshape, size, fns, _, reshape = prep
        args = [a if s is None else a.reshape(s)
                for a, s in zip(ins, shapes)] if reshape else list(ins)
        if stacks:
            args += [b.reshape((b.shape[0],) + bshape) for b in stacks]
        bufs = [np.empty((n,) + bshape, dt) for dt, n in self.rows]
        args += bufs
        if size < _PARALLEL_MIN or _kernels.num_threads() == 1:
            fn = fns[0] or self._jit(prep, False, args)
            fn(*args)
        else:
            fn = fns[1] or self._jit(prep, True, args)
            _parallel_call(fn, args, _kernels.num_threads())
        return bufs

    def _prepare(self, ins):
        """Collapse the dimensions (every input C-contiguous: neighbouring
        dimensions that broadcast alike merge) and the source for it."""
        S = self.shape
        d = len(S)
        pats = []
        for a in ins:
            shp = (1,) * (d - a.ndim) + a.shape
            pats.append(tuple(n == S[k] or S[k] == 1 for k, n in
                              enumerate(shp)))
        dims = [[k] for k in range(d)]
        if all(a.flags.c_contiguous for a in ins) and d > 1:
            merged = [[0]]
            for k in range(1, d):
                if all(p[k] == p[merged[-1][-1]] for p in pats):
                    merged[-1].append(k)
                else:
                    merged.append([k])
            dims = merged
        bshape = tuple(math.prod(S[k] for k in g) for g in dims)
        shapes, bpats = [], []
        for a, p in zip(ins, pats):
            full = tuple(p[g[0]] for g in dims)
            shp = tuple(n if f else 1 for n, f in zip(bshape, full))
            shapes.append(None if a.shape == shp else shp)
            bpats.append(full)
        src = self._source(bpats, len(bshape))
        return [shapes, bshape, math.prod(bshape), [None, None], src,
                any(s is not None for s in shapes)]

    def _jit(self, prep, parallel, args):
        """The compiled kernel for ``prep`` (one per source text and
        variant, shared by every Kernel; compiled for ``args``' types)."""
        src = prep[4]
        key = (src, parallel)
        with _compile_lock:
            fn = _KERNELS.get(key)
            if fn is None:
                import time
                import numba
                t = time.perf_counter()
                from collectives.env import env_str
                where = env_str("DTORCH_COMPILE_CACHE", None)
                if where:
                    fn = _from_file(src, parallel, where)
                else:
                    ns = _namespace()
                    ns["prange"] = numba.prange if parallel else range
                    exec(compile(src, "<dtorch.compile fused kernel>",
                                 "exec"), ns)
                    fn = numba.njit(parallel=parallel, **_JIT)(ns["k"])
                fn.compile(tuple(numba.typeof(a) for a in args))
                stats["kernels"] += 1
                stats["compile_s"] += time.perf_counter() - t
                _KERNELS[key] = fn
        prep[3][parallel] = fn
        return fn

    def _source(self, pats, nd):
        consts = {}
        names = {s.name: f"x{j}" for j, s in enumerate(self.in_syms)}
        ref = _ref(names, consts)
        params = [f"a{j}" for j in range(len(self.in_syms))]
        params += [f"S{k}" for k in range(self.nstacks)]
        params += [f"O{k}" for k in range(len(self.dts))]
        L = [f"def k({', '.join(params)}):"]
        for k in range(nd):
            L.append(f"    n{k} = O0.shape[{k + 1}]")
        ind = "    "
        for k in range(nd):
            L.append(f"{ind}for i{k} in {'prange' if k == 0 else 'range'}"
                     f"(n{k}):")
            ind += "    "
        idx = ", ".join(f"i{k}" for k in range(nd))
        for j, p in enumerate(pats):
            at = ", ".join(f"i{k}" if f else "0" for k, f in enumerate(p))
            L.append(f"{ind}x{j} = a{j}[{at}]")
        for j, (sym, (k, r)) in enumerate(self.st_syms):
            names[sym.name] = f"y{j}"
            L.append(f"{ind}y{j} = S{k}[{r}, {idx}]")
        for name, dt, kind, args in self.stmts:
            names[name] = name
            L.append(f"{ind}{name} = {_expr(dt, kind, args, ref, False)}")
        for o, loc in zip(self.outs, self.loc):
            if loc[0] == "buf":
                L.append(f"{ind}O{loc[1]}[{loc[2]}, {idx}] = {names[o.name]}")
        head = [f"K{j} = {_const_src(c)}" for c, j in consts.values()]
        return "\n".join(head + L) + "\n"

    # ------------------------------------------------------------- GPU --
    def _run_gpu(self, ins, stacks):
        fn = self._fused
        if fn is None:
            fn = self._fused = self._fuse()
        r = fn(*ins)
        r = r if isinstance(r, tuple) else (r,)
        xp = B.get_array_module(ins[0])
        return [a if a.shape == self.shape else
                xp.ascontiguousarray(xp.broadcast_to(a, self.shape))
                for a in r]

    def _fuse(self):
        import cupy
        consts = {}
        names = {s.name: f"x{j}" for j, s in enumerate(self.in_syms)}
        ref = _ref(names, consts)
        L = [f"def k({', '.join(names.values())}):"]
        for name, dt, kind, args in self.stmts:
            names[name] = name
            L.append(f"    {name} = {_expr(dt, kind, args, ref, True)}")
        outs = "".join(names[o.name] + ", " for o in self.computed)
        L.append(f"    return ({outs})")
        ns = _namespace()
        ns["xp"] = cupy
        for c, j in consts.values():
            ns[f"K{j}"] = c.value
        src = "\n".join(L) + "\n"
        exec(compile(src, "<dtorch.compile fused kernel>", "exec"), ns)
        self.gpu_source = src
        return cupy.fuse(kernel_name="dtorch_fused")(ns["k"])


def _ref(names, consts):
    def ref(a):
        if isinstance(a, Sym):
            return names[a.name]
        key = (a.dt.str, np.asarray(a.value).tobytes())
        if key not in consts:
            consts[key] = (a, len(consts))
        return f"K{consts[key][1]}"
    return ref


_JIT = dict(fastmath=False, nogil=True, error_model="numpy")


def _from_file(src, parallel, where):
    """The kernel from a module file in directory ``where``
    (``DTORCH_COMPILE_CACHE``), written once per source text: numba's own
    cache (``cache=True``) keeps its machine code beside it, so a later
    process skips the compile."""
    import hashlib
    import importlib.util
    name = "dtorch_fused_" + hashlib.sha1(
        f"{parallel}\n{src}".encode()).hexdigest()[:20]
    path = os.path.join(where, name + ".py")
    if not os.path.exists(path):
        os.makedirs(where, exist_ok=True)
        head = ["import numba", "import numpy as np",
                "from numba import prange" if parallel else "prange = range"]
        head += [f"{n} = np.{n}" for n in sorted(_namespace()) if n != "np"]
        tail = [f"k = numba.njit(parallel={parallel}, cache=True, "
                f"**{_JIT!r})(k)"]
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write("\n".join(head) + "\n" + src + "\n".join(tail) + "\n")
        os.replace(tmp, path)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    # registered: numba's cached code names its module, and imports it
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod.k


def _namespace():
    ns = {"np": np}
    for dt in _DTYPES:
        ns[dt.name] = dt.type
    ns["bool_"] = np.bool_
    return ns


def _const_src(c):
    v = c.value
    if c.dt.kind == "f":
        return f"{c.dt.name}(float('{float(v)!r}'))"
    return f"{c.dt.name}({int(v)})"


# statement kind -> (numba's scalar expression, cupy.fuse's array one):
# {0} {1} {2} the operands, {op} the operator or function; numba's is
# then wrapped in the result dtype's constructor (the per-op rounding)
_EXPR = {
    "bin": ("{0} {op} {1}", "{0} {op} {1}"),
    "neg": ("-{0}", "-{0}"),
    "cast": ("{0}", "{0}.astype({T})"),
    "call": ("np.{op}({0})", "xp.{gop}({0})"),
    "where": ("{1} if {0} else {2}", "xp.where({0}, {1}, {2})"),
    "or": ("{0} or {1}", "xp.logical_or({0}, {1})"),
    "max": ("np.maximum({0}, {1})", "xp.maximum({0}, {1})"),
    "min": ("np.minimum({0}, {1})", "xp.minimum({0}, {1})"),
}


def _expr(dt, kind, args, ref, gpu):
    op = args[0] if kind in ("bin", "call") else None
    vals = [ref(x) for x in (args[1:] if op is not None else args)]
    boolean = dt == np.bool_
    T = "bool_" if boolean else dt.name
    gop = "absolute" if op == "abs" else op
    e = _EXPR[kind][gpu].format(*vals, op=op, gop=gop, T=T)
    if gpu:
        return e
    if boolean:
        return f"{vals[0]} != 0" if kind == "cast" else e
    return f"{T}({e})"


def _parallel_call(fn, args, n):
    import numba
    prev = numba.get_num_threads()
    if prev != n:
        numba.set_num_threads(n)
    try:
        fn(*args)
    finally:
        if prev != n:
            numba.set_num_threads(prev)
