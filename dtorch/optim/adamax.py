"""Adamax, as ``torch.optim.Adamax``."""
from __future__ import annotations
from .optimizer import (Optimizer, ParamsT, _bump, _check_adam_args,
                        _decayed_grad, _init_state, _kernel_args, _next_step)

__all__ = ["Adamax"]


class Adamax(Optimizer):
    """Adam with the infinity norm: the second moment is replaced by a
    running maximum of |gradient| (Kingma & Ba, section 7).
    ``foreach``/``capturable`` change nothing, ``differentiable=True`` warns
    (see ``dtorch.optim.optimizer``)."""

    def __init__(self, params: ParamsT, lr: float = 2e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0, foreach: bool | None = None, *,
                 maximize: bool = False, differentiable: bool = False,
                 capturable: bool = False) -> None:
        _kernel_args("Adamax", foreach=foreach, capturable=capturable,
                     differentiable=differentiable)
        _check_adam_args(lr, eps, betas, weight_decay)
        defaults = dict(lr=lr, betas=betas, eps=eps,
                        weight_decay=weight_decay, maximize=maximize)
        super().__init__(params, defaults)

    def _update(self, p, group):
        state = _init_state(self.state[p], p, "exp_avg", "exp_inf")
        step = _next_step(state)
        beta1, beta2 = group["betas"]
        x, g, xp = _decayed_grad(p, group)
        m = state["exp_avg"]._data
        u = state["exp_inf"]._data
        m += (1 - beta1) * (g - m)
        u *= beta2
        xp.maximum(u, xp.abs(g) + group["eps"], out=u)
        clr = group["lr"] / (1 - beta1 ** step)
        x -= clr * (m / u)
        _bump(p)
