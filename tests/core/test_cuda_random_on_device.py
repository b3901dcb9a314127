"""Random numbers on CUDA are drawn on the tensor's device by that device's
generator, never drawn on the host and copied (issue 20): every factory,
in-place fill, sampling function, dropout mask and nn.init initialiser.
The CuPy stand-in records host-to-device copies (``cupy._h2d``), so the
tests check that no array of the drawn size crossed. Run with
DTORCH_FAKE_CUDA=1 (the copy count is the stand-in's; on a GPU the device
and seeding checks run)."""
import numpy as np
import pytest

import dtorch
from dtorch import nn
from dtorch.nn import functional as F
from dtorch.nn import init

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not dtorch.cuda.is_available(), reason="needs CuPy or DTORCH_FAKE_CUDA=1")]

N = 777      # a size no other array in these calls has


def _devices():
    return ["cuda"] + (["cuda:1"] if dtorch.cuda.is_available() and
                       dtorch.cuda.device_count() >= 2 else [])


def _w(dev):
    return dtorch.empty(N, device=dev)


DRAWS = [
    ("rand", lambda d: dtorch.rand(N, device=d)),
    ("randn", lambda d: dtorch.randn(N, device=d)),
    ("randn_f16", lambda d: dtorch.randn(N, dtype=dtorch.float16, device=d)),
    ("randn_f64", lambda d: dtorch.randn(N, dtype=dtorch.float64, device=d)),
    ("randint", lambda d: dtorch.randint(0, 10, (N,), device=d)),
    ("randperm", lambda d: dtorch.randperm(N, device=d)),
    ("normal_scalars", lambda d: dtorch.normal(1., 2., (N,), device=d)),
    ("normal_tensor_mean", lambda d: dtorch.normal(
        dtorch.zeros(N, device=d), 1.)),
    ("rand_like", lambda d: dtorch.rand_like(_w(d))),
    ("randn_like", lambda d: dtorch.randn_like(_w(d))),
    ("randint_like", lambda d: dtorch.randint_like(_w(d), 5)),
    ("uniform_", lambda d: _w(d).uniform_(-1, 1)),
    ("normal_", lambda d: _w(d).normal_(0, 2)),
    ("bernoulli_", lambda d: _w(d).bernoulli_(0.3)),
    ("random_", lambda d: _w(d).random_(0, 7)),
    ("exponential_", lambda d: _w(d).exponential_(2.)),
    ("geometric_", lambda d: _w(d).geometric_(0.4)),
    ("log_normal_", lambda d: _w(d).log_normal_()),
    ("cauchy_", lambda d: _w(d).cauchy_()),
    ("bernoulli", lambda d: dtorch.bernoulli(dtorch.full((N,), .5,
                                                         device=d))),
    ("multinomial", lambda d: dtorch.ones(N + 5, device=d).multinomial(N)),
    ("multinomial_replacement", lambda d: dtorch.ones(
        3, device=d).multinomial(N, True)),
    ("poisson", lambda d: dtorch.poisson(dtorch.full((N,), 3.,
                                                     device=d))),
    ("dropout", lambda d: F.dropout(dtorch.ones(N, device=d), 0.5)),
    ("dropout1d", lambda d: F.dropout1d(dtorch.ones(1, N, 2, device=d),
                                        0.5)),
    ("alpha_dropout", lambda d: F.alpha_dropout(dtorch.ones(N, device=d),
                                                0.5, training=True)),
    ("init.uniform_", lambda d: init.uniform_(_w(d))),
    ("init.normal_", lambda d: init.normal_(_w(d))),
    ("init.trunc_normal_", lambda d: init.trunc_normal_(_w(d))),
    ("init.kaiming_uniform_", lambda d: init.kaiming_uniform_(
        dtorch.empty(N, 3, device=d))),
    ("init.xavier_normal_", lambda d: init.xavier_normal_(
        dtorch.empty(N, 3, device=d))),
    ("init.orthogonal_", lambda d: init.orthogonal_(
        dtorch.empty(N, 3, device=d))),
    ("init.sparse_", lambda d: init.sparse_(dtorch.empty(N, 3, device=d),
                                            0.5)),
]


