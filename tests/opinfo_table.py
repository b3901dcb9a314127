"""The differential sweep's op table and its checks (issue 25 item 23).

PyTorch's own test design (torch/testing/_internal/opinfo): one entry per
op, each with a function that yields sample inputs, and one set of checks
run over every sample of every entry. Here the oracle is torch itself:

    values, dtype, shape   the forward output, nan-aware, per-dtype tolerance
    requires_grad          whether the output requires grad / has a grad_fn
    error                  dtorch raises iff torch raises (invalid inputs)
    grad                   first-order gradients (a random cotangent)
    create_graph           the same gradients with create_graph=True, which
                           must agree bitwise with the plain ones (issue 30)
    gradgrad               second-order gradients (float64 samples)
    inplace_out/_in        an in-place op on the output / on a non-leaf input
                           after the forward: backward raises iff in torch
    inplace_silent         where torch raises and dtorch does not, dtorch's
                           gradient must be the one of forward's values
    inplace_grad           where both accept it, the gradients agree
    autocast               the output dtype under CPU bfloat16 autocast

Samples are NumPy arrays (float64 ones become leaves that require grad);
``Sample`` turns them into either library's tensors. Most entries are one
line built from a family's generator (``unary``, ``binary``, ``reduction``,
``scan``...); an op with special inputs gets its own sample function, a
module a constructor and input shapes (``mod``). Adding an op (linalg, say)
is one ``add(...)`` line.

``python tests/opinfo_table.py`` prints the mismatches by kind and op.
"""
import zlib
import warnings
from collections import Counter

import numpy as np

import dtorch

try:
    import torch
except ImportError:          # the sweep needs its oracle
    torch = None

INF, NAN = float("inf"), float("nan")
# the boundary set: signed zeros, +-1, +-inf, NaN, halves (rounding ties)
BOUND = np.array([0., -0., 1., -1., INF, -INF, NAN, 0.5, 2.5, -1.5])
INTS = np.array([-3, -1, 0, 1, 2, 7], dtype=np.int64)
BOOLS = np.array([True, False, True])


# --------------------------------------------------------------- samples

class Dt:
    """A dtype argument, spelled once for both libraries."""
    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return self.name


class As:
    """An array cast to a dtype NumPy lacks (bfloat16) after conversion."""
    def __init__(self, arr, dtype):
        self.arr, self.dtype = arr, dtype


class Sample:
    """One call: positional and keyword arguments in which NumPy arrays
    become tensors (floating ones leaves requiring grad when ``grad``)."""

    def __init__(self, *args, desc="", grad=True, ctor=None, **kwargs):
        self.args, self.kwargs = args, kwargs
        self.desc, self.grad, self.ctor = desc, grad, ctor

    def make(self, lib, nonleaf=False, cast=None):
        leaves, inputs = [], []

        def conv(a):
            if isinstance(a, As):
                t = conv(a.arr).detach().to(getattr(lib, a.dtype))
                if self.grad and t.is_floating_point():
                    t.requires_grad_(True)
                    leaves.append(t)
                inputs.append(t)
                return t
            if isinstance(a, np.ndarray):
                arr = a
                low = cast is not None and arr.dtype.kind == "f"
                if low:
                    arr = arr.astype(np.float32)
                t = lib.tensor(arr.copy())
                if low and cast != "float32":
                    t = t.to(getattr(lib, cast))
                if self.grad and arr.dtype.kind == "f":
                    t.requires_grad_(True)
                    leaves.append(t)
                    if nonleaf:
                        t = t.clone()
                inputs.append(t)
                return t
            if isinstance(a, Dt):
                return getattr(lib, a.name)
            if isinstance(a, (list, tuple)) and not isinstance(a, Shape):
                return type(a)(conv(b) for b in a)
            if isinstance(a, dict):
                return {k: conv(v) for k, v in a.items()}
            return a
        args = [conv(a) for a in self.args]
        kwargs = {k: conv(v) for k, v in self.kwargs.items()}
        return args, kwargs, leaves, inputs

    def __repr__(self):
        def r(a):
            if isinstance(a, np.ndarray):
                return f"{a.dtype}{list(a.shape)}"
            if isinstance(a, As):
                return f"{a.dtype}{list(a.arr.shape)}"
            if isinstance(a, (list, tuple)) and not isinstance(a, Shape):
                return "[" + ",".join(r(b) for b in a) + "]"
            return repr(a)
        s = ", ".join([r(a) for a in self.args]
                      + [f"{k}={r(v)}" for k, v in self.kwargs.items()])
        if self.ctor:
            s = f"{self.ctor} ({s})"
        return f"{self.desc}: {s}" if self.desc else s


class Shape(tuple):
    """A shape argument (not a list of arrays)."""


def rng_for(name):
    return np.random.default_rng(zlib.crc32(name.encode()))


def rand(r, *shape, lo=-2.0, hi=2.0, dtype=np.float64):
    return r.uniform(lo, hi, size=shape).astype(dtype)


# the generic generators: each takes (rng, **options) and returns samples

def unary(r, lo=-2.0, hi=2.0, pre=(), **kw):
    return [
        Sample(rand(r, 2, 3, lo=lo, hi=hi), *pre, desc="random", **kw),
        Sample(rand(r, lo=lo, hi=hi), *pre, desc="0-d", **kw),
        Sample(rand(r, 0, 3), *pre, desc="empty", **kw),
        Sample(BOUND.copy(), *pre, desc="boundary", **kw),
        Sample(rand(r, 3, lo=lo, hi=hi, dtype=np.float32), *pre,
               desc="float32", **kw),
        Sample(INTS.copy(), *pre, desc="int64", **kw),
        Sample(BOOLS.copy(), *pre, desc="bool", **kw),
        Sample([1.0, 2.0], *pre, desc="invalid: a list", **kw),
    ]


def binary(r, lo=-2.0, hi=2.0, scalar=1.5, **kw):
    return [
        Sample(rand(r, 2, 3, lo=lo, hi=hi), rand(r, 2, 3, lo=lo, hi=hi),
               desc="random", **kw),
        Sample(rand(r, 2, 3, lo=lo, hi=hi), rand(r, 3, lo=lo, hi=hi),
               desc="broadcast", **kw),
        Sample(rand(r, 2, lo=lo, hi=hi), scalar, desc="scalar", **kw),
        Sample(rand(r, lo=lo, hi=hi), rand(r, 3, lo=lo, hi=hi),
               desc="0-d", **kw),
        Sample(rand(r, 0, 3), rand(r, 3), desc="empty", **kw),
        Sample(BOUND[:, None].copy(), BOUND[None, :].copy(),
               desc="boundary grid", **kw),
        Sample(INTS[:, None].copy(), INTS[None, :].copy(),
               desc="int64 grid", **kw),
        Sample(BOOLS.copy(), BOOLS[::-1].copy(), desc="bool", **kw),
        Sample(INTS.copy(), rand(r, 6, dtype=np.float32),
               desc="int64 x float32", **kw),
        Sample(rand(r, 2, 3), rand(r, 4), desc="invalid: shapes", **kw),
    ]


TIES = np.array([[1., 3., 3.], [2., 2., 1.]])
WITH_NAN = np.array([[1., NAN, 0.], [INF, -INF, 2.]])


def reduction(r, dim_required=False, tuple_dim=True, keepdim=True,
              pre=(), ints=True, **kw):
    """The reduction samples: all dims, one dim, keepdim, ties, NaN/inf,
    empty dims, 0-d, integer and bool, a dim out of range."""
    k = dict(keepdim=True) if keepdim else {}
    out = [
        Sample(rand(r, 3, 4), *pre, dim=1, desc="dim=1", **kw),
        Sample(rand(r, 3, 4), *pre, dim=-2, desc="keepdim", **k, **kw),
        Sample(TIES.copy(), *pre, dim=1, desc="ties", **kw),
        Sample(WITH_NAN.copy(), *pre, dim=1, desc="nan/inf", **kw),
        Sample(rand(r, 0, 3), *pre, dim=1, desc="empty, other dim", **kw),
        Sample(rand(r, 0, 3), *pre, dim=0, desc="empty dim", **kw),
        Sample(rand(r), *pre, dim=0, desc="0-d", **kw),
        Sample(rand(r, 2, 3), *pre, dim=2, desc="invalid: dim", **kw),
    ]
    if ints:
        out += [Sample(INTS.reshape(2, 3).copy(), *pre, dim=1,
                       desc="int64", **kw),
                Sample(np.array([[True, False], [True, True]]), *pre,
                       dim=0, desc="bool", **kw)]
    if not dim_required:
        out += [Sample(rand(r, 3, 4), *pre, desc="all", **kw),
                Sample(TIES.copy(), *pre, desc="all, ties", **kw),
                Sample(WITH_NAN.copy(), *pre, desc="all, nan", **kw),
                Sample(rand(r, 0, 3), *pre, desc="all, empty", **kw)]
    if tuple_dim:
        out.append(Sample(rand(r, 2, 3, 2), *pre, dim=(0, 2),
                          desc="dims (0,2)", **kw))
    return out


def scan(r, **kw):
    return [
        Sample(rand(r, 3, 4), dim=1, desc="dim=1", **kw),
        Sample(rand(r, 3, 4), dim=0, desc="dim=0", **kw),
        Sample(TIES.copy(), dim=1, desc="ties", **kw),
        Sample(WITH_NAN.copy(), dim=1, desc="nan/inf", **kw),
        Sample(rand(r, 0, 3), dim=0, desc="empty", **kw),
        Sample(rand(r), dim=0, desc="0-d", **kw),
        Sample(INTS.reshape(2, 3).copy(), dim=1, desc="int64", **kw),
        Sample(np.array([[True, False], [True, True]]), dim=0,
               desc="bool", **kw),
        Sample(rand(r, 2, 3), dim=2, desc="invalid: dim", **kw),
    ]


def args(*samples):
    """A generator for hand-written samples: each a tuple (args, kwargs)
    or a Sample."""
    def gen(r):
        out = []
        for s in samples:
            s = s(r) if callable(s) else s
            out.append(s if isinstance(s, Sample) else Sample(*s))
        return out
    return gen


# ------------------------------------------------------------ the table

class OpInfo:
    """One entry: how to call the op in either library and its samples."""

    def __init__(self, name, samples, grad=True, gradgrad=True,
                 values=True, inplace=True, autocast=True, nonleaf=False,
                 tol=None, call=None, train=True):
        self.name, self.gen = name, samples
        self.grad, self.gradgrad, self.values = grad, gradgrad, values
        self.inplace, self.autocast = inplace, autocast
        self.nonleaf, self.tol, self._call = nonleaf, tol, call
        self.train = train

    def samples(self):
        return self.gen(rng_for(self.name))

    def run(self, lib, s, nonleaf=False, cast=None):
        """(output, leaves, inputs) of the op in ``lib`` on sample ``s``."""
        a, k, leaves, inputs = s.make(lib, nonleaf or self.nonleaf, cast)
        if self._call is not None:
            return self._call(lib, *a, **k), leaves, inputs
        ns, _, attr = self.name.rpartition(".")
        if s.ctor is not None:                 # a module
            m = _module(lib, attr, s.ctor, self.train, cast is None)
            leaves = leaves + [p for _, p in sorted(m.named_parameters())]
            return m(*a, **k), leaves, inputs
        if ns == "Tensor":
            desc = getattr(torch.Tensor, attr)
            if not callable(desc):             # an attribute
                return getattr(a[0], attr), leaves, inputs
            return getattr(a[0], attr)(*a[1:], **k), leaves, inputs
        return resolve(lib, self.name)(*a, **k), leaves, inputs


