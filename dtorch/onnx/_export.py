"""The tracer and the graph builder behind ``dtorch.onnx.export``.

Tracing replaces ``Function.apply`` for the duration of one forward pass
(restored in ``finally``; nothing is hooked while no export runs), so every
op is seen with its full arguments, not only what its backward saved. A
tensor is *dynamic* when it is a graph input or the output of a recorded
op; an op whose tensor arguments are all constant is not recorded, and its
output (whose value tracing computed) becomes an initializer when a
dynamic op uses it. Forward pre/post hooks on every submodule keep the
path of the module running, for the error an untranslatable op raises.
"""
import threading
import warnings

import numpy as np

from ..autograd.function import Function, TensorBase
from . import _state
from ._ops import CONVERTERS
from ._values import Const, Value, _onnx_type, _to_numpy
from .errors import OnnxExporterError, UnsupportedOperatorError

_NO_EFFECT = ("export_params", "do_constant_folding", "verbose", "training",
              "keep_initializers_as_inputs", "operator_export_type",
              "custom_opsets", "export_modules_as_functions", "dynamo",
              "external_data", "report", "optimize", "verify",
              "autograd_inlining", "kwargs")
_warned = set()

MIN_OPSET, MAX_OPSET = 17, 20


def _require_onnx():
    try:
        import onnx
    except ImportError:
        raise ImportError(
            "dtorch.onnx.export needs the 'onnx' package: install it with "
            "`pip install -e '.[onnx]'` in the dtorch clone (the 'onnx' "
            "extra)") from None
    return onnx


class Builder:
    """Accumulates nodes and initializers; hands out unique names."""

    def __init__(self, onnx, opset):
        self.onnx, self.helper, self.opset = onnx, onnx.helper, opset
        self.nodes, self.inits = [], {}
        self._n = 0
        self._const_cache = {}       # id(array) -> (array, name)
        self.param_names = {}        # id(tensor) -> state_dict name

    def fresh(self, hint="v"):
        self._n += 1
        return f"/{hint}_{self._n}"

    def node(self, op_type, inputs, n_out=1, **attrs):
        outs = [self.fresh(op_type) for _ in range(n_out)]
        self.nodes.append(self.helper.make_node(
            op_type, list(inputs), outs, name=self.fresh(op_type + "_node"),
            **attrs))
        return outs[0] if n_out == 1 else outs

    def const(self, value, dtype=None, name=None, key=None):
        """An initializer holding ``value``; the same array object (a
        parameter used twice, a tied weight) is stored once."""
        arr = np.asarray(_to_numpy(value))
        if dtype is not None:
            arr = arr.astype(dtype, copy=False)
        k = key if key is not None else (id(value) if isinstance(
            value, np.ndarray) and dtype is None else None)
        if k is not None and k in self._const_cache:
            return self._const_cache[k][1]
        name = name or self.fresh("const")
        self.inits[name] = self.onnx.numpy_helper.from_array(
            np.ascontiguousarray(arr), name)
        if k is not None:
            self._const_cache[k] = (value, name)
        return name

    def ints(self, values):
        return self.const(np.asarray(values, np.int64))


