"""``DistributedSampler``: each rank's shard of a dataset, as PyTorch's.

Same behaviour as ``torch.utils.data.DistributedSampler``: with ``shuffle``
the permutation comes from ``seed + epoch`` (identical on every rank),
``set_epoch`` changes it; the index list is padded by repeating its start so
that every rank gets ``ceil(N / world)`` samples (or truncated with
``drop_last``); rank r takes positions r, r + world, r + 2 world, ...

Beyond PyTorch, the sampler resumes mid-epoch, also on another world size:
``state_dict()`` records the epoch, the seed and how many samples of the
epoch the job has consumed (every rank consumes the same number, so the
first ``world * consumed_per_rank`` positions of the epoch's order are
done); ``load_state_dict`` re-partitions the rest among the new ranks.

``pad=False`` (an extension) gives uneven shards without duplicates, which
is what exact distributed evaluation wants.
"""
import math
import sys

import numpy as np

from ..._settings import are_deterministic_algorithms_enabled
from .sampler import Sampler


def _default_group():
    """(world size, rank) of dtorch.distributed's default process group, or
    None when there is none.

    dtorch.distributed is a layer above this one, so it is not imported
    here: only a process that has loaded it can have initialised a group,
    and then it is in ``sys.modules``."""
    dist = sys.modules.get("dtorch.distributed")
    if dist is None or not dist.is_initialized():
        return None
    return dist.get_world_size(), dist.get_rank()


def _world():
    world = _default_group()
    if world is None:
        raise RuntimeError("Default process group has not been initialized; "
                           "pass num_replicas and rank to "
                           "DistributedSampler")
    return world


class DistributedSampler(Sampler):
    """Sampler that restricts data loading to this rank's shard.

    Example::

        sampler = DistributedSampler(dataset, shuffle=True, seed=0)
        loader = DataLoader(dataset, batch_size=32, sampler=sampler)
        for epoch in range(epochs):
            sampler.set_epoch(epoch)
            for x, y in loader:
                ...
    """

    # the DataLoader saves this sampler's state by samples consumed (which
    # re-partitions onto another world size), not by replaying batches
    _resume_by_consumed = True

    def __init__(self, dataset, num_replicas=None, rank=None, shuffle=True,
                 seed=0, drop_last=False, pad=True):
        if num_replicas is None or rank is None:
            ws, r = _world()
            num_replicas = ws if num_replicas is None else num_replicas
            rank = r if rank is None else rank
        if rank >= num_replicas or rank < 0:
            raise ValueError(f"Invalid rank {rank}, rank should be in the "
                             f"interval [0, {num_replicas - 1}]")
        self.dataset = dataset
        self.num_replicas = int(num_replicas)
        self.rank = int(rank)
        self.shuffle = shuffle
        self.seed = int(seed)
        self.drop_last = drop_last
        self.pad = pad
        self.epoch = 0
        self._start = 0          # positions of this epoch already consumed
        self._yielded = 0        # samples this rank yielded this epoch
        self._spent = False      # a pass has started from _start
        self._plan()

    def _plan(self):
        """num_samples / total_size for the positions left this epoch."""
        n = len(self.dataset) - self._start
        w = self.num_replicas
        if self.drop_last and n % w != 0:
            self.num_samples = math.ceil((n - w) / w)
        elif not self.pad and not self.drop_last:
            self.num_samples = len(range(self.rank, n, w))
        else:
            self.num_samples = math.ceil(n / w)
        self.total_size = self.num_samples * w

    def _order(self):
        n = len(self.dataset)
        if self.shuffle:
            rng = np.random.Generator(np.random.PCG64(self.seed + self.epoch))
            return rng.permutation(n).tolist()
        return list(range(n))

    def __iter__(self):
        if self._spent:
            # a loaded position serves one pass: the next starts the epoch
            # afresh, as the uninterrupted run's does without set_epoch
            self._start = 0
            self._plan()
        self._spent = True
        indices = self._order()[self._start:]
        n = len(indices)
        if n % self.num_replicas and (self.pad or self.drop_last) and \
                are_deterministic_algorithms_enabled():
            # padding repeats, and drop_last drops, a number of samples
            # that depends on the world size: the epoch would too
            raise ValueError(
                f"DistributedSampler: the {n} samples left in epoch "
                f"{self.epoch} do not split evenly into {self.num_replicas} "
                f"replicas, so padding or drop_last would make the epoch "
                f"depend on the world size under use_deterministic_"
                f"algorithms(True); use a dataset length divisible by the "
                f"world size, or pad=False")
        if not self.drop_last and self.pad:
            padding = self.total_size - n
            if padding and n:
                reps = math.ceil(padding / n)
                indices += (indices * reps)[:padding]
        elif self.drop_last:
            indices = indices[:self.total_size]
        mine = indices[self.rank:len(indices):self.num_replicas]
        assert self.pad is False or len(mine) == self.num_samples
        self._yielded = 0
        for i in mine:
            self._yielded += 1
            yield i

    def __len__(self):
        return self.num_samples

    def set_epoch(self, epoch):
        """Shuffle differently for this epoch (same on every rank)."""
        if epoch != self.epoch:
            self._start = 0
        self.epoch = epoch
        self._yielded = 0
        self._plan()

    # ----------------------------------------------------- resumability --
    def state_dict(self, consumed=None):
        """The position in the epoch. ``consumed`` is the number of samples
        this rank has trained on this epoch; by default the number the
        sampler has yielded, exact when the DataLoader has no worker
        prefetch (num_workers=0). Pass it explicitly otherwise."""
        per_rank = self._yielded if consumed is None else int(consumed)
        done = min(self._start + per_rank * self.num_replicas,
                   len(self.dataset))
        return {"epoch": self.epoch, "seed": self.seed,
                "consumed": done, "shuffle": self.shuffle,
                "dataset_len": len(self.dataset)}

    def load_state_dict(self, state):
        """Continue an epoch where ``state`` left it, on this sampler's
        (possibly different) number of replicas."""
        if state.get("dataset_len", len(self.dataset)) != len(self.dataset):
            raise ValueError(
                f"DistributedSampler state is for a dataset of "
                f"{state['dataset_len']} samples, this one has "
                f"{len(self.dataset)}")
        self.epoch = int(state["epoch"])
        self.seed = int(state["seed"])
        self.shuffle = bool(state.get("shuffle", self.shuffle))
        self._start = int(state["consumed"])
        self._yielded = 0
        self._spent = False
        self._plan()
