"""Stochastic gradient descent with momentum, as ``torch.optim.SGD``."""
from __future__ import annotations
import numpy as np

from .. import _kernels
from ..tensor import Tensor
from .optimizer import (Optimizer, ParamsT, _bump, _check, _decayed_grad,
                        _kernel_args)

__all__ = ["SGD"]


class SGD(Optimizer):
    """SGD with optional momentum, dampening, Nesterov momentum, weight
    decay and maximisation; PyTorch's update:

        g = grad + weight_decay * p
        buf = g (first step), else momentum * buf + (1 - dampening) * g
        g = g + momentum * buf (nesterov) or buf
        p = p - lr * g

    ``foreach``/``fused`` change nothing, ``differentiable=True`` warns
    (see ``dtorch.optim.optimizer``).

    Example::

        opt = dtorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        opt.zero_grad(); loss.backward(); opt.step()
    """

    def __init__(self, params: ParamsT, lr: float = 1e-3, momentum: float = 0,
                 dampening: float = 0, weight_decay: float = 0,
                 nesterov: bool = False, *, maximize: bool = False,
                 foreach: bool | None = None, differentiable: bool = False,
                 fused: bool | None = None) -> None:
        _kernel_args("SGD", foreach=foreach, fused=fused,
                     differentiable=differentiable)
        _check(lr >= 0.0, f"Invalid learning rate: {lr}")
        _check(momentum >= 0.0, f"Invalid momentum value: {momentum}")
        _check(weight_decay >= 0.0,
               f"Invalid weight_decay value: {weight_decay}")
        _check(not nesterov or (momentum > 0 and dampening == 0),
               "Nesterov momentum requires a momentum and zero dampening")
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening,
                        weight_decay=weight_decay, nesterov=nesterov,
                        maximize=maximize)
        super().__init__(params, defaults)

    def _update(self, p, group):
        lr = group["lr"]
        momentum = group["momentum"]
        x, g, _ = _decayed_grad(p, group)
        if _sgd_kernel(self.state[p] if momentum != 0 else None, x, g, group):
            _bump(p)
            return
        if momentum != 0:
            state = self.state[p]
            buf = state.get("momentum_buffer")
            if buf is None:
                buf = state["momentum_buffer"] = Tensor._wrap(g.copy())
            else:
                b = buf._data
                b *= momentum
                damp = group["dampening"]
                b += g if damp == 0 else (1 - damp) * g
            if group["nesterov"]:
                g = g + momentum * buf._data
            else:
                g = buf._data
        x -= lr * g
        _bump(p)


def _sgd_kernel(state, x, g, group):
    """The update above in one threaded pass (bit for bit), where the
    kernels apply; False otherwise. ``state``: None without momentum."""
    buf = first = None
    if state is not None:
        buf = state.get("momentum_buffer")
        first = buf is None
        buf = np.empty_like(g) if first else buf._data
    k = _kernels.kernels(x, g, *(() if buf is None else (buf,)))
    if k is None:
        return False
    if first:
        state["momentum_buffer"] = Tensor._wrap(buf)
    f = _kernels.flat
    k.sgd(f(x), f(g), f(x)[:0] if buf is None else f(buf), *_kernels.scalars(
        x, group["lr"], group["momentum"], 1 - group["dampening"]),
        bool(first), group["nesterov"])
    return True