class Tracer:
    def __init__(self, builder):
        self.b = builder
        self.by_fn = {}          # id(grad_fn) -> Value
        self.by_tensor = {}      # id(tensor) -> (Value, version)
        self.dyn_arrays = {}     # id(array) -> (tensor, Value) of dynamic ones
        self.keep = []           # keeps traced objects alive: ids stay unique
        self.modules = []        # (path, module) stack
        self.thread = threading.get_ident()
        self.depth = 0
        self.producer = {}       # Value name -> (cls, args, kwargs)
        self.log, self.log_consts = [], []

    # ------------------------------------------------------------ values --
    def bind(self, t, value):
        self.keep.append(t)
        self.by_tensor[id(t)] = (value, t._vc[0])
        self.dyn_arrays[id(t._data)] = (t, value)
        fn = t.grad_fn
        if fn is not None:
            self.keep.append(fn)
            self.by_fn[(id(fn), t._output_nr)] = value

    def lookup(self, t):
        """The Value of a dynamic tensor, or None for a constant one."""
        fn = t.grad_fn
        if fn is not None:
            v = self.by_fn.get((id(fn), t._output_nr))
            if v is not None:
                return v
        hit = self.by_tensor.get(id(t))
        if hit is None:
            return None
        v, ver = hit
        if t._vc[0] != ver:
            raise OnnxExporterError(
                f"a traced tensor was modified in place outside autograd "
                f"(in {self.where()}); the exporter cannot see that change "
                f"- use an out-of-place op")
        return v

    def where(self):
        if not self.modules:
            return "the top-level module"
        path, mod = self.modules[-1]
        return f"module '{path or '<root>'}' ({type(mod).__name__})"

    # ------------------------------------------------------------- apply --
    def record(self, cls, args, kwargs, out):
        dyn = False
        for a in args:
            if isinstance(a, TensorBase):
                if self.lookup(a) is not None:
                    dyn = True
                    break
            elif self.array_source(a) is not None:
                dyn = True
                break
        if not dyn:
            self._check_hidden_dynamic(cls, args, kwargs)
            return
        conv = CONVERTERS.get(cls)
        if conv is None or not isinstance(out, TensorBase):
            raise UnsupportedOperatorError(
                f"Exporting the operator '{cls.__name__}' to ONNX opset "
                f"version {self.b.opset} is not supported (in "
                f"{self.where()})")
        ins = [self.arg(a) for a in args]
        # what the run-to-run check compares: the op, and its constant
        # arguments that are not parameters or buffers
        self.log.append((cls, self.where()))
        self.log_consts.append(
            [_to_numpy(c.array).copy() if isinstance(c, Const) else c
             for c in ins if not isinstance(c, Value) and not (
                 isinstance(c, Const) and c.pname is not None)]
            + [_plain(v) for _, v in sorted(kwargs.items())])
        ctx = _Ctx(self, cls, ins, kwargs, out)
        name = conv(ctx, *ins, **kwargs)
        v = Value(name, out.shape, _to_numpy(out._data).dtype
                  if not isinstance(out._data, np.ndarray)
                  else out._data.dtype)
        self.producer[name] = (cls, ins, kwargs)
        self.bind(out, v)

    def _check_hidden_dynamic(self, cls, args, kwargs):
        # a dynamic tensor's raw array passed inside a keyword (an index
        # key) would be baked in as a constant: refuse instead
        for v in kwargs.values():
            for a in (v if isinstance(v, tuple) else (v,)):
                if self.array_source(a) is not None:
                    raise UnsupportedOperatorError(
                        f"Exporting '{cls.__name__}' with an index computed "
                        f"from the inputs is not supported (in "
                        f"{self.where()})")

    def array_source(self, a):
        """For a raw array that is a dynamic tensor's array (or a NumPy
        view of one), its (Value, array); None for other objects."""
        if not isinstance(a, np.ndarray):
            return None
        base = a
        while base is not None:
            hit = self.dyn_arrays.get(id(base))
            if hit is not None:
                t, v = hit
                if t._data is base and t._vc[0] == self.by_tensor.get(
                        id(t), (None, t._vc[0]))[1]:
                    return v, base
            base = base.base
        return None

    def array_value(self, a):
        """The graph name of a raw array that views a dynamic one: the
        array itself, a transpose of it or it with size-1 dims added."""
        v, d = self.array_source(a)
        if a is d:
            return v.name
        b = self.b
        if a.ndim == d.ndim and sorted(a.shape) == sorted(d.shape) and \
                a.__array_interface__["data"][0] == \
                d.__array_interface__["data"][0]:
            perm, used = [], set()
            for n, st in zip(a.shape, a.strides):
                j = next((j for j in range(d.ndim) if j not in used and
                          d.shape[j] == n and (d.strides[j] == st or n == 1)),
                         None)
                if j is None:
                    break
                used.add(j)
                perm.append(j)
            else:
                return b.node("Transpose", [v.name], perm=perm)
        if a.size == d.size and a.__array_interface__["data"][0] == \
                d.__array_interface__["data"][0] and \
                [n for n in a.shape if n != 1] == [n for n in d.shape
                                                  if n != 1]:
            ones = [i for i, n in enumerate(a.shape) if n == 1]
            y = v.name
            dones = [i for i, n in enumerate(d.shape) if n == 1]
            if dones:
                y = b.node("Squeeze", [y, b.ints(dones)])
            return b.node("Unsqueeze", [y, b.ints(ones)]) if ones else y
        raise OnnxExporterError(
            f"an op got a raw array cut from a traced tensor in a way the "
            f"exporter cannot follow (shape {list(a.shape)} from "
            f"{list(d.shape)}, in {self.where()})")

    def arg(self, a):
        if isinstance(a, TensorBase):
            v = self.lookup(a)
            if v is not None:
                return v
            return Const(a._data, self.b.param_names.get(id(a)))
        if isinstance(a, np.ndarray) or hasattr(a, "__cuda_array_interface__"):
            if self.array_source(a) is not None:
                return Value(self.array_value(a), a.shape, a.dtype)
            return Const(a, None)
        return a


