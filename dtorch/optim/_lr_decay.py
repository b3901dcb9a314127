"""Schedulers that decay the rate by a closed-form factor of the step:
lambdas, steps, exponential, linear, constant, polynomial."""
from bisect import bisect_right
from collections import Counter

from ._lr_base import LRScheduler, _LambdaScheduler


class LambdaLR(_LambdaScheduler):
    """lr = initial_lr * lr_lambda(epoch); one lambda, or one per group."""

    def get_lr(self):
        self._warn_get_lr()
        return [base * fn(self.last_epoch)
                for fn, base in zip(self.lr_lambdas, self.base_lrs)]


class StepLR(LRScheduler):
    """Multiply lr by ``gamma`` every ``step_size`` epochs."""

    def __init__(self, optimizer, step_size, gamma=0.1, last_epoch=-1):
        self.step_size = step_size
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        self._warn_get_lr()
        if self.last_epoch == 0 or self.last_epoch % self.step_size != 0:
            return self._group_lrs()
        return [lr * self.gamma for lr in self._group_lrs()]

    def _get_closed_form_lr(self):
        return [base * self.gamma ** (self.last_epoch // self.step_size)
                for base in self.base_lrs]


class MultiStepLR(LRScheduler):
    """Multiply lr by ``gamma`` at each milestone epoch."""

    def __init__(self, optimizer, milestones, gamma=0.1, last_epoch=-1):
        self.milestones = Counter(milestones)
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        # a dict read back from a file: restore the Counter (int keys)
        self.milestones = Counter(
            {int(k): v for k, v in self.milestones.items()})

    def get_lr(self):
        self._warn_get_lr()
        if self.last_epoch not in self.milestones:
            return self._group_lrs()
        k = self.milestones[self.last_epoch]
        return [lr * self.gamma ** k for lr in self._group_lrs()]

    def _get_closed_form_lr(self):
        milestones = sorted(self.milestones.elements())
        n = bisect_right(milestones, self.last_epoch)
        return [base * self.gamma ** n for base in self.base_lrs]


class ExponentialLR(LRScheduler):
    """Multiply lr by ``gamma`` every epoch."""

    def __init__(self, optimizer, gamma, last_epoch=-1):
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        self._warn_get_lr()
        if self._is_initial:
            return self._group_lrs()
        return [lr * self.gamma for lr in self._group_lrs()]

    def _get_closed_form_lr(self):
        return [base * self.gamma ** self.last_epoch
                for base in self.base_lrs]


class LinearLR(LRScheduler):
    """Scale lr by a factor that moves linearly from ``start_factor`` to
    ``end_factor`` over ``total_iters`` epochs (a warm-up)."""

    def __init__(self, optimizer, start_factor=1.0 / 3, end_factor=1.0,
                 total_iters=5, last_epoch=-1):
        if start_factor > 1.0 or start_factor <= 0:
            raise ValueError(
                "Starting multiplicative factor expected to be greater "
                "than 0 and less or equal to 1.")
        if end_factor > 1.0 or end_factor < 0:
            raise ValueError("Ending multiplicative factor expected to be "
                             "between 0 and 1.")
        self.start_factor = start_factor
        self.end_factor = end_factor
        self.total_iters = total_iters
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        self._warn_get_lr()
        lrs = self._group_lrs()
        s, e, n = self.start_factor, self.end_factor, self.total_iters
        if self.last_epoch == 0:
            return [lr * s for lr in lrs]
        if self._is_initial or self.last_epoch > n:
            return lrs
        f = 1.0 + (e - s) / (n * s + (self.last_epoch - 1) * (e - s))
        return [lr * f for lr in lrs]

    def _get_closed_form_lr(self):
        s, e, n = self.start_factor, self.end_factor, self.total_iters
        f = s + (e - s) * min(n, self.last_epoch) / n
        return [base * f for base in self.base_lrs]


class ConstantLR(LRScheduler):
    """lr * factor until epoch ``total_iters``, then lr."""

    def __init__(self, optimizer, factor=1.0 / 3, total_iters=5,
                 last_epoch=-1):
        if factor > 1.0 or factor < 0:
            raise ValueError("Constant multiplicative factor expected to be "
                             "between 0 and 1.")
        self.factor = factor
        self.total_iters = total_iters
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        self._warn_get_lr()
        lrs = self._group_lrs()
        if self.last_epoch == 0:
            return [lr * self.factor for lr in lrs]
        if self.last_epoch != self.total_iters:
            return lrs
        return [lr * (1.0 / self.factor) for lr in lrs]

    def _get_closed_form_lr(self):
        f = self.factor + (self.last_epoch >= self.total_iters) * (
            1 - self.factor)
        return [base * f for base in self.base_lrs]


class MultiplicativeLR(_LambdaScheduler):
    """lr *= lr_lambda(epoch) at every step after the first."""

    def get_lr(self):
        self._warn_get_lr()
        lrs = self._group_lrs()
        if self.last_epoch > 0:
            return [lr * fn(self.last_epoch)
                    for fn, lr in zip(self.lr_lambdas, lrs)]
        return lrs


class PolynomialLR(LRScheduler):
    """Decay to zero over ``total_iters`` epochs as (1 - t/T) ** power."""

    def __init__(self, optimizer, total_iters=5, power=1.0, last_epoch=-1):
        self.total_iters = total_iters
        self.power = power
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        self._warn_get_lr()
        lrs = self._group_lrs()
        e, n = self.last_epoch, self.total_iters
        if e == 0 or e > n:
            return lrs
        f = ((1.0 - e / n) / (1.0 - (e - 1) / n)) ** self.power
        return [lr * f for lr in lrs]

    def _get_closed_form_lr(self):
        f = (1.0 - min(self.total_iters, self.last_epoch)
             / self.total_iters) ** self.power
        return [base * f for base in self.base_lrs]
