"""Collectives with CUDA arrays (issue 20): tcp stages CuPy arrays through
the host, NCCL groups send host arrays through their bootstrap (CPU) group,
MPI stages CuPy arrays even when CUDA-aware (it recursed forever),
init_process_group picks the GPU from LOCAL_RANK. CuPy arrays come from the
real CuPy on a GPU machine, or from the stand-in (tests/fakecupy)."""
import importlib.util
import os
import sys
import threading

import numpy as np
import pytest

import collectives
from collectives.arrays import ReduceOp
from helpers import free_port


def _fake_cupy_as_cupy(monkeypatch):
    """The stand-in, imported as `cupy` for this test only."""
    if "cupy" in sys.modules:
        return sys.modules["cupy"]
    d = os.path.join(os.path.dirname(__file__), "..", "fakecupy", "cupy")
    spec = importlib.util.spec_from_file_location(
        "cupy", os.path.join(d, "__init__.py"),
        submodule_search_locations=[d])
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "cupy", mod)
    spec.loader.exec_module(mod)
    for sub in ("cupy.cuda", "cupy.random"):
        monkeypatch.setitem(sys.modules, sub, sys.modules[sub])
    return mod


def test_tcp_all_reduce_and_broadcast_of_cupy_arrays(monkeypatch):
    cp = _fake_cupy_as_cupy(monkeypatch)
    from collectives.tcp import tcp_group
    port, out, errs = free_port(), {}, []

    def rank(r):
        try:
            g = tcp_group(r, 2, "127.0.0.1", port, "tok", timeout=30)
            try:
                x = cp.arange(4, dtype=np.float32) + r
                g.all_reduce(x)
                y = cp.full((3,), float(r + 5))
                g.broadcast(y, src=1)
                z = cp.ones(2) * (r + 1)
                g.all_reduce(z, op=ReduceOp.AVG)
                out[r] = (type(x), x.get(), y.get(), z.get())
            finally:
                g.destroy()
                if r == 0:
                    g.store.close()
        except BaseException as e:   # noqa: BLE001 - reported below
            errs.append(e)
    ts = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not errs, errs
    for r in range(2):
        typ, x, y, z = out[r]
        assert typ is cp.ndarray      # still a device array, reduced
        assert x.tolist() == [1.0, 3.0, 5.0, 7.0]
        assert y.tolist() == [6.0, 6.0, 6.0]
        assert z.tolist() == [1.5, 1.5]


class _Comm:
    """Records the NCCL calls a group makes (no GPU work)."""
    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        return lambda *a: self.calls.append(name)


def _nccl_over(boot, cp):
    from collectives.nccl import NCCLGroup
    g = NCCLGroup.__new__(NCCLGroup)
    collectives.group.ProcessGroup.__init__(g, boot.rank, boot.size, "nccl",
                                           None, 30)
    g._cp, g._nccl, g.comm, g._bootstrap = cp, None, _Comm(), boot
    return g


def test_nccl_group_sends_host_arrays_through_its_bootstrap(monkeypatch):
    cp = _fake_cupy_as_cupy(monkeypatch)

    def body(boot):
        g = _nccl_over(boot, cp)
        h = np.full(3, float(boot.rank + 1))
        g.all_reduce(h)                        # host: bootstrap group
        b = np.arange(2) if boot.rank == 0 else np.zeros(2, np.int64)
        g.broadcast(b, 0)
        obj = g.broadcast_object({"r": boot.rank}, 1)
        d = cp.ones(4, dtype=np.float32)
        g.all_reduce(d)                        # device: NCCL
        return h.tolist(), b.tolist(), obj, g.comm.calls
    res = collectives.spawn_threads(body, 2, timeout=30)
    for h, b, obj, calls in res:
        assert h == [3.0, 3.0, 3.0] and b == [0, 1] and obj == {"r": 1}
        assert calls == ["allReduce"]


def test_nccl_group_without_bootstrap_refuses_host_arrays(monkeypatch):
    cp = _fake_cupy_as_cupy(monkeypatch)
    g = _nccl_over(collectives.single_group(), cp)
    g._bootstrap = None
    with pytest.raises(TypeError, match="moves CuPy arrays only"):
        g.all_reduce(np.ones(2))


def test_nccl_dtype_error_names_the_dtype(monkeypatch):
    cp = _fake_cupy_as_cupy(monkeypatch)
    g = _nccl_over(collectives.single_group(), cp)
    with pytest.raises(TypeError, match="NCCL cannot move bool.*bfloat16"):
        g.all_reduce(cp.ones(2, dtype=bool))


def test_init_process_group_sets_the_device_from_local_rank(monkeypatch):
    import dtorch
    import dtorch.distributed as dist
    if not dtorch.cuda.is_available() or dtorch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA devices (or DTORCH_FAKE_CUDA=1)")
    seen = {}

    def fake_init(backend, **kw):
        seen["backend"] = backend
        seen["device"] = dtorch.cuda.current_device()
        return collectives.single_group()
    monkeypatch.setattr(dist._c, "init", fake_init)
    for k, v in {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
                 "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(k, v)
    prev = dtorch.cuda.current_device()
    try:
        dist.init_process_group()
        assert seen == {"backend": "nccl", "device": 1}
        assert dtorch.zeros(1, device="cuda").device.index == 1
    finally:
        dist.destroy_process_group()
        dtorch.cuda.set_device(prev)


@pytest.mark.mpi(min_size=2)
def test_mpi_stages_cupy_arrays_even_when_cuda_aware(monkeypatch):
    cp = _fake_cupy_as_cupy(monkeypatch)
    from collectives.mpi import MPIGroup
    g = MPIGroup(timeout=30, name="cuda-aware")
    g._cuda_aware = True     # this recursed until RecursionError
    x = cp.ones(5, dtype=np.float32) * (g.rank + 1)
    g.all_reduce(x)
    want = sum(range(1, g.size + 1))
    assert type(x) is cp.ndarray and x.get().tolist() == [want] * 5
    y = cp.arange(3) if g.rank == 0 else cp.zeros(3, dtype=np.int64)
    g.broadcast(y, 0)
    assert y.get().tolist() == [0, 1, 2]
