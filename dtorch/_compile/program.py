"""Replay: two captures of the same code become one array program.

``build`` compares the two Traces (same ops, same slots, same constants;
a tensor read from outside is the same object in both, or equal values,
then baked in) and generates two Python functions from the steps: the
forward, one line per op calling its ``forward(ctx, *arrays)`` on a fresh
ctx, and, per set of outputs a gradient reaches, the backward, one block
per op calling its ``backward(ctx, grad)`` in reverse order and summing
what flows into each slot in the order the engine would. The replayed
outputs hang off one graph node, ``CompiledFunctionBackward``, whose edges
are the parameters' (and inputs') own: the engine accumulates ``.grad``,
runs their hooks and DDP's gradient-ready hooks as it does for eager code.

Why generated code rather than a loop over the steps: a replayed op then
costs its forward call and a few local-variable stores, nothing else
(measured in benchmarks/compile.py); the ops' array bodies are reused as
they are, so no op is written twice (DESIGN.md).
"""
import itertools

import numpy as np

from .. import _backend as B
from ..autograd import function as _fn
from ..autograd.function import Function, once_differentiable
from ..tensor import Tensor

_T = _fn.TensorBase
_counter = itertools.count()


def _fix(a):
    # Tensor._make makes a NumPy scalar a 0-d array; so does the replay
    return np.asarray(a) if isinstance(a, np.generic) else a


