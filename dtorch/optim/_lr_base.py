"""The base of dtorch.optim.lr_scheduler's schedulers: ``LRScheduler``
(stepping, ``state_dict``, the warning when a scheduler steps before its
optimizer), the lambda schedulers' state handling, and the per-group
argument helper."""
import types
import warnings
from functools import wraps
from weakref import ref

from .optimizer import Optimizer


EPOCH_DEPRECATION_WARNING = (
    "The epoch parameter in `scheduler.step()` was not necessary and is "
    "being deprecated where possible. Please use `scheduler.step()` to "
    "step the scheduler. During the deprecation, if epoch is different "
    "from None, the closed form is used instead of the new chainable "
    "form, where available.")


def _check_optimizer(optimizer):
    if not isinstance(optimizer, Optimizer):
        raise TypeError(f"{type(optimizer).__name__} is not an Optimizer")


def _track_step(opt):
    """Wrap ``opt.step`` (once) so schedulers can warn when they are
    stepped before the optimizer, as PyTorch does."""
    if hasattr(opt.step, "_wrapped_by_lr_sched"):
        return
    func = opt.step.__func__
    opt_ref = ref(opt)

    @wraps(func)
    def wrapper(*args, **kwargs):
        o = opt_ref()
        o._opt_called = True
        return func.__get__(o, o.__class__)(*args, **kwargs)

    wrapper._wrapped_by_lr_sched = True
    opt.step = wrapper


class LRScheduler:
    """Base class: ``base_lrs`` (each group's ``initial_lr``),
    ``last_epoch`` (steps taken), ``get_last_lr()``; subclasses define
    ``get_lr()``."""

    _get_lr_called_within_step = False
    _is_initial = False

    def __init__(self, optimizer, last_epoch=-1):
        _check_optimizer(optimizer)
        self.optimizer = optimizer
        if last_epoch == -1:
            for group in optimizer.param_groups:
                group.setdefault("initial_lr", group["lr"])
        else:
            for i, group in enumerate(optimizer.param_groups):
                if "initial_lr" not in group:
                    raise KeyError(
                        f"param 'initial_lr' is not specified in "
                        f"param_groups[{i}] when resuming an optimizer")
        self.base_lrs = [g["initial_lr"] for g in optimizer.param_groups]
        self.last_epoch = last_epoch
        _track_step(optimizer)
        self._initial_step()

    def _initial_step(self):
        self._step_count = 0
        self._is_initial = True
        try:
            self.step()
        finally:
            self._is_initial = False

    def state_dict(self):
        """Every attribute but the optimizer."""
        return {k: v for k, v in self.__dict__.items() if k != "optimizer"}

    def load_state_dict(self, state_dict):
        self.__dict__.update(state_dict)

    def get_last_lr(self):
        """The learning rates that the last ``step()`` set."""
        return self._last_lr

    def get_lr(self):
        raise NotImplementedError

    def _group_lrs(self):
        return [g["lr"] for g in self.optimizer.param_groups]

    def step(self, epoch=None):
        if self._step_count == 1 and not getattr(
                self.optimizer, "_opt_called", False):
            warnings.warn(
                "Detected call of `lr_scheduler.step()` before "
                "`optimizer.step()`. In PyTorch 1.1.0 and later, you should "
                "call them in the opposite order: `optimizer.step()` before "
                "`lr_scheduler.step()`.  Failure to do this will result in "
                "PyTorch skipping the first value of the learning rate "
                "schedule.", UserWarning, stacklevel=2)
        self._step_count += 1
        if epoch is None:
            self.last_epoch += 1
            self._set_lrs(self.get_lr)
        else:
            warnings.warn(EPOCH_DEPRECATION_WARNING, UserWarning,
                          stacklevel=2)
            self.last_epoch = epoch
            self._set_lrs(getattr(self, "_get_closed_form_lr", self.get_lr))

    def _set_lrs(self, compute):
        """Write ``compute()``'s rates into the groups (``get_lr`` called
        from within ``step``: no warning)."""
        self._get_lr_called_within_step = True
        try:
            values = compute()
        finally:
            self._get_lr_called_within_step = False
        for group, lr in zip(self.optimizer.param_groups, values):
            group["lr"] = lr
        self._last_lr = self._group_lrs()

    def _warn_get_lr(self):
        if not self._get_lr_called_within_step:
            warnings.warn("To get the last learning rate computed by the "
                          "scheduler, please use `get_last_lr()`.",
                          UserWarning, stacklevel=3)


class _LambdaScheduler(LRScheduler):
    """The ``lr_lambda`` handling LambdaLR and MultiplicativeLR share: one
    lambda for every group or one per group, and a state dict that keeps
    callable objects' ``__dict__`` (plain functions are not saved)."""

    def __init__(self, optimizer, lr_lambda, last_epoch=-1):
        self.optimizer = optimizer
        n = len(optimizer.param_groups)
        if not isinstance(lr_lambda, (list, tuple)):
            self.lr_lambdas = [lr_lambda] * n
        else:
            if len(lr_lambda) != n:
                raise ValueError(f"Expected {n} lr_lambdas, but got "
                                 f"{len(lr_lambda)}")
            self.lr_lambdas = list(lr_lambda)
        super().__init__(optimizer, last_epoch)

    def state_dict(self):
        return _state_with_parts(self, "lr_lambdas", _lambda_state)

    def load_state_dict(self, state_dict):
        _load_with_parts(self, state_dict, "lr_lambdas", _load_lambda_state)


def _lambda_state(fn):
    # a function's own state is not saved, a callable object's __dict__
    # is (PyTorch's rule)
    return None if isinstance(fn, types.FunctionType) else fn.__dict__.copy()


def _load_lambda_state(fn, saved):
    if saved is not None:
        fn.__dict__.update(saved)


def _state_with_parts(sched, name, save):
    """A state_dict of every attribute but the optimizer, with the list
    attribute ``name`` (lr lambdas, inner schedulers) saved part by part:
    ``save(part)``."""
    sd = {k: v for k, v in sched.__dict__.items()
          if k not in ("optimizer", name)}
    sd[name] = [save(part) for part in getattr(sched, name)]
    return sd


def _load_with_parts(sched, state_dict, name, load):
    """_state_with_parts' inverse: ``load(part, saved)`` for each part."""
    state_dict = dict(state_dict)
    saved = state_dict.pop(name)
    sched.__dict__.update(state_dict)
    for part, s in zip(getattr(sched, name), saved):
        load(part, s)


def _format_param(name, optimizer, param):
    n = len(optimizer.param_groups)
    if isinstance(param, (list, tuple)):
        if len(param) != n:
            raise ValueError(f"{name} must have the same length as "
                             f"optimizer.param_groups. {name} has "
                             f"{len(param)} values, param_groups has {n}.")
        return list(param)
    return [param] * n
