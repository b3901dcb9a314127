"""``dtorch.utils.data``: datasets, samplers, collation and the
``DataLoader``, with ``torch.utils.data``'s API."""
from .dataset import (Dataset, IterableDataset, TensorDataset,
                      ConcatDataset, Subset, random_split)
from .sampler import (Sampler, SequentialSampler, RandomSampler,
                      SubsetRandomSampler, BatchSampler)
from ._collate import default_collate, default_convert
from ._worker import get_worker_info, WorkerInfo
from .dataloader import DataLoader
from .distributed import DistributedSampler
from ._more import WeightedRandomSampler, ChainDataset, StackDataset
from .shards import (ShardedIterableDataset, MemmapTokenDataset,
                     MemmapArrayDataset)

__all__ = ["Dataset", "IterableDataset", "TensorDataset", "ConcatDataset",
           "Subset", "random_split", "Sampler", "SequentialSampler",
           "RandomSampler", "SubsetRandomSampler", "BatchSampler",
           "default_collate", "default_convert", "get_worker_info",
           "WorkerInfo", "DataLoader", "DistributedSampler",
           "WeightedRandomSampler", "ChainDataset", "StackDataset",
           "ShardedIterableDataset", "MemmapTokenDataset",
           "MemmapArrayDataset"]
