"""Samplers: iterables of dataset keys (or lists of keys, for
``BatchSampler``), as in ``torch.utils.data.sampler``. A sampler is any
object with ``__iter__`` (and ``__len__``), so a ``DistributedSampler``
whose ``set_epoch`` users call each epoch plugs into ``DataLoader`` as is.
"""
from ... import _creation
from ...random import Generator, _rng

__all__ = ["Sampler", "SequentialSampler", "RandomSampler",
           "SubsetRandomSampler", "BatchSampler"]


class Sampler:
    """Base class: subclasses define ``__iter__`` and, usually,
    ``__len__``."""

    def __init__(self, data_source=None):
        pass

    def __iter__(self):
        raise NotImplementedError


class SequentialSampler(Sampler):
    """0, 1, ..., len(data_source) - 1."""

    def __init__(self, data_source):
        self.data_source = data_source

    def __iter__(self):
        return iter(range(len(self.data_source)))

    def __len__(self):
        return len(self.data_source)


def _fresh_generator(generator):
    """The given generator, or a new one seeded from the default stream
    (so ``dtorch.manual_seed`` fixes the order, as in PyTorch)."""
    if generator is not None:
        return generator
    seed = int(_rng(None).integers(0, 2 ** 63 - 1))
    return Generator().manual_seed(seed)


class _NextPassState:
    """``state_dict``/``load_state_dict`` for a sampler whose order comes
    from a generator: the state is where the *next* ``__iter__`` starts,
    which is what the DataLoader records when it starts a pass (and then
    fast-forwards by the batches already consumed). With no generator the
    pass's seed is drawn from the default stream ahead of time, so a
    pass costs one draw from it either way."""

    _pending = None

    def state_dict(self):
        if self.generator is not None:
            return {"generator": self.generator.get_state()}
        if self._pending is None:
            self._pending = int(_rng(None).integers(0, 2 ** 63 - 1))
        return {"seed": self._pending}

    def load_state_dict(self, state):
        if "generator" in state:
            if self.generator is None:
                raise ValueError(
                    f"{type(self).__name__} state was saved with a "
                    "generator; this sampler has none")
            self.generator.set_state(state["generator"])
        else:
            self._pending = int(state["seed"])

    def _pass_generator(self):
        if self.generator is not None:
            return self.generator
        if self._pending is not None:
            seed, self._pending = self._pending, None
            return Generator().manual_seed(seed)
        return _fresh_generator(None)


class RandomSampler(_NextPassState, Sampler):
    """Keys in random order: a permutation per pass (``num_samples`` may
    exceed ``len(data_source)``), or draws with ``replacement``."""

    def __init__(self, data_source, replacement=False, num_samples=None,
                 generator=None):
        self.data_source = data_source
        self.replacement = replacement
        self._num_samples = num_samples
        self.generator = generator
        if not isinstance(self.replacement, bool):
            raise TypeError("replacement should be a boolean value, but got "
                            f"replacement={self.replacement}")
        if not isinstance(self.num_samples, int) or self.num_samples <= 0:
            raise ValueError("num_samples should be a positive integer "
                             f"value, but got num_samples={self.num_samples}")

    @property
    def num_samples(self):
        if self._num_samples is None:
            return len(self.data_source)
        return self._num_samples

    def __iter__(self):
        n = len(self.data_source)
        g = self._pass_generator()
        if self.replacement:
            # in chunks of 32, as PyTorch draws them
            for _ in range(self.num_samples // 32):
                yield from _creation.randint(0, n, (32,),
                                             generator=g).tolist()
            yield from _creation.randint(0, n, (self.num_samples % 32,),
                                         generator=g).tolist()
        else:
            for _ in range(self.num_samples // n):
                yield from _creation.randperm(n, generator=g).tolist()
            yield from _creation.randperm(
                n, generator=g).tolist()[:self.num_samples % n]

    def __len__(self):
        return self.num_samples


class SubsetRandomSampler(_NextPassState, Sampler):
    """The given indices, in a random order."""

    def __init__(self, indices, generator=None):
        self.indices = indices
        self.generator = generator

    def __iter__(self):
        perm = _creation.randperm(len(self.indices),
                                  generator=self._pass_generator())
        for i in perm.tolist():
            yield self.indices[i]

    def __len__(self):
        return len(self.indices)


class BatchSampler(Sampler):
    """Groups another sampler's keys into lists of ``batch_size``.

    Example::

        list(BatchSampler(SequentialSampler(range(5)), 2, drop_last=False))
        # [[0, 1], [2, 3], [4]]
    """

    def __init__(self, sampler, batch_size, drop_last):
        if (not isinstance(batch_size, int) or isinstance(batch_size, bool)
                or batch_size <= 0):
            raise ValueError("batch_size should be a positive integer "
                             f"value, but got batch_size={batch_size}")
        if not isinstance(drop_last, bool):
            raise ValueError("drop_last should be a boolean value, but got "
                             f"drop_last={drop_last}")
        self.sampler = sampler
        self.batch_size = batch_size
        self.drop_last = drop_last

    def __iter__(self):
        batch = []
        for idx in self.sampler:
            batch.append(idx)
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch and not self.drop_last:
            yield batch

    def state_dict(self):
        """The wrapped sampler's state (see ``RandomSampler``)."""
        inner = getattr(self.sampler, "state_dict", None)
        return {"sampler": inner() if inner is not None else None}

    def load_state_dict(self, state):
        if state.get("sampler") is not None:
            self.sampler.load_state_dict(state["sampler"])

    def __len__(self):
        if self.drop_last:
            return len(self.sampler) // self.batch_size
        return (len(self.sampler) + self.batch_size - 1) // self.batch_size
