"""WeightedRandomSampler, ChainDataset and StackDataset, as in
``torch.utils.data`` (issue 14)."""
from .dataset import Dataset, IterableDataset
from .sampler import Sampler, _NextPassState
from ... import _creation
from ... import _backend as B

__all__ = ["WeightedRandomSampler", "ChainDataset", "StackDataset"]


class WeightedRandomSampler(_NextPassState, Sampler):
    """``num_samples`` keys drawn with probability proportional to
    ``weights`` (with or without replacement), e.g. to rebalance classes.

    Example::

        w = 1.0 / class_counts[labels]          # one weight per sample
        loader = DataLoader(ds, batch_size=32,
                            sampler=WeightedRandomSampler(w, len(w)))
    """

    def __init__(self, weights, num_samples, replacement=True,
                 generator=None):
        if not isinstance(num_samples, int) or isinstance(num_samples, bool) \
                or num_samples <= 0:
            raise ValueError(f"num_samples should be a positive integer "
                             f"value, but got num_samples={num_samples}")
        if not isinstance(replacement, bool):
            raise ValueError(f"replacement should be a boolean value, but "
                             f"got replacement={replacement}")
        w = _creation.as_tensor(weights, dtype=B.float64)
        if w.ndim != 1:
            raise ValueError(f"weights should be a 1d sequence but given "
                             f"weights have shape {tuple(w.shape)}")
        self.weights = w
        self.num_samples = num_samples
        self.replacement = replacement
        self.generator = generator

    def __iter__(self):
        rand = self.weights.multinomial(self.num_samples, self.replacement,
                                        generator=self._pass_generator())
        yield from rand.tolist()

    def __len__(self):
        return self.num_samples


class ChainDataset(IterableDataset):
    """Iterable datasets, one after the other."""

    def __init__(self, datasets):
        super().__init__()
        self.datasets = datasets

    def __iter__(self):
        for d in self.datasets:
            if not isinstance(d, IterableDataset):
                raise AssertionError("ChainDataset only supports "
                                     "IterableDataset")
            yield from d

    def __len__(self):
        total = 0
        for d in self.datasets:
            if not isinstance(d, IterableDataset):
                raise AssertionError("ChainDataset only supports "
                                     "IterableDataset")
            total += len(d)
        return total


class StackDataset(Dataset):
    """Samples of several equally long datasets side by side: a tuple
    (positional) or a dict (keyword) per index."""

    def __init__(self, *args, **kwargs):
        if args and kwargs:
            raise ValueError("Supported either ``tuple``- (via ``args``) or"
                             "``dict``- (via ``kwargs``) like input/output, "
                             "but both types are given.")
        parts = list(args) or list(kwargs.values())
        if not parts:
            raise ValueError("At least one dataset should be passed")
        self._length = len(parts[0])
        if any(self._length != len(d) for d in parts):
            raise ValueError("Size mismatch between datasets")
        self.datasets = args if args else kwargs

    def __getitem__(self, index):
        if isinstance(self.datasets, dict):
            return {k: d[index] for k, d in self.datasets.items()}
        return tuple(d[index] for d in self.datasets)

    def __len__(self):
        return self._length