def resolve(lib, dotted):
    obj = lib
    for part in dotted.split("."):
        obj = lib.nn.functional if part == "F" and obj is lib else \
            getattr(obj, part)
    return obj


def _module(lib, name, ctor, train, double=True):
    """The module ``lib.nn.<name>(**ctor)`` with torch's initial weights,
    in float64 (float32 under autocast)."""
    torch.manual_seed(0)
    tm = getattr(torch.nn, name)(**ctor)
    tm = (tm.double() if double else tm.float()).train(train)
    if lib is torch:
        return tm
    dm = getattr(dtorch.nn, name)(**ctor)
    dm = (dm.double() if double else dm.float()).train(train)
    state = {k: dtorch.tensor(v.detach().numpy().copy())
             for k, v in tm.state_dict().items()}
    dm.load_state_dict(state)
    return dm


TABLE = {}


def add(name, samples, **kw):
    if name in TABLE:
        raise ValueError(f"{name} is in the table twice")
    TABLE[name] = OpInfo(name, samples, **kw)


def both(names, samples, tensor=True, func=True, **kw):
    """Entries for torch.<name> and Tensor.<name> sharing one generator."""
    for n in names.split():
        if func:
            add(n, samples, **kw)
        if tensor:
            add("Tensor." + n, samples, **kw)


def gen(f, **options):
    return lambda r: f(r, **options)


# ---- elementwise unary
both("exp sigmoid tanh neg abs sin cos erf expm1 square relu sign sgn round "
     "floor ceil trunc frac nan_to_num isnan isinf logical_not erfinv "
     "reciprocal", gen(unary))
both("sqrt rsqrt log log1p", gen(unary, lo=0.2, hi=3.0))
add("log2", gen(unary, lo=0.2, hi=3.0))
add("log10", gen(unary, lo=0.2, hi=3.0))
both("tan atan sinh cosh asin acos exp2 erfc lgamma digamma isfinite "
     "logit signbit", gen(unary, lo=-0.9, hi=0.9), tensor=False)
add("round.decimals", gen(unary, decimals=1), call=lambda lib, x, **k:
    lib.round(x, **k))
add("nan_to_num.values", gen(unary, nan=0.5, posinf=9.0, neginf=-9.0),
    call=lambda lib, x, **k: lib.nan_to_num(x, **k))
add("bitwise_not", lambda r: [Sample(INTS.copy()), Sample(BOOLS.copy()),
                              Sample(rand(r, 3), desc="invalid: float")])
add("Tensor.bitwise_not", TABLE["bitwise_not"].gen)
add("clone", gen(unary))
add("Tensor.clone", gen(unary))
add("detach", gen(unary))
add("Tensor.detach", gen(unary))
add("Tensor.detach_", gen(unary), nonleaf=True)
add("Tensor.contiguous", gen(unary))
for n in "float long int bool half double".split():
    add("Tensor." + n, gen(unary))
add("Tensor.float_power", gen(unary, lo=0.2, hi=3, pre=(2.0,)))
add("clamp", gen(unary, min=-0.5, max=0.5))
add("Tensor.clamp", gen(unary, min=-0.5, max=0.5))
add("clip", gen(unary, min=-0.5, max=0.5))
add("Tensor.clip", gen(unary, min=-0.5, max=0.5))
add("clamp_min", gen(unary, pre=(0.0,)))
add("clamp_max", gen(unary, pre=(0.0,)))
add("clamp.tensor", gen(binary), call=lambda lib, x, y:
    lib.clamp(x, min=y))
# in-place elementwise, on a non-leaf
for n, kw in [("clamp_", dict(min=-0.5, max=0.5)),
              ("clip_", dict(min=-0.5, max=0.5)), ("zero_", {}),
              ("fill_", dict(value=0.25)), ("tril_", {}), ("triu_", {}),
              ("squeeze_", {}), ("unsqueeze_", dict(dim=0)), ("t_", {}),
              ("uniform_", {}), ("normal_", {}), ("bernoulli_", {}),
              ("random_", {}), ("exponential_", {}), ("geometric_",
                                                      dict(p=0.5)),
              ("log_normal_", {}), ("cauchy_", {})]:
    random = n in ("uniform_ normal_ bernoulli_ random_ exponential_ "
                   "geometric_ log_normal_ cauchy_").split()
    samples = (lambda r: [Sample(rand(r, 2, 3))]) if n in (
        "tril_", "triu_", "t_") else gen(unary)
    add("Tensor." + n, lambda r, s=samples, kw=kw: [
        Sample(*x.args, desc=x.desc, **kw) for x in s(r)],
        nonleaf=True, values=not random)
add("Tensor.transpose_", lambda r: [Sample(rand(r, 2, 3), 0, 1)],
    nonleaf=True)
add("Tensor.resize_", lambda r: [Sample(rand(r, 2, 3), 3, 2,
                                        grad=False)], grad=False)

# ---- elementwise binary
both("add sub mul div maximum minimum atan2 eq ne lt le gt ge fmod "
     "remainder fmax fmin", gen(binary))
both("pow", gen(binary, lo=0.2, hi=2.0))
add("true_divide", gen(binary))
add("floor_divide", gen(binary))
add("hypot", gen(binary))
add("xlogy", gen(binary, lo=0.0, hi=2.0))
add("heaviside", gen(binary))
add("copysign", gen(binary))
both("logical_and logical_or", gen(binary))
add("logical_xor", gen(binary))
for n in "bitwise_and bitwise_or".split():
    add(n, lambda r: [Sample(INTS.copy(), INTS[::-1].copy()),
                      Sample(BOOLS.copy(), BOOLS[::-1].copy()),
                      Sample(rand(r, 3), rand(r, 3), desc="invalid: float")])
add("add.alpha", gen(binary, alpha=2), call=lambda lib, x, y, **k:
    lib.add(x, y, **k))
add("div.floor", gen(binary, rounding_mode="floor"),
    call=lambda lib, x, y, **k: lib.div(x, y, **k))
add("div.trunc", gen(binary, rounding_mode="trunc"),
    call=lambda lib, x, y, **k: lib.div(x, y, **k))
for op, sym in [("floordiv", "//"), ("mod", "%"), ("truediv", "/"),
                ("pow", "**"), ("matmul", "@")]:
    if op != "matmul":
        add("operator." + op, gen(binary), call=eval(
            f"lambda lib, x, y: x {sym} y"))
both("isclose", gen(binary))
both("allclose equal", lambda r: [
    Sample(rand(r, 3), rand(r, 3), grad=False),
    Sample(BOUND.copy(), BOUND.copy(), grad=False),
    Sample(rand(r, 3), rand(r, 2, 3), grad=False, desc="broadcast")],
    grad=False)

# in-place binary (Tensor only)
for n in "add_ mul_ div_ sub_ copy_".split():
    add("Tensor." + n, gen(binary), nonleaf=True)


def _ternary(r, **kw):
    return [Sample(rand(r, 2, 3), rand(r, 2, 3), rand(r, 3), **kw),
            Sample(BOUND.copy(), BOUND[::-1].copy(), BOUND.copy(), **kw),
            Sample(rand(r, 0, 3), rand(r, 3), rand(r, 1), **kw),
            Sample(rand(r, 2, 3), rand(r, 4), rand(r, 3),
                   desc="invalid: shapes", **kw)]


both("addcmul addcdiv", gen(_ternary, value=0.5))
add("Tensor.addcmul_", gen(_ternary, value=0.5), nonleaf=True)
add("Tensor.addcdiv_", gen(_ternary, value=0.5), nonleaf=True)
both("lerp", lambda r: [
    Sample(rand(r, 2, 3), rand(r, 2, 3), 0.3),
    Sample(rand(r, 2, 3), rand(r, 3), rand(r, 2, 3)),
    Sample(BOUND.copy(), BOUND[::-1].copy(), 0.5),
    Sample(rand(r, 0, 3), rand(r, 3), 0.5)])
add("Tensor.lerp_", TABLE["lerp"].gen, nonleaf=True)


def _where(r):
    c = np.array([[True, False, True], [False, False, True]])
    return [Sample(c, rand(r, 2, 3), rand(r, 3)),
            Sample(c, rand(r, 2, 3), 0.0),
            Sample(c[0], BOUND[:3].copy(), BOUND[3:6].copy()),
            Sample(c, INTS[:3].copy(), rand(r, 2, 3)),
            Sample(np.zeros((0, 3), bool), rand(r, 0, 3), rand(r, 3)),
            Sample(rand(r, 2, 3), rand(r, 2, 3), rand(r, 2, 3),
                   desc="invalid: float condition")]


add("where", _where)
add("Tensor.where", lambda r: [Sample(s.args[1], s.args[0], s.args[2])
                               for s in _where(r)])

# ---- reductions
both("sum amax amin logsumexp", gen(reduction))
both("mean nanmean nansum", gen(reduction))
add("Tensor.sum.dtype", lambda r: [Sample(INTS.copy(), dtype=Dt("float64"))],
    call=lambda lib, x, **k: x.sum(**k))
both("std var", gen(reduction))
add("std.correction0", gen(reduction, correction=0),
    call=lambda lib, x, **k: lib.std(x, **k))
add("var_mean", gen(reduction))
add("std_mean", gen(reduction))
both("prod", gen(reduction, tuple_dim=False))
both("argmax argmin", gen(reduction, tuple_dim=False))
both("max min", gen(reduction, tuple_dim=False))
both("median", gen(reduction, tuple_dim=False))
add("Tensor.mode", gen(reduction, tuple_dim=False, dim_required=True))
add("mode", gen(reduction, tuple_dim=False, dim_required=True))
both("kthvalue", gen(reduction, tuple_dim=False, dim_required=True,
                     pre=(1,)))
add("quantile", gen(reduction, tuple_dim=False, pre=(0.3,), keepdim=True))
both("any all", gen(reduction, tuple_dim=False))
both("count_nonzero", gen(reduction, keepdim=False))
both("norm", gen(reduction))
add("norm.p1", gen(reduction, p=1), call=lambda lib, x, **k:
    lib.norm(x, **k))
add("norm.inf", gen(reduction, p=INF), call=lambda lib, x, **k:
    lib.norm(x, **k))
add("Tensor.sum_to_size", lambda r: [Sample(rand(r, 2, 3), 1, 3),
                                     Sample(rand(r, 2, 3), 3)])

# ---- scans
both("cumsum cumprod cummax", gen(scan))
add("cummin", gen(scan))
add("logcumsumexp", gen(scan))
both("diff", lambda r: [Sample(rand(r, 3, 4)), Sample(rand(r, 3, 4), dim=0),
                        Sample(rand(r, 0, 3)), Sample(TIES.copy(), n=2),
                        Sample(INTS.copy()), Sample(BOOLS.copy()),
                        Sample(rand(r), desc="invalid: 0-d")])

# ---- softmax family
for n in "softmax log_softmax".split():
    both(n, gen(reduction, dim_required=True, tuple_dim=False,
                keepdim=False))
    add("F." + n, gen(reduction, dim_required=True, tuple_dim=False,
                      keepdim=False, ints=False))
add("F.softmin", gen(reduction, dim_required=True, tuple_dim=False,
                     keepdim=False, ints=False))

