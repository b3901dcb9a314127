"""The CuPy stand-in (tests/fakecupy) refuses what CuPy refuses: each test is
a behaviour from CuPy's documentation or source (cited), checked on the
stand-in, and on the real CuPy too when one with a GPU is installed (so a GPU
run checks the list itself). Behaviours of CuPy 13 that 14 changed are
checked on the stand-in and on real 13.x only."""
import importlib.util
import os
import sys

import numpy as np
import pytest

_FAKE_DIR = os.path.join(os.path.dirname(__file__), "..", "fakecupy",
                         "cupy")


def _load_fake():
    name = "_fakecupy_under_test"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(
        name, os.path.join(_FAKE_DIR, "__init__.py"),
        submodule_search_locations=[_FAKE_DIR])
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _real_cupy():
    try:
        import cupy
        if getattr(cupy, "_FAKE", False):
            return None
        cupy.cuda.runtime.getDeviceCount()
        return cupy
    except Exception:
        return None


_MODULES = [pytest.param("fake", id="stand-in")]
if _real_cupy() is not None:
    _MODULES.append(pytest.param("real", id="cupy", marks=pytest.mark.gpu))


@pytest.fixture(params=_MODULES)
def cp(request):
    return _load_fake() if request.param == "fake" else _real_cupy()


def _v13(cp):
    return int(cp.__version__.split(".")[0]) == 13


def is_fake(cp):
    return getattr(cp, "_FAKE", False)


# --- docs/source/user_guide/difference.rst and cupy/_core/core.pyx ---------

def test_implicit_numpy_conversion_is_refused(cp):
    # core.pyx __array__: "Implicit conversion to a NumPy array is not
    # allowed. Please use `.get()` to construct a NumPy array explicitly."
    a = cp.arange(3)
    with pytest.raises(TypeError, match="Implicit conversion"):
        np.asarray(a)
    with pytest.raises(TypeError):
        np.array(a, dtype=np.float64)
    assert not isinstance(a, np.ndarray)
    h = a.get()
    assert type(h) is np.ndarray and h.tolist() == [0, 1, 2]
    assert type(cp.asnumpy(a)) is np.ndarray


def test_numpy_arrays_are_refused_by_ufuncs_and_operators(cp):
    # difference.rst "Universal Functions only work with CuPy array or
    # scalar": cupy.power([cupy.arange(5)], 2) raises TypeError
    with pytest.raises(TypeError):
        cp.power([cp.arange(5)], 2)
    with pytest.raises(TypeError):
        cp.arange(3) + np.arange(3)
    with pytest.raises(TypeError):
        cp.add(np.arange(3), cp.arange(3))


def test_reductions_return_zero_dim_arrays(cp):
    # difference.rst "Zero-dimensional array / Reduction methods"
    s = cp.sum(cp.arange(3))
    assert type(s) is cp.ndarray and s.ndim == 0
    assert type(cp.arange(3).max()) is cp.ndarray
    assert int(s) == 3 and float(s) == 3.0


def test_zero_dim_arrays_promote_as_arrays(cp):
    # difference.rst "Type promotion": a 0-dim int32 array times a float32
    # array is float64 (NumPy 1.x would give float32)
    r = cp.array(3, dtype=np.int32) * cp.array([1., 2.], dtype=np.float32)
    assert r.dtype == np.float64


def test_random_functions_take_dtype(cp):
    # difference.rst "Random methods support dtype argument"
    assert cp.random.randn(dtype=np.float32).dtype == np.float32
    assert cp.random.random_sample((2,), dtype=np.float32).dtype == \
        np.float32
    rs = cp.random.RandomState(0)
    a = rs.standard_normal((3,))
    assert a.dtype == np.float64 and type(a) is cp.ndarray


def test_python_scalars_take_the_arrays_kind(cp):
    # _kernel.pyx _check_should_use_min_scalar (13) / NEP 50 (14): a Python
    # scalar of the array's kind keeps the array's dtype; a higher kind wins
    f16 = cp.ones(2, dtype=np.float16)
    assert (f16 + 1.0).dtype == np.float16
    assert (f16 * 2).dtype == np.float16
    assert (cp.ones(2, np.int32) + 1.5).dtype == np.float64
    assert (cp.ones(2, np.int32) + 1).dtype == np.int32
    assert cp.where(cp.ones(2, bool), f16, 0).dtype == np.float16


