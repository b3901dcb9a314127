"""Gradient clipping, PyTorch's behaviour for behaviour.

``clip_grad_norm_`` is split as in PyTorch into ``get_total_norm`` (the norm
of the norms of the local gradients) and ``clip_grads_with_norm_`` (scale by
``min(1, max_norm / (total + 1e-6))``, always multiplying, so that no
host-side branch on the norm is needed). A distributed version computes the
global norm its own way (e.g. all-reducing ``total ** p``) and then calls
``clip_grads_with_norm_`` with it, or passes ``total_norm_fn``.

``foreach`` (PyTorch's multi-tensor kernels) is accepted by every function
here and changes nothing: there is one implementation, and the results equal
the default's (tests/nn/test_nn_torch_arguments.py).
"""
import math

import numpy as np

from ..._backend import device_guard, get_array_module
from ...tensor import Tensor


def _params(parameters):
    if isinstance(parameters, Tensor):
        return [parameters]
    return list(parameters)


def _vector_norm(a, p):
    """The p-norm of an array as a 0-d array of its dtype. Half-precision
    input is accumulated in float32 and the result cast back, as PyTorch
    does: a float16 gradient of norm 300 has a sum of squares (90000) past
    float16's largest value."""
    xp = get_array_module(a)
    a = a.reshape(-1)
    dt = a.dtype
    if a.size == 0:
        return xp.zeros((), dt)
    if p == math.inf:
        return xp.abs(a).max()
    if p == -math.inf:
        return xp.abs(a).min()
    if p == 0:
        return (a != 0).sum().astype(dt)
    if (dt.itemsize < 4 and dt.kind == "f") or dt.name == "bfloat16":
        a = a.astype(np.float32)
    if p == 2:
        r = xp.sqrt(xp.dot(a, a))
    elif p == 1:
        r = xp.abs(a).sum()
    else:
        r = (xp.abs(a) ** p).sum() ** (1.0 / p)
    return r.astype(dt)


def get_total_norm(tensors, norm_type=2.0, error_if_nonfinite=False,
                   foreach=None):
    """The norm of the norms of ``tensors`` (grads), a 0-d tensor."""
    from ..._creation import tensor
    tensors = _params(tensors)
    norm_type = float(norm_type)
    if not tensors:
        return tensor(0.0)
    first = tensors[0]
    dev = first.device
    norms = []
    for t in tensors:      # each on its own device (CuPy: the current one)
        with device_guard(t._data):
            norms.append(_vector_norm(t._data, norm_type))
    norms = [dev.send(n) for n in norms]
    xp = get_array_module(first._data)
    dt = np.result_type(*[n.dtype for n in norms])
    # the norms are combined in float32 at least (half is cast back)
    acc = np.promote_types(dt, np.float32)
    with device_guard(first._data):
        total = _vector_norm(xp.stack([n.astype(acc) for n in norms]),
                             norm_type).astype(dt)
        total_t = Tensor._wrap(xp.asarray(total))
    if error_if_nonfinite and not bool(xp.isfinite(total)):
        raise RuntimeError(
            f"The total norm of order {norm_type} for gradients from "
            f"`parameters` is non-finite, so it cannot be clipped. To "
            f"disable this error and scale the gradients by the non-finite "
            f"norm anyway, set `error_if_nonfinite=False`")
    return total_t


def clip_grads_with_norm_(parameters, max_norm, total_norm, foreach=None):
    """Scale every gradient by min(1, max_norm / (total_norm + 1e-6)),
    branch-free (a NaN/inf norm propagates into the grads, as in PyTorch)."""
    params = _params(parameters)
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    tn = total_norm._data if isinstance(total_norm, Tensor) else total_norm
    xp = get_array_module(grads[0]._data)
    with device_guard(tn):
        coef = xp.minimum(float(max_norm) / (tn + 1e-6), 1.0)
    for g in grads:
        c = coef
        if hasattr(c, "shape"):
            c = g.device.send(c)    # to g's device, from any
        with device_guard(g._data):
            g._data *= xp.asarray(c).astype(g._data.dtype)
        g._bump_version()


def clip_grad_norm_(parameters, max_norm, norm_type=2.0,
                    error_if_nonfinite=False, foreach=None,
                    total_norm_fn=None):
    """Clip the gradient norm of an iterable of parameters (in place), as
    if all gradients were one vector; returns the total norm (before
    clipping) as a tensor.

    ``total_norm_fn(grads, norm_type, error_if_nonfinite)`` replaces
    ``get_total_norm``, which is where a distributed caller plugs in a
    global norm.

    Example::

        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        opt.step()
    """
    params = _params(parameters)
    grads = [p.grad for p in params if p.grad is not None]
    fn = total_norm_fn or get_total_norm
    total = fn(grads, norm_type, error_if_nonfinite)
    clip_grads_with_norm_(params, max_norm, total)
    return total


def clip_grad_norm(parameters, max_norm, norm_type=2.0,
                   error_if_nonfinite=False, foreach=None):
    import warnings
    warnings.warn("`torch.nn.utils.clip_grad_norm` is now deprecated in "
                  "favor of `torch.nn.utils.clip_grad_norm_`.",
                  FutureWarning, stacklevel=2)
    return clip_grad_norm_(parameters, max_norm, norm_type,
                           error_if_nonfinite, foreach)


def clip_grad_value_(parameters, clip_value, foreach=None):
    """Clamp every gradient to [-clip_value, clip_value] in place."""
    clip_value = float(clip_value)
    for p in _params(parameters):
        if p.grad is not None:
            g = p.grad
            xp = get_array_module(g._data)
            with device_guard(g._data):
                xp.clip(g._data, -clip_value, clip_value, out=g._data)
            g._bump_version()
