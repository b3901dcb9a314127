"""Adadelta, as ``torch.optim.Adadelta``."""
from __future__ import annotations
from .optimizer import (Optimizer, ParamsT, _bump, _check, _decayed_grad,
                        _init_state, _kernel_args, _next_step)

__all__ = ["Adadelta"]


class Adadelta(Optimizer):
    """Adadelta (Zeiler, 2012): steps scaled by the ratio of the running
    RMS of past updates to the running RMS of gradients, then by ``lr``.
    ``foreach``/``capturable`` change nothing, ``differentiable=True`` warns
    (see ``dtorch.optim.optimizer``).

    Example::

        opt = dtorch.optim.Adadelta(model.parameters(), lr=1.0)
    """

    def __init__(self, params: ParamsT, lr: float = 1.0, rho: float = 0.9,
                 eps: float = 1e-6, weight_decay: float = 0,
                 foreach: bool | None = None, *, capturable: bool = False,
                 maximize: bool = False, differentiable: bool = False) -> None:
        _kernel_args("Adadelta", foreach=foreach, capturable=capturable,
                     differentiable=differentiable)
        _check(0.0 <= lr, f"Invalid learning rate: {lr}")
        _check(0.0 <= rho <= 1.0, f"Invalid rho value: {rho}")
        _check(0.0 <= eps, f"Invalid epsilon value: {eps}")
        _check(0.0 <= weight_decay,
               f"Invalid weight_decay value: {weight_decay}")
        defaults = dict(lr=lr, rho=rho, eps=eps, weight_decay=weight_decay,
                        maximize=maximize)
        super().__init__(params, defaults)

    def _update(self, p, group):
        state = _init_state(self.state[p], p, "square_avg", "acc_delta")
        _next_step(state)
        rho, eps = group["rho"], group["eps"]
        x, g, xp = _decayed_grad(p, group)
        sq = state["square_avg"]._data
        acc = state["acc_delta"]._data
        sq *= rho
        sq += (1 - rho) * (g * g)
        delta = xp.sqrt(acc + eps) / xp.sqrt(sq + eps) * g
        acc *= rho
        acc += (1 - rho) * (delta * delta)
        x -= group["lr"] * delta
        _bump(p)
