"""Datasets: map-style ``Dataset`` (``__getitem__`` + ``__len__``),
``IterableDataset``, and the composites of ``torch.utils.data``."""
import bisect
import math
import warnings

from ... import _creation

__all__ = ["Dataset", "IterableDataset", "TensorDataset", "ConcatDataset",
           "Subset", "random_split"]


class Dataset:
    """A map from keys (usually ``0 .. len-1``) to samples. Subclasses
    define ``__getitem__`` and usually ``__len__``."""

    def __getitem__(self, index):
        raise NotImplementedError(
            "Subclasses of Dataset should implement __getitem__.")

    def __add__(self, other):
        return ConcatDataset([self, other])


class IterableDataset(Dataset):
    """A stream of samples: subclasses define ``__iter__``. With worker
    processes every worker iterates its own copy; split the work with
    ``get_worker_info()`` to avoid duplicates."""

    def __iter__(self):
        raise NotImplementedError(
            "Subclasses of IterableDataset should implement __iter__.")

    def __add__(self, other):
        raise TypeError("ConcatDataset does not support IterableDataset; "
                        "chain the iterables instead")


class TensorDataset(Dataset):
    """Samples are rows of the given tensors: ``ds[i] = (t[i] for t)``.

    Example::

        ds = TensorDataset(x, y)      # x: (N, ...), y: (N,)
    """

    def __init__(self, *tensors):
        if not tensors or any(t.size(0) != tensors[0].size(0)
                              for t in tensors):
            raise AssertionError("Size mismatch between tensors")
        self.tensors = tensors

    def __getitem__(self, index):
        return tuple(t[index] for t in self.tensors)

    def __len__(self):
        return self.tensors[0].size(0)


class ConcatDataset(Dataset):
    """Several map-style datasets one after the other."""

    def __init__(self, datasets):
        self.datasets = list(datasets)
        if len(self.datasets) == 0:
            raise AssertionError("datasets should not be an empty iterable")
        for d in self.datasets:
            if isinstance(d, IterableDataset):
                raise AssertionError(
                    "ConcatDataset does not support IterableDataset")
        self.cumulative_sizes = []
        total = 0
        for d in self.datasets:
            total += len(d)
            self.cumulative_sizes.append(total)

    def __len__(self):
        return self.cumulative_sizes[-1]

    def __getitem__(self, idx):
        if idx < 0:
            if -idx > len(self):
                raise ValueError("absolute value of index should not "
                                 "exceed dataset length")
            idx = len(self) + idx
        d = bisect.bisect_right(self.cumulative_sizes, idx)
        start = self.cumulative_sizes[d - 1] if d > 0 else 0
        return self.datasets[d][idx - start]


class Subset(Dataset):
    """The samples of ``dataset`` at ``indices``."""

    def __init__(self, dataset, indices):
        self.dataset = dataset
        self.indices = indices

    def __getitem__(self, idx):
        if isinstance(idx, list):
            return self.dataset[[self.indices[i] for i in idx]]
        return self.dataset[self.indices[idx]]

    def __getitems__(self, indices):
        # let the wrapped dataset batch-fetch when it can
        inner = getattr(self.dataset, "__getitems__", None)
        if inner is not None:
            return inner([self.indices[i] for i in indices])
        return [self.dataset[self.indices[i]] for i in indices]

    def __len__(self):
        return len(self.indices)


def random_split(dataset, lengths, generator=None):
    """Split ``dataset`` into non-overlapping random ``Subset``s of the
    given lengths, or fractions summing to 1 (remainders go round-robin
    to the first subsets, as in PyTorch).

    Example::

        train, val = random_split(ds, [0.8, 0.2],
                                  generator=dtorch.Generator().manual_seed(0))
    """
    n = len(dataset)
    lengths = list(lengths)
    if math.isclose(sum(lengths), 1) and sum(lengths) <= 1:
        sizes = []
        for i, frac in enumerate(lengths):
            if frac < 0 or frac > 1:
                raise ValueError(f"Fraction at index {i} is not between "
                                 "0 and 1")
            sizes.append(int(math.floor(n * frac)))
        for i in range(n - sum(sizes)):
            sizes[i % len(sizes)] += 1
        for i, size in enumerate(sizes):
            if size == 0:
                warnings.warn(f"Length of split at index {i} is 0. This "
                              "might result in an empty dataset.")
        lengths = sizes
    if sum(lengths) != n:
        raise ValueError("Sum of input lengths does not equal the length "
                         "of the input dataset!")
    perm = _creation.randperm(n, generator=generator).tolist()
    out, offset = [], 0
    for size in lengths:
        out.append(Subset(dataset, perm[offset:offset + size]))
        offset += size
    return out
