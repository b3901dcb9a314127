"""CUDA random numbers: manual_seed seeds the GPU generators before CuPy is
loaded (lazily, at the first draw), each device has its own generator, and
dtorch.cuda.get_rng_state/set_rng_state restore the continuation (issue 20).
Run with a GPU or DTORCH_FAKE_CUDA=1."""
import json

import numpy as np
import pytest

import dtorch
from dtorch.nn import functional as F
from helpers import last_json, run_python

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not dtorch.cuda.is_available(), reason="needs CuPy or DTORCH_FAKE_CUDA=1")]

_SCRIPT = """
import json, sys, dtorch
dtorch.manual_seed(3)                      # CuPy not imported yet
assert 'cupy' not in sys.modules, 'manual_seed imported CuPy'
x = dtorch.ones(64, device='cuda')
m = dtorch.nn.functional.dropout(x, 0.5)
print(json.dumps(m.cpu().tolist()))
"""


def test_manual_seed_before_cupy_loads_seeds_the_gpu():
    # a fresh process (CuPy not loaded at manual_seed) draws what this one
    # draws after the same seed
    a = last_json(run_python(_SCRIPT).stdout)
    dtorch.manual_seed(3)
    b = F.dropout(dtorch.ones(64, device="cuda"), 0.5).cpu().tolist()
    assert a == b
    assert 0 < sum(v == 0 for v in a) < 64


def _mask(device="cuda", n=256):
    x = dtorch.ones(n, device=device)
    return F.dropout(x, 0.5).cpu().numpy()


def test_manual_seed_repeats_and_state_restores_continuation():
    dtorch.manual_seed(5)
    a = _mask()
    dtorch.manual_seed(5)
    assert np.array_equal(a, _mask())
    st = dtorch.cuda.get_rng_state()
    json.dumps(st)              # checkpointable as JSON
    b, c = _mask(), _mask()
    assert not np.array_equal(b, c)
    dtorch.cuda.set_rng_state(st)
    assert np.array_equal(b, _mask()) and np.array_equal(c, _mask())
    dtorch.manual_seed(6)
    assert not np.array_equal(a, _mask())


def test_each_device_draws_on_its_own_device():
    if dtorch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA devices")
    dtorch.manual_seed(0)
    # ops on a device other than the current one run inside its context
    # (CuPy runs kernels on the current device)
    with dtorch.cuda.device(1):
        x = dtorch.ones(32, device="cuda:1")
        y = F.dropout(x, 0.5)
        assert y.device.index == 1 and y._data.device.id == 1
        states = dtorch.cuda.get_rng_state_all()
        assert len(states) == dtorch.cuda.device_count()
        a1 = F.dropout(x, 0.5).cpu().numpy()
        dtorch.cuda.set_rng_state_all(states)
        assert np.array_equal(a1, F.dropout(x, 0.5).cpu().numpy())
    # device 0's generator is its own: same seed, same first draw
    dtorch.manual_seed(0)
    assert np.array_equal(_mask(n=32), _mask_on(1))


def _mask_on(i):
    dtorch.manual_seed(0)
    with dtorch.cuda.device(i):
        return F.dropout(dtorch.ones(32, device=f"cuda:{i}"), 0.5).cpu().numpy()
