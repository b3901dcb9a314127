"""Conv3d, MaxPool3d, AvgPool3d against PyTorch (values and gradients in
float64) and gradcheck."""
import numpy as np
import pytest

import dtorch
import dtorch.nn as nn
import dtorch.nn.functional as F
from dtorch.autograd import gradcheck
from helpers import same_as_torch

torch = pytest.importorskip("torch")
TF = torch.nn.functional

rng = np.random.default_rng(0)
X = rng.standard_normal((2, 4, 5, 6, 7))


def _same(fd, ft, *arrays, tol=1e-10):
    same_as_torch(fd, ft, *arrays, tol=tol)


@pytest.mark.parametrize("kw,cin", [
    (dict(), 4), (dict(stride=2, padding=1), 4),
    (dict(stride=(1, 2, 1), padding=(0, 1, 2), dilation=(1, 2, 1)), 4),
    (dict(groups=2, padding=1), 2),
])
def test_conv3d_matches_torch(kw, cin):
    w = rng.standard_normal((6, cin, 2, 3, 2))
    b = rng.standard_normal(6)
    _same(lambda x, w_, b_: F.conv3d(x, w_, b_, **kw),
          lambda x, w_, b_: TF.conv3d(x, w_, b_, **kw), X, w, b)


def test_conv3d_module_pools_and_gradcheck():
    torch.manual_seed(0)
    tm = torch.nn.Conv3d(4, 3, 3, padding=1, padding_mode="replicate")
    tm = tm.double()
    dm = nn.Conv3d(4, 3, 3, padding=1, padding_mode="replicate").double()
    dm.load_state_dict({k: dtorch.tensor(v.detach().numpy())
                        for k, v in tm.state_dict().items()})
    np.testing.assert_allclose(dm(dtorch.tensor(X)).detach().numpy(),
                               tm(torch.tensor(X)).detach().numpy(),
                               atol=1e-10)
    assert dm(dtorch.tensor(X[0])).shape == (3, 5, 6, 7)
    _same(lambda x: F.max_pool3d(x, 2, padding=1),
          lambda x: TF.max_pool3d(x, 2, padding=1), X)
    _same(lambda x: nn.MaxPool3d((2, 3, 2), stride=1)(x),
          lambda x: torch.nn.MaxPool3d((2, 3, 2), stride=1)(x), X)
    for cip in (True, False):
        _same(lambda x: F.avg_pool3d(x, 3, 2, 1, count_include_pad=cip),
              lambda x: TF.avg_pool3d(x, 3, 2, 1, count_include_pad=cip), X)
    _same(lambda x: nn.AvgPool3d(2)(x), lambda x: torch.nn.AvgPool3d(2)(x), X)
    small = dtorch.tensor(X[:1, :2, :3, :3, :3], requires_grad=True)
    wt = dtorch.tensor(rng.standard_normal((2, 2, 2, 2, 2)),
                       requires_grad=True)
    assert gradcheck(lambda a, b: F.conv3d(a, b, stride=1, padding=1),
                     (small, wt))
    with pytest.raises(RuntimeError, match="channels"):
        F.conv3d(dtorch.tensor(X), dtorch.zeros(2, 3, 1, 1, 1,
                                                dtype=dtorch.float64))
