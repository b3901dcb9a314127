"""``gradcheck``: analytical gradients against central finite differences.

Use float64 inputs; the full Jacobian is compared (torch.autograd.gradcheck's
default), which is cheap for the small shapes tests use.
"""
import warnings

import numpy as np

from ._api import grad as _grad
from . import function as _fn
from .grad_mode import no_grad, enable_grad


class GradcheckError(RuntimeError):
    pass


def _host(a):
    """A float64 NumPy copy of a NumPy or CuPy array (CuPy refuses
    np.asarray: device arrays come back through .get())."""
    if hasattr(a, "get") and not isinstance(a, np.ndarray):
        a = a.get()
    return np.asarray(a, dtype=np.float64)


def _outputs(fn, inputs):
    out = fn(*inputs)
    if isinstance(out, (list, tuple)):
        return [o for o in out if isinstance(o, _fn.TensorBase)]
    return [out]


def gradcheck(func, inputs, eps=1e-6, atol=1e-5, rtol=1e-3,
              raise_exception=True, nondet_tol=0.0):
    """True when ``func``'s backward matches finite differences for every
    input that requires grad, and gives the same answer when run twice
    (within ``nondet_tol``, PyTorch's reentrancy check); otherwise raise
    (or return False).

    Example::

        x = dtorch.randn(3, 4, dtype=dtorch.float64, requires_grad=True)
        assert dtorch.autograd.gradcheck(lambda t: (t * t).sum(1), (x,))
    """
    T = _fn.TensorBase
    if isinstance(inputs, T):
        inputs = (inputs,)
    inputs = tuple(inputs)
    diff = [i for i, t in enumerate(inputs)
            if isinstance(t, T) and t.requires_grad]
    if not diff:
        raise ValueError("gradcheck expects at least one input tensor to "
                         "require gradient")
    for i in diff:
        if inputs[i].dtype.name != "float64":
            warnings.warn(f"gradcheck: input {i} is {inputs[i].dtype}, not "
                          f"float64; the check may fail from rounding")
    outs = _outputs(func, inputs)
    for k, out in enumerate(outs):
        if not out.requires_grad:
            continue
        n_out = out.numel()
        # analytical Jacobian, one backward per output element
        analytical = {i: np.zeros((inputs[i].numel(), n_out))
                      for i in diff}
        again = {i: np.zeros_like(a) for i, a in analytical.items()}
        for j in range(n_out):
            outs_j = _outputs(func, inputs)[k]
            g = np.zeros(n_out)
            g[j] = 1.0
            g = outs_j._make(outs_j._xp().asarray(
                g.reshape(outs_j.shape).astype(outs_j._data.dtype)),
                False, None)
            for jac, retain in ((analytical, True), (again, False)):
                grads = _grad([outs_j], [inputs[i] for i in diff], [g],
                              retain_graph=retain, allow_unused=True)
                for i, gi in zip(diff, grads):
                    if gi is not None:
                        jac[i][:, j] = _host(gi.detach()._data).reshape(-1)
        # numerical Jacobian, central differences
        for i in diff:
            x = inputs[i]
            # index the array itself, in C order: reshape(-1) would copy
            # a non-contiguous input, and the perturbation would be lost
            data = x._data
            numerical = np.zeros_like(analytical[i])
            with no_grad():
                for e, idx in enumerate(np.ndindex(*data.shape)):
                    orig = data[idx].item()
                    data[idx] = orig + eps
                    hi = _outputs(func, inputs)[k]._data.reshape(-1).copy()
                    data[idx] = orig - eps
                    lo = _outputs(func, inputs)[k]._data.reshape(-1).copy()
                    data[idx] = orig
                    numerical[e] = _host((hi - lo) / (2 * eps))
            a = analytical[i]
            if not np.allclose(a, numerical, rtol=rtol, atol=atol):
                bad = np.unravel_index(np.argmax(np.abs(a - numerical)),
                                       a.shape)
                msg = (f"Jacobian mismatch for output {k} with respect to "
                       f"input {i},\nnumerical:{numerical}\nanalytical:{a}\n"
                       f"largest difference at (input elem {bad[0]}, output "
                       f"elem {bad[1]}): numerical {numerical[bad]} vs "
                       f"analytical {a[bad]}")
                if raise_exception:
                    raise GradcheckError(msg)
                return False
            if not np.allclose(a, again[i], rtol=0, atol=nondet_tol):
                msg = (f"Backward is not reentrant, i.e., running backward "
                       f"with same input and grad_output multiple times "
                       f"gives different values, although analytical "
                       f"gradient matches numerical gradient. The tolerance "
                       f"for nondeterminism was {nondet_tol}.")
                if raise_exception:
                    raise GradcheckError(msg)
                return False
    return True


def gradgradcheck(func, inputs, grad_outputs=None, eps=1e-6, atol=1e-5,
                  rtol=1e-3, gen_non_contig_grad_outputs=False,
                  raise_exception=True, nondet_tol=0.0):
    """``gradcheck`` of the gradient itself: the second derivatives that
    ``create_graph=True`` gives, against finite differences of the first
    ones. ``grad_outputs`` (random, requiring grad, when None) are inputs
    of the checked function too, as in torch.autograd.gradgradcheck.

    Example::

        x = dtorch.randn(3, dtype=dtorch.float64, requires_grad=True)
        assert dtorch.autograd.gradgradcheck(lambda t: t.tanh() * t, (x,))
    """
    T = _fn.TensorBase
    if isinstance(inputs, T):
        inputs = (inputs,)
    inputs = tuple(inputs)
    outs = [o for o in _outputs(func, inputs) if o.requires_grad]
    if grad_outputs is None:
        rng = np.random.default_rng(0)
        grad_outputs = []
        for o in outs:
            a = rng.standard_normal(tuple(o.shape))
            if gen_non_contig_grad_outputs and a.ndim:
                a = np.repeat(a, 2, axis=-1)[..., ::2]
            grad_outputs.append(o._make(
                o._xp().asarray(a).astype(o._data.dtype), True, None))
    elif isinstance(grad_outputs, T):
        grad_outputs = [grad_outputs]
    grad_outputs = tuple(grad_outputs)
    n_in = len(inputs)
    diff = [i for i, t in enumerate(inputs)
            if isinstance(t, T) and t.requires_grad]

    def first_order(*args):
        # also while gradcheck perturbs inputs under no_grad
        ins, gos = args[:n_in], args[n_in:]
        with enable_grad():
            outs = [o for o in _outputs(func, ins) if o.requires_grad]
            gs = _grad(outs, [ins[i] for i in diff], list(gos),
                       create_graph=True, allow_unused=True)
        return tuple(g for g in gs if g is not None)

    return gradcheck(first_order, inputs + grad_outputs, eps=eps, atol=atol,
                     rtol=rtol, raise_exception=raise_exception,
                     nondet_tol=nondet_tol)