class _Ctx:
    """What a converter gets besides its arguments."""

    def __init__(self, tracer, cls, ins, kwargs, out):
        self.tracer, self.b, self.cls = tracer, tracer.b, cls
        self.ins, self.kwargs = ins, kwargs
        self.out_shape = tuple(out.shape)
        self.out_dtype = np.dtype(out._data.dtype)

    def name(self, x, dtype=None):
        """The graph name of an argument (a Value, Const or scalar); with
        ``dtype``, cast to it."""
        b = self.b
        if isinstance(x, Value):
            if dtype is not None and np.dtype(dtype) != x.dtype:
                return b.node("Cast", [x.name],
                              to=_onnx_type(b.onnx, dtype))
            return x.name
        if isinstance(x, Const):
            if dtype is not None and np.dtype(dtype) != x.dtype:
                return b.const(x.numpy().astype(dtype))
            return b.const(x.array if isinstance(x.array, np.ndarray)
                           else x.numpy(), name=x.pname,
                           key=id(x.array))
        if x is None:
            return ""
        return b.const(np.asarray(x, dtype if dtype is not None
                                  else self.out_dtype))

    def unsupported(self, what):
        raise UnsupportedOperatorError(
            f"Exporting the operator '{self.cls.__name__}' with {what} to "
            f"ONNX is not supported (in {self.tracer.where()})")


def _flatten(out):
    if isinstance(out, TensorBase):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _flatten(o)]
    if isinstance(out, dict):
        return [t for o in out.values() for t in _flatten(o)]
    raise OnnxExporterError(
        f"the model returned a {type(out).__name__}: only tensors and "
        f"(nested) tuples/lists/dicts of tensors can be exported")


def _dyn_dims(spec, name):
    if spec is None:
        return {}
    if isinstance(spec, dict):
        return {int(k): str(v) for k, v in spec.items()}
    return {int(a): f"{name}_dynamic_axes_{i + 1}"
            for i, a in enumerate(spec)}


def _value_info(onnx, name, shape, dtype, dyn):
    dims = [dyn.get(i, dyn.get(i - len(shape), d))
            for i, d in enumerate(shape)]
    return onnx.helper.make_tensor_value_info(
        name, _onnx_type(onnx, dtype), dims)


