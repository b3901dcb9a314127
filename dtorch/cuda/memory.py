"""``dtorch.cuda.memory``: what CuPy's memory pool holds, per device, with
PyTorch's names (``torch.cuda.memory_allocated`` and the rest).

"Allocated" is the bytes of the blocks the default pool has lent to arrays
(``MemoryPool.used_bytes``), "reserved" those plus its free blocks
(``total_bytes``). CuPy keeps no peaks: once CuPy is loaded, dtorch puts
an allocator in front of the pool's (``cupy.cuda.set_allocator``) that
updates the device's peaks after each allocation (a peak can only rise at
one). Peaks are per device since CuPy was loaded, or since
``reset_peak_memory_stats``. Without CuPy every figure is 0.
"""
import threading

from .. import _backend as B

__all__ = ["memory_allocated", "max_memory_allocated", "memory_reserved",
           "max_memory_reserved", "reset_peak_memory_stats",
           "reset_max_memory_allocated", "memory_stats"]

_peaks = {}            # device index -> [allocated peak, reserved peak]
_lock = threading.Lock()


def _track(cp):
    """Installed when CuPy loads: peaks measured after every allocation."""
    pool = cp.get_default_memory_pool()
    inner = cp.cuda.get_allocator()

    def malloc(size):
        mem = inner(size)
        used, total = pool.used_bytes(), pool.total_bytes()
        p = _peaks.get(mem.device_id)
        if p is None:
            _peaks[mem.device_id] = [used, total]
        else:
            if used > p[0]:
                p[0] = used
            if total > p[1]:
                p[1] = total
        return mem
    cp.cuda.set_allocator(malloc)


B.on_cupy_load(_track)


def _index(cp, device):
    if device is None:
        return cp.cuda.runtime.getDevice()
    if isinstance(device, int):
        return device
    d = B.device(device)
    if d.type != "cuda":
        raise ValueError(f"Expected a cuda device, but got: {d}")
    return cp.cuda.runtime.getDevice() if d.index is None else d.index


def _now(device):
    """(allocated, reserved, device index) now, or None without CuPy."""
    cp = B._load_cupy()
    if cp is None:
        return None
    i = _index(cp, device)
    with cp.cuda.Device(i):
        pool = cp.get_default_memory_pool()
        return pool.used_bytes(), pool.total_bytes(), i


def memory_allocated(device=None):
    now = _now(device)
    return 0 if now is None else now[0]


def memory_reserved(device=None):
    now = _now(device)
    return 0 if now is None else now[1]


def _peak(device, k):
    now = _now(device)
    if now is None:
        return 0
    p = _peaks.get(now[2])
    return max(now[k], p[k] if p is not None else 0)


def max_memory_allocated(device=None):
    return _peak(device, 0)


def max_memory_reserved(device=None):
    return _peak(device, 1)


def reset_peak_memory_stats(device=None):
    """The device's peaks start again from what it holds now."""
    now = _now(device)
    if now is not None:
        with _lock:
            _peaks[now[2]] = [now[0], now[1]]


def reset_max_memory_allocated(device=None):
    reset_peak_memory_stats(device)


def memory_stats(device=None):
    """PyTorch's keys for what dtorch measures: allocated and reserved
    bytes, current and peak (the ``all`` pool: CuPy has one)."""
    now = _now(device)
    if now is None:
        return {}
    return {"allocated_bytes.all.current": now[0],
            "allocated_bytes.all.peak": max_memory_allocated(now[2]),
            "reserved_bytes.all.current": now[1],
            "reserved_bytes.all.peak": max_memory_reserved(now[2])}
