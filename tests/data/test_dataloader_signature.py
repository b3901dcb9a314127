"""DataLoader takes torch.utils.data.DataLoader's signature; ``in_order``
(PyTorch's out-of-order switch) is accepted and yields the default's
batches, silently."""
import inspect
import warnings

import numpy as np
import pytest

import dtorch
from dtorch.utils.data import DataLoader, TensorDataset


def test_dataloader_signature_matches_torch():
    torch = pytest.importorskip("torch")
    t = inspect.signature(torch.utils.data.DataLoader.__init__).parameters
    d = inspect.signature(DataLoader.__init__).parameters
    assert list(d) == list(t)
    for k in t:
        if k not in ("self", "generator"):
            assert d[k].default == t[k].default, k


@pytest.mark.parametrize("num_workers", [0, 2])
def test_in_order_false_gives_the_default_batches(num_workers):
    ds = TensorDataset(dtorch.arange(23))

    def batches(**kw):
        g = dtorch.Generator().manual_seed(5)
        loader = DataLoader(ds, batch_size=4, shuffle=True, generator=g,
                            num_workers=num_workers, **kw)
        return [b[0].numpy() for b in loader]

    base = batches()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        got = batches(in_order=False)
    assert not [str(x.message) for x in w]
    assert len(got) == len(base) == 6
    for g, b in zip(got, base):
        np.testing.assert_array_equal(g, b)
