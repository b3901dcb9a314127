"""Exact distributed evaluation metrics.

Every rank adds up what it saw (``update``); ``compute`` sums the totals
over ranks in one all-reduce, so every rank reports the global figure. With
``DistributedSampler(..., pad=False)`` no sample is counted twice — PyTorch's
padded sampler makes some samples count twice in validation metrics.

Example::

    m = dtorch.distributed.metrics.MetricSum()
    for x, y in val_loader:
        pred = model(x).argmax(1)
        m.update(correct=(pred == y).sum(), total=len(y), loss=loss * len(y))
    r = m.compute()                    # same dict on every rank
    accuracy = r["correct"] / r["total"]

Under ``use_deterministic_algorithms(True)`` the sums are exact (rational
sums of the float values, every element of a tensor on its own), so a
metric such as a summed per-sample loss has the same bits on any world
size and batch split, as the deterministic training it evaluates.
"""
from fractions import Fraction

import numpy as np

from .._settings import are_deterministic_algorithms_enabled
from ..tensor import Tensor


class MetricSum:
    """Named running sums, reduced over ranks on ``compute()``."""

    def __init__(self, group=None):
        self.group = group
        self.sums = {}

    def update(self, **values):
        exact = are_deterministic_algorithms_enabled()
        for k, v in values.items():
            if exact:
                # Fraction(float) is exact, and so is adding them
                vals = v.detach().cpu().numpy().astype(np.float64).ravel() \
                    if isinstance(v, Tensor) else [v]
                v = sum(map(Fraction, vals), Fraction(0))
                self.sums[k] = self.sums.get(k, Fraction(0)) + v
                continue
            if isinstance(v, Tensor):
                v = v.detach().sum().item()
            self.sums[k] = self.sums.get(k, 0.0) + float(v)

    def reset(self):
        self.sums = {}

    def compute(self):
        """The sums over all ranks (one all-reduce, float64)."""
        from .. import distributed as dist
        g = self.group if self.group is not None else dist.group.WORLD
        names = sorted(self.sums)
        if any(isinstance(v, Fraction) for v in self.sums.values()):
            return self._compute_exact(g, names)
        buf = np.array([self.sums[k] for k in names], dtype=np.float64)
        if g is not None and dist.get_world_size(g) > 1:
            # every rank must hold the same names in the same order
            all_names = [None] * dist.get_world_size(g)
            dist.all_gather_object(all_names, names, group=g)
            for r, other in enumerate(all_names):
                if other != names:
                    raise RuntimeError(
                        f"MetricSum.compute: rank {dist.get_rank(g)} has "
                        f"metrics {names} but rank {r} has {other}")
            dist.all_reduce(Tensor._wrap(buf), group=g)
        return dict(zip(names, buf.tolist()))

    def _compute_exact(self, g, names):
        """Deterministic mode: every rank's exact sums, gathered and added
        exactly, rounded once."""
        from .. import distributed as dist
        mine = [(k, self.sums[k]) for k in names]
        every = [mine]
        if g is not None and dist.get_world_size(g) > 1:
            every = [None] * dist.get_world_size(g)
            dist.all_gather_object(every, mine, group=g)
        for r, other in enumerate(every):
            if [k for k, _ in other] != names:
                raise RuntimeError(
                    f"MetricSum.compute: rank {dist.get_rank(g)} has "
                    f"metrics {names} but rank {r} has "
                    f"{[k for k, _ in other]}")
        return {k: float(sum((Fraction(o[i][1]) for o in every),
                             Fraction(0)))
                for i, k in enumerate(names)}