# ---- products
M = lambda r, *s: rand(r, *s)
both("matmul", lambda r: [
    Sample(M(r, 2, 3), M(r, 3, 4)), Sample(M(r, 3), M(r, 3)),
    Sample(M(r, 2, 2, 3), M(r, 3)), Sample(M(r, 3), M(r, 2, 3, 2)),
    Sample(M(r, 2, 1, 2, 3), M(r, 3, 3, 2)), Sample(M(r, 0, 3), M(r, 3, 2)),
    Sample(M(r, 2, 0), M(r, 0, 2)), Sample(INTS.reshape(2, 3).copy(),
                                           INTS.reshape(3, 2).copy()),
    Sample(M(r, 2, 3), INTS.reshape(3, 2).copy(), desc="invalid: dtypes"),
    Sample(M(r, 2, 3), M(r, 2, 3), desc="invalid: shapes"),
    Sample(M(r), M(r, 3), desc="invalid: 0-d")])
add("operator.matmul", TABLE["matmul"].gen, call=lambda lib, x, y: x @ y)
both("mm", lambda r: [Sample(M(r, 2, 3), M(r, 3, 4)),
                      Sample(M(r, 0, 3), M(r, 3, 2)),
                      Sample(M(r, 2, 3), M(r, 2, 3), desc="invalid")])
both("bmm", lambda r: [Sample(M(r, 2, 2, 3), M(r, 2, 3, 4)),
                       Sample(M(r, 0, 2, 3), M(r, 0, 3, 4)),
                       Sample(M(r, 2, 3), M(r, 3, 4), desc="invalid")])
add("mv", lambda r: [Sample(M(r, 2, 3), M(r, 3)),
                     Sample(M(r, 2, 3), M(r, 2), desc="invalid")])
both("dot", lambda r: [Sample(M(r, 3), M(r, 3)), Sample(M(r, 0), M(r, 0)),
                       Sample(INTS.copy(), INTS.copy()),
                       Sample(M(r, 3), M(r, 4), desc="invalid"),
                       Sample(M(r, 3), INTS[:3].copy(), desc="invalid")])
add("vdot", TABLE["dot"].gen)
add("inner", lambda r: [Sample(M(r, 2, 3), M(r, 4, 3)),
                        Sample(M(r, 3), M(r, 3)), Sample(M(r), M(r, 2))])
both("outer", lambda r: [Sample(M(r, 3), M(r, 2)), Sample(M(r, 0), M(r, 2)),
                         Sample(INTS.copy(), INTS.copy())])
add("addmm", lambda r: [Sample(M(r, 2, 4), M(r, 2, 3), M(r, 3, 4)),
                        Sample(M(r, 4), M(r, 2, 3), M(r, 3, 4), beta=0.5,
                               alpha=2.0)])
add("baddbmm", lambda r: [Sample(M(r, 2, 2, 4), M(r, 2, 2, 3),
                                 M(r, 2, 3, 4))])
add("tensordot", lambda r: [Sample(M(r, 2, 3, 4), M(r, 3, 4, 2)),
                            Sample(M(r, 2, 3), M(r, 3, 2), dims=1),
                            Sample(M(r, 2, 3), M(r, 2, 3),
                                   dims=([0], [0]))])
add("einsum", lambda r: [Sample("ij,jk->ik", M(r, 2, 3), M(r, 3, 4)),
                         Sample("ii->i", M(r, 3, 3)),
                         Sample("bij->b", M(r, 2, 2, 3)),
                         Sample("i,i->", M(r, 3), M(r, 4), desc="invalid")])
add("kron", lambda r: [Sample(M(r, 2, 2), M(r, 2, 3)),
                       Sample(M(r, 3), M(r, 2))])
add("cross", lambda r: [Sample(M(r, 2, 3), M(r, 2, 3), dim=1),
                        Sample(M(r, 3), M(r, 3), dim=0),
                        Sample(M(r, 2, 2), M(r, 2, 2), dim=1,
                               desc="invalid: size 2")])
both("trace", lambda r: [Sample(M(r, 3, 3)), Sample(M(r, 2, 3)),
                         Sample(INTS.reshape(2, 3).copy()),
                         Sample(M(r, 3), desc="invalid: 1-d")])
add("cdist", lambda r: [Sample(M(r, 3, 2), M(r, 4, 2)),
                        Sample(M(r, 3, 2), M(r, 4, 2), p=1.0),
                        Sample(M(r, 2, 2), M(r, 2, 2) * 0, desc="zero"),
                        Sample(M(r, 3, 2), M(r, 4, 3), desc="invalid")],
    gradgrad=False)


# ---- shape and movement
def _lists(r):
    return [Sample([M(r, 2, 3), M(r, 1, 3)]),
            Sample([M(r, 2, 3), M(r, 2, 3)], dim=1),
            Sample([M(r, 0, 3), M(r, 2, 3)]),
            Sample([INTS[:3].copy(), M(r, 3)]),
            Sample([M(r, 3)]),
            Sample([M(r, 2, 3), M(r, 2, 4)], desc="invalid: shapes"),
            Sample([], desc="invalid: empty list")]


for n in "cat concat concatenate".split():
    add(n, _lists)
add("stack", lambda r: [Sample([M(r, 2, 3), M(r, 2, 3)]),
                        Sample([M(r, 2, 3), M(r, 2, 3)], dim=2),
                        Sample([M(r), M(r)]),
                        Sample([M(r, 2, 3), M(r, 3, 2)], desc="invalid")])
for n in "hstack vstack dstack column_stack".split():
    add(n, lambda r: [Sample([M(r, 2, 3), M(r, 2, 3)]),
                      Sample([M(r, 3), M(r, 3)]),
                      Sample([M(r), M(r)])])
both("chunk", lambda r: [Sample(M(r, 5, 2), 2), Sample(M(r, 5, 2), 3, dim=1),
                         Sample(M(r, 0, 2), 2)])
both("split", lambda r: [Sample(M(r, 5, 2), 2), Sample(M(r, 5, 2), [1, 4]),
                         Sample(M(r, 5, 2), [1, 1], desc="invalid sizes")])
both("unbind", lambda r: [Sample(M(r, 2, 3)), Sample(M(r, 2, 3), dim=1)])
both("reshape", lambda r: [Sample(M(r, 2, 3), (3, 2)),
                           Sample(M(r, 2, 3), (-1,)), Sample(M(r), (1, 1)),
                           Sample(M(r, 0, 3), (3, 0)),
                           Sample(M(r, 2, 3), (4, 2), desc="invalid")])
add("Tensor.view", TABLE["reshape"].gen)
add("Tensor.view_as", lambda r: [Sample(M(r, 2, 3), M(r, 3, 2))])
add("Tensor.reshape_as", lambda r: [Sample(M(r, 2, 3), M(r, 3, 2))])
add("Tensor.expand_as", lambda r: [Sample(M(r, 1, 3), M(r, 2, 3))])
add("Tensor.type_as", lambda r: [Sample(M(r, 2, 3), INTS.copy()),
                                 Sample(INTS.copy(), M(r, 2))])
add("Tensor.expand", lambda r: [Sample(M(r, 1, 3), 2, 3),
                                Sample(M(r, 3), (2, -1)),
                                Sample(M(r, 2, 3), 3, 3, desc="invalid")])
add("broadcast_to", lambda r: [Sample(M(r, 1, 3), (2, 3)),
                               Sample(M(r, 2, 3), (3, 3), desc="invalid")])
add("Tensor.repeat", lambda r: [Sample(M(r, 2, 3), 2, 1),
                                Sample(M(r, 3), 2, 2)])
add("tile", lambda r: [Sample(M(r, 2, 3), (2,)), Sample(M(r, 3), (2, 2))])
both("transpose", lambda r: [Sample(M(r, 2, 3), 0, 1),
                             Sample(M(r, 2, 3, 2), -1, 0),
                             Sample(M(r, 2, 3), 0, 2, desc="invalid")])
both("swapaxes", lambda r: [Sample(M(r, 2, 3), 0, 1)])
both("permute", lambda r: [Sample(M(r, 2, 3, 2), (2, 0, 1)),
                           Sample(M(r, 2, 3), (0, 0), desc="invalid")])
both("movedim", lambda r: [Sample(M(r, 2, 3, 2), 0, 2),
                           Sample(M(r, 2, 3, 2), (0, 1), (2, 0))])
both("t", lambda r: [Sample(M(r, 2, 3)), Sample(M(r, 3)),
                     Sample(M(r, 2, 3, 2), desc="invalid: 3-d")])
both("flatten", lambda r: [Sample(M(r, 2, 3, 2)), Sample(M(r)),
                           Sample(M(r, 2, 3, 2), start_dim=1)])
both("squeeze", lambda r: [Sample(M(r, 2, 1, 3)), Sample(M(r, 2, 1, 3), 1),
                           Sample(M(r, 1)), Sample(M(r, 2, 1), 0)])
both("unsqueeze", lambda r: [Sample(M(r, 2, 3), 1), Sample(M(r), 0),
                             Sample(M(r, 2), -1), Sample(M(r, 2), 3,
                                                         desc="invalid")])
both("narrow", lambda r: [Sample(M(r, 4, 3), 0, 1, 2),
                          Sample(M(r, 4, 3), 0, 3, 2, desc="invalid")])
both("flip", lambda r: [Sample(M(r, 2, 3), [0]), Sample(M(r, 2, 3), (0, 1))])
both("roll", lambda r: [Sample(M(r, 2, 3), 1), Sample(M(r, 2, 3), 1, 1),
                        Sample(M(r, 2, 3), (1, -1), (0, 1))])
both("repeat_interleave", lambda r: [Sample(M(r, 2, 3), 2),
                                     Sample(M(r, 2, 3), 2, dim=1)])
both("diag", lambda r: [Sample(M(r, 3)), Sample(M(r, 3, 3)),
                        Sample(M(r, 2, 3), 1)])
add("diag_embed", lambda r: [Sample(M(r, 2, 3))])
both("diagonal", lambda r: [Sample(M(r, 3, 3)), Sample(M(r, 2, 3), 1),
                            Sample(M(r, 2, 3, 3), 0, 1, 2)])
both("tril triu", lambda r: [Sample(M(r, 3, 3)), Sample(M(r, 3, 4), 1),
                             Sample(M(r, 2, 3, 3), -1),
                             Sample(M(r, 3), desc="invalid: 1-d")])
add("block_diag", lambda r: [Sample(M(r, 2, 2), M(r, 1, 3))])
add("cartesian_prod", lambda r: [Sample(M(r, 2), M(r, 3))])
add("combinations", lambda r: [Sample(M(r, 4)), Sample(M(r, 4), r=3)])
add("meshgrid", lambda r: [Sample(M(r, 2), M(r, 3), indexing="ij"),
                           Sample(M(r, 2), M(r, 3), indexing="xy")])
add("Tensor.unfold", lambda r: [Sample(M(r, 2, 5), 1, 2, 2)])
add("Tensor.mT", lambda r: [Sample(M(r, 2, 3, 2))])
add("Tensor.T", lambda r: [Sample(M(r, 2, 3))])
add("Tensor.H", lambda r: [Sample(M(r, 2, 3))])


# ---- indexing
def _idx(*v):
    return np.array(v, dtype=np.int64)


both("gather", lambda r: [
    Sample(M(r, 3, 4), 1, _idx([0, 3], [1, 1], [2, 0])),
    Sample(M(r, 3, 4), 0, _idx([0, 2, 2, 1])[None]),
    Sample(M(r, 3, 4), 1, _idx([0, 4]), desc="invalid: index dims")])
both("take_along_dim", lambda r: [
    Sample(M(r, 3, 4), _idx([0, 3], [1, 1], [2, 0]), dim=1)])
add("Tensor.take", lambda r: [Sample(M(r, 3, 4), _idx([0, 11, 5])),
                              Sample(M(r, 3), _idx([3]), desc="invalid")])
