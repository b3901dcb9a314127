"""Shared fixtures: the devices every device-parametrised test runs on (cpu
always, cuda when CuPy sees a GPU), so the same suite is the GPU check."""
import os

import pytest

# one BLAS thread per process keeps the 2-core CI machine predictable
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import dtorch  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if dtorch.cuda.is_available() else [])


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


@pytest.fixture(autouse=True)
def _seed():
    dtorch.manual_seed(0)
    yield


@pytest.fixture(scope="session")
def mpi_world():
    """The MPI world as dtorch.distributed's default group, for tests
    marked mpi (run under mpiexec); it stays up for the whole session."""
    import dtorch.distributed as dist
    if not dist.is_initialized():
        dist.init_process_group("mpi")
    yield dist
