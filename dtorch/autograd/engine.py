"""The backward engine.

One iterative pass, no recursion: nodes run latest-created first (the order
PyTorch uses), and a leaf's gradient is accumulated, and its post-accumulate
hooks fire, as soon as its last consumer has run. DDP's bucketed all-reduce
relies on that early signal.
"""
import operator
import threading
import weakref

from .. import _backend as _B
from . import function as _fn
from .function import AccumulateGrad, _FREED_MSG
from .grad_mode import _state
from .anomaly_mode import _state as _anomaly, check_grads


class _Callbacks(threading.local):
    pending = None
    grad_inputs = False     # the running backward was given inputs=


_callbacks = _Callbacks()


def queue_callback(fn):
    """Run ``fn()`` once, when the backward pass now running finishes (as
    PyTorch's ``Variable._execution_engine.queue_callback``); DDP waits for
    its last all-reduces there."""
    if _callbacks.pending is None:
        raise RuntimeError("queue_callback can only be called while a "
                           "backward pass is running")
    _callbacks.pending.append(fn)


def is_checkpoint_valid():
    """False inside a backward pass that was given ``inputs`` (autograd.grad
    or backward(inputs=)): a reentrant checkpoint cannot run there."""
    return not _callbacks.grad_inputs


def _describe(t):
    return f"[dtorch.{t.dtype.name} {list(t.shape)}]"


def _check_versions(node):
    check_versions(node._versions, node.name())


def check_versions(versions, name):
    """Raise PyTorch's error when a tensor of ``versions`` ((counter,
    version when saved, tensor or weak reference, what it is) each) has
    been changed in place since; ``name`` is the node that saved it."""
    for vc, v, t, what in versions:
        if vc[0] != v:
            if isinstance(t, weakref.ref):     # a saved output
                t = t()
            desc = _describe(t) if t is not None else "a tensor"
            raise RuntimeError(
                "one of the variables needed for gradient computation has "
                f"been modified by an inplace operation: {desc}, "
                f"which is {what} of {name}, is at version {vc[0]}; "
                f"expected version {v} instead. Hint: replace the in-place "
                "operation with an out-of-place one (e.g. x = x + y instead "
                "of x += y), or clone() the tensor before modifying it.")


def _call_hooks(hooks, g):
    # hooks are array -> array (Tensor.register_hook wraps the user's)
    for h in hooks:
        g = h(g)
    return g