for n in "scatter scatter_add".split():
    both(n, lambda r: [
        Sample(M(r, 3, 4), 1, _idx([0, 1], [1, 1], [2, 3]), M(r, 3, 2)),
        Sample(M(r, 3, 4), 0, _idx([[0, 0, 2, 1]]), M(r, 1, 4))])
    add("Tensor." + n + "_", TABLE[n].gen, nonleaf=True)
add("scatter.reduce", lambda r: [
    Sample(M(r, 3, 4), 1, _idx([0, 1], [1, 1], [2, 3]), M(r, 3, 2),
           reduce="add")], call=lambda lib, *a, **k: lib.scatter(*a, **k))
for n, val in [("index_add", "src"), ("index_copy", "src"),
               ("index_fill", "value")]:
    gen_ = (lambda r: [Sample(M(r, 3, 4), 0, _idx(2, 0), M(r, 2, 4)),
                       Sample(M(r, 3, 4), 1, _idx(3, 1, 3), M(r, 3, 3)),
                       Sample(M(r, 3, 4), 0, _idx(5), M(r, 1, 4),
                              desc="invalid: index")]) if val == "src" \
        else (lambda r: [Sample(M(r, 3, 4), 0, _idx(2, 0), -1.0),
                         Sample(M(r, 3, 4), 1, _idx(3, 3), 2.0)])
    add(n, gen_)
    add("Tensor." + n + "_", gen_, nonleaf=True)
both("index_select", lambda r: [
    Sample(M(r, 3, 4), 0, _idx(2, 0, 2)), Sample(M(r, 3, 4), 1, _idx()),
    Sample(M(r, 3, 4), 0, _idx(3), desc="invalid")])
MASK = np.array([[True, False, True, False], [False, False, True, True],
                 [True, True, True, False]])
both("masked_fill", lambda r: [Sample(M(r, 3, 4), MASK, -1.0),
                               Sample(M(r, 3, 4), MASK[0], INF),
                               Sample(INTS.copy(), INTS > 0, 5),
                               Sample(M(r, 3, 4), MASK[:2], 0.0,
                                      desc="invalid: mask")])
add("Tensor.masked_fill_", TABLE["masked_fill"].gen, nonleaf=True)
both("masked_select", lambda r: [Sample(M(r, 3, 4), MASK),
                                 Sample(M(r, 3, 4), MASK[0])])
add("Tensor.index_put_", lambda r: [
    Sample(M(r, 3, 4), (_idx(0, 2),), M(r, 2, 4)),
    Sample(M(r, 3, 4), (_idx(0, 0),), M(r, 2, 4), accumulate=True)],
    nonleaf=True)
add("Tensor.put_", lambda r: [Sample(M(r, 3, 4), _idx(0, 5), M(r, 2))],
    nonleaf=True)
add("operator.getitem", lambda r: [
    Sample(M(r, 3, 4), 1), Sample(M(r, 3, 4), (slice(None), 2)),
    Sample(M(r, 3, 4), _idx(0, 0, 2)), Sample(M(r, 3, 4), MASK),
    Sample(M(r, 3, 4), (None, Ellipsis, slice(1, None, 2))),
    Sample(M(r, 3, 4), 5, desc="invalid: index")],
    call=lambda lib, x, k: x[k])
both("nonzero", lambda r: [Sample(np.array([[0., 1.], [2., 0.]])),
                           Sample(INTS.copy()), Sample(np.zeros((0, 2)))],
     grad=False)
both("sort", lambda r: [Sample(M(r, 3, 4)), Sample(TIES.copy(), dim=0),
                        Sample(WITH_NAN.copy(), descending=True),
                        Sample(M(r), ), Sample(M(r, 0, 3)),
                        Sample(INTS.copy(), stable=True)])
both("argsort", TABLE["sort"].gen)
both("topk", lambda r: [Sample(M(r, 3, 4), 2), Sample(M(r, 3, 4), 2, dim=0),
                        Sample(WITH_NAN.copy(), 2),
                        Sample(M(r, 3, 4), 2, largest=False),
                        Sample(M(r, 3, 4), 5, desc="invalid: k")])
both("unique", lambda r: [Sample(np.array([3., 1., 3., 2.]), grad=False),
                          Sample(INTS[[0, 0, 1]].copy(), return_counts=True),
                          Sample(np.array([3., 1., 3.]), grad=False,
                                 return_inverse=True)], grad=False)
add("searchsorted", lambda r: [
    Sample(np.array([0., 1., 1., 3.]), np.array([1., 2., -1.]), grad=False),
    Sample(np.array([0., 1., 1., 3.]), np.array([1., 2.]), right=True,
           grad=False)], grad=False)
add("bucketize", lambda r: [Sample(np.array([1., 2., -1., 3.]),
                                   np.array([0., 1., 3.]), grad=False)],
    grad=False)
add("histc", lambda r: [Sample(np.array([1., 2., 1., 0.5]), bins=4,
                               grad=False)], grad=False)
add("bincount", lambda r: [Sample(_idx(0, 1, 1, 3)),
                           Sample(_idx(0, 1), np.array([0.5, 2.]), grad=False),
                           Sample(_idx(-1), desc="invalid: negative")],
    grad=False)

# ---- creation and random (values only where deterministic)
CREATE = [
    ("tensor", [([1.0, 2.0],), ([[1, 2]],), (True,), ([],),
                ([1, 2], {"dtype": Dt("float16")})]),
    ("as_tensor", [([1.0, 2.0],), ([1, 2],)]),
    ("zeros", [(2, 3), ((0,),), ((2,), {"dtype": Dt("int64")})]),
    ("ones", [(2, 3), ((),)]),
    ("empty", [(2, 3)]),
    ("full", [((2, 3), 1.5), ((2,), 1), ((2,), True)]),
    ("eye", [(3,), (2, 3)]),
    ("arange", [(5,), (1, 2.5, 0.5), (0, -3, -1), (0, 1, 0)]),
    ("linspace", [(0, 1, 5), (0, 1, 1), (0, 1, 0)]),
    ("logspace", [(0, 1, 4)]),
    ("triu_indices", [(3, 3), (3, 4, 1)]),
    ("tril_indices", [(3, 3), (3, 4, -1)]),
    ("rand", [(2, 3)]), ("randn", [(2, 3)]), ("randint", [(0, 5, (3,))]),
    ("randperm", [(4,)]),
]
for n, calls in CREATE:
    add(n, lambda r, c=calls: [
        Sample(*a[:-1], **a[-1]) if a and isinstance(a[-1], dict) else
        Sample(*a) for a in c], grad=False,
        values=n not in ("empty", "rand", "randn", "randint", "randperm"))
for n in "zeros_like ones_like empty_like rand_like randn_like".split():
    add(n, lambda r: [Sample(M(r, 2, 3)), Sample(INTS.copy())], grad=False,
        values=n in ("zeros_like", "ones_like"))
add("full_like", lambda r: [Sample(M(r, 2, 3), 2.0),
                            Sample(INTS.copy(), 2.5)], grad=False)
add("from_numpy", lambda r: [Sample(M(r, 2, 3), grad=False)], grad=False,
    call=lambda lib, x: lib.from_numpy(x.numpy()))
for n, kw in [("new_zeros", (2,)), ("new_ones", (2,)), ("new_empty", (2,)),
              ("new_full", ((2,), 3.0)), ("new_tensor", ([1, 2],))]:
    add("Tensor." + n, lambda r, kw=kw: [Sample(M(r, 2, 3), *kw),
                                         Sample(INTS.copy(), *kw)],
        grad=False, values=n != "new_empty")
add("multinomial", lambda r: [Sample(np.array([0.2, 0.8]), 3,
                                     replacement=True, grad=False)],
    grad=False, values=False)
add("Tensor.multinomial", TABLE["multinomial"].gen, grad=False,
    values=False)
both("bernoulli", lambda r: [Sample(np.array([0., 1., 0.5]), grad=False)],
     grad=False, values=False)
add("normal", lambda r: [Sample(M(r, 3), 1.0), Sample(0.0, 1.0, (2,))],
    values=False)
add("poisson", lambda r: [Sample(np.array([0.5, 2.]), grad=False)],
    grad=False, values=False)

# ---- dtype, shape and metadata queries (Python values out)
add("promote_types", args(((Dt("int64"), Dt("float16")),),
                          ((Dt("bool"), Dt("uint8")),),
                          ((Dt("int8"), Dt("uint8")),)), grad=False)
for n in "is_floating_point is_complex numel is_tensor".split():
    add(n, lambda r: [Sample(M(r, 2, 3)), Sample(INTS.copy()),
                      Sample(BOOLS.copy())], grad=False)
for n in ("size shape dim ndim numel item tolist element_size nbytes "
          "itemsize stride is_contiguous is_floating_point is_complex "
          "is_leaf is_cuda is_sparse get_device storage_offset numpy dtype "
          "device requires_grad grad grad_fn cpu data").split():
    add("Tensor." + n, lambda r, n=n: [
        Sample(M(r) if n == "item" else M(r, 2, 3)),
        Sample(INTS[:1].copy() if n == "item" else INTS.copy()),
        Sample(M(r, 0, 3) if n != "item" else M(r, 2),
               desc="invalid: not one element" if n == "item" else "empty")],
        grad=n in ("cpu", "data"), inplace=False,
        call=(lambda lib, x: x.detach().numpy()) if n == "numpy" else None)
add("Tensor.to", lambda r: [Sample(M(r, 2, 3), Dt("float32")),
                            Sample(INTS.copy(), Dt("float64")),
                            Sample(M(r, 2, 3), "cpu"),
                            Sample(M(r, 2, 3), dtype=Dt("int32"))])


# ---- nn.functional
def shapes(*shapes, **kw):
    """Random float64 inputs of these shapes."""
    return lambda r: [Sample(*[rand(r, *s) for s in shapes], **kw)]


def fsamples(*groups):
    """Concatenate sample generators."""
    return lambda r: [s for g in groups for s in g(r)]


for n in ("relu sigmoid tanh gelu silu mish logsigmoid elu selu celu "
          "softplus softsign tanhshrink hardshrink softshrink relu6 "
          "hardtanh hardswish hardsigmoid leaky_relu").split():
    add("F." + n, gen(unary))
add("F.gelu.tanh", gen(unary, approximate="tanh"),
    call=lambda lib, x, **k: lib.nn.functional.gelu(x, **k))
add("F.threshold", gen(unary, pre=(0.1, -1.0)))
add("F.glu", lambda r: [Sample(M(r, 2, 4)), Sample(M(r, 4, 2), dim=0),
                        Sample(M(r, 3), desc="invalid: odd")])
add("F.prelu", lambda r: [Sample(M(r, 2, 3), M(r, 3)),
                          Sample(BOUND.copy(), M(r, 1))])
add("F.normalize", lambda r: [Sample(M(r, 2, 3)), Sample(M(r, 2, 3), dim=0),
                              Sample(np.zeros((2, 3)), desc="zero"),
                              Sample(M(r, 2, 3), p=1.0)])
add("F.linear", lambda r: [Sample(M(r, 2, 3), M(r, 4, 3), M(r, 4)),
                           Sample(M(r, 3), M(r, 4, 3)),
                           Sample(M(r, 0, 3), M(r, 4, 3)),
                           Sample(As(M(r, 2, 3), "bfloat16"), M(r, 4, 3),
                                  desc="invalid: bf16 x f64"),
                           Sample(M(r, 2, 5), M(r, 4, 3), desc="invalid")])
add("F.bilinear", shapes((2, 3), (2, 4), (5, 3, 4), (5,)))
add("F.dropout", lambda r: [Sample(M(r, 2, 3), p=0.0),
                            Sample(M(r, 2, 3), training=False),
                            Sample(M(r, 2, 3), p=1.0),
                            Sample(M(r, 2, 3), p=1.5, desc="invalid: p")])
