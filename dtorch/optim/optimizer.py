"""The ``Optimizer`` base class: parameter groups, per-parameter state and
PyTorch's ``state_dict`` format.

Subclasses implement ``step`` as one readable per-parameter update on the
parameters' arrays (the shape of mlx's ``apply_single``), with no
foreach/fused variants.

PyTorch's kernel-choice arguments, which every optimizer here accepts where
PyTorch's does (``_kernel_args``):

- ``foreach``, ``fused``, ``capturable`` pick among PyTorch's
  implementations of the same update (multi-tensor, fused, CUDA-graph safe).
  dtorch has one, so they are accepted silently and the results equal the
  default's (tests/optim/test_optim_torch_arguments.py pins that).
  PyTorch's refusal of ``fused`` with ``foreach`` or ``differentiable`` is
  kept, so a script that fails there fails here.
- ``differentiable=True`` asks for a step recorded by autograd; dtorch's
  step is not, so it warns once (dtorch._ignored).
"""
from __future__ import annotations
import copy
import functools
import os
import sys
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterable
from itertools import chain
from typing import Any, Union

import numpy as np

from .. import _backend as B
from .._ignored import ignored_argument
from ..autograd import enable_grad
from ..nn.modules.module import RemovableHandle, zero_grads
from ..tensor import Tensor

# what an optimizer takes: tensors, or parameter groups (dicts with "params")
ParamsT = Union[Iterable[Tensor], Iterable[dict[str, Any]]]

__all__ = ["Optimizer", "required", "register_optimizer_step_pre_hook",
           "register_optimizer_step_post_hook"]

# PyTorch's step hooks: every optimizer's (these) and one optimizer's own
# (Optimizer.register_step_pre_hook / register_step_post_hook)
_global_step_pre_hooks: dict = {}
_global_step_post_hooks: dict = {}


def register_optimizer_step_pre_hook(hook):
    """``hook(optimizer, args, kwargs)`` before every optimizer's step
    (``args`` starts with the optimizer, as PyTorch's); it may return
    ``(new_args, new_kwargs)``."""
    h = RemovableHandle(_global_step_pre_hooks)
    _global_step_pre_hooks[h.id] = hook
    return h


def register_optimizer_step_post_hook(hook):
    """``hook(optimizer, args, kwargs)`` after every optimizer's step."""
    h = RemovableHandle(_global_step_post_hooks)
    _global_step_post_hooks[h.id] = hook
    return h


def _with_step_hooks(step):
    """``step`` running the step hooks around it (once: a subclass's step
    that calls ``super().step()`` runs them for the outer call only)."""
    @functools.wraps(step)
    def hooked(self, *args, **kwargs):
        d = self.__dict__
        pre, post = d.get("_step_pre_hooks"), d.get("_step_post_hooks")
        if not (pre or post or _global_step_pre_hooks
                or _global_step_post_hooks) or d.get("_in_step"):
            return step(self, *args, **kwargs)
        d["_in_step"] = True
        # as PyTorch's, a hook's args are the step's, the optimizer first
        args = (self,) + args
        try:
            for hook in chain(list(_global_step_pre_hooks.values()),
                              list((pre or {}).values())):
                res = hook(self, args, kwargs)
                if res is not None:
                    if not (isinstance(res, tuple) and len(res) == 2):
                        raise RuntimeError(
                            f"{hook} must return None or a tuple of "
                            f"(new_args, new_kwargs), but got {res}.")
                    args, kwargs = res
            out = step(*args, **kwargs)
            # PyTorch's order: pre hooks global first, post hooks own first
            for hook in chain(list((post or {}).values()),
                              list(_global_step_post_hooks.values())):
                hook(self, args, kwargs)
            return out
        finally:
            d["_in_step"] = False
    return hooked


class _RequiredParameter:
    """Marks a hyper-parameter without a default (SGD's lr in old torch)."""

    def __repr__(self):
        return "<required parameter>"


required = _RequiredParameter()