def run_backward(roots, grads, retain_graph=False, inputs=None,
                 accumulate=True, create_graph=False):
    """Propagate ``grads`` (arrays) from ``roots`` (tensors) to the leaves.

    With ``inputs`` (a list of tensors), return their gradients instead of,
    or (``accumulate=True``) besides, accumulating into leaves' ``.grad``.

    With ``create_graph`` the gradients are tensors instead of arrays (the
    roots' ``grads`` too), and the backward pass is itself recorded: each
    node runs its differentiable backward (``Function._run_backward_graph``)
    with grad mode on, so the results can be differentiated again.
    """
    # ---- the graph. A node's inputs always come from nodes created before
    # it, so decreasing creation number is a topological order: no consumer
    # counts or priority queue are needed for inner nodes. Leaves are
    # counted, so each accumulates the moment its last consumer has run.
    root_edges = [_fn._edge(t) for t in roots]
    nodes, leaves = [], []
    seen = set()
    leaf_deps = {}
    # node -> the leaves it feeds (one entry per edge), so that the main
    # loop below does not walk every node's edges a second time
    feeds = {}
    stack = []
    for node, _ in root_edges:
        if node not in seen:
            seen.add(node)
            if type(node) is AccumulateGrad:
                leaves.append(node)
                leaf_deps[node] = 0
            else:
                nodes.append(node)
                stack.append(node)
    while stack:
        node = stack.pop()
        for e in node.next_edges:
            if e is None:
                continue
            c = e[0]
            if type(c) is AccumulateGrad:
                leaf_deps[c] = leaf_deps.get(c, 0) + 1
                f = feeds.get(node)
                if f is None:
                    feeds[node] = [c]
                else:
                    f.append(c)
            elif c not in seen:
                seen.add(c)
                nodes.append(c)
                stack.append(c)
    nodes.sort(key=_by_seq, reverse=True)

    # ---- where autograd.grad wants its answers
    capture = None
    results = None
    if inputs is not None:
        capture = {}
        for i, t in enumerate(inputs):
            capture.setdefault(_fn._edge(t), []).append(i)
        results = [None] * len(inputs)

    buffers = {}
    for (node, nr), g in zip(root_edges, grads):
        buf = buffers.get(node)
        if buf is None:
            buf = buffers[node] = {}
        buf[nr] = g if nr not in buf else buf[nr] + g

    prev_mode = _state.enabled
    # no graph is recorded while differentiating, unless create_graph
    _state.enabled = bool(create_graph)
    outer_callbacks = _callbacks.pending
    _callbacks.pending = []
    outer_inputs = _callbacks.grad_inputs
    _callbacks.grad_inputs = inputs is not None
    try:
        # with CuPy loaded, each node and leaf runs on its gradients'
        # device (CuPy runs kernels on the current device); CPU-only
        # processes take the unguarded calls
        if create_graph:
            run, acc = ((_run_node_graph_on_device, _accumulate_on_device)
                        if _B._cupy is not None
                        else (_run_node_graph, _accumulate_graph))
        else:
            run, acc = ((_run_node_on_device, _accumulate_on_device)
                        if _B._cupy is not None else (_run_node, _accumulate))
        if _fn._profile is not None:     # dtorch.profiler is recording
            run = _fn._profile.backward_node(run)
        for leaf in leaves:      # backward() called on a leaf itself
            if leaf_deps[leaf] == 0:
                acc(leaf, buffers.pop(leaf, None), capture,
                    results, accumulate)
        pop = buffers.pop
        for node in nodes:
            buf = pop(node, None)
            if buf:
                run(node, buf, buffers, capture, results, retain_graph)
            fed = feeds.get(node)
            if fed is not None:
                for c in fed:
                    d = leaf_deps[c] - 1
                    leaf_deps[c] = d
                    if d == 0:
                        acc(c, pop(c, None), capture, results, accumulate)
        # callbacks may queue more callbacks
        while _callbacks.pending:
            _callbacks.pending.pop(0)()
    finally:
        _state.enabled = prev_mode
        _callbacks.pending = outer_callbacks
        _callbacks.grad_inputs = outer_inputs
    return results


_by_seq = operator.attrgetter("_seq")


def _run_node(node, buf, buffers, capture, results, retain_graph,
              graph=False):
    """Call one node's backward and send its gradients along its edges.
    With ``graph`` (create_graph=True) the gradients are tensors and the
    node's differentiable backward runs (Function._run_backward_graph)."""
    if node._freed:
        raise RuntimeError(_FREED_MSG)
    if len(buf) == 1 and 0 in buf:
        out_grads = [buf[0]]
    else:
        out_grads = [None] * (max(buf) + 1)
        for nr, g in buf.items():
            out_grads[nr] = g
    if node._hooks:
        call = _call_hooks_graph if graph else _call_hooks
        for nr, hooks in node._hooks.items():
            if nr < len(out_grads) and out_grads[nr] is not None:
                out_grads[nr] = call(hooks, out_grads[nr])
    if capture is not None:
        for nr, g in enumerate(out_grads):
            for i in capture.get((node, nr), ()):
                results[i] = g
    if node._versions:
        _check_versions(node)
    if graph:
        in_grads = node._run_backward_graph(out_grads)
    elif node._array_api:    # Function._run_backward's array case, inlined
        # (one gradient, the common case, without a star-call)
        in_grads = (type(node).backward(node, out_grads[0])
                    if len(out_grads) == 1
                    else type(node).backward(node, *out_grads))
        if type(in_grads) is not tuple:
            in_grads = (in_grads,)
    else:
        in_grads = node._run_backward(out_grads)
    if _anomaly[0]:
        check_grads(node, [None if g is None else g._data for g in in_grads]
                    if graph else in_grads)
    if not retain_graph:
        node.__dict__.clear()
        node._freed = True
        node._versions = None
    elif "_packed" in node.__dict__:
        # what saved-tensors hooks packed stays packed for the next
        # backward, which unpacks (a checkpoint: recomputes) it again
        d = node.__dict__
        for k in d["_packed"]:
            d.pop(k, None)
    first = sent = None
    for e, g in zip(node.next_edges, in_grads):
        if e is None or g is None:
            continue
        # the same array sent to two places must not become two .grad
        # tensors that alias each other (a set only from the second one;
        # tensors of a recorded backward are new objects, never updated
        # in place)
        if graph:
            pass
        elif first is None:
            first = g
        else:
            if sent is None:
                sent = {id(first)}
            if id(g) in sent:
                g = (_on_device_of(g, g.copy) if _B._cupy is not None
                     else g.copy())
            else:
                sent.add(id(g))
        c, nr = e
        cb = buffers.get(c)
        if cb is None:
            buffers[c] = {nr: g}
        elif nr in cb:
            # an op that moved data between devices sends its gradient to
            # another device than the one this node ran on
            cb[nr] = (_on_device_of(g, cb[nr].__add__, g)
                      if _B._cupy is not None and not graph
                      else cb[nr] + g)
        else:
            cb[nr] = g


