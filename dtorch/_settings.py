"""Process-wide settings scripts call at their top (``set_num_threads``,
``use_deterministic_algorithms``, matmul precision, print options), dtype
information (``finfo``, ``iinfo``, ``result_type``, ``can_cast``), memory
formats and layouts, and small predicates."""
import os

import numpy as np

from . import _backend as B
from . import _blas_threads
from . import _kernels
from ._rank_local import RankLocal
from .tensor import Tensor

__all__ = [
    "finfo", "iinfo", "get_num_threads", "set_num_threads",
    "get_num_interop_threads", "set_num_interop_threads",
    "use_deterministic_algorithms", "are_deterministic_algorithms_enabled",
    "is_deterministic_algorithms_warn_only_enabled",
    "set_printoptions", "is_complex", "is_nonzero",
    "memory_format", "contiguous_format", "channels_last",
    "channels_last_3d", "preserve_format", "layout", "strided", "sparse_coo",
    "set_float32_matmul_precision", "get_float32_matmul_precision",
    "is_storage", "result_type", "can_cast",
]


# ==================================================== dtype info, settings ==

class finfo:
    """Machine limits of a floating dtype (``torch.finfo``)."""

    def __init__(self, type=None):
        d = B.to_dtype(type) if type is not None else B.get_default_dtype()
        if not d.is_floating_point:
            raise TypeError(f"torch.finfo() requires a floating point input "
                            f"type. Use torch.iinfo to handle '{d}'")
        i = np.finfo(d.np)
        self.bits = i.bits
        self.eps = float(i.eps)
        self.max = float(i.max)
        self.min = float(i.min)
        self.tiny = self.smallest_normal = float(i.tiny)
        self.resolution = 10.0 ** -int(i.precision)   # as PyTorch's
        self.dtype = d.name

    def __repr__(self):
        return (f"finfo(resolution={self.resolution}, min={self.min:g}, "
                f"max={self.max:g}, eps={self.eps:g}, "
                f"smallest_normal={self.tiny:g}, tiny={self.tiny:g}, "
                f"dtype={self.dtype})")


class iinfo:
    """Limits of an integer dtype (``torch.iinfo``)."""

    def __init__(self, type):
        d = B.to_dtype(type)
        if d.is_floating_point:
            raise TypeError(f"torch.iinfo() requires an integer input type. "
                            f"Use torch.finfo to handle '{d}'")
        i = np.iinfo(d.np if d.np != np.bool_ else np.uint8)
        self.bits, self.min, self.max = i.bits, int(i.min), int(i.max)
        self.dtype = d.name

    def __repr__(self):
        return f"iinfo(min={self.min}, max={self.max}, dtype={self.dtype})"


# the BLAS/kernel thread pools are one per interpreter; the flags a script
# sets are one per process and one per thread rank (dtorch._rank_local)
_settings = {"threads": None, "interop": None}
_flags = RankLocal(lambda: {"deterministic": False, "warn_only": False,
                            "matmul_precision": "highest"})


def get_num_threads():
    """The BLAS thread count (the OMP/OpenBLAS environment, else the
    number of usable cores)."""
    if _settings["threads"] is not None:
        return _settings["threads"]
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                "MKL_NUM_THREADS"):
        v = os.environ.get(var)
        if v and v.isdigit():
            return int(v)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else (os.cpu_count() or 1)


def set_num_threads(n):
    """Limit the BLAS thread pool (threadpoolctl when installed) and the
    compiled kernels' threads (dtorch._kernels)."""
    if int(n) <= 0:
        raise RuntimeError("set_num_threads expects a positive integer")
    try:
        from threadpoolctl import threadpool_limits
        # BLAS only: the OpenMP runtimes loaded are other libraries' (the
        # kernels' own is numba's, set below); limiting them all set
        # torch's intra-op count in a process that has both
        threadpool_limits(int(n), user_api="blas")
    except ImportError:
        pass
    _settings["threads"] = int(n)
    _kernels.set_num_threads(int(n))     # the compiled kernels' pool too


