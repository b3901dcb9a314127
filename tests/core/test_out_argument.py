"""``out=`` acts where dtorch accepts it (zeros, cat, stack,
F.normalize): the result is written into ``out`` and ``out`` returned, as
PyTorch (it was ignored: ``out`` kept its old values)."""
import warnings

import numpy as np
import pytest

import dtorch
import dtorch.nn.functional as F


def _both(fn_d, fn_t, out_shape, out_dtype):
    torch = pytest.importorskip("torch")
    res = []
    for lib, fn in ((dtorch, fn_d), (torch, fn_t)):
        out = lib.full(out_shape, 7.0, dtype=getattr(lib, out_dtype))
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            r = fn(lib, out)
        assert r is out
        res.append((out.numpy().copy(), str(out.dtype).split(".")[-1],
                    any("resized" in str(x.message) for x in w)))
    assert res[0][1:] == res[1][1:]
    np.testing.assert_allclose(res[0][0], res[1][0], rtol=1e-6)


X = np.arange(6.0).reshape(2, 3)


@pytest.mark.parametrize("shape", [(2, 3), (0,), (5,)])
def test_zeros_out(shape):
    _both(lambda lib, o: lib.zeros(2, 3, out=o),
          lambda lib, o: lib.zeros(2, 3, out=o), shape, "float64")


@pytest.mark.parametrize("shape", [(4, 3), (0,), (3,)])
def test_cat_out(shape):
    f = (lambda lib, o: lib.cat([lib.tensor(X, dtype=lib.float32)] * 2,
                                out=o))
    _both(f, f, shape, "float64")


def test_stack_out():
    f = (lambda lib, o: lib.stack([lib.tensor(X)] * 3, 1, out=o))
    _both(f, f, (2, 3, 3), "float64")


def test_normalize_out():
    def fd(lib, o):
        return F.normalize(lib.tensor(X), dim=0, out=o)

    def ft(lib, o):
        return lib.nn.functional.normalize(lib.tensor(X), dim=0, out=o)
    _both(fd, ft, (2, 3), "float64")


def test_out_refusals_as_torch():
    a = dtorch.ones(2, requires_grad=True)
    with pytest.raises(RuntimeError, match="cat\\(\\): functions with out"):
        dtorch.cat([a, a], out=dtorch.empty(4))
    with pytest.raises(RuntimeError, match="can't be cast"):
        dtorch.stack([dtorch.ones(2)] * 2,
                     out=dtorch.empty(2, 2, dtype=dtorch.int64))
    with dtorch.no_grad():                  # no graph: allowed
        o = dtorch.cat([a, a], out=dtorch.empty(4))
    assert o.tolist() == [1.0] * 4
