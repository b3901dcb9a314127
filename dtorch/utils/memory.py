"""``dtorch.utils.memory``: the peak of host memory allocated inside a
block, as the tests and benchmarks measure it (dtorch's own; PyTorch has
no CPU counterpart of ``torch.cuda.max_memory_allocated``).

NumPy reports every array's data buffer to ``tracemalloc``, so the peak of
traced memory over a block is the peak of tensor data it allocated (plus
the Python objects it made, small beside arrays of any size). It counts
allocations, not touched pages: an array made and never written still
counts, which is what "allocates nothing" must rule out. Tracing slows
Python code (about 2x on small ops), so it runs only inside the block.

    with dtorch.utils.memory.track_peak() as mem:
        loss = model(x).sum(); loss.backward()
    print(mem.peak, mem.allocated)     # bytes above the level at entry

Blocks nest: an outer block's peak includes the inner ones'.
"""
import threading
import tracemalloc

__all__ = ["track_peak"]

_active = []                 # open blocks, outermost first
_lock = threading.Lock()


def _fold_peak():
    # tracemalloc keeps one peak: fold it into every open block before
    # a reset, so nested blocks each keep their own maximum
    now, peak = tracemalloc.get_traced_memory()
    for b in _active:
        b._max = max(b._max, peak)
    return now


class track_peak:
    """Measures host allocations in its block (tracemalloc): after the
    block ``peak`` is the most bytes allocated at once above the level at
    entry, ``allocated`` what is still allocated at exit above it."""

    def __init__(self):
        self.peak = self.allocated = None

    def __enter__(self):
        with _lock:
            self._started = not tracemalloc.is_tracing()
            if self._started:
                tracemalloc.start()
            self._base = _fold_peak() if _active else \
                tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            self._max = self._base
            _active.append(self)
        return self

    def __exit__(self, *exc):
        with _lock:
            now = _fold_peak()
            _active.remove(self)
            self.peak = self._max - self._base
            self.allocated = now - self._base
            if self._started:
                tracemalloc.stop()
        return False
