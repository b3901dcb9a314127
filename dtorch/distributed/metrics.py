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
"""
import numpy as np

from ..tensor import Tensor


class MetricSum:
    """Named running sums, reduced over ranks on ``compute()``."""

    def __init__(self, group=None):
        self.group = group
        self.sums = {}

    def update(self, **values):
        for k, v in values.items():
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
