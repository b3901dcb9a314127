"""Compiled, fused, multi-threaded CPU kernels for hot non-GEMM ops (numba),
with the NumPy code in each op as the fallback.

``kernels(*arrays)`` is the one switch the ops and optimizers ask: the
compiled kernel namespace (``dtorch._kernels._numba``) when every array is
a C-contiguous float32/float64 NumPy array and kernels are on, else None
(the caller runs its NumPy code). Kernels are on when numba imports and
``DTORCH_NUMBA`` is not 0 (read once, at the first kernel call; README's
table). numba is imported at that first call, never by ``import dtorch``.

Threads follow ``dtorch.set_num_threads`` (else OMP_NUM_THREADS, else the
usable cores), as PyTorch's intra-op pool does: numba's count is per
calling thread, so it is applied in each thread before its first kernel.
A process forked after kernels ran (DataLoader workers) runs the NumPy
path: GNU OpenMP's thread pool does not survive fork.
"""
import ctypes
import os
import sys
import threading
import warnings

import numpy as np

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))

# mod: None unknown, False off; deterministic: dtorch's
# are_deterministic_algorithms_enabled (set by dtorch._settings)
_state = {"mod": None, "threads": None, "deterministic": lambda: False}

# Below this many elements a kernel runs on the calling thread only: waking
# a sleeping worker costs more than the work (measured in
# benchmarks/cpu_kernels.py: the *_small cases).
PARALLEL_MIN = 1 << 17
_tls = threading.local()


def _load(switch=True):
    """The kernel module, or False when numba is missing or (``switch``)
    switched off."""
    if switch and "DTORCH_NUMBA" in os.environ:
        # the project's one switch parser; imported only when the switch
        # is set, so a plain `import dtorch` loads no collectives code
        from collectives import env_flag
        if not env_flag("DTORCH_NUMBA", True):
            return False
    if "numba" in _state:
        return _state["numba"]
    try:
        import numba
        from numba.np.ufunc import parallel
    except ImportError:
        return False
    # GNU OpenMP's workers spin for a while after each parallel loop by
    # default; on a machine with as many threads as cores, a spinning
    # worker takes the core the main thread (NumPy, OpenBLAS) needs next
    # (measured: kernels 3-30x slower at 2 threads on 2 busy cores). The
    # policy is read once, when a libgomp loads: set it for the moment
    # numba's pool loads its libgomp (a user's own OMP_WAIT_POLICY wins)
    # and restore the environment.
    passive = os.environ.get("OMP_WAIT_POLICY", "").upper() == "PASSIVE"
    own = "OMP_WAIT_POLICY" not in os.environ
    if own:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    # A libgomp loaded before (import torch loads torch/lib/libgomp.so.1)
    # read the spinning default, and numba's omppool, loaded plainly,
    # binds its GOMP_* symbols to that one (the first in the global
    # scope): measured at 2 threads, 4.0 of every 5 ms after each kernel
    # burnt by spinning workers, a CNN step 290-310 ms against 30-38 ms.
    # Loaded with RTLD_DEEPBIND, omppool binds to its own dependency, the
    # system libgomp.so.1.0.0, a second OpenMP runtime that loads now
    # (passive) with its own pool and thread count: both libraries then
    # run on every core, neither sees the other's settings (LD_DEBUG=
    # bindings: no omppool or libgomp.so.1.0.0 symbol bound to torch's).
    # Only where that file was already loaded too (or RTLD_DEEPBIND is
    # missing) do the kernels keep to one thread, unless the user set
    # OMP_WAIT_POLICY=PASSIVE for the process.
    before = _gomp_files()
    deep = getattr(os, "RTLD_DEEPBIND", 0) if before else 0
    # numba's pool start sets the calling thread's OpenMP thread count to
    # its own pool size: where numba shares a libgomp loaded before, the
    # other library (torch) ran on every core from then on (measured after
    # torch.set_num_threads(1): at::get_num_threads() 1 -> 2, and a
    # 16x32x16x16 3x3 conv's fwd+bwd 1.9 -> 3-50 ms thread time). Put back
    # what it was.
    gomp = _gomp()
    saved = gomp.omp_get_max_threads() if gomp is not None else None
    flags = sys.getdlopenflags()
    try:
        if deep:
            sys.setdlopenflags(flags | deep)
        try:
            parallel._launch_threads()
        finally:
            sys.setdlopenflags(flags)
        if saved is not None:
            gomp.omp_set_num_threads(saved)
        from . import _numba
    except Exception as e:      # no threading layer, no writable cache, ...
        warnings.warn(f"dtorch: compiled CPU kernels unavailable, using "
                      f"NumPy ({type(e).__name__}: {e})", RuntimeWarning,
                      stacklevel=2)
        return False
    finally:
        if own:
            del os.environ["OMP_WAIT_POLICY"]
    # numba's own libgomp is fresh if a libgomp file loaded just now, and
    # deep binding made it the one omppool calls
    fresh = bool(deep) and bool(_gomp_files() - before)
    _state["serial"] = bool(before) and not fresh and not passive \
        and numba.threading_layer() == "omp"
    _state["max_threads"] = numba.config.NUMBA_NUM_THREADS
    _state["set_threads"] = numba.set_num_threads
    os.register_at_fork(after_in_child=_disable)
    _state["numba"] = _numba
    return _numba