def export(model, args, f, input_names, output_names, dynamic_axes,
           opset_version, **kwargs):
    for k in kwargs:
        if k not in _NO_EFFECT:
            raise TypeError(f"export() got an unexpected keyword argument "
                            f"'{k}'")
        if k not in _warned:
            _warned.add(k)
            warnings.warn(f"dtorch.onnx.export: '{k}' has no effect "
                          f"(parameters are always exported, constants "
                          f"always folded)", UserWarning, stacklevel=3)
    onnx = _require_onnx()
    if opset_version is None:
        opset_version = MIN_OPSET
    if not MIN_OPSET <= opset_version <= MAX_OPSET:
        raise ValueError(f"dtorch.onnx.export supports opset versions "
                         f"{MIN_OPSET} to {MAX_OPSET}, got {opset_version}")
    if isinstance(args, TensorBase):
        args = (args,)
    elif not isinstance(args, tuple):
        args = tuple(args) if isinstance(args, list) else (args,)
    call_kwargs = {}
    if args and isinstance(args[-1], dict):
        call_kwargs, args = args[-1], args[:-1]
    tensors = [a for a in args if isinstance(a, TensorBase)]
    input_names = _names(input_names, len(tensors), "input", "tensor inputs")
    dynamic_axes = dynamic_axes or {}

    b = Builder(onnx, opset_version)
    tr, out, graph_inputs = _trace(model, b, args, call_kwargs, input_names,
                                   dynamic_axes)
    # Values computed outside dtorch's ops (a comparison, argmax, .item()
    # steering Python control flow) reach the graph as constants. A second
    # run on other inputs shows whether any of them depended on the inputs.
    try:
        tr2, _, _ = _trace(model, Builder(onnx, opset_version),
                           tuple(_perturb(a) for a in args), call_kwargs,
                           input_names, dynamic_axes)
    except OnnxExporterError as e:
        raise OnnxExporterError(
            f"the model runs different ops for other input values: its "
            f"control flow depends on them, which a traced graph cannot "
            f"follow ({e})") from None
    except Exception as e:      # e.g. a model that checks its input values
        warnings.warn(f"dtorch.onnx.export: could not check that the graph "
                      f"does not depend on values computed outside dtorch's "
                      f"ops (the model raised {type(e).__name__}: {e} on "
                      f"other inputs)", UserWarning, stacklevel=3)
    else:
        _compare_runs(tr, tr2)

    outs = _flatten(out)
    output_names = _names(output_names, len(outs), "output", "outputs")
    graph_outputs = []
    for t, name in zip(outs, output_names):
        v = tr.lookup(t)
        src = v.name if v is not None else b.const(_to_numpy(t._data))
        b.nodes.append(onnx.helper.make_node("Identity", [src], [name],
                                             name=b.fresh("output")))
        graph_outputs.append(_value_info(
            onnx, name, t.shape, _to_numpy(t._data).dtype,
            _dyn_dims(dynamic_axes.get(name), name)))

    nodes, inits = _prune(b.nodes, b.inits, output_names)
    graph = onnx.helper.make_graph(nodes, type(model).__name__, graph_inputs,
                                   graph_outputs, initializer=inits)
    m = onnx.helper.make_model(
        graph, opset_imports=[onnx.helper.make_opsetid("", opset_version)],
        producer_name="dtorch")
    # keep the IR version at what the opset needs, so that runtimes older
    # than this onnx package load the file
    m.ir_version = min(m.ir_version, {17: 8, 18: 8, 19: 9, 20: 9}
                       [opset_version])
    onnx.checker.check_model(m)
    onnx.save_model(m, f)


def _names(given, n, kind, what):
    """The user's ``{kind}_names`` for the graph's ``n`` inputs or
    outputs, the rest numbered ``{kind}_<i>``."""
    names = list(given or [])
    if len(names) > n:
        raise ValueError(f"{len(names)} {kind}_names for {n} {what}")
    return names + [f"{kind}_{i}" for i in range(len(names), n)]


def _prune(nodes, inits, outputs):
    """Drop nodes no output depends on (e.g. an RNN's input projection
    that the ONNX RNN node took over) and the initializers they used."""
    need = set(outputs)
    keep = []
    for n in reversed(nodes):
        if any(o in need for o in n.output):
            keep.append(n)
            need.update(i for i in n.input if i)
    keep.reverse()
    return keep, [t for k, t in inits.items() if k in need]


def _perturb(a):
    """Other values of an input's shape and dtype (ints within the range
    of the given ones, so that embedding ids stay valid)."""
    if not isinstance(a, TensorBase) or a.numel() == 0:
        return a
    x = _to_numpy(a._data)
    rng = np.random.default_rng(1234)
    if x.dtype.kind == "f":
        y = (rng.standard_normal(x.shape) * (np.abs(x).max() + 1)).astype(
            x.dtype)
    elif x.dtype.kind in "iu":
        y = rng.integers(x.min(), x.max() + 1, x.shape).astype(x.dtype)
        if x.min() == x.max() or np.array_equal(y, x):
            return a
    else:
        return a
    return type(a)._make(a._xp().asarray(y), False, None)