for n in ("dropout1d dropout2d dropout3d alpha_dropout "
          "feature_alpha_dropout").split():
    add("F." + n, lambda r, n=n: [
        Sample(M(r, 2, 3, *((4,) if n != "dropout1d" else ())
                 + ((2,) if n == "dropout3d" else ())), training=False),
        Sample(M(r, 2, 3, 4, 2, 2), p=0.5, training=False,
               desc="invalid: rank") if n != "alpha_dropout" else
        Sample(M(r, 2, 3), p=-0.5, desc="invalid: p")])
add("F.one_hot", lambda r: [Sample(_idx(0, 2, 1)),
                            Sample(_idx(0, 2), num_classes=4),
                            Sample(_idx(3), num_classes=2, desc="invalid")],
    grad=False)
add("F.embedding", lambda r: [Sample(_idx(0, 2, 2), M(r, 3, 2)),
                              Sample(_idx([0, 1], [2, 2]), M(r, 3, 2),
                                     padding_idx=2),
                              Sample(_idx(3), M(r, 3, 2), desc="invalid")])
add("F.embedding_bag", lambda r: [
    Sample(_idx([0, 2], [1, 2]), M(r, 3, 2)),
    Sample(_idx(0, 2, 1), M(r, 3, 2), _idx(0, 1), mode="sum")])
add("F.pad", lambda r: [Sample(M(r, 2, 3), (1, 2)),
                        Sample(M(r, 1, 2, 3), (1, 1), mode="reflect"),
                        Sample(M(r, 1, 2, 3), (1, 1), mode="replicate"),
                        Sample(M(r, 2, 3), (1, 1, 0, 1), value=2.0),
                        Sample(M(r, 2, 3), (-1, 0)),
                        Sample(M(r, 2, 3), (1,), desc="invalid: odd pad")])
add("F.layer_norm", lambda r: [Sample(M(r, 2, 3), (3,)),
                               Sample(M(r, 2, 3), (3,), M(r, 3), M(r, 3)),
                               Sample(np.ones((2, 3)), (3,), desc="constant"),
                               Sample(M(r, 2, 3), (2,), desc="invalid")])
add("F.group_norm", lambda r: [Sample(M(r, 2, 4, 3), 2),
                               Sample(M(r, 2, 4, 3), 2, M(r, 4), M(r, 4)),
                               Sample(M(r, 2, 4, 3), 3, desc="invalid")])
add("F.batch_norm", lambda r: [
    Sample(M(r, 4, 3), np.zeros(3), np.ones(3), training=True, grad=True),
    Sample(M(r, 4, 3), np.zeros(3), np.ones(3), M(r, 3), M(r, 3)),
    Sample(M(r, 1, 3), np.zeros(3), np.ones(3), training=True,
           desc="invalid: one value per channel")],
    call=lambda lib, x, rm, rv, *a, **k: lib.nn.functional.batch_norm(
        x, rm.detach(), rv.detach(), *a, **k))
add("F.instance_norm", shapes((2, 3, 4)))
add("F.local_response_norm", lambda r: [Sample(M(r, 2, 4, 3), 2)])
add("F.conv1d", lambda r: [Sample(M(r, 2, 3, 5), M(r, 4, 3, 2), M(r, 4)),
                           Sample(M(r, 2, 4, 5), M(r, 4, 2, 3), stride=2,
                                  padding=1, groups=2),
                           Sample(M(r, 2, 3, 5), M(r, 4, 2, 2),
                                  desc="invalid: channels")])
add("F.conv2d", lambda r: [
    Sample(M(r, 1, 2, 4, 4), M(r, 3, 2, 2, 2), M(r, 3)),
    Sample(M(r, 1, 2, 5, 4), M(r, 2, 1, 3, 3), stride=2, padding=1,
           groups=2, dilation=1),
    Sample(M(r, 1, 2, 4, 4), M(r, 3, 2, 2, 2), padding="same"),
    Sample(INTS[:1].reshape(1, 1, 1, 1).copy(), M(r, 1, 1, 1, 1),
           desc="invalid: int64 input"),
    Sample(M(r, 1, 3, 4, 4), M(r, 3, 2, 2, 2), desc="invalid: channels")])
add("F.conv3d", lambda r: [Sample(M(r, 1, 2, 3, 3, 3), M(r, 2, 2, 2, 2, 2))])
add("F.conv_transpose1d", lambda r: [
    Sample(M(r, 2, 3, 4), M(r, 3, 2, 2), M(r, 2), stride=2)])
add("F.conv_transpose2d", lambda r: [
    Sample(M(r, 1, 3, 3, 3), M(r, 3, 2, 2, 2), M(r, 2), stride=2,
           padding=1, output_padding=1)])
add("F.unfold", lambda r: [Sample(M(r, 1, 2, 4, 4), 2),
                           Sample(M(r, 1, 2, 4, 4), 3, padding=1,
                                  stride=2)])
add("F.fold", lambda r: [Sample(M(r, 1, 8, 9), (4, 4), 2)])
add("F.pixel_shuffle", lambda r: [Sample(M(r, 1, 4, 2, 3), 2),
                                  Sample(M(r, 1, 3, 2, 2), 2,
                                         desc="invalid")])
POOL_TIES = np.array([[[[1., 1., 2., 2., 0.], [1., 1., 2., 2., 0.],
                        [3., 3., 0., 0., 1.], [3., 3., 0., -1., NAN]]]])
for n, d in [("max_pool2d", 2), ("avg_pool2d", 2), ("max_pool1d", 1),
             ("avg_pool1d", 1)]:
    x4 = (lambda r: POOL_TIES.copy()) if d == 2 else \
        (lambda r: POOL_TIES[0].copy())
    add("F." + n, lambda r, x4=x4, d=d: [
        Sample(rand(r, 1, 2, *(4,) * d), 2),
        Sample(rand(r, 1, 2, *(5,) * d), 3, stride=2, padding=1),
        Sample(x4(r), 2, desc="ties"),
        Sample(x4(r), 3, stride=1, padding=1, desc="ties, general"),
        Sample(rand(r, 1, 2, *(5,) * d), 2, ceil_mode=True),
        Sample(rand(r, 1, 2, *(4,) * d), 2, padding=2,
               desc="invalid: padding")])
add("F.max_pool3d", shapes((1, 1, 4, 4, 4), kernel_size=2))
add("F.avg_pool3d", shapes((1, 1, 4, 4, 4), kernel_size=2))
add("F.adaptive_avg_pool2d", lambda r: [Sample(M(r, 1, 2, 5, 4), (2, 3)),
                                        Sample(M(r, 1, 2, 4, 4), 1)])
add("F.adaptive_avg_pool1d", lambda r: [Sample(M(r, 1, 2, 5), 3)])
add("F.adaptive_max_pool2d", lambda r: [Sample(M(r, 1, 2, 5, 4), (2, 3)),
                                        Sample(POOL_TIES.copy(), 2)])
add("F.interpolate", lambda r: [
    Sample(M(r, 1, 2, 3, 3), scale_factor=2),
    Sample(M(r, 1, 2, 3, 3), size=(4, 5), mode="bilinear",
           align_corners=False),
    Sample(M(r, 1, 2, 3, 3), size=(4, 5), mode="bilinear",
           align_corners=True),
    Sample(M(r, 1, 2, 3), scale_factor=2, mode="linear")])
add("F.upsample", lambda r: [Sample(M(r, 1, 2, 3, 3), scale_factor=2)])
add("F.grid_sample", lambda r: [
    Sample(M(r, 1, 2, 3, 3), rand(r, 1, 2, 2, 2, lo=-1, hi=1),
           align_corners=False)], gradgrad=False)
add("F.affine_grid", lambda r: [Sample(M(r, 1, 2, 3), (1, 1, 2, 3),
                                       align_corners=False)])
add("F.scaled_dot_product_attention", lambda r: [
    Sample(M(r, 1, 2, 3, 4), M(r, 1, 2, 3, 4), M(r, 1, 2, 3, 4)),
    Sample(M(r, 1, 2, 3, 4), M(r, 1, 2, 3, 4), M(r, 1, 2, 3, 4),
           is_causal=True),
    Sample(M(r, 1, 3, 4), M(r, 1, 2, 4), M(r, 1, 2, 4),
           attn_mask=np.array([[True, False]] * 3))])
add("F.cosine_similarity", lambda r: [
    Sample(M(r, 2, 3), M(r, 2, 3)), Sample(M(r, 2, 3), M(r, 3), dim=1),
    Sample(np.array([1e-5, 0., 0.]), np.array([1e-5, 0., 0.]), dim=0,
           desc="tiny"),
    Sample(np.zeros((1, 3)), M(r, 1, 3), desc="zero vector"),
    Sample(np.zeros((2, 3)), np.zeros((2, 3)), desc="both zero")])
add("F.pairwise_distance", lambda r: [
    Sample(M(r, 2, 3), M(r, 2, 3)), Sample(M(r, 2, 3), M(r, 2, 3), p=1.0),
    Sample(np.zeros((1, 3)), np.zeros((1, 3)), desc="equal")])


def _loss_inputs(r, kind):
    """(input, target) pairs for a loss family, float64."""
    if kind == "regress":
        return [(M(r, 2, 3), M(r, 2, 3)), (M(r, 3), M(r, 3)),
                (BOUND.copy(), BOUND[::-1].copy())]
    if kind == "prob":
        return [(rand(r, 2, 3, lo=0.01, hi=0.99),
                 rand(r, 2, 3, lo=0, hi=1)),
                (np.array([0., 1., 0.5]), np.array([0., 1., 1.]))]
    if kind == "class":
        return [(M(r, 3, 4), _idx(0, 3, 1)), (M(r, 4), _idx(2)[0]),
                (M(r, 2, 4, 3), _idx([0, 1, 3], [2, 2, 0]))]
    if kind == "sign":
        return [(M(r, 2, 3), np.sign(M(r, 2, 3)))]
    if kind == "multilabel":
        return [(M(r, 2, 3), (M(r, 2, 3) > 0).astype(np.float64))]
    raise KeyError(kind)


def losses(kind, invalid=True, extra=(), **kw):
    def g(r):
        out = []
        for red in ("mean", "sum", "none"):
            for x, y in _loss_inputs(r, kind):
                out.append(Sample(x, y, *extra, reduction=red, **kw))
        if invalid:
            out.append(Sample(M(r, 2, 3), M(r, 5), *extra,
                              desc="invalid: shapes", **kw))
        return out
    return g


for n in "mse_loss l1_loss smooth_l1_loss huber_loss".split():
    add("F." + n, losses("regress"))
add("F.soft_margin_loss", losses("sign"))
add("F.kl_div", losses("regress", log_target=False))
add("F.poisson_nll_loss", losses("regress"))
add("F.binary_cross_entropy", losses("prob"))
add("F.binary_cross_entropy_with_logits", losses("regress"))
add("F.cross_entropy", losses("class", invalid=False))
add("F.cross_entropy.smoothing", losses("class", invalid=False,
                                        label_smoothing=0.1),
    call=lambda lib, *a, **k: lib.nn.functional.cross_entropy(*a, **k))
add("F.cross_entropy.probs", lambda r: [
    Sample(M(r, 3, 4), rand(r, 3, 4, lo=0, hi=1))],
    call=lambda lib, *a, **k: lib.nn.functional.cross_entropy(*a, **k))
