"""Ranks under a bare mpiexec split the host's cores for BLAS (as
dtorch-launch does through the environment): 4 ranks with 2 OpenBLAS
threads each on 2 cores ran gpt.py 40-70x slower."""
import os
import shutil
import subprocess
import sys

import pytest

from collectives import blas_threads

pytestmark = pytest.mark.skipif(
    "OMPI_COMM_WORLD_SIZE" in os.environ,
    reason="starts its own mpiexec; runs in the single-process phase")

PROBE = r"""
import ctypes, os, sys
import numpy  # loads OpenBLAS first, as a user's script may
from collectives import blas_threads
lib = ctypes.CDLL(blas_threads._blas_libraries()[0])
get = lib.scipy_openblas_get_num_threads64_
before = get()
if sys.argv[1] == "init":
    import dtorch.distributed as dist
    dist.init_process_group()
    dist.barrier()
else:
    blas_threads.fit(int(sys.argv[1]))
print("BLAS", before, get(), os.environ.get("OPENBLAS_NUM_THREADS"),
      os.environ.get("OMP_NUM_THREADS"), flush=True)
"""


def _clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in blas_threads.THREAD_VARS}
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               **extra)
    return env


def _numpy_openblas():
    import numpy  # noqa: F401
    libs = blas_threads._blas_libraries()
    if not libs or "scipy_openblas" not in libs[0]:
        pytest.skip(f"NumPy's BLAS here is not scipy-openblas: {libs}")


def _run(cmd, env, tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    r = subprocess.run([c if c != "PROBE" else str(probe) for c in cmd],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return [line.split()[1:] for line in r.stdout.splitlines()
            if line.startswith("BLAS ")]


def test_fit_sets_budget_unless_user_chose(tmp_path):
    _numpy_openblas()
    cores = blas_threads.cpu_count()
    want = str(max(1, cores // 4))
    (got,) = _run([sys.executable, "PROBE", "4"], _clean_env(), tmp_path)
    assert got == [str(cores), want, want, want]
    # a user's setting wins: nothing changes
    (got,) = _run([sys.executable, "PROBE", "4"],
                  _clean_env(OPENBLAS_NUM_THREADS="2"), tmp_path)
    assert got[0] == got[1] == got[2] == "2" and got[3] == "None"
    assert blas_threads.fit(1, env={}) is None


def test_bare_mpiexec_ranks_split_the_cores(tmp_path):
    _numpy_openblas()
    mpiexec = shutil.which("mpiexec", path=os.path.dirname(sys.executable))
    if mpiexec is None:
        pytest.fail("mpiexec not found next to the interpreter: in the "
                    "dtorch clone, pip install -e '.[dev]'")
    # oversubscribed: Open MPI binds no rank, so each OpenBLAS starts with
    # every core of the host
    rows = _run([mpiexec, "-n", "3", "--oversubscribe", sys.executable,
                 "PROBE", "init"], _clean_env(), tmp_path)
    want = str(max(1, blas_threads.cpu_count() // 3))
    assert len(rows) == 3
    assert all(r[1:] == [want, want, want] for r in rows), rows
