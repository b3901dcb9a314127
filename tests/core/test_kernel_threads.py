"""The compiled kernels' threads follow dtorch.set_num_threads whatever was
imported first (issue 28): where torch loaded its GNU OpenMP before
numba's pool started, numba's omppool used to share that library (its
spinning wait policy, its thread count), so dtorch kept its kernels to one
thread there. Now omppool binds its own libgomp (dtorch/_kernels
``_load``); a kernel counts the distinct numba threads that ran its
iterations, so the figure is a count, not a time."""
import os
import subprocess
import sys

import pytest

numba = pytest.importorskip("numba")

CODE = """
import sys, threading, numpy as np
first = sys.argv[1]
torch = None
if first == "torch":
    import torch
    torch.set_num_threads(1)
    torch.get_num_threads()             # torch's pool in use before
import numba, dtorch
from dtorch import _kernels as K

@numba.njit(parallel=True)
def ids(out):
    for i in numba.prange(out.size):
        out[i] = numba.get_thread_id()

def distinct():
    # a kernel-sized array applies dtorch's count to this thread, as
    # every op does before its kernel
    K.kernels(np.ones(K.PARALLEL_MIN, np.float32))
    t = np.zeros(1 << 16, np.int64)
    ids(t)
    return len(set(t.tolist()))

for n in (2, 1):
    dtorch.set_num_threads(n)
    main = distinct()
    seen = []
    th = threading.Thread(target=lambda: seen.append(distinct()))
    th.start()
    th.join(120)
    print(main, seen[0], torch.get_num_threads() if torch else 0,
          numba.threading_layer())
"""


def _run(first):
    env = dict(os.environ, NUMBA_NUM_THREADS="2")
    for var in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "DTORCH_NUMBA",
                "NUMBA_THREADING_LAYER"):
        env.pop(var, None)
    r = subprocess.run([sys.executable, "-c", CODE, first],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    return [line.split() for line in r.stdout.splitlines()]


@pytest.mark.skipif(not sys.platform.startswith("linux"),
                    reason="GNU OpenMP's load order is a Linux matter")
def test_kernels_use_set_num_threads_with_torch_imported_first():
    pytest.importorskip("torch")
    # set_num_threads(2), then (1): as many numba threads in the main
    # thread and in another (a thread rank), torch's own count (1) left
    # as it was
    assert _run("torch") == [["2", "2", "1", "omp"], ["1", "1", "1", "omp"]]


def test_kernels_use_set_num_threads_without_torch():
    two, one = _run("plain")
    assert two[:3] == ["2", "2", "0"] and one[:2] == ["1", "1"]
