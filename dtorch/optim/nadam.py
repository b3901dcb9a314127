"""NAdam, as ``torch.optim.NAdam`` (Adam with Nesterov momentum and
Dozat's momentum schedule)."""
from __future__ import annotations
import numpy as np

from ..tensor import Tensor
from .optimizer import (Optimizer, ParamsT, _bump, _check, _check_adam_args,
                        _decayed_grad, _kernel_args, _next_step,
                        _step_tensor, _zeros)

__all__ = ["NAdam"]


class NAdam(Optimizer):
    """As ``torch.optim.NAdam``; ``foreach``/``capturable`` change nothing,
    ``differentiable=True`` warns (see ``dtorch.optim.optimizer``)."""

    def __init__(self, params: ParamsT, lr: float = 2e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0, momentum_decay: float = 4e-3,
                 decoupled_weight_decay: bool = False, *,
                 foreach: bool | None = None, maximize: bool = False,
                 capturable: bool = False,
                 differentiable: bool = False) -> None:
        _kernel_args("NAdam", foreach=foreach, capturable=capturable,
                     differentiable=differentiable)
        _check_adam_args(lr, eps, betas, weight_decay)
        _check(0.0 <= momentum_decay,
               f"Invalid momentum_decay value: {momentum_decay}")
        defaults = dict(lr=lr, betas=betas, eps=eps,
                        weight_decay=weight_decay,
                        momentum_decay=momentum_decay,
                        decoupled_weight_decay=decoupled_weight_decay,
                        maximize=maximize)
        super().__init__(params, defaults)

    def _update(self, p, group):
        state = self.state[p]
        if not state:
            state["step"] = _step_tensor()
            # a float32 0-d tensor in PyTorch; its rounding is kept
            state["mu_product"] = Tensor._wrap(np.ones((), np.float32))
            state["exp_avg"] = _zeros(p)
            state["exp_avg_sq"] = _zeros(p)
        step = _next_step(state)
        lr, eps = group["lr"], group["eps"]
        beta1, beta2 = group["betas"]
        md = group["momentum_decay"]
        x, g, xp = _decayed_grad(p, group, group["decoupled_weight_decay"])
        bc2 = 1 - beta2 ** step
        mu = beta1 * (1.0 - 0.5 * (0.96 ** (step * md)))
        mu_next = beta1 * (1.0 - 0.5 * (0.96 ** ((step + 1) * md)))
        mp = state["mu_product"]._data
        mp *= np.float32(mu)
        mu_product = float(mp)
        m = state["exp_avg"]._data
        v = state["exp_avg_sq"]._data
        m += (1 - beta1) * (g - m)
        v *= beta2
        v += (1 - beta2) * (g * g)
        denom = xp.sqrt(v / bc2) + eps
        x += (-lr * (1.0 - mu) / (1.0 - mu_product)) * (g / denom)
        x += ((-lr * mu_next) / (1.0 - mu_product * mu_next)) * (m / denom)
        _bump(p)
