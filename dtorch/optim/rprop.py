"""Rprop, as ``torch.optim.Rprop``: per-element step sizes that grow while
the gradient keeps its sign and shrink when it flips."""
from __future__ import annotations
from .. import _backend as B
from ..tensor import Tensor
from .optimizer import (Optimizer, ParamsT, _bump, _check, _kernel_args,
                        _next_step, _step_tensor, _zeros)

__all__ = ["Rprop"]


class Rprop(Optimizer):
    """As ``torch.optim.Rprop``; ``foreach``/``capturable`` change nothing,
    ``differentiable=True`` warns (see ``dtorch.optim.optimizer``)."""

    def __init__(self, params: ParamsT, lr: float = 1e-2,
                 etas: tuple[float, float] = (0.5, 1.2),
                 step_sizes: tuple[float, float] = (1e-6, 50), *,
                 capturable: bool = False, foreach: bool | None = None,
                 maximize: bool = False, differentiable: bool = False) -> None:
        _kernel_args("Rprop", foreach=foreach, capturable=capturable,
                     differentiable=differentiable)
        _check(0.0 <= lr, f"Invalid learning rate: {lr}")
        _check(0.0 < etas[0] < 1.0 < etas[1],
               f"Invalid eta values: {etas[0]}, {etas[1]}")
        defaults = dict(lr=lr, etas=etas, step_sizes=step_sizes,
                        maximize=maximize)
        super().__init__(params, defaults)

    def _update(self, p, group):
        state = self.state[p]
        x, g = p._data, p.grad._data
        xp = B.get_array_module(x)
        if not state:
            state["step"] = _step_tensor()
            state["prev"] = _zeros(p)
            state["step_size"] = Tensor._wrap(xp.full_like(g, group["lr"]))
        _next_step(state)
        if group["maximize"]:
            g = -g
        etaminus, etaplus = group["etas"]
        lo, hi = group["step_sizes"]
        prev = state["prev"]._data
        size = state["step_size"]._data
        s = xp.sign(g * prev)
        factor = xp.where(s > 0, etaplus, xp.where(s < 0, etaminus, 1.0))
        size *= factor.astype(size.dtype, copy=False)
        xp.clip(size, lo, hi, out=size)
        # after a sign flip the step is skipped and the gradient forgotten
        g = xp.where(factor == etaminus, 0, g).astype(g.dtype, copy=False)
        x -= xp.sign(g) * size
        prev[...] = g
        _bump(p)
