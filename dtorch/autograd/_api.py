"""``backward`` and ``grad``: run the engine from the given outputs, as
``torch.autograd.backward`` / ``torch.autograd.grad``. Their own module so
that ``functional`` and ``gradcheck`` import ``grad`` at module level (the
package ``__init__`` imports those two)."""
import threading

from .. import _backend as _B
from . import engine as _engine
from . import function as _fn


class _Seed(threading.local):
    scale = None


_seed = _Seed()


def scale_next_seed(scale):
    """Multiply the root gradients (the implicit ones, or the given ones)
    of this thread's next ``backward()`` by ``scale``. Deterministic DDP
    (nn/parallel/_deterministic.py) folds its 1/world into the loss this
    way: a mean loss then scales by 1/n_local * 1/world, rounded as the
    global 1/n."""
    _seed.scale = scale


def _scaled(g, s):
    g *= g.dtype.type(s)
    return g


def _as_list(x):
    if x is None:
        return None
    if isinstance(x, (list, tuple)):
        return list(x)
    return [x]


def _root_grads(outputs, grad_outputs, what, create_graph=False):
    """The gradients the engine starts from: arrays, or tensors (a given
    gradient as it is, so that it may itself require grad) under
    create_graph."""
    T = _fn.TensorBase
    grads = []
    for i, (t, g) in enumerate(zip(outputs, grad_outputs)):
        if not t.requires_grad:
            raise RuntimeError(
                f"element {i} of tensors does not require grad and does not "
                f"have a grad_fn")
        with _B.device_guard(t._data):    # made on the output's device
            if g is None:
                if t._data.size != 1:
                    raise RuntimeError(
                        "grad can be implicitly created only for scalar "
                        f"outputs ({what} of a tensor of shape "
                        f"{list(t.shape)}: pass gradient=)")
                g = t._xp().ones(t._data.shape, t._data.dtype)
                if create_graph:
                    g = t._make(g, False, None)
            else:
                if not isinstance(g, T):
                    g = t._make(t._xp().asarray(g, dtype=t._data.dtype),
                                False, None)
                if g.shape != t.shape:
                    raise RuntimeError(
                        f"Mismatch in shape: grad_output[{i}] has a shape "
                        f"of {list(g.shape)} and output[{i}] has a shape of "
                        f"{list(t.shape)}.")
                if not create_graph:
                    g = g._data.copy()   # the engine may add into it
        grads.append(g)
    return grads


def backward(tensors, grad_tensors=None, retain_graph=None,
             create_graph=False, inputs=None):
    """Accumulate gradients of ``tensors`` into the leaves' ``.grad``.

    With ``create_graph=True`` the gradients are recorded, so that
    ``.grad`` can be differentiated again (gradient penalties, Hessian-
    vector products); ``retain_graph`` then defaults to True."""
    if retain_graph is None:
        retain_graph = create_graph
    outs = _as_list(tensors)
    gs = _as_list(grad_tensors) or [None] * len(outs)
    if len(gs) != len(outs):
        raise RuntimeError(f"got {len(gs)} gradients for {len(outs)} "
                           f"tensors")
    grads = _root_grads(outs, gs, "backward", create_graph)
    if _seed.scale is not None:
        # arrays made or copied by _root_grads: scaling in place is safe
        s, _seed.scale = _seed.scale, None
        grads = [g * s if create_graph else _scaled(g, s) for g in grads]
    if inputs is not None:
        ins = _as_list(inputs)
        res = _engine.run_backward(outs, grads, bool(retain_graph), ins,
                                   accumulate=False,
                                   create_graph=create_graph)
        for t, g in zip(ins, res):
            if g is not None and create_graph:
                # a copy, as the engine's AccumulateGrad under create_graph
                t._grad = g.clone() if t._grad is None else t._grad + g
            elif g is not None:
                with _B.device_guard(g):
                    if t._grad is None:
                        t._grad = t._make(g.copy(), False, None)
                    else:
                        t._grad._data += g
        return
    _engine.run_backward(outs, grads, bool(retain_graph),
                         create_graph=create_graph)


def grad(outputs, inputs, grad_outputs=None, retain_graph=None,
         create_graph=False, allow_unused=False, materialize_grads=False):
    """Gradients of ``outputs`` with respect to ``inputs``, returned (not
    accumulated into ``.grad``).

    Example::

        gx, = dtorch.autograd.grad((x ** 2).sum(), [x])

    With ``create_graph=True`` the returned gradients are part of a graph
    and can be differentiated again::

        gx, = dtorch.autograd.grad((x ** 3).sum(), x, create_graph=True)
        gxx, = dtorch.autograd.grad(gx.sum(), x)       # 6 * x
    """
    if retain_graph is None:
        retain_graph = create_graph
    outs = _as_list(outputs)
    ins = _as_list(inputs)
    single = not isinstance(inputs, (list, tuple))
    T = _fn.TensorBase
    for i, t in enumerate(ins):
        if not isinstance(t, T) or not t.requires_grad:
            raise RuntimeError(
                f"One of the differentiated Tensors (input {i}) does not "
                f"require grad")
    gs = _as_list(grad_outputs) or [None] * len(outs)
    grads = _root_grads(outs, gs, "grad", create_graph)
    res = _engine.run_backward(outs, grads, bool(retain_graph), ins,
                               accumulate=False, create_graph=create_graph)
    out = []
    for i, (t, g) in enumerate(zip(ins, res)):
        if g is None:
            if materialize_grads:
                g = t._xp().zeros_like(t._data)
            elif not allow_unused:
                raise RuntimeError(
                    f"One of the differentiated Tensors (input {i}) appears "
                    f"to not have been used in the graph. Set "
                    f"allow_unused=True if this is the desired behavior.")
        if g is None or create_graph and isinstance(g, T):
            out.append(g)
        else:
            out.append(t._make(g, False, None))
    return tuple(out)