def get_num_interop_threads():
    return _settings["interop"] or 1


def set_num_interop_threads(n):
    _settings["interop"] = int(n)


def use_deterministic_algorithms(mode, *, warn_only=False):
    """Make results bitwise reproducible, as ``torch``'s switch.

    A single process's ops are deterministic already; the switch makes
    data-parallel training (DDP, and the reductions it relies on) give the
    same bits on any number of ranks: see README "Deterministic mode" and
    ``dtorch.nn.parallel._deterministic``. ``warn_only=True`` makes a
    layout that cannot be made identical warn instead of raise."""
    if not isinstance(mode, bool):
        raise TypeError(f"use_deterministic_algorithms expects a bool, but "
                        f"got {type(mode).__name__}")
    f = _flags.get()
    f["deterministic"] = mode
    f["warn_only"] = bool(warn_only)
    # the BLAS thread count changes GEMM bits: one thread while on
    # (dtorch/_blas_threads.py); given back by the last holder's False
    hold = f.pop("blas_hold", None)
    if mode:
        f["blas_hold"] = hold or _blas_threads.Hold()
    elif hold is not None:
        hold.release()


def are_deterministic_algorithms_enabled():
    return _flags.get()["deterministic"]


_kernels._state["deterministic"] = are_deterministic_algorithms_enabled


def is_deterministic_algorithms_warn_only_enabled():
    return _flags.get()["warn_only"]


def set_float32_matmul_precision(precision):
    if precision not in ("highest", "high", "medium"):
        raise RuntimeError(f"Invalid precision: {precision}")
    _flags.get()["matmul_precision"] = precision


def get_float32_matmul_precision():
    return _flags.get()["matmul_precision"]


def set_printoptions(precision=None, threshold=None, edgeitems=None,
                     linewidth=None, profile=None, sci_mode=None):
    """Printing options, passed to NumPy's (dtorch formats via NumPy)."""
    kw = {}
    if profile == "full":
        kw["threshold"] = np.inf
    elif profile == "short":
        kw.update(precision=2, threshold=1000, edgeitems=2)
    elif profile == "default":
        kw.update(precision=4, threshold=1000, edgeitems=3, linewidth=80)
    for k, v in (("precision", precision), ("threshold", threshold),
                 ("edgeitems", edgeitems), ("linewidth", linewidth)):
        if v is not None:
            kw[k] = v
    if sci_mode is not None:
        kw["suppress"] = not sci_mode
    np.set_printoptions(**kw)


def is_complex(input):
    return False


def is_nonzero(input):
    if input.numel() != 1:
        raise RuntimeError("Boolean value of Tensor with more than one value "
                           "is ambiguous" if input.numel() else
                           "Boolean value of Tensor with no values is "
                           "ambiguous")
    return bool(input.item())


def is_storage(obj):
    return False


def result_type(tensor1, tensor2):
    def d(x):
        return (x.dtype, x.ndim > 0) if isinstance(x, Tensor) else \
            (type(x), False)
    (a, ad), (b, bd) = d(tensor1), d(tensor2)
    return B.result_type(a, b, ad, bd)


def can_cast(from_, to):
    return bool(np.can_cast(B.to_dtype(from_).np, B.to_dtype(to).np,
                            "same_kind"))


class memory_format:
    """A memory layout request. dtorch keeps arrays C-contiguous and takes
    these where PyTorch does (``contiguous``, ``to``, ``*_like``)."""

    def __init__(self, name):
        self._name = name

    def __repr__(self):
        return f"torch.{self._name}"


contiguous_format = memory_format("contiguous_format")
channels_last = memory_format("channels_last")
channels_last_3d = memory_format("channels_last_3d")
preserve_format = memory_format("preserve_format")


# torch.layout: dense tensors' strided and the sparse COO layout live
# with the sparse tensor methods (dtorch.tensor uses them)
from ._tensor_methods.sparse import layout, strided, sparse_coo  # noqa