add("F.nll_loss", losses("class", invalid=False))
add("F.multi_margin_loss", lambda r: [Sample(M(r, 3, 4), _idx(0, 3, 1))])
add("F.multilabel_soft_margin_loss", losses("multilabel"))
add("F.hinge_embedding_loss", losses("sign"))
add("F.gaussian_nll_loss", lambda r: [
    Sample(M(r, 2, 3), M(r, 2, 3), rand(r, 2, 3, lo=0.1, hi=1))])
add("F.margin_ranking_loss", lambda r: [
    Sample(M(r, 3), M(r, 3), np.sign(M(r, 3)))])
add("F.cosine_embedding_loss", lambda r: [
    Sample(M(r, 3, 4), M(r, 3, 4), np.sign(M(r, 3)))])
add("F.triplet_margin_loss", shapes((3, 4), (3, 4), (3, 4)))
add("F.ctc_loss", lambda r: [Sample(
    np.log(np.full((5, 2, 4), 0.25)), _idx([1, 2], [3, 3]), _idx(5, 5),
    _idx(2, 1))], gradgrad=False)
add("F.gumbel_softmax", shapes((2, 3)), values=False, grad=False)
add("F.multi_head_attention_forward", lambda r: [Sample(
    M(r, 3, 1, 4), M(r, 3, 1, 4), M(r, 3, 1, 4), 4, 2, M(r, 12, 4),
    M(r, 12), None, None, False, 0.0, M(r, 4, 4), M(r, 4))],
    gradgrad=False)


# ---- nn modules: constructor kwargs + input shapes
def mod(name, ctor, *inputs, samples=None, train=True, **kw):
    """An nn.<name> entry: one sample per input tuple (shapes or arrays)."""
    def g(r):
        out = []
        for inp in inputs:
            out.append(Sample(*[rand(r, *i) if isinstance(i, tuple) else i
                                for i in inp], ctor=ctor))
        return out + (samples(r) if samples else [])
    add("nn." + name, g, train=train, **kw)


for n in ("ReLU Tanh Sigmoid GELU SiLU Mish ELU Softplus LeakyReLU ReLU6 "
          "Hardtanh Hardswish Hardsigmoid LogSigmoid Identity "
          "Flatten").split():
    mod(n, {}, [(2, 3)], [(0, 3)], [BOUND.copy()])
mod("PReLU", {}, [(2, 3)])
mod("Threshold", dict(threshold=0.1, value=-1.0), [(2, 3)])
for n in "Softmax LogSoftmax Softmin".split():
    mod(n, dict(dim=1), [(2, 3)], [np.array([[0., INF, -INF]])])
mod("Linear", dict(in_features=3, out_features=2), [(4, 3)], [(3,)],
    [(0, 3)], [(2, 5)], [As(rand(np.random.default_rng(0), 2, 3),
                            "bfloat16")], [np.ones((2, 3), np.float32)])
mod("Bilinear", dict(in1_features=2, in2_features=3, out_features=2),
    [(4, 2), (4, 3)])
mod("Conv1d", dict(in_channels=2, out_channels=3, kernel_size=2),
    [(1, 2, 5)], [(2, 5)])
mod("Conv2d", dict(in_channels=2, out_channels=3, kernel_size=3, padding=1),
    [(1, 2, 4, 4)], [(1, 3, 4, 4)], [INTS.reshape(1, 2, 3, 1)[:, :, :1]],
    [As(rand(np.random.default_rng(0), 1, 2, 3, 3), "bfloat16")])
mod("Conv3d", dict(in_channels=1, out_channels=2, kernel_size=2),
    [(1, 1, 3, 3, 3)])
mod("ConvTranspose1d", dict(in_channels=2, out_channels=3, kernel_size=2,
                            stride=2), [(1, 2, 3)])
mod("ConvTranspose2d", dict(in_channels=2, out_channels=3, kernel_size=3,
                            stride=2, padding=1), [(1, 2, 3, 3)])
mod("MaxPool2d", dict(kernel_size=3, stride=2, padding=1), [(1, 2, 5, 5)],
    [POOL_TIES.copy()])
mod("MaxPool1d", dict(kernel_size=2), [(1, 2, 5)])
mod("AvgPool2d", dict(kernel_size=2), [(1, 2, 4, 4)])
mod("AvgPool1d", dict(kernel_size=2), [(1, 2, 4)])
mod("AdaptiveAvgPool2d", dict(output_size=(2, 2)), [(1, 2, 5, 4)])
mod("AdaptiveAvgPool1d", dict(output_size=2), [(1, 2, 5)])
mod("AdaptiveMaxPool2d", dict(output_size=(2, 2)), [(1, 2, 5, 4)])
mod("Upsample", dict(scale_factor=2), [(1, 2, 3, 3)])
mod("PixelShuffle", dict(upscale_factor=2), [(1, 4, 2, 2)])
mod("Unflatten", dict(dim=1, unflattened_size=(2, 3)), [(2, 6)])
for n, c in [("ZeroPad2d", dict(padding=1)),
             ("ConstantPad2d", dict(padding=1, value=2.0)),
             ("ReflectionPad2d", dict(padding=1)),
             ("ReplicationPad2d", dict(padding=1))]:
    mod(n, c, [(1, 2, 3, 3)])
for n, c, shp in [("BatchNorm1d", 3, [(4, 3)]), ("BatchNorm2d", 2,
                                                 [(2, 2, 3, 3)]),
                  ("BatchNorm3d", 2, [(2, 2, 2, 2, 2)])]:
    mod(n, dict(num_features=c), *shp, [np.ones(shp[0])])
mod("BatchNorm2d.bf16", dict(num_features=2), [As(rand(
    np.random.default_rng(1), 2, 2, 3, 3), "bfloat16")],
    call=lambda lib, x: _bn_float32(lib)(x), autocast=False)
mod("LayerNorm", dict(normalized_shape=3), [(2, 3)], [np.ones((2, 3))])
mod("GroupNorm", dict(num_groups=2, num_channels=4), [(2, 4, 3)])
mod("InstanceNorm2d", dict(num_features=2), [(2, 2, 3, 3)])
mod("Dropout", dict(p=0.0), [(2, 3)])
for n in "Dropout1d Dropout2d AlphaDropout".split():
    mod(n, dict(p=0.5), [(2, 3, 4)], train=False)
mod("Embedding", dict(num_embeddings=4, embedding_dim=2), [_idx(0, 3, 3)],
    [_idx(4)])
mod("EmbeddingBag", dict(num_embeddings=4, embedding_dim=2),
    [_idx([0, 3], [3, 1])])
for n in "RNN LSTM GRU".split():
    mod(n, dict(input_size=3, hidden_size=2), [(4, 1, 3)], [(4, 3)],
        gradgrad=False)
for n in "RNNCell LSTMCell GRUCell".split():
    mod(n, dict(input_size=3, hidden_size=2), [(1, 3)], [(3,)])
mod("MultiheadAttention", dict(embed_dim=4, num_heads=2),
    [(3, 1, 4), (3, 1, 4), (3, 1, 4)], gradgrad=False)
mod("TransformerEncoderLayer", dict(d_model=4, nhead=2, dim_feedforward=8,
                                    dropout=0.0), [(3, 1, 4)],
    gradgrad=False)
mod("TransformerDecoderLayer", dict(d_model=4, nhead=2, dim_feedforward=8,
                                    dropout=0.0), [(3, 1, 4), (2, 1, 4)],
    gradgrad=False)
mod("Transformer", dict(d_model=4, nhead=2, num_encoder_layers=1,
                        num_decoder_layers=1, dim_feedforward=8,
                        dropout=0.0), [(3, 1, 4), (2, 1, 4)],
    gradgrad=False, inplace=False)
for n in ("MSELoss L1Loss SmoothL1Loss HuberLoss SoftMarginLoss "
          "BCEWithLogitsLoss PoissonNLLLoss KLDivLoss "
          "MultiLabelSoftMarginLoss HingeEmbeddingLoss").split():
    mod(n, {}, [(2, 3), (2, 3)])
mod("BCELoss", {}, [rand(np.random.default_rng(0), 2, 3, lo=0.1, hi=0.9),
                    rand(np.random.default_rng(1), 2, 3, lo=0, hi=1)])
for n in "CrossEntropyLoss NLLLoss MultiMarginLoss".split():
    mod(n, {}, [(3, 4), _idx(0, 3, 1)])
mod("GaussianNLLLoss", {}, [(2, 3), (2, 3), rand(np.random.default_rng(0),
                                                  2, 3, lo=0.1, hi=1)])
mod("MarginRankingLoss", {}, [(3,), (3,), np.array([1., -1., 1.])])
mod("CosineEmbeddingLoss", {}, [(3, 4), (3, 4), np.array([1., -1., 1.])])
mod("TripletMarginLoss", {}, [(3, 4), (3, 4), (3, 4)])
mod("CosineSimilarity", {}, [(2, 3), (2, 3)])
mod("PairwiseDistance", {}, [(2, 3), (2, 3)])
mod("CTCLoss", {}, [np.log(np.full((5, 2, 4), 0.25)), _idx([1, 2], [3, 3]),
                    _idx(5, 5), _idx(2, 1)], gradgrad=False)


def _bn_float32(lib):
    """A float32 BatchNorm2d (torch's initial weights): item 5's bfloat16
    input with float32 parameters."""
    torch.manual_seed(0)
    return lib.nn.BatchNorm2d(2)


# Sequential (and item 4's MaxPool2d -> ReLU(inplace=True)) built by hand
def _pool_relu(lib, x):
    m = lib.nn.Sequential(lib.nn.MaxPool2d(3, stride=2, padding=1),
                          lib.nn.ReLU(inplace=True))
    return m(x)


add("nn.Sequential", lambda r: [Sample(rand(r, 1, 2, 5, 5)),
                                Sample(POOL_TIES.copy())],
    call=_pool_relu)
add("nn.ReLU.inplace", lambda r: [Sample(rand(r, 2, 3))], nonleaf=True,
    call=lambda lib, x: lib.nn.ReLU(inplace=True)(x))
add("nn.Linear.float32", lambda r: [
    Sample(As(rand(r, 2, 3), "bfloat16"), desc="invalid: bf16 input"),
    Sample(rand(r, 2, 3), desc="invalid: float64 input")],
    call=lambda lib, x: lib.nn.Linear(3, 2)(x), values=False)
add("nn.Conv2d.bias_dtype", lambda r: [Sample(
    INTS.reshape(1, 1, 2, 3).copy(), grad=False)],
    call=lambda lib, x: lib.nn.Conv2d(1, 1, 1)(x))


# ---- nn.init (in place on a tensor; the deterministic ones by value)
for n in ("zeros_ ones_ constant_ eye_ dirac_ xavier_uniform_ "
          "xavier_normal_ kaiming_uniform_ kaiming_normal_ normal_ "
          "uniform_ orthogonal_ trunc_normal_ sparse_").split():
    extra = {"constant_": (0.5,), "sparse_": (0.5,)}.get(n, ())
    shp = (2, 2, 3) if n == "dirac_" else (3, 3)
    add("nn.init." + n, lambda r, shp=shp, extra=extra: [
        Sample(rand(r, *shp), *extra, grad=False),
        Sample(rand(r, 3), *extra, grad=False, desc="1-d")], grad=False,
        values=n in ("zeros_", "ones_", "constant_", "eye_", "dirac_"))
add("nn.init.calculate_gain", args(("relu",), ("leaky_relu", 0.2),
                                   ("tanh",), ("bogus",)), grad=False)

# ---- linalg (issue 25 item 11, another branch): dormant until
# dtorch.linalg exists, then swept like the rest. One line per op.
def _spd(r):
    a = rand(r, 3, 3)
    return a @ a.T + 3 * np.eye(3)


