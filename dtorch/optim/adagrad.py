"""Adagrad, as ``torch.optim.Adagrad``."""
from __future__ import annotations
from .. import _backend as B
from ..tensor import Tensor
from .optimizer import (Optimizer, ParamsT, _bump, _check, _decayed_grad,
                        _kernel_args, _next_step, _step_tensor)

__all__ = ["Adagrad"]


class Adagrad(Optimizer):
    """Adagrad (Duchi et al.): the step is divided by the root of the sum
    of squared gradients; ``lr_decay`` shrinks lr as ``lr / (1 + (t - 1) *
    lr_decay)``. ``foreach``/``fused`` change nothing,
    ``differentiable=True`` warns (see ``dtorch.optim.optimizer``).

    Example::

        opt = dtorch.optim.Adagrad(model.parameters(), lr=1e-2)
    """

    def __init__(self, params: ParamsT, lr: float = 1e-2, lr_decay: float = 0,
                 weight_decay: float = 0, initial_accumulator_value: float = 0,
                 eps: float = 1e-10, foreach: bool | None = None, *,
                 maximize: bool = False, differentiable: bool = False,
                 fused: bool | None = None) -> None:
        _kernel_args("Adagrad", foreach=foreach, fused=fused,
                     differentiable=differentiable)
        _check(0.0 <= lr, f"Invalid learning rate: {lr}")
        _check(0.0 <= lr_decay, f"Invalid lr_decay value: {lr_decay}")
        _check(0.0 <= weight_decay,
               f"Invalid weight_decay value: {weight_decay}")
        _check(0.0 <= initial_accumulator_value,
               "Invalid initial_accumulator_value value: "
               f"{initial_accumulator_value}")
        _check(0.0 <= eps, f"Invalid epsilon value: {eps}")
        defaults = dict(lr=lr, lr_decay=lr_decay, eps=eps,
                        weight_decay=weight_decay,
                        initial_accumulator_value=initial_accumulator_value,
                        maximize=maximize)
        super().__init__(params, defaults)

    def _init_state(self, p, group):
        state = self.state[p]
        if not state:
            xp = B.get_array_module(p._data)
            state["step"] = _step_tensor()
            with B.device_guard(p._data):    # on p's device
                state["sum"] = Tensor._wrap(xp.full_like(
                    p._data, group["initial_accumulator_value"]))

    def add_param_group(self, param_group):
        # PyTorch fills Adagrad's state up front, so a state_dict taken
        # before the first step already holds every accumulator
        super().add_param_group(param_group)
        for p in self.param_groups[-1]["params"]:
            self._init_state(p, self.param_groups[-1])

    def _update(self, p, group):
        state = self.state[p]
        step = _next_step(state)
        x, g, xp = _decayed_grad(p, group)
        clr = group["lr"] / (1 + (step - 1) * group["lr_decay"])
        s = state["sum"]._data
        s += g * g
        std = xp.sqrt(s)
        std += group["eps"]
        x -= clr * (g / std)
        _bump(p)
