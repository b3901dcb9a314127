"""Named tuples returned by ops such as ``max(dim)`` (``torch.return_types``)."""
from collections import namedtuple

MinMax = namedtuple("MinMax", ["values", "indices"])
max = min = sort = topk = MinMax
kthvalue = median = mode = cummax = cummin = MinMax