if hasattr(dtorch, "linalg"):
    add("linalg.vector_norm", gen(reduction))
    add("linalg.matrix_norm", lambda r: [Sample(M(r, 3, 3)),
                                         Sample(M(r, 2, 3, 3), ord=1)])
    add("linalg.norm", lambda r: [Sample(M(r, 3)), Sample(M(r, 3, 3))])
    for n in "inv det slogdet cholesky eigvalsh matrix_exp".split():
        add("linalg." + n, lambda r: [Sample(_spd(r)),
                                      Sample(M(r, 2, 3), desc="invalid")])
    add("linalg.solve", lambda r: [Sample(_spd(r), M(r, 3, 2))])
    add("linalg.qr", lambda r: [Sample(M(r, 4, 3))])
    add("linalg.svdvals", lambda r: [Sample(M(r, 4, 3))])
    add("linalg.pinv", lambda r: [Sample(M(r, 4, 3))])
    add("linalg.cross", lambda r: [Sample(M(r, 2, 3), M(r, 2, 3))])
    add("linalg.vecdot", lambda r: [Sample(M(r, 2, 3), M(r, 2, 3))])
    add("linalg.multi_dot", lambda r: [Sample([M(r, 2, 3), M(r, 3, 4),
                                               M(r, 4, 2)])])


# ---- distributed queries before init_process_group (item 21)
for n in ("get_rank get_world_size is_initialized is_available "
          "get_backend").split():
    add("distributed." + n, args(()), grad=False)


# ---------------------------------------------- names that are not ops
# Every name of tests/core/test_api_coverage.py's TORCH / TENSOR / NN /
# FUNCTIONAL lists is either an entry above or here, with the reason it is
# not swept (a test elsewhere covers it).
NOT_OPS = {
    "dtypes and dtype objects (tests/core/test_reduced_precision_dtypes.py)":
        "float32 float64 int64 bool float16 bfloat16 int32 uint8 int8 int16 "
        "half double int short long float dtype finfo iinfo",
    "grad modes and autograd API (tests/core/test_autograd*.py)":
        "no_grad set_grad_enabled inference_mode is_grad_enabled enable_grad "
        "autograd.grad autograd.Function autograd.backward "
        "autograd.gradcheck autograd.set_detect_anomaly "
        "autograd.detect_anomaly autograd.Variable "
        "autograd.functional.jacobian autograd.gradgradcheck "
        "autograd.functional.hessian autograd.functional.vjp "
        "autograd.functional.jvp autograd.functional.hvp "
        "autograd.functional.vhp Tensor.backward Tensor.retain_grad "
        "Tensor.register_hook Tensor.requires_grad_",
    "RNG state (tests/examples/test_seed_programs.py, core/test_cuda_rng.py)":
        "manual_seed Generator seed initial_seed get_rng_state set_rng_state "
        "default_generator random.manual_seed random.seed "
        "random.get_rng_state random.set_rng_state",
    "files (tests/serialization/)":
        "save load serialization.safe_globals",
    "devices, backends, threads, settings (tests/core/test_ops_on_devices.py, "
    "core/test_api_behaviour.py)":
        "device cuda.is_available Tensor Size get_default_dtype "
        "set_default_dtype contiguous_format channels_last preserve_format "
        "memory_format get_num_threads set_num_threads "
        "use_deterministic_algorithms are_deterministic_algorithms_enabled "
        "set_printoptions compile backends.cudnn.benchmark "
        "backends.cudnn.deterministic backends.cudnn.allow_tf32 "
        "backends.cuda.matmul.allow_tf32 backends.mps.is_available "
        "backends.cudnn.enabled backends.mps.is_built "
        "accelerator.is_available accelerator.current_accelerator "
        "accelerator.device_count cuda.device_count cuda.manual_seed "
        "cuda.manual_seed_all cuda.empty_cache cuda.synchronize "
        "cuda.current_device cuda.set_device cuda.get_device_name "
        "cuda.memory_allocated cuda.max_memory_allocated "
        "cuda.is_bf16_supported Tensor.cuda Tensor.data_ptr Tensor.is_xpu "
        "is_autocast_enabled get_autocast_dtype "
        "is_deterministic_algorithms_warn_only_enabled",
    "linear algebra outside linalg.* (tests/core/test_linalg.py, against torch; "
    "the linalg.* entries here)":
        "Tensor.cholesky Tensor.cholesky_inverse Tensor.cholesky_solve "
        "Tensor.det Tensor.inverse Tensor.logdet Tensor.matrix_exp "
        "Tensor.matrix_power Tensor.pinverse Tensor.qr Tensor.slogdet "
        "Tensor.svd cholesky cholesky_inverse cholesky_solve det inverse "
        "logdet matrix_exp matrix_power pinverse qr slogdet svd",
    "sparse COO tensors and layouts (tests/core/test_sparse.py)":
        "Tensor._nnz Tensor.coalesce Tensor.dense_dim Tensor.indices "
        "Tensor.is_coalesced Tensor.layout Tensor.sparse_dim Tensor.to_dense "
        "Tensor.to_sparse Tensor.values layout sparse.addmm sparse.mm "
        "sparse.sum sparse_coo sparse_coo_tensor spmm strided",
    "memory: checkpointing, saved-tensor hooks, CUDA pool statistics "
    "(tests/core/test_activation_checkpoint.py, tools/test_memory*.py)":
        "autograd.graph.save_on_cpu autograd.graph.saved_tensors_hooks "
        "utils.checkpoint.CheckpointPolicy "
        "utils.checkpoint.checkpoint_sequential "
        "utils.checkpoint.create_selective_checkpoint_contexts "
        "cuda.max_memory_reserved cuda.memory_reserved cuda.memory_stats "
        "cuda.reset_peak_memory_stats",
    "processes and tools (tests/data/, tools/test_summary.py)":
        "multiprocessing.spawn multiprocessing.Process multiprocessing.Queue "
        "multiprocessing.set_start_method multiprocessing.get_context "
        "multiprocessing.cpu_count utils.tensorboard.SummaryWriter "
        "utils.checkpoint.checkpoint",
    "legacy typed tensors and distributions "
    "(tests/core/test_distributions_legacy.py)":
        "LongTensor FloatTensor distributions.Categorical "
        "distributions.Normal distributions.Bernoulli "
        "distributions.kl_divergence",
    "containers and parameters (tests/nn/test_nn_module.py)":
        "nn.Module nn.ModuleList nn.ModuleDict nn.ParameterList "
        "nn.ParameterDict nn.Parameter nn.Buffer",
    "whole-module wrappers and utilities (tests/nn/test_nn_utils_rnn.py, "
    "nn/test_nn_weight_spectral_norm.py, distributed/test_ddp.py, "
    "distributed/test_clip_grad_norm_global.py)":
        "nn.SyncBatchNorm nn.TransformerEncoder nn.TransformerDecoder "
        "nn.utils.clip_grad_norm_ nn.utils.clip_grad_value_ "
        "nn.utils.parameters_to_vector nn.utils.vector_to_parameters "
        "nn.utils.rnn.pad_sequence nn.utils.rnn.pack_padded_sequence "
        "nn.utils.rnn.pad_packed_sequence nn.utils.rnn.pack_sequence "
        "nn.utils.weight_norm nn.utils.spectral_norm "
        "nn.utils.parametrizations.weight_norm "
        "nn.parallel.DistributedDataParallel nn.DataParallel "
        "nn.modules.linear.NonDynamicallyQuantizableLinear "
        "nn.modules.module.Module nn.modules.conv.Conv2d "
        "nn.modules.activation.MultiheadAttention "
        "nn.modules.batchnorm._BatchNorm nn.modules.loss._Loss "
        "nn.modules.transformer.TransformerEncoderLayer",
}


def table_names():
    """The api-coverage spelling of every name the table sweeps."""
    out = set()
    for name in TABLE:
        base = name.split(".")
        if base[0] in ("F",):
            out.add("F." + base[1])
        elif base[0] == "nn" and base[1] == "init":
            out.add("nn.init." + base[2])
        elif base[0] in ("nn", "Tensor", "distributed"):
            out.add(base[0] + "." + base[1])
        elif base[0] != "operator":
            out.add(base[0])
    return out


# ----------------------------------------------------------- the checks

TOL = {"float64": (1e-7, 1e-9), "float32": (1e-5, 1e-6),
       "float16": (1e-2, 1e-3), "bfloat16": (2e-2, 1e-2)}


def dname(dt):
    return str(dt).rpartition(".")[2]


def oracle_unavailable(exc):
    """True when torch raised for a reason of this CPU (a oneDNN/bf16 kernel
    the CPU lacks), not of the op: then there is nothing to compare.
    Point this at the shared helper of tests/ (branch trust-infra) when it
    lands."""
    text = str(exc).lower()
    return any(w in text for w in ("onednn", "mkldnn", "avx512", "avx-512",
                                   "cpu does not support", "dnnl"))


def _flat(x):
    if isinstance(x, (list, tuple)) and not isinstance(
            x, (torch.Size, dtorch.Size)):
        out = []
        for v in x:
            out += _flat(v)
        return out
    return [x]


def _np(t):
    t = t.detach()
    if isinstance(t, torch.Tensor):
        if t.is_floating_point():
            t = t.to(torch.float64)
        return np.asarray(t.numpy(force=True))
    if t.is_floating_point():
        t = t.to(dtorch.float64)
    return np.asarray(t.cpu().numpy())


def _is_tensor(x):
    return isinstance(x, (torch.Tensor, dtorch.Tensor))


def _plain(x):
    """A non-tensor result as a comparable Python value."""
    if isinstance(x, (torch.dtype, dtorch.dtype)):
        return ("dtype", dname(x))
    if isinstance(x, (torch.device, dtorch.device)):
        return ("device", str(x))
    if isinstance(x, (torch.Size, dtorch.Size)):
        return tuple(x)
    if isinstance(x, np.ndarray):
        return ("array", x.dtype.str, x.shape, x.tolist())
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    return ("object", type(x).__name__)


def _same_plain(a, b):
    if isinstance(a, float) and isinstance(b, float):
        return (a == b) or (a != a and b != b) or abs(a - b) <= 1e-7 * abs(a)
    if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b):
        return all(_same_plain(x, y) for x, y in zip(a, b))
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return all(_same_plain(x, y) for x, y in zip(a, b))
    if type(a) is bool or type(b) is bool:
        return type(a) is type(b) and a == b
    return a == b


def close(a, b, dtype, exact=False):
    """nan-aware comparison of two arrays (a from torch, b from dtorch)."""
    if a.shape != b.shape:
        return False
    if exact or a.dtype.kind in "biu":
        return np.array_equal(a, b, equal_nan=a.dtype.kind == "f")
    rtol, atol = TOL.get(dtype, (1e-7, 1e-9))
    with np.errstate(invalid="ignore"):
        return bool(np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True))


def _raised(te, de):
    """Which side raised, and the first one's error."""
    side = lambda e: "raises" if e is not None else "passes"  # noqa: E731
    return (f"torch {side(te)}, dtorch {side(de)}: "
            f"{te if te is not None else de!r}")[:300]


def _diff(a, b):
    """Where two arrays of one shape differ: torch's and dtorch's values at
    the first few differing positions (of the sample's flat order)."""
    a, b = np.asarray(a).ravel(), np.asarray(b).ravel()
    if a.shape != b.shape:
        return f"shape {a.shape} vs {b.shape}"
    with np.errstate(invalid="ignore"):
        same = (a == b) | ((a != a) & (b != b))
    idx = np.flatnonzero(~same)[:4]
    return "at " + ", ".join(f"[{i}] {a[i]!r} vs {b[i]!r}" for i in idx)