class Optimizer:
    """Base class of all optimizers, as ``torch.optim.Optimizer``.

    Args:
        params: an iterable of tensors, or of dicts that define parameter
            groups (each with a ``'params'`` key).
        defaults: hyper-parameters used by groups that do not set them.
    """

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "step" in cls.__dict__:
            cls.step = _with_step_hooks(cls.__dict__["step"])

    def register_step_pre_hook(self, hook: Callable) -> RemovableHandle:
        """``hook(optimizer, args, kwargs)`` before this optimizer's step;
        it may return ``(new_args, new_kwargs)``."""
        hooks = self.__dict__.setdefault("_step_pre_hooks", {})
        h = RemovableHandle(hooks)
        hooks[h.id] = hook
        return h

    def register_step_post_hook(self, hook: Callable) -> RemovableHandle:
        """``hook(optimizer, args, kwargs)`` after this optimizer's step."""
        hooks = self.__dict__.setdefault("_step_post_hooks", {})
        h = RemovableHandle(hooks)
        hooks[h.id] = hook
        return h

    def __init__(self, params: ParamsT, defaults: dict[str, Any]) -> None:
        self.defaults = defaults
        self.state = defaultdict(dict)
        self.param_groups = []
        if isinstance(params, Tensor):
            raise TypeError(
                "params argument given to the optimizer should be an "
                "iterable of Tensors or dicts, but got "
                f"{type(params).__module__}.{type(params).__name__}")
        groups = list(params)
        if len(groups) == 0:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for group in groups:
            self.add_param_group(group)

    def __repr__(self):
        lines = [self.__class__.__name__ + " ("]
        for i, group in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            for key in sorted(group):
                if key != "params":
                    lines.append(f"    {key}: {group[key]}")
        lines.append(")")
        return "\n".join(lines)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group of parameters (a dict with ``'params'``), e.g. when
        unfreezing layers during fine-tuning."""
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group must be a dict, but got "
                            f"{type(param_group).__name__}")
        params = param_group["params"]
        if isinstance(params, Tensor):
            param_group["params"] = [params]
        elif isinstance(params, set):
            raise TypeError(
                "optimizer parameters need to be organized in ordered "
                "collections, but the ordering of tensors in sets will "
                "change between runs. Please use a list instead.")
        else:
            param_group["params"] = list(params)
        for p in param_group["params"]:
            if not isinstance(p, Tensor):
                raise TypeError("optimizer can only optimize Tensors, but "
                                "one of the params is "
                                f"{type(p).__module__}.{type(p).__name__}")
            if not p.is_leaf:
                raise ValueError("can't optimize a non-leaf Tensor")
        # a group may set PyTorch's kernel switches too (never stored as
        # defaults: dtorch's param_groups leave them out)
        _kernel_args(type(self).__name__, **{
            k: param_group[k] for k in _KERNEL_ARGS if k in param_group})
        for name, default in self.defaults.items():
            if default is required and name not in param_group:
                raise ValueError(
                    "parameter group didn't specify a value of required "
                    f"optimization parameter {name}")
            param_group.setdefault(name, default)
        if len({id(p) for p in param_group["params"]}) != len(
                param_group["params"]):
            warnings.warn("optimizer contains a parameter group with "
                          "duplicate parameters; in future, this will "
                          "cause an error", stacklevel=3)
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        if any(id(p) in seen for p in param_group["params"]):
            raise ValueError("some parameters appear in more than one "
                             "parameter group")
        self.param_groups.append(param_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset the gradients of all optimized tensors: drop them
        (``set_to_none=True``, the default) or fill them with zeros."""
        zero_grads((p for group in self.param_groups
                    for p in group["params"]), set_to_none)

    @_with_step_hooks
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One optimization step. ``closure`` (optional) re-evaluates the
        model and returns the loss, which ``step`` returns."""
        loss = None
        if closure is not None:
            with enable_grad():
                loss = closure()
        # CuPy runs kernels on the current device: each parameter is
        # updated on its own (cuda:1 parameters while device 0 is current)
        gpu = B._cupy is not None
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    if gpu:
                        with B.device_guard(p._data):
                            self._update(p, group)
                    else:
                        self._update(p, group)
        return loss

    def _update(self, p, group):
        """Update one parameter in place from ``p.grad``; subclasses
        implement this (or override ``step``)."""
        raise NotImplementedError

    # ------------------------------------------------------ state dict --
    def state_dict(self) -> dict[str, Any]:
        """The state as PyTorch lays it out: ``{'state': {index: {...}},
        'param_groups': [{..., 'params': [index, ...]}]}``, parameters
        numbered in group order. Tensors are references, not copies."""
        index = {}
        groups = []
        for group in self.param_groups:
            packed = {k: v for k, v in group.items() if k != "params"}
            for p in group["params"]:
                index.setdefault(id(p), len(index))
            packed["params"] = [index[id(p)] for p in group["params"]]
            groups.append(packed)
        state = {(index[id(k)] if isinstance(k, Tensor) else k): v
                 for k, v in self.state.items()}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a ``state_dict()``; state tensors are copied onto each
        parameter's device (and floating dtype, except ``step``)."""
        groups = self.param_groups
        saved_groups = copy.deepcopy(state_dict["param_groups"])
        if len(groups) != len(saved_groups):
            raise ValueError("loaded state dict has a different number of "
                             "parameter groups")
        if any(len(g["params"]) != len(s["params"])
               for g, s in zip(groups, saved_groups)):
            raise ValueError("loaded state dict contains a parameter group "
                             "that doesn't match the size of optimizer's "
                             "group")
        id_map = dict(zip(
            chain.from_iterable(g["params"] for g in saved_groups),
            chain.from_iterable(g["params"] for g in groups)))
        state = defaultdict(dict)
        for k, v in state_dict["state"].items():
            # files written by dtorch.save keep int keys; JSON-ish copies
            # from elsewhere may carry them as strings
            key = int(k) if isinstance(k, str) and k.isdigit() else k
            if key in id_map:
                p = id_map[key]
                state[p] = {n: _cast(p, x, n) for n, x in v.items()}
            else:
                state[k] = v
        for g, s in zip(groups, saved_groups):
            s["params"] = g["params"]
        self.state = state
        self.param_groups = saved_groups


