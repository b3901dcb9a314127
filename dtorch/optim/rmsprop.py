"""RMSprop, as ``torch.optim.RMSprop``."""
from __future__ import annotations
from .optimizer import (Optimizer, ParamsT, _bump, _check, _decayed_grad,
                        _kernel_args, _next_step, _step_tensor, _zeros)

__all__ = ["RMSprop"]


class RMSprop(Optimizer):
    """RMSprop (Hinton), PyTorch's variant: eps is added outside the square
    root; ``centered`` subtracts the squared running mean of the gradient;
    ``momentum`` accumulates ``g / avg``. ``foreach``/``capturable`` change
    nothing, ``differentiable=True`` warns (see ``dtorch.optim.optimizer``).

    Example::

        opt = dtorch.optim.RMSprop(model.parameters(), lr=1e-2)
    """

    def __init__(self, params: ParamsT, lr: float = 1e-2, alpha: float = 0.99,
                 eps: float = 1e-8, weight_decay: float = 0,
                 momentum: float = 0, centered: bool = False,
                 capturable: bool = False, foreach: bool | None = None,
                 maximize: bool = False, differentiable: bool = False) -> None:
        _kernel_args("RMSprop", foreach=foreach, capturable=capturable,
                     differentiable=differentiable)
        _check(0.0 <= lr, f"Invalid learning rate: {lr}")
        _check(0.0 <= eps, f"Invalid epsilon value: {eps}")
        _check(0.0 <= momentum, f"Invalid momentum value: {momentum}")
        _check(0.0 <= weight_decay,
               f"Invalid weight_decay value: {weight_decay}")
        _check(0.0 <= alpha, f"Invalid alpha value: {alpha}")
        defaults = dict(lr=lr, momentum=momentum, alpha=alpha, eps=eps,
                        centered=centered, weight_decay=weight_decay,
                        maximize=maximize)
        super().__init__(params, defaults)

    def _update(self, p, group):
        lr, alpha = group["lr"], group["alpha"]
        momentum = group["momentum"]
        state = self.state[p]
        if not state:
            state["step"] = _step_tensor()
            state["square_avg"] = _zeros(p)
            if momentum > 0:
                state["momentum_buffer"] = _zeros(p)
            if group["centered"]:
                state["grad_avg"] = _zeros(p)
        _next_step(state)
        x, g, xp = _decayed_grad(p, group)
        sq = state["square_avg"]._data
        sq *= alpha
        sq += (1 - alpha) * (g * g)
        if group["centered"]:
            ga = state["grad_avg"]._data
            ga += (1 - alpha) * (g - ga)    # lerp_(g, 1 - alpha)
            avg = xp.sqrt(sq - ga * ga)
        else:
            avg = xp.sqrt(sq)
        avg += group["eps"]
        if momentum > 0:
            buf = state["momentum_buffer"]._data
            buf *= momentum
            buf += g / avg
            x -= lr * buf
        else:
            x -= lr * (g / avg)
        _bump(p)