def _plain(v):
    """A keyword argument as comparable data (arrays copied)."""
    if isinstance(v, (tuple, list)):
        return tuple(_plain(x) for x in v)
    if isinstance(v, np.ndarray) or hasattr(v, "__cuda_array_interface__"):
        return _to_numpy(v).copy()
    if isinstance(v, slice):
        return ("slice", v.start, v.stop, v.step)
    return v


def _same(a, b):
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)
                and a.shape == b.shape and a.dtype == b.dtype
                and np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    try:
        return bool(a == b) or (a != a and b != b)
    except Exception:
        return a is b


def _compare_runs(tr, tr2):
    if [e[0] for e in tr.log] != [e[0] for e in tr2.log]:
        for (c1, w1), (c2, w2) in zip(tr.log, tr2.log):
            if c1 is not c2:
                break
        else:
            w1 = tr.log[-1][1] if tr.log else "the top-level module"
        raise OnnxExporterError(
            f"the model runs different ops for different inputs (from "
            f"{w1}): its control flow depends on the input values, which a "
            f"traced ONNX graph cannot follow")
    for (cls, where), c1, c2 in zip(tr.log, tr.log_consts, tr2.log_consts):
        for a, b in zip(c1, c2):
            if not _same(a, b):
                raise OnnxExporterError(
                    f"an argument of '{cls.__name__}' (in {where}) was "
                    f"computed from the inputs outside dtorch's ops (a "
                    f"comparison, argmax, .numpy()...) and would be frozen "
                    f"into the graph as a constant")


def _trace(model, b, args, call_kwargs, input_names, dynamic_axes):
    """Run the model once with the tracer on; returns (tracer, output,
    graph input infos)."""
    onnx = b.onnx
    tr = Tracer(b)
    for pname, p in list(model.named_parameters()) + list(
            model.named_buffers()):
        b.param_names.setdefault(id(p), pname)

    # inputs: fresh leaves, float ones requiring grad so that in-place ops
    # on them go through autograd's rebase (which the tracer follows)
    call_args, graph_inputs = [], []
    it = iter(input_names)
    for a in args:
        if not isinstance(a, TensorBase):
            call_args.append(a)
            continue
        name = next(it)
        t = a.detach().clone()
        if t.dtype.is_floating_point:
            t.requires_grad_(True)
        tr.bind(t, Value(name, t.shape, np.dtype(t._data.dtype)))
        graph_inputs.append(_value_info(
            onnx, name, t.shape, t._data.dtype,
            _dyn_dims(dynamic_axes.get(name), name)))
        call_args.append(t)

    handles = []

    def pre(path):
        def hook(mod, inp):
            tr.modules.append((path, mod))
        return hook

    def post(mod, inp, out):
        if tr.modules:
            tr.modules.pop()

    for path, mod in model.named_modules():
        handles.append(mod.register_forward_pre_hook(pre(path)))
        handles.append(mod.register_forward_hook(post))

    orig = Function.__dict__["apply"]
    raw = orig.__func__

    def traced(cls, *a, **kw):
        if threading.get_ident() != tr.thread or tr.depth:
            return raw(cls, *a, **kw)
        tr.depth += 1
        try:
            out = raw(cls, *a, **kw)
        finally:
            tr.depth -= 1
        tr.record(cls, a, kw, out)
        return out

    was_training = model.training
    from ..autograd.grad_mode import enable_grad
    model.eval()
    patches = _tensor_patches(tr)
    saved = [(cls, name, cls.__dict__[name]) for cls, name, _ in patches]
    Function.apply = classmethod(traced)
    for cls, name, fn in patches:
        setattr(cls, name, fn)
    _state.active = True
    try:
        with enable_grad():
            out = model(*call_args, **call_kwargs)
    finally:
        _state.active = False
        Function.apply = orig
        for cls, name, fn in saved:
            setattr(cls, name, fn)
        for h in handles:
            h.remove()
        model.train(was_training)
    return tr, out, graph_inputs


