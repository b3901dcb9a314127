"""Adamax, as ``torch.optim.Adamax``."""
from __future__ import annotations
from .. import _backend as B
from .optimizer import (Optimizer, ParamsT, _bump, _check, _kernel_args,
                        _next_step, _step_tensor, _zeros)

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
        _check(0.0 <= lr, f"Invalid learning rate: {lr}")
        _check(0.0 <= eps, f"Invalid epsilon value: {eps}")
        _check(0.0 <= betas[0] < 1.0,
               f"Invalid beta parameter at index 0: {betas[0]}")
        _check(0.0 <= betas[1] < 1.0,
               f"Invalid beta parameter at index 1: {betas[1]}")
        _check(0.0 <= weight_decay,
               f"Invalid weight_decay value: {weight_decay}")
        defaults = dict(lr=lr, betas=betas, eps=eps,
                        weight_decay=weight_decay, maximize=maximize)
        super().__init__(params, defaults)

    def _update(self, p, group):
        state = self.state[p]
        if not state:
            state["step"] = _step_tensor()
            state["exp_avg"] = _zeros(p)
            state["exp_inf"] = _zeros(p)
        step = _next_step(state)
        beta1, beta2 = group["betas"]
        x, g = p._data, p.grad._data
        xp = B.get_array_module(x)
        if group["maximize"]:
            g = -g
        if group["weight_decay"] != 0:
            g = g + group["weight_decay"] * x
        m = state["exp_avg"]._data
        u = state["exp_inf"]._data
        m += (1 - beta1) * (g - m)
        u *= beta2
        xp.maximum(u, xp.abs(g) + group["eps"], out=u)
        clr = group["lr"] / (1 - beta1 ** step)
        x -= clr * (m / u)
        _bump(p)
