"""``dtorch.accelerator``: the device-agnostic accelerator API that current
scripts probe at their top (``torch.accelerator.is_available()``,
``current_accelerator()``). dtorch's one accelerator kind is CUDA (CuPy);
with no GPU there is none and the answers say so, as PyTorch's CPU build."""
from . import _backend as B
from . import cuda as _cuda

__all__ = ["is_available", "current_accelerator", "device_count",
           "current_device_index", "set_device_index", "set_device_idx",
           "current_device_idx", "synchronize", "device_index"]


def is_available():
    return _cuda.is_available()


def current_accelerator(check_available=False):
    """``dtorch.device('cuda')`` when a GPU is there, else None."""
    if _cuda.is_available():
        return B.device("cuda")
    return None


def device_count():
    return _cuda.device_count()


def _require():
    if not _cuda.is_available():
        raise RuntimeError("Cannot access accelerator device when none is "
                           "available.")


def current_device_index():
    _require()
    return _cuda.current_device()


def set_device_index(device):
    _require()
    _cuda.set_device(device)


current_device_idx = current_device_index
set_device_idx = set_device_index


def synchronize(device=None):
    _require()
    _cuda.synchronize(device)


class device_index:
    """``with dtorch.accelerator.device_index(i):`` runs on device i and
    restores the previous one; None is a no-op."""

    def __init__(self, device, /):
        self.idx = device
        self.prev = None

    def __enter__(self):
        if self.idx is not None:
            self.prev = current_device_index()
            set_device_index(self.idx)
        return self

    def __exit__(self, *exc):
        if self.prev is not None:
            set_device_index(self.prev)
        return False
