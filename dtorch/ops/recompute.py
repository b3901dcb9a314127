"""create_graph=True backward by recomputation, for ops whose backward is a
long hand-written loop (the recurrent layers): ``backward_by_recompute``
runs a composite form of the op (differentiable tensor ops) on leaves of
its own, differentiates that with create_graph=True, and hands the
results back as ``Reconnect`` tensors joined to the real inputs.

Why it stays beside the one-body rule (issue 30): an RNN layer's fast
backward is a time loop over preallocated buffers written in place, one
fused kernel per step (on CUDA 21 elementwise launches per LSTM step
become one); the same body on tensors would record T steps of a dozen
ops each on the fast path's code and slow it down. So the loop stays the
fast path, and under create_graph the composite is recomputed and its
gradients pinned (``pin_all``) to the loop's values: the create_graph
gradient is bitwise the plain one, and its derivative is autograd's of
the composite. ``Pin`` serves the same purpose for other bodies whose
fast path no tensor can run (compiled kernels, in-place buffers:
LayerNorm, BatchNorm, cross_entropy, SDPA).

The composite graph is kept apart from the real one: autograd.grad walks
every node reachable from its outputs, so a recomputation on the real
inputs' tensors would walk (and free) the whole model below the op. Its
leaves stand for the real tensors instead, one for one, and ``Reconnect``
maps gradients between them: backward of a Reconnect output is
autograd.grad over the private graph, and under create_graph=True again a
Reconnect of that, so any order works.
"""
from ..autograd._api import grad as _grad
from .base import Op


class Pin(Op):
    """``value`` (an array) standing for tensor ``t``: its value, with t's
    derivative (identity backward). How a one-body backward under
    create_graph uses what forward saved of an intermediate (LayerNorm's
    xhat, a softmax) or what a compiled kernel computed: ``t`` recomputes
    it from the op's inputs as a graph, the pinned value keeps the
    first-order gradient bitwise the fast path's."""
    @staticmethod
    def forward(ctx, t, value=None):
        return value

    @staticmethod
    def backward(ctx, g):
        return g


def pin(t, value):
    """``Pin``: array ``value`` with the derivative of tensor ``t``."""
    return Pin.apply(t, value=value)


def pin_all(grads, fast):
    """The gradient tensors of a backward under create_graph pinned to
    the arrays the fast path computed (``fast``; None: nothing to pin):
    for a body that works in place or in a compiled kernel (which sums
    in its own order), so that both orders give the same values."""
    if not fast:
        return grads
    return tuple(None if t is None else pin(t, a)
                 for t, a in zip(grads, fast))


class Reconnect(Op):
    """``out`` (a tensor of a private graph whose leaves are ``leaves``)
    as a function of the real tensors ``qs``, leaf j standing for qs[j]
    (same values)."""
    @staticmethod
    def forward(ctx, *qs, out=None, leaves=()):
        ctx.sub, ctx.leaves, ctx.qs = out, leaves, qs
        return out._data

    @staticmethod
    def backward(ctx, h):
        # autograd.grad over the private graph; under create_graph again a
        # Reconnect of what it records, so any order works
        graph = ctx._gmake is not None
        hl = h._make(h._data, True, None) if graph else \
            ctx.sub._make(h, False, None)
        gs = _grad([ctx.sub], list(ctx.leaves), [hl], retain_graph=True,
                   create_graph=graph, allow_unused=True)
        if not graph:
            return tuple(None if g is None else g._data for g in gs)
        qs = [ctx.graph_input(i, q) for i, q in enumerate(ctx.qs)]
        leaves = tuple(ctx.leaves) + (hl,)
        return tuple(None if g is None or not g.requires_grad else
                     Reconnect.apply(*qs, h, out=g, leaves=leaves)
                     for g in gs)


def backward_by_recompute(ctx, g, fn, values):
    """The gradients of ``fn`` (the op's composite form: tensors in, one
    tensor out) at ``values`` (one array per op input, None where the
    input is not a tensor), joined to the op's inputs: what a
    backward_graph returns. ``values`` need only agree with the real
    inputs in what the op's gradients depend on."""
    need = ctx.needs_input_grad
    gl = g._make(g._data, True, None)
    ins, leaves, qs, which = [], [gl], [g], []
    for i, v in enumerate(values):
        if v is None:
            ins.append(None)
        elif i < len(need) and need[i]:
            t = g._make(v, True, None)
            ins.append(t)
            leaves.append(t)
            qs.append(ctx.graph_input(i, v))
            which.append(i)
        else:
            ins.append(g._make(v, False, None))
    out = fn(*ins)
    gs = _grad([out], leaves[1:], [gl], create_graph=True,
               allow_unused=True)
    res = [None] * len(values)
    for i, gi in zip(which, gs):
        if gi is not None:
            res[i] = Reconnect.apply(*qs, out=gi, leaves=tuple(leaves))
    return tuple(res)
