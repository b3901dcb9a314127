"""The same-host pipe between tcp ring neighbours.

Same-host fast path: loopback TCP copies every byte twice through the
kernel and tops out near 2 GB/s each way on a small machine, under half of
MPI's shared memory. So at setup each rank offers its right neighbour a
ring of slots in an anonymous shared file (`shm.anonymous_file`: no name
in /dev/shm, so a rank killed at any moment leaves nothing behind; its
/proc path is sent over the authenticated socket and the descriptor
closed as soon as the neighbour has answered); a neighbour that can open
it and finds the random cookie inside shares the host. Messages of
SHM_MIN bytes or more on such a link keep their header on the socket, but
the payload goes slot by slot through the file:
one token byte on the socket says "slot filled", one byte back on the same
connection says "slot free". The reader reduces straight out of the slot,
which is still in cache. Control stays on the socket, so a dead peer is
still seen as a closed connection. DTORCH_TCP_SHM=0 turns it off.
"""
import os

import numpy as np

from .. import shm


class ShmPipe:
    """A one-way stream between ring neighbours: k slots of `slot` bytes
    in an anonymous shared file (`shm.create_mapped`), written by one rank
    and read by its right neighbour, while the socket between them carries
    one token byte per slot filled and one back per slot freed.

    Why not `shm_reduce.ShmReducer`: that is a whole-host all-reduce
    through one file synchronised by counters in it (hence x86-only, see
    `shm_reduce.usable`); this is a point-to-point link that any ring
    step (reduce-scatter, all-gather, broadcast) streams through, and its
    synchronisation is the socket's tokens (system calls order the
    memory accesses on any architecture; a dead peer is a closed socket).
    Both use one transport: `collectives.shm`'s anonymous files.

    seq counts slots filled (writer) or drained (reader); acked counts
    slots the reader gave back."""
    HEAD = 4096    # the cookie's page; keeps the slots page aligned

    def __init__(self, path, mm, k, slot, fd=None):
        self.path, self.mm, self.k, self.slot = path, mm, k, slot
        self.fd = fd   # the creator's descriptor, until release()
        self.arr = np.frombuffer(mm, np.uint8, k * slot, self.HEAD)
        self.seq = self.acked = 0

    @classmethod
    def create(cls, k, slot):
        """(writer's pipe, cookie): a new file to offer the neighbour."""
        fd, path, mm, cookie = shm.create_mapped(cls.HEAD + k * slot, 'tcp',
                                                 0)
        return cls(path, mm, k, slot, fd), cookie

    @classmethod
    def attach(cls, path, cookie, k, slot):
        """The neighbour's pipe (read side), or None when this rank cannot
        see it."""
        mm = shm.attach_mapped(path, cls.HEAD + k * slot, cookie, 0,
                               writable=False)
        return None if mm is None else cls(path, mm, k, slot)

    def release(self):
        """Close the creator's descriptor: once the neighbour has opened
        the file (or never will), only the mappings keep it."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    # ---- writer
    def full(self):
        return self.seq - self.acked >= self.k

    def fill(self, src, pos):
        """Copy src[pos:] (bytes) into the free slots: (new pos, slots
        filled), one token to send for each."""
        filled = 0
        while self.seq - self.acked < self.k and pos < src.size:
            m = min(self.slot, src.size - pos)
            at = (self.seq % self.k) * self.slot
            self.arr[at:at + m] = src[pos:pos + m]
            pos += m
            self.seq += 1
            filled += 1
        return pos, filled

    # ---- reader
    def drain(self, n, dst, pos, op=None):
        """Take n filled slots into the flat array dst from byte pos on
        (dst <- op(dst, slot) with a ufunc op), straight out of the
        shared pages; the new pos. One ack to send back for each."""
        dst8 = dst.view(np.uint8)
        for _ in range(n):
            m = min(self.slot, dst8.size - pos)
            at = (self.seq % self.k) * self.slot
            piece = self.arr[at:at + m]
            if op is None:
                dst8[pos:pos + m] = piece
            else:
                d = dst8[pos:pos + m].view(dst.dtype)
                op(d, piece.view(dst.dtype), out=d)
            pos += m
            self.seq += 1
        return pos
