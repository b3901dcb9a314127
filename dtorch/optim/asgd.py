"""ASGD, as ``torch.optim.ASGD``: SGD with a decaying step and a running
average of the iterates (``state['ax']``)."""
from __future__ import annotations
import numpy as np

from ..tensor import Tensor
from .optimizer import (Optimizer, ParamsT, _bump, _check, _decayed_grad,
                        _kernel_args, _next_step, _step_tensor, _zeros)

__all__ = ["ASGD"]


def _f32(v):
    # eta and mu are float32 0-d tensors in PyTorch; keep their rounding
    return Tensor._wrap(np.asarray(v, np.float32))


class ASGD(Optimizer):
    """As ``torch.optim.ASGD``; ``foreach``/``capturable`` change nothing,
    ``differentiable=True`` warns (see ``dtorch.optim.optimizer``)."""

    def __init__(self, params: ParamsT, lr: float = 1e-2, lambd: float = 1e-4,
                 alpha: float = 0.75, t0: float = 1e6, weight_decay: float = 0,
                 foreach: bool | None = None, maximize: bool = False,
                 differentiable: bool = False,
                 capturable: bool = False) -> None:
        _kernel_args("ASGD", foreach=foreach, capturable=capturable,
                     differentiable=differentiable)
        _check(0.0 <= lr, f"Invalid learning rate: {lr}")
        _check(0.0 <= weight_decay,
               f"Invalid weight_decay value: {weight_decay}")
        defaults = dict(lr=lr, lambd=lambd, alpha=alpha, t0=t0,
                        weight_decay=weight_decay, maximize=maximize)
        super().__init__(params, defaults)

    def _update(self, p, group):
        state = self.state[p]
        if not state:
            state["step"] = _step_tensor()
            state["eta"] = _f32(group["lr"])
            state["mu"] = _f32(1.0)
            state["ax"] = _zeros(p)
        step = _next_step(state)
        lr, lambd = group["lr"], group["lambd"]
        x, g, _ = _decayed_grad(p, group)
        eta = float(state["eta"]._data)
        x *= 1 - lambd * eta
        x -= eta * g
        ax = state["ax"]._data
        mu = float(state["mu"]._data)
        if mu != 1:
            ax += (x - ax) * mu
        else:
            ax[...] = x
        state["eta"]._data[...] = lr / ((1 + lambd * lr * step)
                                        ** group["alpha"])
        state["mu"]._data[...] = 1 / max(1, step - group["t0"])
        _bump(p)
