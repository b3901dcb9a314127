"""The tcp backend's ring algorithms, over `SocketTransport._step`.

All-reduce: below SMALL bytes, an all-gather of whole buffers followed by a
reduction in rank order (n-1 messages instead of 2(n-1)); above, the classic
ring reduce-scatter + all-gather in n chunks. Both give bitwise equal results
on every rank.
"""
import numpy as np

from ..arrays import (ReduceOp, divide_avg, get_array_module, reduce_into,
                      ufunc)
from .transport import kind

SMALL = 64 * 1024


class RingAlgorithms:
    """All-reduce, reduce-scatter, all-gather and broadcast round the ring
    (a mixin of TCPGroup: needs rank, size, _right and _step)."""

    @staticmethod
    def _on_host(method, arr, *args):
        """CuPy arrays: sockets move host memory, so run ``method`` on a host
        copy and copy the result back. True when it did."""
        if get_array_module(arr) is np:
            return False
        host = arr.get()
        method(host, *args)
        arr.set(host)
        return True

    def _all_reduce(self, arr, op, deadline, seq):
        n = self.size
        if op is ReduceOp.AVG and arr.dtype.kind not in 'fc':
            divide_avg(arr, n)   # raises the TypeError
        if n == 1:
            return
        if self._on_host(self._all_reduce, arr, op, deadline, seq):
            return
        flat = arr.reshape(-1)
        if arr.nbytes <= SMALL or flat.size < n or \
                get_array_module(arr) is not np or flat.dtype.kind == 'b':
            full = np.empty((n,) + flat.shape, flat.dtype)
            self._ring_gather([full[r] for r in range(n)], flat, deadline,
                              seq, op)
            reduce_into(flat, list(full), op, n)
            return
        bounds = np.linspace(0, flat.size, n + 1).astype(np.int64)
        chunks = [flat[bounds[i]:bounds[i + 1]] for i in range(n)]
        self._ring_reduce_scatter(chunks, op, deadline, seq, shift=0)
        self._ring_all_gather(chunks, deadline, seq, shift=0)
        if op is ReduceOp.AVG:
            divide_avg(arr, n)

    def _ring_reduce_scatter(self, chunks, op, deadline, seq, shift):
        """Afterwards this rank's chunk (rank + 1 + shift) % n holds the
        reduction over all ranks."""
        n, r = self.size, self.rank
        f, what = ufunc(op), kind(chunks[0].dtype, op)
        for s in range(n - 1):
            out = chunks[(r - s + shift) % n]
            dst = chunks[(r - s - 1 + shift) % n]
            # a wait in step s is for the chunk rank r - s - 1 began
            self._step(out, dst, deadline, seq * 4096 + s, op=f, what=what,
                       origin=(r - s - 1) % n)

    def _ring_all_gather(self, chunks, deadline, seq, shift):
        """Chunk (rank + 1 + shift) % n is complete here; fill the rest."""
        n, r = self.size, self.rank
        what = kind(chunks[0].dtype)
        for s in range(n - 1):
            out = chunks[(r + 1 - s + shift) % n]
            dst = chunks[(r - s + shift) % n]
            self._step(out, dst, deadline, seq * 4096 + 2048 + s, what=what,
                       origin=(r - s - 1) % n)   # who completed it

    def _ring_gather(self, blocks, mine, deadline, seq, op=None):
        """blocks[r] <- rank r's `mine` (blocks may alias mine); ``op``:
        the reduction the caller applies next (checked in the headers)."""
        n, r = self.size, self.rank
        if blocks[r] is not mine:
            blocks[r][...] = mine
        what = kind(mine.dtype, op)
        for s in range(n - 1):
            self._step(blocks[(r - s) % n], blocks[(r - s - 1) % n],
                       deadline, seq * 4096 + 1024 + s, what=what,
                       origin=(r - s - 1) % n)   # whose block it is

    def _broadcast(self, arr, src, deadline, seq):
        """A pipelined chain round the ring, starting at src."""
        n, r = self.size, self.rank
        if n == 1:
            return
        if self._on_host(self._broadcast, arr, src, deadline, seq):
            return
        what = kind(arr.dtype)
        flat = arr.reshape(-1).view(np.uint8)
        piece = 1 << 20
        parts = [flat[i:i + piece] for i in range(0, max(flat.size, 1),
                                                  piece)]
        forward = self._right != src
        for k in range(len(parts) + 1):
            out = parts[k - 1] if (k >= 1 and forward and r != src) \
                else None
            if r == src:
                out = parts[k] if k < len(parts) else None
            inn = parts[k] if (k < len(parts) and r != src) else None
            if out is not None or inn is not None:
                base = seq * 4096 + 3072
                self._step(out, inn, deadline,
                           base + k - (r != src), base + k, what=what,
                           origin=src)