def _disable():
    _state["mod"] = False


def _gomp_files():
    """The GNU OpenMP library files loaded in this process (each read its
    wait policy when it loaded)."""
    try:
        with open("/proc/self/maps") as f:
            return {line.split(None, 5)[-1].strip() for line in f
                    if "libgomp" in line}
    except OSError:
        return set()


def _gomp():
    """The GNU OpenMP library already loaded in this process, or None."""
    try:
        return ctypes.CDLL("libgomp.so.1", mode=os.RTLD_NOLOAD)
    except (OSError, AttributeError):
        return None


def enabled():
    """True when the compiled kernels are used."""
    mod = _state["mod"]
    if mod is None:
        mod = _state["mod"] = _load()
    return mod is not False


def _default_threads():
    for var in ("OMP_NUM_THREADS",):
        v = os.environ.get(var, "").strip()
        if v.isdigit() and int(v) > 0:
            return int(v)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else (os.cpu_count() or 1)


def set_num_threads(n):
    """The kernels' thread count from now on (dtorch.set_num_threads)."""
    _state["threads"] = int(n)
    _state.pop("n", None)


def num_threads():
    """Threads a large kernel uses (dtorch.set_num_threads, else
    OMP_NUM_THREADS, else the usable cores; at most numba's pool)."""
    want = _state["threads"] or _default_threads()
    if enabled():
        if _state.get("serial"):
            return 1
        return min(want, _state["max_threads"])
    return want


def kernels(*arrays, reduces=False):
    """The compiled kernels when they apply to ``arrays`` (C-contiguous
    NumPy float32/float64, one dtype, not empty), else None. ``reduces``:
    the kernel's bits are not the NumPy path's (it sums in another order,
    float64 per channel, or rounds otherwise: the float32 exp polynomial
    ``vexp`` of softmax, log_softmax, cross-entropy, gelu, silu): None
    under ``dtorch.use_deterministic_algorithms(True)``, whose results are
    the NumPy path's bits (ZeRO's parameters differed from plain DDP's
    there through log_softmax's and cross-entropy's exp)."""
    mod = _state["mod"]
    if mod is None:
        enabled()
        mod = _state["mod"]
    if mod is False:
        return None
    if reduces and _state["deterministic"]():
        return None
    dt = arrays[0].dtype
    if arrays[0].size == 0:       # NumPy's path handles empty shapes
        return None
    for a in arrays:
        if type(a) is not np.ndarray or a.dtype != dt \
                or not a.flags.c_contiguous:
            return None
    if dt not in _FLOATS:
        return None
    # numba's thread count is per calling thread: set it here when it
    # differs from what this kernel should use
    n = 1 if arrays[0].size < PARALLEL_MIN else (
        _state.get("n") or _state.setdefault("n", num_threads()))
    if getattr(_tls, "n", None) != n:
        _state["set_threads"](n)
        _tls.n = n
    return mod


def scalar(a, v):
    """``v`` as ``a``'s dtype: how NumPy 2 casts a Python float operand."""
    return a.dtype.type(v)


class forced:
    """``with forced(False):`` runs the NumPy path (``True``: the kernels,
    where numba imports) inside the block; for tests and benchmarks that
    compare both in one process."""

    def __init__(self, on):
        self.on = on

    def __enter__(self):
        self.saved = _state["mod"]
        if self.on:
            mod = _load(switch=False)
            if mod is False:
                raise ImportError("the compiled kernels need numba")
            _state["mod"] = mod
        else:
            _state["mod"] = False
        return self

    def __exit__(self, *exc):
        _state["mod"] = self.saved


def scalars(a, *vs):
    """Each of ``vs`` as ``a``'s dtype."""
    t = a.dtype.type
    return tuple(t(v) for v in vs)


def flat(a):
    """A 1-D view of a C-contiguous array (what element-wise kernels take:
    one compiled version per dtype serves every shape)."""
    return a.reshape(-1)
