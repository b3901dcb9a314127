"""``dtorch.cuda``: is the GPU there, and small utilities over CuPy.

Importing this never imports CuPy; every function asks ``_backend`` lazily.
"""
from .. import _backend as B
from .memory import (memory_allocated, max_memory_allocated,  # noqa: F401
                     memory_reserved, max_memory_reserved,
                     reset_peak_memory_stats, reset_max_memory_allocated,
                     memory_stats)


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
        B.flush_checks()    # deferred device input checks raise here


def empty_cache():
    if B._load_cupy() is not None:
        B._cupy.get_default_memory_pool().free_all_blocks()


def manual_seed(seed):
    """Seed the current device's generator (lazily, at its first draw)."""
    from .. import random as R
    if B._cupy is None:   # no device in use yet: seed them all, as PyTorch
        R.cuda_manual_seed(seed, all_devices=True)   # defers the same way
    else:
        R.cuda_manual_seed(seed)


def manual_seed_all(seed):
    from .. import random as R
    R.cuda_manual_seed(seed, all_devices=True)


def get_rng_state(device="cuda"):
    """The generator state of a device, a small JSON-friendly dict."""
    from .. import random as R
    return R.cuda_get_rng_state(device)


def set_rng_state(new_state, device="cuda"):
    from .. import random as R
    R.cuda_set_rng_state(new_state, device)


def get_rng_state_all():
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(new_states):
    for i, s in enumerate(new_states):
        set_rng_state(s, i)


class device:
    """``with dtorch.cuda.device(i):`` makes device i current inside the
    block ('cuda' tensors and CuPy work go there), as torch.cuda.device."""

    def __init__(self, device):
        self.idx = device if isinstance(device, int) else (
            -1 if device is None else B.device(device).index or 0)
        self._prev = -1

    def __enter__(self):
        if self.idx >= 0:
            cp = B.check_cuda_available()
            self._prev = cp.cuda.Device().id
            cp.cuda.Device(self.idx).use()
        return self

    def __exit__(self, *exc):
        if self._prev >= 0:
            B._cupy.cuda.Device(self._prev).use()
        return False


def get_device_name(device=None):
    cp = B.check_cuda_available()
    idx = 0 if device is None else (device if isinstance(device, int)
                                    else B.device(device).index or 0)
    return cp.cuda.runtime.getDeviceProperties(idx)["name"].decode()


def is_bf16_supported(including_emulation=True):
    """False: dtorch has no bfloat16 on CUDA devices yet.

    CuPy (13.x and 14.x, the versions dtorch supports) has no bfloat16
    dtype, so dtorch refuses bfloat16 CUDA tensors
    (``_backend.check_cuda_dtype``) whatever the GPU's compute capability;
    answering True would send mixed-precision code (``autocast(dtype=
    torch.bfloat16 if is_bf16_supported() else torch.float16)``) into that
    error. Use float16 with ``amp.GradScaler`` on the GPU. This never
    initialises CUDA."""
    return False
