"""Dropout: element-wise, and channel-wise (Dropout1d/2d/3d zero whole
feature maps, as PyTorch's feature dropout)."""
import numpy as np
import pytest

import dtorch
from dtorch import nn
import dtorch.nn.functional as F
from dtorch.autograd import gradcheck


@pytest.mark.parametrize("cls,shape", [
    (nn.Dropout1d, (8, 16, 5)), (nn.Dropout1d, (16, 5)),
    (nn.Dropout2d, (8, 16, 3, 4)), (nn.Dropout3d, (8, 16, 2, 3, 4)),
    (nn.Dropout3d, (16, 2, 3, 4))])
def test_channel_dropout_zeroes_whole_channels(cls, shape):
    dtorch.manual_seed(0)
    x = dtorch.ones(*shape)
    y = cls(0.5)(x).numpy()
    batched = len(shape) in (3, 4, 5) and not (cls is nn.Dropout3d
                                             and len(shape) == 4)
    chans = y.reshape(shape[:2] + (-1,)) if batched else \
        y.reshape(shape[:1] + (-1,))
    # each channel is all zeros or all 1 / (1 - p)
    assert np.all(chans.min(-1) == chans.max(-1))
    assert set(np.unique(chans)) == {0.0, 2.0}
    assert 0.2 < (chans[..., 0] == 0).mean() < 0.8


def test_channel_dropout_backward_uses_the_forward_mask():
    x = dtorch.randn(4, 6, 3, 3, dtype=dtorch.float64, requires_grad=True)
    dtorch.manual_seed(1)
    y = F.dropout2d(x, 0.5)
    y.sum().backward()
    kept = (y.detach().numpy() != 0)
    np.testing.assert_array_equal(x.grad.numpy(), kept * 2.0)

    def fn(a):
        dtorch.manual_seed(3)        # the same mask at every evaluation
        return F.dropout2d(a, 0.3)
    assert gradcheck(fn, (x,))


def test_channel_dropout_eval_inplace_and_errors():
    x = dtorch.ones(2, 3, 4, 4)
    d = nn.Dropout2d(0.5)
    d.eval()
    assert d(x) is x
    z = dtorch.ones(2, 3, 4, 4)
    dtorch.manual_seed(0)
    assert F.dropout2d(z, 0.5, inplace=True) is z
    assert (z.numpy() == 0).any()
    with pytest.raises(RuntimeError, match="dropout1d: Expected 2D or 3D"):
        F.dropout1d(dtorch.ones(2, 3, 4, 5))
    with pytest.warns(UserWarning, match="assuming that channel-wise 1D"):
        F.dropout2d(dtorch.ones(2, 3, 4))
    with pytest.raises(ValueError, match="between 0 and 1"):
        F.dropout2d(x, 1.5)
    assert repr(nn.Dropout2d(0.2)) == "Dropout2d(p=0.2, inplace=False)"


def test_channel_dropout_matches_torch_statistics():
    torch = pytest.importorskip("torch")
    # same rule as torch: which dims share one draw
    x = torch.ones(64, 32, 2, 2)
    t = torch.nn.functional.dropout2d(x, 0.5).reshape(64, 32, -1)
    d = F.dropout2d(dtorch.ones(64, 32, 2, 2), 0.5).numpy().reshape(
        64, 32, -1)
    for a in (t.numpy(), d):
        assert np.all(a.min(-1) == a.max(-1))