def _first_cuda(arrays):
    nd = _B._cupy.ndarray
    for a in arrays:
        if isinstance(a, nd):
            return a
    return None


def _on_device_of(a, fn, *args):
    with _B.device_guard(a):
        return fn(*args)


def _run_node_on_device(node, buf, *rest):
    with _B.device_guard(_first_cuda(buf.values())):
        _run_node(node, buf, *rest)


def _accumulate_on_device(node, buf, capture, results, accumulate):
    # on the leaf's device: .grad += g runs on the current device
    if buf:
        with _B.device_guard(node.variable._data):
            if isinstance(buf[0], _fn.TensorBase):
                _accumulate_graph(node, buf, capture, results, accumulate)
            else:
                _accumulate(node, buf, capture, results, accumulate)


def _leaf_gradient(node, buf, capture, results, accumulate, call_hooks):
    """What _accumulate and _accumulate_graph share: the shape check, the
    leaf's hooks and autograd.grad's capture. The gradient to add into
    .grad, or None when there is none to add."""
    if not buf:
        return None
    g = buf[0]
    t = node.variable
    if g.shape != t._data.shape:
        raise RuntimeError(
            f"Function AccumulateGrad returned an invalid gradient: got "
            f"shape {list(g.shape)} for a tensor of shape {list(t.shape)}")
    if t._hooks:
        g = call_hooks(t._hooks, g)
    if capture is not None:
        for i in capture.get((node, 0), ()):
            results[i] = g
        if not accumulate:
            return None
    return g


def _accumulate(node, buf, capture, results, accumulate):
    g = _leaf_gradient(node, buf, capture, results, accumulate, _call_hooks)
    if g is None:
        return
    t = node.variable
    if g.dtype != t._data.dtype:
        g = g.astype(t._data.dtype)
    if t._grad is None:
        t._grad = t._make(g, False, None)
    else:
        gd = t._grad._data
        if gd.shape == g.shape and gd.dtype == g.dtype:
            gd += g        # in place: .grad may be a view into a DDP bucket
            t._grad._bump_version()
        else:
            t._grad = t._make(gd + g, False, None)
    if t._post_hooks:
        for h in t._post_hooks:
            h(t)


# ---------------------------------------------------------------------------
# create_graph=True: the same walk over tensors, recorded as a new graph.

def _call_hooks_graph(hooks, g):
    # a user's tensor hook (Tensor.register_hook) sees the tensor itself;
    # dtorch's own array hooks see its array, and a new array they return
    # replaces the gradient as a constant
    for h in hooks:
        th = getattr(h, "hook", None)
        if th is not None:
            r = th(g)
            if r is not None:
                g = r
        else:
            r = h(g._data)
            if r is not g._data:
                g = g._make(r, False, None)
    return g


def _run_node_graph(node, buf, *rest):
    _run_node(node, buf, *rest, graph=True)


def _run_node_graph_on_device(node, buf, *rest):
    with _B.device_guard(_first_cuda(g._data for g in buf.values())):
        _run_node_graph(node, buf, *rest)


def _accumulate_graph(node, buf, capture, results, accumulate):
    """_accumulate over tensors: ``.grad`` becomes the (differentiable)
    gradient tensor, summed out of place with an earlier one, as PyTorch
    does under create_graph."""
    g = _leaf_gradient(node, buf, capture, results, accumulate,
                       _call_hooks_graph)
    if g is None:
        return
    t = node.variable
    if g.dtype != t.dtype:
        g = g.to(t.dtype)
    # a copy, as PyTorch's AccumulateGrad under grad mode: the gradient may
    # be a broadcast view or the caller's own tensor, and .grad is updated
    # in place later (optimizers, zero_grad)
    t._grad = g.clone() if t._grad is None else t._grad + g
    if t._post_hooks:
        for h in t._post_hooks:
            h(t)
