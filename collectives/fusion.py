"""Pack many small arrays into one flat buffer and back (DDP buckets).

One all-reduce of a 25 MB bucket beats hundreds of tiny ones: latency is
paid once. Like mlx's `average_gradients`: concatenate, reduce, split.

    layout = FlatLayout.of(grads)           # shapes, dtype, offsets
    flat = layout.pack(grads)               # one contiguous buffer
    group.all_reduce(flat, 'avg')
    layout.unpack(flat, grads)              # copy back in place
"""
from __future__ import annotations
from collections.abc import Sequence
from typing import Any

from .arrays import Array, get_array_module


class FlatLayout:
    """Offsets of arrays of one dtype inside a flat buffer."""

    def __init__(self, shapes: Sequence[tuple[int, ...]], dtype: Any) -> None:
        self.shapes = [tuple(s) for s in shapes]
        self.dtype = dtype
        self.offsets = [0]
        for s in self.shapes:
            n = 1
            for d in s:
                n *= d
            self.offsets.append(self.offsets[-1] + n)
        self.numel = self.offsets[-1]

    @classmethod
    def of(cls, arrays: Sequence[Array]) -> FlatLayout:
        if not arrays:
            raise ValueError("cannot fuse an empty list of arrays")
        dt = arrays[0].dtype
        for i, a in enumerate(arrays):
            if a.dtype != dt:
                raise TypeError(
                    f"fusion needs one dtype: arrays[0] is {dt} but "
                    f"arrays[{i}] is {a.dtype}; bucket by dtype "
                    f"(see bucketize)")
        return cls([a.shape for a in arrays], dt)

    def pack(self, arrays: Sequence[Array], out: Array | None = None) -> Array:
        """Copy arrays into `out` (allocated when None); returns it."""
        if len(arrays) != len(self.shapes):
            raise ValueError(f"layout has {len(self.shapes)} arrays, got "
                             f"{len(arrays)}")
        xp = get_array_module(arrays[0])
        if out is None:
            out = xp.empty(self.numel, self.dtype)
        elif out.shape != (self.numel,) or out.dtype != self.dtype:
            raise ValueError(f"flat buffer is {list(out.shape)} {out.dtype}"
                             f", layout needs [{self.numel}] {self.dtype}")
        for a, s, lo, hi in zip(arrays, self.shapes, self.offsets,
                                self.offsets[1:]):
            if tuple(a.shape) != s:
                raise ValueError(f"array shape {list(a.shape)} does not "
                                 f"match the layout's {list(s)}")
            out[lo:hi] = a.reshape(-1)
        return out

    def views(self, flat: Array) -> list[Array]:
        """Views of flat shaped like the packed arrays (no copy)."""
        return [flat[lo:hi].reshape(s) for s, lo, hi in
                zip(self.shapes, self.offsets, self.offsets[1:])]

    def unpack(self, flat: Array,
               arrays: Sequence[Array] | None = None) -> Sequence[Array]:
        """Copy back into `arrays` in place, or return new arrays."""
        if flat.shape != (self.numel,):
            raise ValueError(f"flat buffer is {list(flat.shape)}, layout "
                             f"needs [{self.numel}]")
        views = self.views(flat)
        if arrays is None:
            return [v.copy() for v in views]
        for a, v in zip(arrays, views):
            a[...] = v
        return arrays


def pack(arrays: Sequence[Array],
         out: Array | None = None) -> tuple[Array, FlatLayout]:
    """(flat, layout) for a list of same-dtype arrays."""
    layout = FlatLayout.of(arrays)
    return layout.pack(arrays, out), layout


def unpack(flat: Array, layout: FlatLayout,
           arrays: Sequence[Array] | None = None) -> Sequence[Array]:
    return layout.unpack(flat, arrays)


def bucketize(arrays: Sequence[Array],
              cap_bytes: int = 25 * 1024 * 1024) -> list[list[int]]:
    """Split indices of `arrays` into buckets of consecutive same-dtype
    arrays, each at most cap_bytes (an array bigger than the cap gets a
    bucket of its own). Returns a list of index lists, in input order."""
    buckets, cur, size, dt = [], [], 0, None
    for i, a in enumerate(arrays):
        if cur and (a.dtype != dt or size + a.nbytes > cap_bytes):
            buckets.append(cur)
            cur, size = [], 0
        cur.append(i)
        size += a.nbytes
        dt = a.dtype
    if cur:
        buckets.append(cur)
    return buckets