def test_cupy13_value_based_scalar_casting(cp):
    # CuPy 13 (_kernel.pyx _min_scalar_type): NumPy scalars are scalars too,
    # and a large value picks a wider type; NumPy 2 (NEP 50) differs
    if not _v13(cp):
        pytest.skip("CuPy 14 follows NEP 50")
    f32 = cp.ones(2, dtype=np.float32)
    assert (f32 * np.float64(2.0)).dtype == np.float32
    assert (cp.ones(2, np.float16) + 1e5).dtype == np.float32
    assert (cp.ones(2, np.int8) + 1000).dtype == np.int16
    # the scalar's value is not rounded to its minimal type
    x = cp.ones(1, dtype=np.float64) / 3e-6
    assert abs(float(x[0]) - 1 / 3e-6) < 1e-6


def test_out_of_bounds_integer_indices_wrap(cp):
    # difference.rst "Out-of-bounds indices": CuPy wraps around them
    x = cp.array([0, 1, 2])
    x[[1, 3]] = 10
    assert x.get().tolist() == [10, 10, 2]
    assert cp.arange(3)[cp.asarray([4])].get().tolist() == [1]
    assert cp.take(cp.arange(3), cp.asarray([3])).get().tolist() == [0]


def test_where_needs_an_array_condition(cp):
    # cupy/_sorting/search.py: _where_ufunc(condition.astype('?'), x, y)
    a = cp.arange(3.0)
    with pytest.raises(AttributeError):
        cp.where(True, a, a)
    assert cp.where(a > 0, a, -1.0).get().tolist() == [-1.0, 1.0, 2.0]


def test_ufunc_at_dtypes(cp):
    # _routines_indexing.pyx _scatter_op_single: add.at only on int32,
    # float16, float32, float64, uint32, uint64 (no int64); subtract.at only
    # int32/uint32
    idx = cp.asarray([0, 1, 1])
    with pytest.raises(TypeError, match="add.at only supports"):
        cp.add.at(cp.zeros(3, np.int64), idx, 1)
    z = cp.zeros(3, np.float32)
    cp.add.at(z, idx, cp.ones(3, np.float32))
    assert z.get().tolist() == [1.0, 2.0, 0.0]
    with pytest.raises(TypeError):
        cp.subtract.at(cp.zeros(3, np.float32), idx, 1)
    with pytest.raises(NotImplementedError):
        cp.multiply.at(cp.ones(3, np.float32), idx, 2)


def test_cupy13_namespace_and_methods(cp):
    # put_along_axis arrived in 14.0 (cupy/__init__.py), reshape(copy=) in
    # 14.2; bfloat16 is in no release
    assert not hasattr(cp, "bfloat16")
    if not _v13(cp):
        pytest.skip("CuPy 14 has put_along_axis")
    assert not hasattr(cp, "put_along_axis")
    assert hasattr(cp, "take_along_axis")
    with pytest.raises(TypeError):
        cp.arange(6).reshape(2, 3, copy=False)


def test_setting_shape_refuses_a_copy(cp):
    # core.pyx shape setter: AttributeError('incompatible shape') when the
    # new shape needs a copy (dtorch's view() relies on it for CuPy < 14.2)
    t = cp.arange(6).reshape(2, 3).T
    v = t.view()
    with pytest.raises(AttributeError):
        v.shape = (6,)
    w = cp.arange(6).view()
    w.shape = (3, 2)
    assert w.shape == (3, 2)


def test_bfloat16_and_object_dtypes_are_refused(cp):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    with pytest.raises((ValueError, TypeError)):
        cp.asarray(np.zeros(2, dtype=ml_dtypes.bfloat16))
    with pytest.raises((ValueError, TypeError)):
        cp.asarray(np.array(["a", "b"]))


# --- devices, streams, events (cupy/cuda/device.pyx, stream.pyx) ----------

def test_arrays_remember_their_device(cp):
    if cp.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs 2 devices")
    assert cp.cuda.Device().id == 0
    with cp.cuda.Device(1) as d:
        assert d.id == 1 and cp.cuda.Device().id == 1
        a = cp.ones(3)
    assert cp.cuda.Device().id == 0
    assert a.device.id == 1 and a.data.device_id == 1
    assert isinstance(a.data.ptr, int) and a.data.ptr != 0
    assert "data" in a.__cuda_array_interface__
    # views stay on the array's device; copy()/asarray() bring to the
    # current one (core.pyx copy: "makes a copy ... in the current device")
    assert a[1:].device.id == 1 and a.T.device.id == 1
    assert a.copy().device.id == 0
    assert cp.asarray(a).device.id == 0
    with cp.cuda.Device(1):
        assert cp.asarray(a) is a