def _cast(param, value, key):
    """A copy of a state value on the parameter's device; floating state
    takes the parameter's dtype, but ``step`` stays as saved."""
    if isinstance(value, Tensor):
        if key != "step" and param.is_floating_point() \
                and value.is_floating_point():
            value = value.to(dtype=param.dtype)
        # copy() allocates on the current device: on the parameter's
        with B.device_guard(param._data):
            return Tensor._wrap(param.device.send(value._data).copy())
    if isinstance(value, dict):
        return {k: _cast(param, v, k) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(param, v, key) for v in value)
    return value


_KERNEL_ARGS = ("foreach", "fused", "capturable", "differentiable")


def _kernel_args(owner, foreach=None, fused=None, capturable=False,
                 differentiable=False):
    """Check PyTorch's kernel-choice arguments for optimizer ``owner`` (a
    name) as PyTorch does, and warn once for ``differentiable``; see the
    module docstring for why the others change nothing."""
    if fused and foreach:
        raise RuntimeError("`fused` and `foreach` cannot be `True` together.")
    if fused and differentiable:
        raise RuntimeError("`fused` does not support `differentiable`")
    if differentiable:
        ignored_argument(owner, "differentiable", differentiable,
                         "the optimizer step is not recorded by autograd",
                         stacklevel=_caller_stacklevel())


def _caller_stacklevel():
    """warnings.warn's stacklevel, seen from ignored_argument, of the first
    frame outside dtorch.optim: the user's line, through any chain of
    optimizer constructors (AdamW -> Adam -> _kernel_args)."""
    f, level = sys._getframe(1), 2
    while f is not None and os.path.dirname(
            f.f_code.co_filename) == _HERE:
        f, level = f.f_back, level + 1
    return level


_HERE = os.path.dirname(os.path.abspath(__file__))


def _check(cond, msg):
    if not cond:
        raise ValueError(msg)


def _zeros(p):
    """A zero state tensor shaped, typed and placed like ``p``."""
    with B.device_guard(p._data):
        return Tensor._wrap(B.get_array_module(p._data).zeros_like(p._data))


def _step_tensor():
    # PyTorch keeps 'step' as a float32 0-d CPU tensor
    return Tensor._wrap(np.zeros((), np.float32))


def _next_step(state):
    """Increment ``state['step']`` and return it as a Python float."""
    t = state["step"]
    t._data += 1
    return float(t._data)


def _check_adam_args(lr, eps, betas, weight_decay):
    """The Adam family's argument checks, in PyTorch's order and words."""
    _check(0.0 <= lr, f"Invalid learning rate: {lr}")
    _check(0.0 <= eps, f"Invalid epsilon value: {eps}")
    _check(0.0 <= betas[0] < 1.0,
           f"Invalid beta parameter at index 0: {betas[0]}")
    _check(0.0 <= betas[1] < 1.0,
           f"Invalid beta parameter at index 1: {betas[1]}")
    _check(0.0 <= weight_decay, f"Invalid weight_decay value: {weight_decay}")


def _init_state(state, p, *names):
    """On a parameter's first step, fill its empty ``state`` with 'step' and
    a zero tensor like ``p`` per name, in PyTorch's key order."""
    if not state:
        state["step"] = _step_tensor()
        for name in names:
            state[name] = _zeros(p)
    return state


def _decayed_grad(p, group, decoupled=False):
    """``p``'s array, its gradient (negated under ``maximize``, plus L2
    weight decay; or, ``decoupled``, the decay applied to the parameter
    itself, AdamW-style) and their array module."""
    x, g = p._data, p.grad._data
    if group["maximize"]:
        g = -g
    wd = group["weight_decay"]
    if wd != 0:
        if decoupled:
            x *= 1 - group["lr"] * wd
        else:
            g = g + wd * x
    return x, g, B.get_array_module(x)


def _bump(p):
    """Count an in-place update of ``p``'s array: a graph that saved ``p``
    before the step then fails at backward, as in PyTorch."""
    p._bump_version()

