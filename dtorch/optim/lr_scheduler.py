"""Learning-rate schedulers, as ``torch.optim.lr_scheduler``.

Each scheduler writes ``group['lr']`` of its optimizer's groups on every
``step()``. ``get_lr`` uses PyTorch's recursive ("chainable") formulas, so
the sequences agree with PyTorch's to the last bit; ``step(epoch)`` uses
the closed forms. ``state_dict()`` holds plain numbers, so it can go
through ``dtorch.save``.
"""
import math
import warnings
from bisect import bisect_right

# the schedulers by family; each class keeps this module as its home
# (__module__ below), as in torch.optim.lr_scheduler: pickled names and
# reprs say dtorch.optim.lr_scheduler.StepLR
from ._lr_base import (EPOCH_DEPRECATION_WARNING, LRScheduler,  # noqa: F401
                       _check_optimizer, _load_with_parts, _state_with_parts)
from ._lr_cyclic import (CosineAnnealingLR, CosineAnnealingWarmRestarts,
                         CyclicLR, OneCycleLR)
from ._lr_decay import (ConstantLR, ExponentialLR, LambdaLR, LinearLR,
                        MultiplicativeLR, MultiStepLR, PolynomialLR, StepLR)

__all__ = ["LRScheduler", "LambdaLR", "StepLR", "MultiStepLR",
           "ExponentialLR", "CosineAnnealingLR", "LinearLR", "OneCycleLR",
           "ReduceLROnPlateau", "ConstantLR", "MultiplicativeLR",
           "PolynomialLR", "CosineAnnealingWarmRestarts", "CyclicLR",
           "SequentialLR", "ChainedScheduler"]


class ReduceLROnPlateau(LRScheduler):
    """Multiply lr by ``factor`` when a metric has stopped improving for
    ``patience`` epochs; ``step(metric)`` once per epoch."""

    def __init__(self, optimizer, mode="min", factor=0.1, patience=10,
                 threshold=1e-4, threshold_mode="rel", cooldown=0,
                 min_lr=0, eps=1e-8):
        if factor >= 1.0:
            raise ValueError("Factor should be < 1.0.")
        self.factor = factor
        _check_optimizer(optimizer)
        self.optimizer = optimizer
        n = len(optimizer.param_groups)
        if isinstance(min_lr, (list, tuple)):
            if len(min_lr) != n:
                raise ValueError(f"expected {n} min_lrs, got {len(min_lr)}")
            self.default_min_lr = None
            self.min_lrs = list(min_lr)
        else:
            self.default_min_lr = min_lr
            self.min_lrs = [min_lr] * n
        self.patience = patience
        self.cooldown = cooldown
        self.eps = eps
        self.last_epoch = 0
        self._last_lr = self._group_lrs()
        self._init_is_better(mode, threshold, threshold_mode)
        self._reset()

    def _reset(self):
        self.best = self.mode_worse
        self.cooldown_counter = 0
        self.num_bad_epochs = 0

    def step(self, metrics, epoch=None):
        current = float(metrics)
        if epoch is None:
            epoch = self.last_epoch + 1
        else:
            warnings.warn(EPOCH_DEPRECATION_WARNING, UserWarning,
                          stacklevel=2)
        self.last_epoch = epoch
        if self._is_better(current, self.best):
            self.best = current
            self.num_bad_epochs = 0
        else:
            self.num_bad_epochs += 1
        if self.in_cooldown:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0    # bad epochs in cooldown don't count
        if self.num_bad_epochs > self.patience:
            self._reduce_lr()
            self.cooldown_counter = self.cooldown
            self.num_bad_epochs = 0
        self._last_lr = self._group_lrs()

    def _reduce_lr(self):
        groups = self.optimizer.param_groups
        if len(groups) != len(self.min_lrs):
            if self.default_min_lr is None:
                raise RuntimeError(
                    f"The number of param groups in the `optimizer` "
                    f"({len(groups)}) differs from when "
                    f"`ReduceLROnPlateau` was initialized "
                    f"({len(self.min_lrs)}), usually due to a new param "
                    f"group being added to the optimizer. Please modify "
                    f"the `min_lrs` field to match the length of the "
                    f"`optimizer` param groups.")
            self.min_lrs = [self.default_min_lr] * len(groups)
        for i, group in enumerate(groups):
            old = float(group["lr"])
            new = max(old * self.factor, self.min_lrs[i])
            if old - new > self.eps:
                group["lr"] = new

    @property
    def in_cooldown(self):
        return self.cooldown_counter > 0

    def _is_better(self, a, best):
        if self.mode == "min" and self.threshold_mode == "rel":
            return a < best * (1.0 - self.threshold)
        if self.mode == "min":
            return a < best - self.threshold
        if self.threshold_mode == "rel":
            return a > best * (self.threshold + 1.0)
        return a > best + self.threshold

    def _init_is_better(self, mode, threshold, threshold_mode):
        if mode not in ("min", "max"):
            raise ValueError("mode " + mode + " is unknown!")
        if threshold_mode not in ("rel", "abs"):
            raise ValueError("threshold mode " + threshold_mode
                             + " is unknown!")
        self.mode_worse = math.inf if mode == "min" else -math.inf
        self.mode = mode
        self.threshold = threshold
        self.threshold_mode = threshold_mode

    def load_state_dict(self, state_dict):
        self.__dict__.update(state_dict)
        self._init_is_better(self.mode, self.threshold, self.threshold_mode)