def same(a, b):
    """Equal constants (arrays by value, NaN equal to NaN)."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if _is_array(a):
        return (a.shape == b.shape and a.dtype == b.dtype
                and bool(B.get_array_module(a).array_equal(
                    a, b, equal_nan=a.dtype.kind in "fc")))
    if isinstance(a, _T):
        return same_meta(a, b) and same(a._data, b._data)
    if isinstance(a, float) and a != a:
        return b != b
    try:
        return bool(a == b)
    except Exception:
        return False


def same_meta(a, b):
    da, db = a._data, b._data
    return (type(da) is type(db) and da.shape == db.shape
            and da.dtype == db.dtype)


def _is_array(a):
    return type(a) is np.ndarray or B.is_cupy_array(a)


def _same_step(x, y):
    if x[0] != y[0] or len(x) != len(y):
        return False
    if x[0] in ("op", "src"):      # (kind, fn, arg specs, kw specs, ...)
        return (x[1] is y[1] and x[4:] == y[4:] and len(x[2]) == len(y[2])
                and all(_same_spec(p, q) for p, q in zip(x[2], y[2]))
                and [k for k, _ in x[3]] == [k for k, _ in y[3]]
                and all(_same_spec(p, q) for (_, p), (_, q)
                        in zip(x[3], y[3])))
    if x[0] == "ufunc":
        return x[1] is y[1] and x[2] == y[2] and _same_spec(x[3], y[3])
    return x == y


def _same_spec(p, q):
    return p[0] == q[0] and (p[1] == q[1] if p[0] in "sr"
                             else same(p[1], q[1]))


def _reader(steps, slot):
    for st in steps:
        if st[0] == "op" and any(p == ("s", slot) for p in st[2]):
            return st[1].__name__
    return "the compiled code"


def out_spec(tr, leaves, inputs):
    """How each output leaf relates to a capture: ('in', i) an input
    tensor itself, ('obj', t) a tensor from outside returned as it is,
    ('t', slot, requires_grad) an array of the program, ('new', t) a
    tensor the code made outside ops, ('py', value) not a tensor."""
    spec = []
    live = {id(t) for _, t in tr.live}
    for x in leaves:
        if not isinstance(x, _T):
            spec.append(("py", x))
            continue
        i = next((k for k, t in enumerate(inputs) if t is x), None)
        if i is not None:
            spec.append(("in", i))
        elif id(x) in live:
            spec.append(("obj", x))
        elif id(x._data) in tr.slot_of:
            s = tr.slot_of[id(x._data)]
            spec.append(("t", s, bool(x.requires_grad and s in tr.graph)))
        else:
            spec.append(("new", x))
    return spec


def build(a, b, outs_a, outs_b, name):
    """A Program from two Traces of the same call, or the reason (a
    string) why there is none."""
    for tr in (a, b):
        if tr.fail is not None:
            return tr.fail
    if len(a.steps) != len(b.steps) or a.nslots != b.nslots:
        return (f"the two captures of {name} ran different programs "
                f"({len(a.steps)} and {len(b.steps)} steps): Python control "
                f"flow that changes between calls")
    for x, y in zip(a.steps, b.steps):
        if not _same_step(x, y):
            what = x[1].__name__ if x[0] == "op" else x[0]
            return (f"{what} differs between the two captures of {name} "
                    f"(an argument or its source changed): Python control "
                    f"flow or values that change between calls")
    if [s for s, _ in a.live] != [s for s, _ in b.live]:
        return f"the two captures of {name} read different tensors"
    live, consts = [], []
    for (s, ta), (_, tb) in zip(a.live, b.live):
        if ta is tb:
            live.append((s, tb))
        elif (not (ta.requires_grad or tb.requires_grad)
              and same_meta(ta, tb) and same(ta._data, tb._data)):
            consts.append((s, tb._data.copy()))
        else:
            return (f"a tensor made outside dtorch ops (read by "
                    f"{_reader(b.steps, s)}) differs between two calls of "
                    f"{name}: e.g. one drawn with a random function the "
                    f"compiler does not replay, or built from Python data")
    if len(outs_a) != len(outs_b):
        return f"{name} returned different structures"
    outs = []
    for p, q in zip(outs_a, outs_b):
        if p[0] != q[0]:
            return f"{name} returned different kinds of values"
        if p[0] == "new":
            if p[1] is q[1]:
                q = ("obj", q[1])
            elif not q[1].requires_grad and same(p[1], q[1]):
                q = ("fresh", q[1]._data.copy())
            else:
                return (f"{name} returns a tensor made outside dtorch ops "
                        f"that differs between calls")
        elif p[0] in ("py", "obj") and not same(p[1], q[1]):
            return (f"{name} returned a Python value that differs between "
                    f"calls")
        elif p != q and p[0] in ("in", "t"):
            return f"{name} returned different tensors"
        outs.append(q)
    return Program(b, live, consts, outs, name)


class CompiledFunctionBackward(Function):
    """The graph node of one replayed call: its backward is the program's
    backward (one generated function per set of outputs that receive a
    gradient)."""
    _array_api = True

    @staticmethod
    @once_differentiable     # the replayed bodies run on arrays
    def backward(ctx, *grads):
        prog = ctx.prog
        n = len(prog.graph_outs)
        grads = grads + (None,) * (n - len(grads))
        has = tuple(g is not None for g in grads)
        fn = prog.backwards.get(has)
        if fn is None:
            fn = prog.backwards[has] = prog.gen_backward(has)
        return fn(ctx.ctxs, grads)


class Program:
    """The replayable array program of one guard key."""

    def __init__(self, tr, live, consts, outs, name):
        self.name = name
        self.steps = tr.steps
        self.inputs = tr.inputs
        self.live = live
        self.live_tensors = [t for _, t in live]
        self.outs = outs
        self.n_ops = sum(1 for s in tr.steps if s[0] == "op")
        self.meta = tr.meta
        self.graph = tr.graph
        self.groups = []         # fused groups (fuse.py), after fuse()
        self.graph_steps = self._graph_steps()
        # the outputs that carry the graph: node output nr k is graph_outs[k]
        self.graph_outs = [o[1] for o in outs if o[0] == "t" and o[2]]
        kinds = {s: ("in", k) for k, s in enumerate(tr.inputs)}
        kinds.update({s: ("live", t) for s, t in live})
        need = set()
        for i in self.graph_steps:
            st = self.steps[i]
            for p, n in zip(st[2], st[5]):
                if n and p[0] == "s" and p[1] in kinds:
                    need.add(p[1])
        # leaves: inputs and outside tensors a gradient flows to
        self.leaves = [(s, kinds[s]) for s in sorted(need)]
        self.leaf_live = [k[1] for _, k in self.leaves if k[0] == "live"]
        self.backwards = {}
        self.source = []
        self._consts = consts
        self.forward = self._gen_forward(consts)

    def _graph_steps(self):
        return [i for i, s in enumerate(self.steps)
                if (s[0] == "op" and s[4] in self.graph)
                or (s[0] == "fused" and s[1].graph)]

    def fuse(self, exact):
        """Runs of elementwise ops become fused kernels (fuse.py);
        ``exact``: only ops whose kernels round as NumPy does. Returns the
        number of groups."""
        from . import fuse as _fuse
        keep = {o[1] for o in self.outs if o[0] == "t"}
        steps, groups = _fuse.plan(self.steps, self.meta, keep, _reads,
                                   exact)
        if groups:
            self.steps = steps
            self.groups = groups
            self.graph_steps = self._graph_steps()
            self.backwards = {}
            self.source = []
            self.forward = self._gen_forward(self._consts)
        return len(groups)

    # ---------------------------------------------------------- codegen --
    def _gen_forward(self, consts):
        ns = {"new": object.__new__, "fix": _fix, "wrap": Tensor._wrap}
        L = ["def forward(I, L):"]
        for k, s in enumerate(self.inputs):
            L.append(f"    v{s} = I[{k}]")
        for j, (s, t) in enumerate(self.live):
            L.append(f"    v{s} = L[{j}]._data")
        for s, arr in consts:
            ns[f"K{s}"] = arr
            L.append(f"    v{s} = K{s}")
        keep = {o[1] for o in self.outs if o[0] == "t"}
        last = {}
        for i, st in enumerate(self.steps):
            for s in _reads(st):
                last[s] = i
        live_idx = {s: j for j, (s, _) in enumerate(self.live)}
        ctxs = []
        for i, st in enumerate(self.steps):
            kind = st[0]
            if kind == "op":
                _, cls, specs, kw, slot, needs, scalar = st
                ns[f"C{i}"], ns[f"F{i}"] = cls, cls.forward
                args = [_arg(p, ns, f"a{i}_{j}") for j, p in enumerate(specs)]
                args += [f"{k}={_arg(p, ns, f'k{i}_{k}')}" for k, p in kw]
                if needs is not None:
                    ns[f"N{i}"] = list(needs)
                    L.append(f"    c{i} = new(C{i}); "
                             f"c{i}.needs_input_grad = N{i}")
                    ctxs.append(f"c{i}")
                else:
                    L.append(f"    c{i} = new(C{i})")
                call = f"F{i}(c{i}, {', '.join(args)})"
                L.append(f"    v{slot} = " + (f"fix({call})" if scalar
                                              else call))
            elif kind == "src":
                # a function outside ops (a comparison, a random draw):
                # called again on tensors over this replay's arrays
                _, fn, specs, kw, slot, is_t = st
                ns[f"S{i}"] = fn
                args = [_targ(p, ns, f"a{i}_{j}") for j, p in enumerate(specs)]
                args += [f"{k}={_targ(p, ns, f'k{i}_{k}')}" for k, p in kw]
                L.append(f"    v{slot} = S{i}({', '.join(args)})"
                         + ("._data" if is_t else ""))
            elif kind == "ufunc":
                _, uf, t, other = st
                ns[f"U{i}"] = uf
                L.append(f"    U{i}(v{t}, {_arg(other, ns, f'o{i}')}, "
                         f"out=v{t}, casting='same_kind')")
                if t in live_idx:
                    L.append(f"    L[{live_idx[t]}]._bump_version()")
            elif kind == "fused":
                g = st[1]
                ns[f"G{i}"] = g.forward
                outs = [f"v{s}" for s in g.outside]
                if g.graph:
                    outs.append(f"c{i}")
                    ctxs.append(f"c{i}")
                ins = ", ".join(f"v{s}" for s in g.ext)
                L.append(f"    {', '.join(outs)}, = G{i}({ins})")
            elif kind == "bump":
                if st[1] in live_idx:
                    L.append(f"    L[{live_idx[st[1]]}]._bump_version()")
            else:                                        # copy
                L.append(f"    v{st[1]}[...] = v{st[2]}")
            dead = sorted({s for s in _reads(st)
                           if last[s] == i and s not in keep})
            if dead:
                L.append("    del " + ", ".join(f"v{s}" for s in dead))
        outs = [f"v{o[1]}" for o in self.outs if o[0] == "t"]
        L.append(f"    return ({''.join(o + ', ' for o in outs)}), "
                 f"({''.join(c + ', ' for c in ctxs)})")
        self.ctx_names = ctxs
        return self._compile("\n".join(L), ns, "forward")

    def gen_backward(self, has):
        ns = {}
        steps = self.steps
        reached = {s for s, h in zip(self.graph_outs, has) if h}
        ops = []
        for i in reversed(self.graph_steps):
            st = steps[i]
            if st[0] == "fused":
                if any(s in reached for s in st[1].entries):
                    ops.append(i)
                    reached.update(t for _, _, t in st[1].contribs)
                continue
            if st[4] in reached:
                ops.append(i)
                for p, n in zip(st[2], st[5]):
                    if n and p[0] == "s":
                        reached.add(p[1])
        L = ["def backward(C, G):"]
        if self.ctx_names:
            L.append(f"    ({''.join(c + ', ' for c in self.ctx_names)}) = C")
        for s in sorted(reached):
            L.append(f"    g{s} = None")
        for k, (s, h) in enumerate(zip(self.graph_outs, has)):
            if h:
                L.append(f"    g{s} = G[{k}] if g{s} is None "
                         f"else g{s} + G[{k}]")
        for i in ops:
            if steps[i][0] == "fused":
                g = steps[i][1]
                ns[f"H{i}"] = g.backward
                ent = "".join((f"g{s}" if s in reached else "None") + ", "
                              for s in g.entries)
                L.append(f"    r = H{i}(c{i}, ({ent}))")
                for k, (_, _, t) in enumerate(g.contribs):
                    L.append(f"    x = r[{k}]")
                    L.append(f"    if x is not None: "
                             f"g{t} = x if g{t} is None else g{t} + x")
                continue
            _, cls, specs, _, slot, needs, _ = steps[i]
            ns[f"B{i}"] = cls.backward
            L.append(f"    if g{slot} is not None:")
            L.append(f"        r = B{i}(c{i}, g{slot})")
            L.append("        if type(r) is not tuple: r = (r,)")
            for j, (p, n) in enumerate(zip(specs, needs)):
                if not (n and p[0] == "s"):
                    continue
                t = p[1]
                L.append(f"        x = r[{j}]" if j == 0 else
                         f"        x = r[{j}] if len(r) > {j} else None")
                L.append(f"        if x is not None: "
                         f"g{t} = x if g{t} is None else g{t} + x")
        ret = [f"g{s}" if s in reached else "None" for s, _ in self.leaves]
        L.append(f"    return ({''.join(r + ', ' for r in ret)})")
        return self._compile("\n".join(L), ns,
                             f"backward{len(self.backwards)}")

    def _compile(self, src, ns, what):
        self.source.append(src)
        name = f"<dtorch.compile {self.name} {what} #{next(_counter)}>"
        exec(compile(src, name, "exec"), ns)
        return ns[what.rstrip("0123456789")]

    # ----------------------------------------------------------- replay --
    def guard(self, meta):
        """The outside tensors still have the metadata they had when
        captured (``meta``: (tensor, shape, dtype, array type,
        requires_grad) each)."""
        for t, shp, dt, typ, rg in meta:
            d = t._data
            if d.shape != shp or d.dtype != dt or type(d) is not typ \
                    or t.requires_grad != rg:
                return False
        return True

    def run(self, tensors):
        arrays = [t._data for t in tensors]
        if B._cupy is not None:
            with B.device_guard(next((a for a in arrays if B.is_cupy_array(a)),
                                     None)):
                vals, ctxs = self.forward(arrays, self.live_tensors)
        else:
            vals, ctxs = self.forward(arrays, self.live_tensors)
        node = None
        if self.graph_outs:
            node = object.__new__(CompiledFunctionBackward)
            edges = []
            vers = []
            for s, (kind, x) in self.leaves:
                t = tensors[x] if kind == "in" else x
                edges.append(_fn._edge(t) if t.requires_grad else None)
                vers.append((t._vc, t._vc[0], t, "an input"))
            node.next_edges = edges
            node._seq = next(_fn._seq)
            node._freed = False
            node._hooks = None
            # an in-place change of a parameter between this forward and
            # its backward is an error, as in eager code (conservatively:
            # eager raises only where an op saved the tensor)
            node._versions = vers or None
            node.ctxs = ctxs
            node.prog = self
        res = []
        it = iter(vals)
        nr = 0
        mk = Tensor._make
        for o in self.outs:
            k = o[0]
            if k == "t":
                a = next(it)
                if o[2]:
                    t = mk(a, True, node)
                    t._output_nr = nr
                    nr += 1
                else:
                    t = mk(a, False, None)
                res.append(t)
            elif k == "in":
                res.append(tensors[o[1]])
            elif k == "fresh":
                res.append(mk(o[1].copy(), False, None))
            else:
                res.append(o[1])
        return res


def _arg(p, ns, name):
    if p[0] in "sr":
        return f"v{p[1]}"
    ns[name] = p[1]
    return name


def _targ(p, ns, name):
    return f"wrap(v{p[1]})" if p[0] == "s" else _arg(p, ns, name)


def _reads(st):
    kind = st[0]
    if kind in ("op", "src"):
        return [p[1] for p in st[2] if p[0] in "sr"] + \
            [p[1] for _, p in st[3] if p[0] in "sr"]
    if kind == "ufunc":
        return [st[2]] + ([st[3][1]] if st[3][0] in "sr" else [])
    if kind == "copy":
        return [st[1], st[2]]
    if kind == "fused":
        return list(st[1].ext)
    return []
