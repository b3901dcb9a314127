"""Adam and AdamW, as ``torch.optim.Adam`` / ``torch.optim.AdamW``."""
from __future__ import annotations
import math

from .. import _kernels
from .optimizer import (Optimizer, ParamsT, _bump, _check_adam_args,
                        _decayed_grad, _init_state, _kernel_args, _next_step)

__all__ = ["Adam", "AdamW"]


class Adam(Optimizer):
    """Adam (Kingma & Ba), with PyTorch's update order and bias
    correction; ``amsgrad`` keeps the running maximum of the second moment;
    ``decoupled_weight_decay=True`` is AdamW. ``foreach``/``fused``/
    ``capturable`` change nothing, ``differentiable=True`` warns (see
    ``dtorch.optim.optimizer``).

    Example::

        opt = dtorch.optim.Adam(model.parameters(), lr=1e-3)
    """

    def __init__(self, params: ParamsT, lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0, amsgrad: bool = False, *,
                 foreach: bool | None = None, maximize: bool = False,
                 capturable: bool = False, differentiable: bool = False,
                 fused: bool | None = None,
                 decoupled_weight_decay: bool = False) -> None:
        _kernel_args(type(self).__name__, foreach=foreach, fused=fused,
                     capturable=capturable, differentiable=differentiable)
        _check_adam_args(lr, eps, betas, weight_decay)
        defaults = dict(lr=lr, betas=betas, eps=eps,
                        weight_decay=weight_decay, amsgrad=amsgrad,
                        maximize=maximize,
                        decoupled_weight_decay=decoupled_weight_decay)
        super().__init__(params, defaults)

    def _update(self, p, group):
        lr, eps = group["lr"], group["eps"]
        beta1, beta2 = group["betas"]
        names = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")
        state = _init_state(self.state[p], p,
                            *names[:3 if group["amsgrad"] else 2])
        step = _next_step(state)
        x, g, xp = _decayed_grad(
            p, group, group.get("decoupled_weight_decay", False))
        m, v = state["exp_avg"]._data, state["exp_avg_sq"]._data
        vmax = state["max_exp_avg_sq"]._data if group["amsgrad"] else v
        k = _kernels.kernels(x, g, m, v, vmax)
        if k is not None:   # one threaded pass, bit for bit the code below
            f = _kernels.flat
            k.adam(f(x), f(g), f(m), f(v), f(vmax), *_kernels.scalars(
                x, 1 - beta1, beta2, 1 - beta2,
                math.sqrt(1 - beta2 ** step), eps, lr / (1 - beta1 ** step)),
                group["amsgrad"])
            _bump(p)
            return
        # one scratch array for every intermediate: each temporary costs a
        # pass over the parameter (and page faults, for large ones)
        t = g - m
        t *= 1 - beta1
        m += t                              # lerp_(g, 1 - beta1)
        xp.multiply(g, g, out=t)
        t *= 1 - beta2
        v *= beta2
        v += t
        step_size = lr / (1 - beta1 ** step)
        bias2_sqrt = math.sqrt(1 - beta2 ** step)
        if group["amsgrad"]:
            vmax = state["max_exp_avg_sq"]._data
            xp.maximum(vmax, v, out=vmax)
            v = vmax
        xp.sqrt(v, out=t)
        t /= bias2_sqrt
        t += eps
        xp.divide(m, t, out=t)
        t *= step_size
        x -= t
        _bump(p)


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter):
    ``p *= 1 - lr * weight_decay`` before the Adam step."""

    def __init__(self, params: ParamsT, lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, amsgrad: bool = False, *,
                 maximize: bool = False, foreach: bool | None = None,
                 capturable: bool = False, differentiable: bool = False,
                 fused: bool | None = None) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad,
                         foreach=foreach, maximize=maximize,
                         capturable=capturable,
                         differentiable=differentiable, fused=fused,
                         decoupled_weight_decay=True)