# PyTorch's old name of the base class
_LRScheduler = LRScheduler


class SequentialLR(LRScheduler):
    """Run ``schedulers`` one after another, switching at ``milestones``
    (each new one starts from its epoch 0)."""

    def __init__(self, optimizer, schedulers, milestones, last_epoch=-1):
        if len(schedulers) < 1:
            raise ValueError(f"{type(self).__name__} expects at least one "
                             f"scheduler, but got no scheduler.")
        for i, s in enumerate(schedulers):
            if getattr(s, "optimizer", None) is not optimizer:
                raise ValueError(
                    f"{type(self).__name__} expects all schedulers to belong "
                    f"to the same optimizer, but got scheduler at index {i} "
                    f"to be different than the optimizer passed in.")
        if len(milestones) != len(schedulers) - 1:
            raise ValueError(
                f"Sequential Schedulers expects number of schedulers "
                f"provided to be one more than the number of milestone "
                f"points, but got number of schedulers {len(schedulers)} and "
                f"the number of milestones to be equal to "
                f"{len(milestones)}")
        self._schedulers = list(schedulers)
        self._milestones = list(milestones)
        self.last_epoch = last_epoch + 1
        self.optimizer = optimizer
        # back to the initial lrs, and undo the other schedulers' first step
        for group in optimizer.param_groups:
            group["lr"] = group["initial_lr"]
        for s in self._schedulers:
            s.last_epoch -= 1
        self._schedulers[0]._initial_step()
        self._last_lr = self._schedulers[0].get_last_lr()

    def step(self):
        self.last_epoch += 1
        idx = bisect_right(self._milestones, self.last_epoch)
        s = self._schedulers[idx]
        if idx > 0 and self._milestones[idx - 1] == self.last_epoch:
            with warnings.catch_warnings():
                # the closed form at epoch 0 is the documented behaviour
                warnings.simplefilter("ignore", UserWarning)
                s.step(0)
        else:
            s.step()
        self._last_lr = s.get_last_lr()

    def state_dict(self):
        return _state_with_parts(self, "_schedulers",
                                 lambda s: s.state_dict())

    def load_state_dict(self, state_dict):
        _load_with_parts(self, state_dict, "_schedulers",
                         lambda s, saved: s.load_state_dict(saved))


class ChainedScheduler(LRScheduler):
    """Step every scheduler in ``schedulers`` on each ``step()``."""

    def __init__(self, schedulers, optimizer=None):
        if len(schedulers) < 1:
            raise ValueError(f"{type(self).__name__} expects at least one "
                             f"scheduler to be chained, but got no "
                             f"scheduler.")
        optimizer = optimizer or schedulers[0].optimizer
        for i, s in enumerate(schedulers):
            if getattr(s, "optimizer", None) is not optimizer:
                raise ValueError(
                    f"{type(self).__name__} expects all schedulers to belong "
                    f"to the same optimizer, but got scheduler "
                    f"{type(s).__name__} at index {i} has {s.optimizer}, "
                    f"which is different from {type(optimizer).__name__}.")
        self._schedulers = list(schedulers)
        self.optimizer = optimizer
        self._last_lr = self._group_lrs()

    def step(self):
        for s in self._schedulers:
            s.step()
        self._last_lr = self._group_lrs()

    state_dict = SequentialLR.state_dict
    load_state_dict = SequentialLR.load_state_dict


for _cls in (LRScheduler, LambdaLR, StepLR, MultiStepLR, ExponentialLR,
             CosineAnnealingLR, LinearLR, OneCycleLR, ConstantLR,
             MultiplicativeLR, PolynomialLR, CosineAnnealingWarmRestarts,
             CyclicLR):
    _cls.__module__ = __name__
del _cls
