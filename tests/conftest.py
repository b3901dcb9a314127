"""Shared fixtures: the devices every device-parametrised test runs on (cpu
always, cuda when CuPy sees a GPU), so the same suite is the GPU check.

DTORCH_FAKE_CUDA=1 puts tests/fakecupy (a strict NumPy-backed CuPy stand-in)
first on the path, so the cuda half of the suite runs on a CPU machine: it
checks that the CUDA path uses CuPy's API correctly, not GPU results.
Every test that runs on the cuda device is marked ``gpu``
(``pytest -m gpu`` selects them)."""
import functools
import os
import re
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

# Bytecode: the suite starts some hundreds of interpreters (ranks,
# launchers, examples), each importing dtorch. Without cached bytecode each
# compiles dtorch's ~300 modules again: 0.44 s of CPU per `import dtorch`
# instead of 0.18 s (2 cores, 2026-12-02). Under PYTHONDONTWRITEBYTECODE
# (no __pycache__ next to the sources) the bytecode goes to a cache outside
# the checkout instead, for this process and the ones the tests start.
if os.environ.get("PYTHONDONTWRITEBYTECODE") and not os.environ.get(
        "PYTHONPYCACHEPREFIX"):
    import tempfile
    _prefix = os.path.join(tempfile.gettempdir(),
                           f"dtorch-tests-pycache-{os.getuid()}")
    os.environ.pop("PYTHONDONTWRITEBYTECODE")
    os.environ["PYTHONPYCACHEPREFIX"] = _prefix
    sys.dont_write_bytecode = False
    sys.pycache_prefix = _prefix

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


# pytest-xdist (tests/run.sh runs the single-process phases with -n 2
# --dist loadgroup --no-loadscope-reorder): the work units are made here,
# from the test ids (pytest 9 keeps xdist 3.8's xdist_group marks out of
# the ids, so its own loadgroup never grouped anything). A test of a
# package in SPLIT is a unit of its own (it runs wherever a worker is
# free), unless its file has a module-, class- or session-scoped fixture
# (built once: the file is one unit); every other file is one unit
# (processes, ports, /dev/shm names of one file never overlap), and files
# that share one machine-wide resource (the local SLURM cluster, a Ray
# head) are one unit, so they never run at the same time. The workers
# order the tests: files first, the longest first (FIRST: the longest in
# wall time on 2 cores, measured 2026-12-02), so that the single tests fill both workers up at the end.
_SHARED_RESOURCE = {"test_slurm.py": "slurm", "test_slurm_nodes.py": "slurm",
                    "test_elastic_slurm.py": "slurm",
                    "test_launch_ray.py": "ray", "test_ray_nodes.py": "ray"}
SPLIT = {"core", "nn", "optim", "amp", "serialization"}
FIRST = ["test_examples.py", "slurm", "test_elastic.py",
         "test_collectives_tcp.py", "test_collectives_hier.py",
         "test_dcp_process.py", "test_two_nodes.py", "ray", "test_ddp.py",
         "test_determinism_acceptance.py", "test_pipeline_gpt.py",
         "test_pipeline_mpi.py", "test_determinism_process.py",
         "test_dry_run.py", "test_straggler_tcp.py", "test_amp_digits.py",
         "test_plots.py", "test_data_resume_rng.py", "test_data_resume.py",
         "test_data_shards.py", "test_data_shm.py", "test_data.py",
         "test_layering.py", "test_tcp_teardown.py"]
_WIDE = re.compile(r"scope=['\"](module|class|package|session)['\"]")


@functools.lru_cache(maxsize=None)
def _has_wide_fixture(path):
    with open(os.path.join(os.path.dirname(TESTS), path),
              encoding="utf-8") as f:
        return bool(_WIDE.search(f.read()))


def work_unit(nodeid):
    """The xdist work unit of a test: its own id, its file, or a shared
    resource's name."""
    path = nodeid.split("::")[0]
    parts = path.split("/")
    if parts[-1] in _SHARED_RESOURCE:
        return _SHARED_RESOURCE[parts[-1]]
    if len(parts) > 2 and parts[-2] in SPLIT and not _has_wide_fixture(path):
        return nodeid
    return parts[-1]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Scheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            return work_unit(nodeid)
    return Scheduling(config, log)


def pytest_collection_modifyitems(config, items):
    if hasattr(config, "workerinput"):          # in an xdist worker
        rank = {u: i for i, u in enumerate(FIRST)}
        units = {it.nodeid: work_unit(it.nodeid) for it in items}
        # stable: files (FIRST in its order, then the others), then the
        # single tests, each in collection order
        items.sort(key=lambda it: (units[it.nodeid] == it.nodeid,
                                   rank.get(units[it.nodeid], len(rank))))
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
