"""BLAS threads per rank: a host's cores split among the ranks on it.

NumPy's OpenBLAS starts a thread per core in every process, and idle BLAS
threads spin before they sleep. dtorch-launch gives each rank
OMP/OPENBLAS/MKL_NUM_THREADS = cores // local ranks; under a bare mpiexec or
srun nobody does, and there 4 ranks on 2 cores ran 40-70x slower than with
one thread each (examples/gpt.py --tp 2 --pp 2: 36-60 against 2,300-2,500
tokens/s): every rank's spinning BLAS thread took the core a peer needed
to answer a collective. ``fit(local_world_size)`` sets that budget at run
time (the BLAS library is loaded by then) and in the environment for child
processes, unless the user set one of the variables.
"""
import ctypes
import os

THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
# NumPy 2 wheels (scipy-openblas, 64-bit ints), older wheels, plain OpenBLAS,
# MKL
_SETTERS = ("scipy_openblas_set_num_threads64_", "openblas_set_num_threads64_",
            "openblas_set_num_threads", "MKL_Set_Num_Threads")


def cpu_count():
    """CPUs this process may run on (affinity mask, not the whole host)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _blas_libraries():
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split(None, 5)[-1].strip() for line in f}
    except OSError:             # not Linux: leave the BLAS alone
        return []
    return sorted(p for p in paths if "/" in p and any(
        k in os.path.basename(p).lower() for k in ("blas", "mkl_rt")))


def set_blas_threads(n):
    """Tell every loaded BLAS library to use ``n`` threads; how many took
    it."""
    done = 0
    for path in _blas_libraries():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in _SETTERS:
            fn = getattr(lib, name, None)
            if fn is not None:
                fn(ctypes.c_int(n))
                done += 1
                break
    return done


def fit(local_world_size, env=None):
    """Cores // local ranks BLAS threads for this rank, when more than one
    rank shares the host and the user chose no thread count; returns the
    number set (None: left alone)."""
    env = os.environ if env is None else env
    if local_world_size <= 1 or any(env.get(v) for v in THREAD_VARS):
        return None
    n = max(1, cpu_count() // local_world_size)
    for v in THREAD_VARS:
        env[v] = str(n)
    set_blas_threads(n)
    return n