def test_kernels_refuse_arrays_of_another_device(cp):
    # _kernel.pyx _check_peer_access: ValueError when peer access is
    # unavailable (the stand-in has none)
    if not is_fake(cp):
        pytest.skip("real GPUs may have peer access")
    with cp.cuda.Device(1):
        a = cp.ones(3)
    with pytest.raises(ValueError, match="different from the current"):
        a + 1
    with pytest.raises(ValueError):
        cp.zeros(3) + a
    with pytest.raises(ValueError):
        a.sum()
    with cp.cuda.Device(1):
        assert float((a + 1).sum()) == 6.0


def test_current_device_is_per_thread(cp):
    import threading
    if cp.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs 2 devices")
    seen = []
    cp.cuda.Device(1).use()
    try:
        t = threading.Thread(target=lambda: seen.append(cp.cuda.Device().id))
        t.start()
        t.join()
    finally:
        cp.cuda.Device(0).use()
    assert seen == [0]


def test_streams_and_events(cp):
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        assert cp.cuda.get_current_stream() is s or \
            cp.cuda.get_current_stream().ptr == s.ptr
        ev = cp.cuda.Event(disable_timing=True)
        ev.record(s)
    cp.cuda.get_current_stream().wait_event(ev)
    ev.synchronize()
    assert ev.done
    if is_fake(cp):
        # an event records on a stream of its own device only
        with cp.cuda.Device(1):
            s1 = cp.cuda.Stream()
        with pytest.raises(cp.cuda.runtime.CUDARuntimeError):
            cp.cuda.Event().record(s1)


def test_no_nccl_in_the_stand_in(cp):
    if not is_fake(cp):
        pytest.skip("the real CuPy may have NCCL")
    with pytest.raises((ImportError, AttributeError)):
        cp.cuda.nccl


# --- cupy/_core/fusion.pyx, docs reference/generated/cupy.fuse ------------

def test_fuse_forms_out_args_and_numpy_fallback(cp):
    # @fuse, @fuse() and @fuse(kernel_name=...); ufuncs with out= write into
    # the arguments (fusion_tests TestFusionInplaceUpdate); Python scalars
    # are arguments too; NumPy arguments run the plain function
    def body(x, y, s, z):
        cp.add(x * s, cp.tanh(y), out=z)
        z += 1
        return z

    x, y = cp.arange(4.0), cp.ones(4)
    want = (cp.arange(4.0) * 2 + cp.tanh(cp.ones(4)) + 1).get()
    for f in (cp.fuse(body), cp.fuse()(body),
              cp.fuse(kernel_name="k_body")(body)):
        z = cp.zeros(4)
        r = f(x, y, 2, z)
        np.testing.assert_allclose(z.get(), want)
        np.testing.assert_allclose(r.get(), want)
    # a where inside a fused function (cupy/_sorting/search.py has a fusion
    # branch)
    g = cp.fuse(lambda h, d: cp.where(h <= 0, 0, d))
    assert g(cp.asarray([-1.0, 2.0]), cp.asarray([5.0, 6.0])).get().tolist() \
        == [0.0, 6.0]
    if is_fake(cp):
        out = np.zeros(2)
        cp.fuse(lambda a, o: np.add(a, 1, out=o))(np.ones(2), out)
        assert out.tolist() == [2.0, 2.0]
    with pytest.raises(TypeError):      # kernel_name given twice
        cp.fuse(body, kernel_name="x")(body)


def test_fused_function_counts_one_launch(cp):
    if not is_fake(cp):
        pytest.skip("launch counts are the stand-in's")
    x = cp.arange(3.0)
    f = cp.fuse(kernel_name="three")(lambda a: cp.exp(a) * a + 1)
    cp._launches.clear()
    f(x)
    assert dict(cp._launches) == {"fuse:three": 1}
    cp._launches.clear()
    cp.exp(x) * x + 1
    assert dict(cp._launches) == {"exp": 1, "multiply": 1, "add": 1}
    # what CuPy's fusion cannot trace is refused inside the function
    for bad in (lambda a: a[0] + 1, lambda a: a @ a,
                lambda a: cp.concatenate([a, a])):
        with pytest.raises(TypeError, match="cupy.fuse"):
            cp.fuse(bad)(x)
    assert not cp._fusing()     # a refused call leaves the state clean