_CMP = {"equal": "Equal", "less": "Less", "less_equal": "LessOrEqual",
        "greater": "Greater", "greater_equal": "GreaterOrEqual",
        "not_equal": "Equal", "logical_and": "And", "logical_or": "Or",
        "bitwise_and": "And", "bitwise_or": "Or", "bitwise_xor": "Xor",
        "logical_xor": "Xor"}


def _tensor_patches(tr):
    """Tensor methods that compute on raw arrays, not through an op
    (comparisons, logical ops, argmax): wrapped while tracing so that a
    mask or an index computed from the inputs becomes graph nodes."""
    from ..tensor import Tensor
    from .. import ops as N
    # each is defined by one of Tensor's family mixins (tensor.py), which
    # is the class patched and restored
    owner = {n: next(c for c in Tensor.__mro__ if n in vars(c))
             for n in ("_cmp", "_logical", "__invert__", "logical_not",
                       "_arg")}
    cmp, logical = vars(owner["_cmp"])["_cmp"], \
        vars(owner["_logical"])["_logical"]
    invert = vars(owner["__invert__"])["__invert__"]
    lnot = vars(owner["logical_not"])["logical_not"]
    arg = vars(owner["_arg"])["_arg"]

    def mine():
        return threading.get_ident() == tr.thread and not tr.depth

    def binary(orig):
        def fn(self, name, other):
            out = orig(self, name, other)
            if not mine():
                return out
            xv = tr.lookup(self)
            ov = tr.lookup(other) if isinstance(other, TensorBase) else None
            if xv is None and ov is None:
                return out
            ctx = _Ctx(tr, type(name, (), {}), [], {}, out)
            if name not in _CMP:
                ctx.unsupported(f"the '{name}' comparison")
            if orig is cmp:
                x, y = N.promote(self._data, other._data if isinstance(
                    other, TensorBase) else other, name)
                dt = np.dtype(x.dtype)
            else:
                dt = np.dtype(np.bool_) if name.startswith("logical") \
                    else ctx.out_dtype
            a = ctx.name(xv if xv is not None else tr.arg(self), dt)
            if isinstance(other, TensorBase):
                b = ctx.name(ov if ov is not None else tr.arg(other), dt)
            else:
                b = ctx.name(other, dt)
            y = tr.b.node(_CMP[name], [a, b])
            if name == "not_equal":
                y = tr.b.node("Not", [y])
            tr.bind(out, Value(y, out.shape, ctx.out_dtype))
            return out
        return fn

    def unary_not(orig):
        def fn(self):
            out = orig(self)
            v = tr.lookup(self) if mine() else None
            if v is not None:
                if v.dtype != np.bool_ and orig is invert:
                    _Ctx(tr, type("BitwiseNot", (), {}), [], {},
                         out).unsupported("a non-boolean tensor")
                ctx = _Ctx(tr, type("Not", (), {}), [], {}, out)
                y = tr.b.node("Not", [ctx.name(v, np.bool_)])
                tr.bind(out, Value(y, out.shape, ctx.out_dtype))
            return out
        return fn

    def argfn(self, fn, dim, keepdim):
        out = arg(self, fn, dim, keepdim)
        v = tr.lookup(self) if mine() else None
        if v is None:
            return out
        b = tr.b
        op = "ArgMax" if fn == "argmax" else "ArgMin"
        if dim is None:
            y = b.node(op, [b.node("Reshape", [v.name, b.ints([-1])])],
                       axis=0, keepdims=0)
            if keepdim:
                y = b.node("Reshape", [y, b.ints([1] * len(v.shape))])
        elif not v.shape:
            y = b.const(np.zeros((), np.int64))
        else:
            y = b.node(op, [v.name], axis=int(dim), keepdims=int(keepdim))
        tr.bind(out, Value(y, out.shape, np.dtype(np.int64)))
        return out

    return [(owner["_cmp"], "_cmp", binary(cmp)),
            (owner["_logical"], "_logical", binary(logical)),
            (owner["__invert__"], "__invert__", unary_not(invert)),
            (owner["logical_not"], "logical_not", unary_not(lnot)),
            (owner["_arg"], "_arg", argfn)]
