"""``autograd.functional``: jacobian, hessian, vjp, jvp, vhp and hvp with
torch.autograd.functional's signatures and results. Reverse mode, one
backward per output element (PyTorch's ``vectorize=False``); jvp by the
double-backward trick, the second-order functions through create_graph.

It stacks gradient tensors (a differentiable op), so it sits above the ops
(layer 3 in DESIGN.md): the autograd package loads it on first use of
``dtorch.autograd.functional``.
"""
from ..ops.movement import stack
from ._api import grad
from . import function as _fn
from .grad_mode import enable_grad


def _tuple(x):
    return (tuple(x), True) if isinstance(x, (tuple, list)) else ((x,), False)


def _check_tensors(xs, what, fn):
    T = _fn.TensorBase
    for i, x in enumerate(xs):
        if not isinstance(x, T):
            raise TypeError(
                f"The {what} given to {fn} must be either a Tensor or a tuple "
                f"of Tensors but the value at index {i} has type "
                f"{type(x).__name__}.")


def _prepare(inputs, create_graph, fn):
    """Inputs as fresh graph leaves (or, under create_graph, views that keep
    the caller's graph), as PyTorch's _grad_preprocess."""
    ins, is_tuple = _tuple(inputs)
    _check_tensors(ins, "inputs", fn)
    if create_graph:
        ins = tuple(x.view_as(x) if x.requires_grad
                    else x.detach().requires_grad_(True) for x in ins)
    else:
        ins = tuple(x.detach().requires_grad_(True) for x in ins)
    return ins, is_tuple


def _call(func, ins, fn):
    with enable_grad():
        outs, is_tuple = _tuple(func(*ins))
    _check_tensors(outs, "outputs of the user-provided function", fn)
    return outs, is_tuple


def _vectors(v, like, fn, what):
    """``v`` checked against ``like`` (one tensor per entry, same shapes);
    None only where like is one single-element tensor."""
    if v is None:
        if len(like) != 1 or like[0].numel() != 1:
            raise RuntimeError(
                f"The vector v can only be None if the {what} is a single "
                f"Tensor with a single element.")
        return (like[0].new_ones(like[0].shape),)
    vs, _ = _tuple(v)
    _check_tensors(vs, "v", fn)
    if len(vs) != len(like):
        raise RuntimeError(f"v has {len(vs)} entries but the {what} has "
                           f"{len(like)}")
    for i, (a, b) in enumerate(zip(vs, like)):
        if tuple(a.shape) != tuple(b.shape):
            raise RuntimeError(
                f"Entry {i} in v has invalid size: should be "
                f"{list(b.shape)} but got {list(a.shape)}.")
    return vs


def _grads(outs, ins, gouts, create_graph, strict, fn):
    """d outs / d ins contracted with gouts; zeros for an input the outputs
    do not depend on (an error under strict)."""
    pairs = [(o, g) for o, g in zip(outs, gouts) if o.requires_grad]
    gs = (None,) * len(ins)
    if pairs:
        with enable_grad():
            gs = grad([o for o, _ in pairs], list(ins),
                      [g for _, g in pairs], retain_graph=True,
                      create_graph=create_graph, allow_unused=True)
    return [_or_zeros(g, x, strict, "The output", j)
            for j, (g, x) in enumerate(zip(gs, ins))]


def _or_zeros(g, x, strict, output, j):
    """``g``, or zeros for an input ``x`` (number ``j``) that ``output``
    does not depend on: PyTorch's error under strict."""
    if g is None:
        if strict:
            raise RuntimeError(
                f"{output} of the user-provided function is independent "
                f"of input {j}. This is not allowed in strict mode.")
        g = x.new_zeros(x.shape)
    return g


def _done(ts, create_graph, is_tuple):
    ts = tuple(t if create_graph else t.detach() for t in ts)
    return ts if is_tuple else ts[0]


