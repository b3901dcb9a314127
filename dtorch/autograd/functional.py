"""``autograd.functional.jacobian`` (reverse mode, one backward per output
element, as PyTorch's default ``vectorize=False``). ``hessian`` and the
other second-order functions need double backward, which dtorch lacks."""
from ._api import grad
from . import function as _fn
from .grad_mode import enable_grad


def _tuple(x):
    return (tuple(x), True) if isinstance(x, (tuple, list)) else ((x,), False)


def jacobian(func, inputs, create_graph=False, strict=False, vectorize=False,
             strategy="reverse-mode"):
    """d func(inputs) / d inputs: for one input and one output a tensor of
    shape output.shape + input.shape; tuples of tuples otherwise.
    ``vectorize=True`` (PyTorch's vmap path) is accepted and gives the same
    Jacobian: dtorch computes it one backward per output element either
    way."""
    if create_graph:
        raise NotImplementedError("jacobian(create_graph=True) needs double "
                                  "backward, which dtorch does not support")
    if strategy != "reverse-mode":
        raise NotImplementedError("only strategy='reverse-mode' is "
                                  "supported by dtorch")
    ins, tuple_in = _tuple(inputs)
    ins = tuple(t.detach().requires_grad_(True) for t in ins)
    with enable_grad():
        outs, tuple_out = _tuple(func(*ins))
    T = _fn.TensorBase
    rows = []
    for i, out in enumerate(outs):
        if not isinstance(out, T):
            raise TypeError(f"The outputs of the user-provided function "
                            f"given to jacobian must be Tensors, but output "
                            f"{i} is {type(out).__name__}")
        flat = out.reshape(-1)
        per_in = [[] for _ in ins]
        for k in range(flat.numel()):      # one backward per output element
            gs = grad(flat[k], ins, retain_graph=True, allow_unused=True) \
                if out.requires_grad else (None,) * len(ins)
            for j, (g, x) in enumerate(zip(gs, ins)):
                if g is None:
                    if strict:
                        raise RuntimeError(
                            f"Output {i} of the user-provided function is "
                            f"independent of input {j}. This is not allowed "
                            f"in strict mode.")
                    g = x.new_zeros(x.shape).detach()
                per_in[j].append(g)
        jac = []
        for j, x in enumerate(ins):
            if per_in[j]:
                # gradients carry no graph here: stack their arrays
                J = x._make(x._xp().stack([g._data for g in per_in[j]], 0),
                            False, None)
            else:
                J = x.new_zeros((0,) + tuple(x.shape))
            jac.append(J.reshape(tuple(out.shape) + tuple(x.shape)))
        rows.append(tuple(jac) if tuple_in else jac[0])
    return tuple(rows) if tuple_out else rows[0]


def hessian(func, inputs, create_graph=False, strict=False, vectorize=False,
            outer_jacobian_strategy="reverse-mode"):
    raise NotImplementedError("hessian needs double backward "
                              "(create_graph=True), which dtorch does not "
                              "support")
