"""RAdam, as ``torch.optim.RAdam`` (Adam with the variance of the adaptive
learning rate rectified; plain momentum SGD while it is undefined)."""
from __future__ import annotations
import math

from .optimizer import (Optimizer, ParamsT, _bump, _check_adam_args,
                        _decayed_grad, _init_state, _kernel_args, _next_step)

__all__ = ["RAdam"]


class RAdam(Optimizer):
    """As ``torch.optim.RAdam``; ``foreach``/``capturable`` change nothing,
    ``differentiable=True`` warns (see ``dtorch.optim.optimizer``)."""

    def __init__(self, params: ParamsT, lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0, decoupled_weight_decay: bool = False,
                 *, foreach: bool | None = None, maximize: bool = False,
                 capturable: bool = False,
                 differentiable: bool = False) -> None:
        _kernel_args("RAdam", foreach=foreach, capturable=capturable,
                     differentiable=differentiable)
        _check_adam_args(lr, eps, betas, weight_decay)
        defaults = dict(lr=lr, betas=betas, eps=eps,
                        weight_decay=weight_decay,
                        decoupled_weight_decay=decoupled_weight_decay,
                        maximize=maximize)
        super().__init__(params, defaults)

    def _update(self, p, group):
        state = _init_state(self.state[p], p, "exp_avg", "exp_avg_sq")
        step = _next_step(state)
        lr, eps = group["lr"], group["eps"]
        beta1, beta2 = group["betas"]
        x, g, xp = _decayed_grad(p, group, group["decoupled_weight_decay"])
        m = state["exp_avg"]._data
        v = state["exp_avg_sq"]._data
        m += (1 - beta1) * (g - m)
        v *= beta2
        v += (1 - beta2) * (g * g)
        bc1 = 1 - beta1 ** step
        bc2 = 1 - beta2 ** step
        m_hat = m / bc1
        rho_inf = 2 / (1 - beta2) - 1
        rho_t = rho_inf - 2 * step * (beta2 ** step) / bc2
        if rho_t > 5.0:
            rect = math.sqrt((rho_t - 4) * (rho_t - 2) * rho_inf
                             / ((rho_inf - 4) * (rho_inf - 2) * rho_t))
            adaptive = (bc2 ** 0.5) / (xp.sqrt(v) + eps)
            x -= m_hat * lr * adaptive * rect
        else:
            x -= m_hat * lr
        _bump(p)
