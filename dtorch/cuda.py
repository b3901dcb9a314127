"""``dtorch.cuda``: is the GPU there, and small utilities over CuPy.

Importing this never imports CuPy; every function asks ``_backend`` lazily.
"""
from . import _backend as B


def is_available():
    return B.cupy_available()


def device_count():
    cp = B._load_cupy()
    return cp.cuda.runtime.getDeviceCount() if cp is not None else 0


def current_device():
    return B.check_cuda_available().cuda.Device().id


def set_device(device):
    cp = B.check_cuda_available()
    idx = device if isinstance(device, int) else (B.device(device).index or 0)
    cp.cuda.Device(idx).use()


def synchronize(device=None):
    if B._load_cupy() is not None:
        B._cupy.cuda.Device().synchronize()


def empty_cache():
    if B._load_cupy() is not None:
        B._cupy.get_default_memory_pool().free_all_blocks()


def memory_allocated(device=None):
    if B._load_cupy() is None:
        return 0
    return B._cupy.get_default_memory_pool().used_bytes()


def max_memory_allocated(device=None):
    if B._load_cupy() is None:
        return 0
    return B._cupy.get_default_memory_pool().total_bytes()


def manual_seed(seed):
    if B._load_cupy() is not None:
        B._cupy.random.seed(int(seed) & 0xFFFF_FFFF)


manual_seed_all = manual_seed


def get_device_name(device=None):
    cp = B.check_cuda_available()
    idx = 0 if device is None else (device if isinstance(device, int)
                                    else B.device(device).index or 0)
    return cp.cuda.runtime.getDeviceProperties(idx)["name"].decode()
