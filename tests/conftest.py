"""Shared fixtures: the devices every device-parametrised test runs on (cpu
always, cuda when CuPy sees a GPU), so the same suite is the GPU check.

DTORCH_FAKE_CUDA=1 puts tests/fakecupy (a strict NumPy-backed CuPy stand-in)
first on the path, so the cuda half of the suite runs on a CPU machine: it
checks that the CUDA path uses CuPy's API correctly, not GPU results.
Every test that runs on the cuda device is marked ``gpu``
(``pytest -m gpu`` selects them)."""
import os
import sys

import pytest

# The tests live in packages (tests/core, tests/nn, tests/distributed, ...:
# tests/project/test_test_layout.py lists them), plain directories without
# __init__.py, imported in pytest's default "prepend" mode: a test module's
# name is its file name, so file names are unique across packages (pytest
# stops with "import file mismatch" otherwise; the layout test says which).
# With __init__.py files, tests/collectives and tests/launch would shadow the
# real collectives and launch packages. The shared modules (helpers,
# torch_oracle, opinfo_table, collectives_helpers, netns_nodes,
# launch_scripts) stay here and are imported by bare name: tests/ is on
# sys.path (a test file that is also a rank script puts it there itself).
TESTS = os.path.dirname(os.path.abspath(__file__))
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)

# one BLAS thread per process keeps the 2-core CI machine predictable
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

FAKE_CUDA = os.environ.get("DTORCH_FAKE_CUDA", "") not in ("", "0")
if FAKE_CUDA:
    _fake = os.path.join(TESTS, "fakecupy")
    if "cupy" in sys.modules and not getattr(sys.modules["cupy"], "_FAKE",
                                             False):
        raise RuntimeError("DTORCH_FAKE_CUDA=1 but the real CuPy is "
                           "already imported")
    sys.path.insert(0, _fake)
    # child processes (DataLoader workers, launched ranks) see it too
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [_fake] + [p for p in os.environ.get("PYTHONPATH", "").split(
            os.pathsep) if p])

import dtorch  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if dtorch.cuda.is_available() else [])


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


# pytest-xdist (tests/run.sh runs the single-process phases with -n 2 and
# --dist loadgroup): a file's tests stay in one worker (module fixtures such
# as a namespace cluster are built once), and files that share one machine-wide
# resource (the local SLURM cluster, a Ray head) share a worker, so they never
# run at the same time
_SHARED_RESOURCE = {"test_slurm.py": "slurm", "test_slurm_nodes.py": "slurm",
                    "test_launch_ray.py": "ray", "test_ray_nodes.py": "ray"}


def pytest_collection_modifyitems(config, items):
    if config.pluginmanager.hasplugin("xdist"):
        for item in items:
            name = item.path.name
            item.add_marker(pytest.mark.xdist_group(
                _SHARED_RESOURCE.get(name, name)))
    # the gpu marker: every test that runs on a cuda device (the device
    # fixture's cuda half, or a test parametrised with a 'cuda...' value)
    for item in items:
        cs = getattr(item, "callspec", None)
        if cs is None:
            continue
        if any(isinstance(v, str) and (v == "cuda" or v.startswith("cuda:"))
               for v in cs.params.values()):
            item.add_marker(pytest.mark.gpu)


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