def _h2d():
    import cupy
    if not getattr(cupy, "_FAKE", False):
        return None
    return cupy._h2d


@pytest.mark.parametrize("dev", _devices())
@pytest.mark.parametrize("name,make", DRAWS, ids=[d[0] for d in DRAWS])
def test_drawn_on_the_device_not_copied_from_the_host(name, make, dev):
    log = _h2d()
    if log is not None:
        log.clear()
    dtorch.cuda.set_device(0)
    t = make(dev)
    want = dtorch.device(dev).resolve()
    assert t.device == want and t._data.device.id == want.index
    assert dtorch.cuda.current_device() == 0
    if log is not None:
        big = [n for n in log if n >= N]
        assert not big, f"{name}: host arrays of {big} elements copied"


@pytest.mark.parametrize("name,make", DRAWS, ids=[d[0] for d in DRAWS])
def test_seeding_reproduces_each_device_sequence(name, make):
    devs = _devices()

    def run():
        dtorch.manual_seed(11)
        return [host(make(d)) for d in devs for _ in range(2)]
    a, b = run(), run()
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    if name in ("randperm", "multinomial"):
        return
    # successive draws differ (the generator advances)
    assert not np.array_equal(a[0], a[1])


def host(t):
    return t.detach().cpu().numpy()


def test_devices_have_their_own_generators():
    if len(_devices()) < 2:
        pytest.skip("needs 2 CUDA devices")
    dtorch.manual_seed(5)
    a0 = host(dtorch.rand(8, device="cuda:0"))
    dtorch.manual_seed(5)
    for _ in range(3):
        dtorch.rand(8, device="cuda:1")   # device 1's draws leave 0's alone
    assert np.array_equal(a0, host(dtorch.rand(8, device="cuda:0")))
    # every device is seeded alike (as PyTorch's manual_seed)
    dtorch.manual_seed(5)
    assert np.array_equal(a0, host(dtorch.rand(8, device="cuda:1")))


def test_float64_draws_are_not_float32_draws_cast():
    x = host(dtorch.randn(N, dtype=dtorch.float64, device="cuda"))
    assert x.dtype == np.float64
    assert (x != x.astype(np.float32).astype(np.float64)).any()


def test_cuda_generator_objects():
    g = dtorch.Generator(device="cuda")
    g.manual_seed(3)
    a = host(dtorch.randn(16, generator=g, device="cuda"))
    st = g.get_state()
    b = host(dtorch.randn(16, generator=g, device="cuda"))
    g.manual_seed(3)
    assert np.array_equal(a, host(dtorch.randn(16, generator=g,
                                               device="cuda")))
    g.set_state(st)
    assert np.array_equal(b, host(dtorch.randn(16, generator=g,
                                               device="cuda")))
    assert g.initial_seed() == 3
    # PyTorch refuses a generator of another device type
    with pytest.raises(RuntimeError, match="Expected a 'cuda' device type "
                                           "for generator but found 'cpu'"):
        dtorch.randn(3, generator=dtorch.Generator(), device="cuda")
    with pytest.raises(RuntimeError, match="Expected a 'cpu' device type "
                                           "for generator but found 'cuda'"):
        dtorch.randn(3, generator=g)


def test_dropout_in_a_model_on_cuda1_draws_there():
    if len(_devices()) < 2:
        pytest.skip("needs 2 CUDA devices")
    m = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5)).to("cuda:1")
    dtorch.manual_seed(2)
    y = m(dtorch.ones(3, 4, device="cuda:1"))
    assert y.device.index == 1
    dtorch.manual_seed(2)
    assert np.array_equal(host(y), host(m(dtorch.ones(3, 4,
                                                      device="cuda:1"))))
