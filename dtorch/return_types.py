"""Named tuples returned by ops such as ``max(dim)`` (``torch.return_types``)."""
from collections import namedtuple

MinMax = namedtuple("MinMax", ["values", "indices"])
max = min = sort = topk = MinMax
kthvalue = median = mode = cummax = cummin = MinMax

# torch.linalg's results (torch.return_types.linalg_*) and the older
# torch.svd / torch.slogdet / torch.qr ones
linalg_inv_ex = namedtuple("linalg_inv_ex", ["inverse", "info"])
linalg_cholesky_ex = namedtuple("linalg_cholesky_ex", ["L", "info"])
linalg_solve_ex = namedtuple("linalg_solve_ex", ["result", "info"])
linalg_slogdet = namedtuple("linalg_slogdet", ["sign", "logabsdet"])
linalg_qr = namedtuple("linalg_qr", ["Q", "R"])
linalg_svd = namedtuple("linalg_svd", ["U", "S", "Vh"])
linalg_eigh = namedtuple("linalg_eigh", ["eigenvalues", "eigenvectors"])
linalg_lstsq = namedtuple("linalg_lstsq", ["solution", "residuals", "rank",
                                           "singular_values"])
slogdet = namedtuple("slogdet", ["sign", "logabsdet"])
qr = namedtuple("qr", ["Q", "R"])
svd = namedtuple("svd", ["U", "S", "V"])