class Report:
    """Mismatches (op, kind, sample, detail) and the count of checks run."""

    def __init__(self):
        self.mismatches = []
        self.checks = Counter()
        self.unavailable = []

    def check(self, ok, op, kind, sample, detail=""):
        self.checks[kind] += 1
        if not ok:
            self.mismatches.append((op, kind, repr(sample), detail))
        return ok

    def keys(self):
        return {(m[0], m[1]) for m in self.mismatches}

    def by_kind(self):
        return Counter(m[1] for m in self.mismatches)


def attempt(f):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return f(), None
    except Exception as e:          # noqa: BLE001 - compared, not hidden
        return None, e


def compare_outputs(rep, op, s, tout, dout, kinds=("value", "dtype",
                                                   "requires_grad")):
    tf, df = _flat(tout), _flat(dout)
    if not rep.check(len(tf) == len(df), op.name, "structure", s,
                     f"{len(tf)} outputs vs {len(df)}"):
        return
    for a, b in zip(tf, df):
        if _is_tensor(a):
            if not rep.check(isinstance(b, dtorch.Tensor), op.name, "value",
                             s, f"torch tensor, dtorch {type(b).__name__}"):
                continue
            if "dtype" in kinds:
                rep.check(dname(a.dtype) == dname(b.dtype), op.name,
                          "dtype", s, f"{a.dtype} vs {b.dtype}")
            if "requires_grad" in kinds:
                rep.check((a.requires_grad, a.grad_fn is None)
                          == (b.requires_grad, b.grad_fn is None), op.name,
                          "requires_grad", s,
                          f"torch {a.requires_grad}/{a.grad_fn is not None}"
                          f" dtorch {b.requires_grad}/"
                          f"{b.grad_fn is not None}")
            if "value" in kinds:
                ta, db = _np(a), _np(b)
                ok = tuple(a.shape) == tuple(b.shape) and (
                    not op.values or close(ta, db, dname(a.dtype)))
                rep.check(ok, op.name, "value", s,
                          f"shape {tuple(a.shape)} vs {tuple(b.shape)}"
                          if ta.shape != db.shape else _diff(ta, db))
        elif "value" in kinds:
            pa, pb = _plain(a), _plain(b)
            rep.check(not op.values or _same_plain(pa, pb), op.name, "value",
                      s, f"{pa!r} vs {pb!r}"[:200])


def _diff_outputs(out):
    return [i for i, o in enumerate(_flat(out))
            if _is_tensor(o) and o.requires_grad and o.is_floating_point()]


def _cotangents(outs, lib):
    r = np.random.default_rng(7)
    return [lib.tensor(r.uniform(-1, 1, size=tuple(o.shape)))
            .to(o.dtype) for o in outs]


def _grads(lib, out, leaves, idx, create_graph=False):
    outs = [_flat(out)[i] for i in idx]
    return lib.autograd.grad(outs, leaves, _cotangents(outs, lib),
                             allow_unused=True, create_graph=create_graph)


def _as_np(g, leaf):
    if g is None:
        return np.zeros(tuple(leaf.shape))
    return _np(g)


def check_grads(rep, op, s, t, d):
    """First order, create_graph bitwise, second order."""
    (tout, tl, _), (dout, dl, _) = t, d
    idx = _diff_outputs(tout)
    if not idx or not tl:
        return
    tg, te = attempt(lambda: _grads(torch, tout, tl, idx))
    dg, de = attempt(lambda: _grads(dtorch, dout, dl, idx))
    if not rep.check((te is None) == (de is None), op.name, "grad", s,
                     _raised(te, de)):
        return
    if te is not None:
        return
    bad = [i for i, (a, b, lf) in enumerate(zip(tg, dg, tl))
           if not close(_as_np(a, lf), _as_np(b, lf), dname(lf.dtype))]
    rep.check(not bad, op.name, "grad", s,
              f"leaf {bad}: " + _diff(_as_np(tg[bad[0]], tl[bad[0]]),
                                      _as_np(dg[bad[0]], tl[bad[0]]))
              if bad else "")
    # create_graph=True must give the same first-order gradients, bitwise
    d2 = op.run(dtorch, s)
    dgc, dce = attempt(lambda: _grads(dtorch, d2[0], d2[1], idx, True))
    same = dce is None and all(
        np.array_equal(_as_np(a, lf), _as_np(b, lf), equal_nan=True)
        for a, b, lf in zip(dg, dgc, dl))
    rep.check(same, op.name, "create_graph", s,
              repr(dce)[:200] if dce else "first-order grads differ")
    if not op.gradgrad or dce is not None or any(
            lf.dtype != torch.float64 for lf in tl):
        return
    t2 = op.run(torch, s)
    tgc = _grads(torch, t2[0], t2[1], idx, True)

    def second(lib, gs, leaves):
        # one random weight per leaf, whichever gradients require grad
        r = np.random.default_rng(11)
        ws = [r.uniform(-1, 1, size=tuple(lf.shape)) for lf in leaves]
        terms = [(g * lib.tensor(w)).sum() for g, w in zip(gs, ws)
                 if g is not None and g.requires_grad]
        if not terms:
            return None
        return lib.autograd.grad(sum(terms), leaves, allow_unused=True)
    tgg, te = attempt(lambda: second(torch, tgc, t2[1]))
    dgg, de = attempt(lambda: second(dtorch, dgc, d2[1]))
    if te is not None or tgg is None:
        return              # torch's first derivative is constant
    if not rep.check(de is None and dgg is not None, op.name, "gradgrad", s,
                     f"dtorch: {de!r}"[:200] if de else
                     "dtorch's gradient is not differentiable"):
        return
    bad = [i for i, (a, b, lf) in enumerate(zip(tgg, dgg, tl))
           if not close(_as_np(a, lf), _as_np(b, lf), "float64")]
    rep.check(not bad, op.name, "gradgrad", s,
              f"leaf {bad}: " + _diff(_as_np(tgg[bad[0]], tl[bad[0]]),
                                      _as_np(dgg[bad[0]], tl[bad[0]]))
              if bad else "")


def _bump(t):
    with_grad = t.requires_grad
    t.add_(1.0) if t.is_floating_point() else t.add_(1)
    return with_grad


def check_inplace(rep, op, s):
    """An in-place op on the output, then on a non-leaf input, after the
    forward: backward (or the in-place op itself) raises iff in torch."""
    for where in ("inplace_out", "inplace_in"):
        res = {}
        for lib in (torch, dtorch):
            def go(bump=True):
                out, leaves, inputs = op.run(lib, s, nonleaf=True)
                idx = _diff_outputs(out)
                if not idx:
                    return "no grad"
                if not bump:
                    pass
                elif where == "inplace_out":
                    _bump(_flat(out)[idx[0]])
                else:
                    floats = [t for t in inputs if t.is_floating_point()]
                    if not floats:
                        return "no input"
                    _bump(floats[0])
                return [_as_np(g, lf) for g, lf in
                        zip(_grads(lib, out, leaves, idx), leaves)]
            res[lib.__name__] = attempt(go)
        (tr, te), (dr, de) = res["torch"], res["dtorch"]
        if isinstance(tr, str):
            continue
        if isinstance(dr, str):     # torch's output is in the graph only
            rep.check(False, op.name, where, s, f"dtorch: {dr}")
            continue
        rep.check((te is None) == (de is None), op.name, where, s,
                  _raised(te, de))
        if de is None and te is None:
            # both accept it: the gradients after the in-place op agree
            bad = [i for i, (a, b) in enumerate(zip(tr, dr))
                   if not close(a, b, "float64")]
            rep.check(not bad, op.name, "inplace_grad", s,
                      f"{where}: leaf {bad}: " + _diff(tr[bad[0]], dr[bad[0]])
                      if bad else "")
        if de is None and te is not None:
            # dtorch lets it pass: its gradient must still be the one of
            # the values forward saw (else the change corrupted it)
            clean = go(bump=False)
            rep.check(all(np.array_equal(a, b, equal_nan=True)
                          for a, b in zip(dr, clean)), op.name,
                      "inplace_silent", s, "the in-place change altered "
                      "dtorch's gradient")


def check_autocast(rep, op, s):
    """The output dtypes under CPU bfloat16 autocast, on float32 inputs
    (the lower-precision list) and on bfloat16 ones (the float32 list)."""
    for cast in ("float32", "bfloat16"):
        _autocast_dtypes(rep, op, s, cast)


def _autocast_dtypes(rep, op, s, cast):
    def go(lib):
        with lib.autocast("cpu", dtype=lib.bfloat16):
            return op.run(lib, s, cast=cast)[0]
    tout, te = attempt(lambda: go(torch))
    if te is not None and oracle_unavailable(te):
        rep.unavailable.append((op.name, repr(te)[:200]))
        return
    dout, de = attempt(lambda: go(dtorch))
    if not rep.check((te is None) == (de is None), op.name, "autocast", s,
                     f"{cast} inputs: " + _raised(te, de)) \
            or te:
        return
    tf, df = _flat(tout), _flat(dout)
    rep.check([dname(a.dtype) if _is_tensor(a) else None for a in tf]
              == [dname(b.dtype) if _is_tensor(b) else None for b in df],
              op.name, "autocast", s,
              f"{cast} inputs: {[getattr(a, 'dtype', None) for a in tf]} vs "
              f"{[getattr(b, 'dtype', None) for b in df]}"[:200])


def run_op(op, rep):
    """Every check of one entry over all its samples."""
    did_inplace = did_autocast = False
    for s in op.samples():
        t, te = attempt(lambda: op.run(torch, s))
        d, de = attempt(lambda: op.run(dtorch, s))
        if not rep.check((te is None) == (de is None), op.name, "error", s,
                         _raised(te, de)):
            continue
        if te is not None:
            continue
        compare_outputs(rep, op, s, t[0], d[0])
        if op.grad:
            check_grads(rep, op, s, t, d)
        if op.inplace and op.grad and not did_inplace and t[1] \
                and _diff_outputs(t[0]):
            did_inplace = True
            check_inplace(rep, op, s)
        if op.autocast and not did_autocast and any(
                lf.dtype == torch.float64 for lf in t[1][:len(t[2])]):
            did_autocast = True
            check_autocast(rep, op, s)


def sweep(names=None):
    rep = Report()
    for name, op in TABLE.items():
        if names is None or name in names:
            _, e = attempt(lambda: run_op(op, rep))
            # a harness failure is a mismatch too: it fails the test
            rep.check(e is None, name, "sweep_error", "", repr(e)[:300])
    return rep


def family(name):
    """The pytest parameter an entry runs under."""
    head = name.split(".")[0]
    if head in ("F", "nn", "distributed", "Tensor", "linalg"):
        return head
    return "torch"


def summary(rep):
    lines = [f"ops: {len(TABLE)}  checks: {sum(rep.checks.values())}  "
             f"mismatches: {len(rep.mismatches)}  "
             f"(op, kind) pairs: {len(rep.keys())}"]
    lines.append("checks by kind: " + ", ".join(
        f"{k} {v}" for k, v in sorted(rep.checks.items())))
    lines.append("mismatches by kind: " + ", ".join(
        f"{k} {v}" for k, v in sorted(rep.by_kind().items())))
    lines.append(f"oracle unavailable: {len(rep.unavailable)}")
    return "\n".join(lines)


if __name__ == "__main__":
    import sys
    import time
    t0 = time.process_time()
    rep = sweep(set(sys.argv[1:]) or None)
    print(summary(rep))
    print(f"cpu: {time.process_time() - t0:.1f} s")
    for m in sorted(rep.mismatches):
        print(" | ".join(m)[:400])
