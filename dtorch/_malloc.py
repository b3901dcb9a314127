"""glibc malloc tuning for training loops: ``tune_malloc()``.

``import dtorch`` calls it once unless ``DTORCH_MALLOC_TUNING=0`` (README's
table of environment variables); nothing else in dtorch changes process-wide
allocator settings, and importing this module changes nothing.
"""
import ctypes
import sys


def tune_malloc():
    """Keep freed NumPy buffers in glibc's heap for reuse.

    A training step allocates and frees the same few large arrays (im2col
    columns, gate buffers, gradients) every step. By default glibc serves
    such sizes with fresh mmap()s, or trims the heap top, so every step
    page-faults its working set in again: measured 1-3 thousand faults and
    up to 10 ms of system time per CNN step. PyTorch's allocator reuses its
    memory. Raising the mmap threshold to glibc's maximum (32 MB) and the
    trim threshold to 256 MB keeps that memory mapped; peak RSS is
    unchanged, only the return of freed memory to the OS is delayed.
    Returns True when the thresholds were set (Linux with glibc)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 32 << 20)       # M_MMAP_THRESHOLD
        libc.mallopt(-1, 256 << 20)      # M_TRIM_THRESHOLD
    except (OSError, AttributeError):    # not glibc (musl, ...): skip
        return False
    return True