def jacobian(func, inputs, create_graph=False, strict=False, vectorize=False,
             strategy="reverse-mode"):
    """d func(inputs) / d inputs: for one input and one output a tensor of
    shape output.shape + input.shape; tuples of tuples otherwise.
    ``vectorize=True`` (PyTorch's vmap path) gives the same Jacobian:
    dtorch computes it one backward per output element either way."""
    if strategy != "reverse-mode":
        raise NotImplementedError("only strategy='reverse-mode' is "
                                  "supported by dtorch")
    ins, tuple_in = _prepare(inputs, create_graph, "jacobian")
    outs, tuple_out = _call(func, ins, "jacobian")
    rows = []
    for i, out in enumerate(outs):
        flat = out.reshape(-1)
        per_in = [[] for _ in ins]
        for k in range(flat.numel()):      # one backward per output element
            one = flat.new_zeros(flat.shape)
            one._data[k] = 1
            gs = (None,) * len(ins)
            if out.requires_grad:
                with enable_grad():
                    gs = grad(flat, list(ins), one, retain_graph=True,
                              create_graph=create_graph, allow_unused=True)
            for j, (g, x) in enumerate(zip(gs, ins)):
                per_in[j].append(_or_zeros(g, x, strict, f"Output {i}", j))
        jac = []
        for j, x in enumerate(ins):
            if per_in[j]:
                J = stack(*per_in[j], dim=0)
            else:
                J = x.new_zeros((0,) + tuple(x.shape))
            J = J.reshape(tuple(out.shape) + tuple(x.shape))
            jac.append(J if create_graph else J.detach())
        rows.append(tuple(jac) if tuple_in else jac[0])
    return tuple(rows) if tuple_out else rows[0]


def hessian(func, inputs, create_graph=False, strict=False, vectorize=False,
            outer_jacobian_strategy="reverse-mode"):
    """The Hessian of a scalar function: for one input a tensor of shape
    input.shape + input.shape, for several a tuple of tuples (block i, j =
    d2 f / d inputs[i] d inputs[j])."""
    _, tuple_in = _tuple(inputs)

    def gradient(*xs):
        out, _ = _call(func, xs, "hessian")
        if len(out) != 1 or out[0].numel() != 1:
            raise RuntimeError(
                "The function given to hessian should return a single "
                "Tensor with a single element")
        gs = _grads(out, xs, (out[0].new_ones(out[0].shape),), True,
                    strict, "hessian")
        return tuple(gs) if tuple_in else gs[0]

    return jacobian(gradient, inputs, create_graph=create_graph,
                    strict=strict, strategy=outer_jacobian_strategy)


def vjp(func, inputs, v=None, create_graph=False, strict=False):
    """(func(inputs), v^T J)."""
    ins, tuple_in = _prepare(inputs, create_graph, "vjp")
    outs, tuple_out = _call(func, ins, "vjp")
    vs = _vectors(v, outs, "vjp", "output of the user-provided function")
    gs = _grads(outs, ins, vs, create_graph, strict, "vjp")
    return _done(outs, create_graph, tuple_out), \
        _done(gs, create_graph, tuple_in)


def jvp(func, inputs, v=None, create_graph=False, strict=False):
    """(func(inputs), J v), by the double-backward trick: the vjp with a
    dummy u is linear in u, and its own vjp with v is J v."""
    ins, tuple_in = _prepare(inputs, create_graph, "jvp")
    vs = _vectors(v, ins, "jvp", "input")
    outs, tuple_out = _call(func, ins, "jvp")
    us = tuple(o.new_zeros(o.shape).requires_grad_(True) for o in outs)
    gs = _grads(outs, ins, us, True, strict, "jvp")
    pairs = [(g, w) for g, w in zip(gs, vs) if g.requires_grad]
    res = [None] * len(us)
    if pairs:
        with enable_grad():
            res = grad([g for g, _ in pairs], list(us),
                       [w for _, w in pairs], create_graph=create_graph,
                       retain_graph=True, allow_unused=True)
    res = [o.new_zeros(o.shape) if r is None else r
           for r, o in zip(res, outs)]
    return _done(outs, create_graph, tuple_out), \
        _done(res, create_graph, tuple_out)


def vhp(func, inputs, v=None, create_graph=False, strict=False):
    """(func(inputs), v^T H) of a scalar function."""
    ins, tuple_in = _prepare(inputs, create_graph, "vhp")
    outs, _ = _call(func, ins, "vhp")
    if len(outs) != 1 or outs[0].numel() != 1:
        raise RuntimeError("The function given to vhp should return a "
                           "single Tensor with a single element.")
    vs = _vectors(v, ins, "vhp", "input")
    gs = _grads(outs, ins, (outs[0].new_ones(outs[0].shape),), True, strict,
                "vhp")
    hv = _grads(gs, ins, vs, create_graph, strict, "vhp")
    return _done(outs, create_graph, False), \
        _done(hv, create_graph, tuple_in)


def hvp(func, inputs, v=None, create_graph=False, strict=False):
    """(func(inputs), H v) of a scalar function: the Hessian of a twice
    differentiable function is symmetric, so H v = (v^T H)^T, which is
    what ``vhp`` computes."""
    return vhp(func, inputs, v, create_graph, strict)
