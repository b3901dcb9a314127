"""One BLAS thread while the deterministic switch is on (issue 26).

OpenBLAS's threaded GEMM sums in another order than its 1-thread GEMM, so
the same shard computation gave other bits with another BLAS thread count:
a 1-process run with 2 threads and a 2-process run with 1 thread each (or
thread ranks, which share one pool, vs processes) disagreed. Measured with
numpy's OpenBLAS 0.3.31 (Haswell kernels), 1 vs 2 threads,
tests/distributed/test_determinism_blas_threads.py for a training run:

- float32 GEMM, M x K x N: equal up to 16 x 128 x 128 (OpenBLAS keeps such
  small products on one thread), different from 32 x 256 x 256 on (45% of
  the elements of 32 x 256 x 256, 17% of 256 x 256 x 32, 28% of 32 x 64 x
  1024: the change is not confined to one thread's block of rows or
  columns, and even the 1-thread product of 32 rows is not the two 1-thread
  products of 16 rows: the kernel and its summation order are chosen by
  the shape and the thread count together). einsum with ``optimize=True``
  goes through the same GEMM and changes alike.
- float64 GEMM with a long K and a short M (2 x 8192 x 64) and ``dot`` of
  100 000 float64 (clip_grad_norm_'s sum of squares): threaded over K, the
  partial sums added at the end; float32 GEMV/dot of these sizes did not
  change.

So the thread count is a parameter of the bits, and the one count every
layout can have is 1: ``use_deterministic_algorithms(True)`` holds the BLAS
pools (threadpoolctl, every BLAS library loaded) at one thread; the last
holder's ``False`` (or the collection of a thread rank's flags, which
hold one) gives back the counts it found. Forward, backward, the loss,
clip_grad_norm_ and the optimizer all run in that window; the
deterministic DDP step re-pins at each forward in case a script set the
threads after the switch. Normal mode never enters here.

Cost: taking the hold 0.8-1.6 ms once (threadpoolctl finds the
libraries); the re-pin check ~1 us per forward. At 1 rank on the loaded
2-core VM (load 7-10) the held step took 0.03-0.11x the process CPU of the
same step with 2 BLAS threads (GPT, GPT d 256, MLP 256 wide:
benchmarks/determinism_blas_threads.py): OpenBLAS's second thread spins on
busy cores; on idle cores a large GEMM would lose at most its thread
speed-up. A BLAS library loaded after the switch (scipy's, by
scipy.special) is not held; dtorch computes with numpy's. CuPy's cuBLAS is
not a thread pool: see README.
"""
import threading

_lock = threading.Lock()
_state = {"holders": 0, "libs": None, "saved": None}


def available():
    """Whether the BLAS thread pools can be pinned (threadpoolctl)."""
    try:
        import threadpoolctl  # noqa: F401
    except ImportError:
        return False
    return True


def _blas_libs():
    from threadpoolctl import ThreadpoolController
    return [c for c in ThreadpoolController().lib_controllers
            if c.user_api == "blas"]


def _set(lib, n):
    # threadpoolctl >= 3.6 lets one "controlling" thread set a pthreads
    # OpenBLAS pool and silently ignores the others, and a thread rank is
    # not the main thread: take the control for this call and leave it free
    clear = getattr(type(lib), "clear_controlling_thread", None)
    if clear is not None:
        clear(force=True)
    lib.set_num_threads(n)
    if clear is not None:
        clear(force=True)


def repin():
    """Put every pinned BLAS library back to one thread (a script may have
    set the count since the switch); a no-op with no holder."""
    for lib in _state["libs"] or ():
        if lib.num_threads != 1:
            with _lock:
                _set(lib, 1)


class Hold:
    """One holder of the pin; the pools get their counts back when the
    last holder is released or collected (a thread rank's flags die with
    the rank)."""

    def __init__(self):
        self.held = False
        if not available():
            return
        with _lock:
            if _state["holders"] == 0:
                libs = _blas_libs()
                _state["libs"] = libs
                _state["saved"] = [lib.num_threads for lib in libs]
            _state["holders"] += 1
            self.held = True
            for lib in _state["libs"]:
                _set(lib, 1)

    def release(self):
        if not self.held:
            return
        self.held = False
        with _lock:
            _state["holders"] -= 1
            if _state["holders"] == 0:
                for lib, n in zip(_state["libs"], _state["saved"]):
                    _set(lib, n)
                _state["libs"] = _state["saved"] = None

    def __del__(self):
        try:
            self.release()
        except Exception:       # interpreter shutdown: the pools go too
            pass
