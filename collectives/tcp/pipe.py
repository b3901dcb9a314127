"""Same-host fast path: loopback TCP copies every byte twice through the
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
import mmap
import os

import numpy as np

from .. import shm


class _Shm:
    """A ring of k slots of `slot` bytes in an anonymous shared file,
    written by one rank and read by its right neighbour. seq counts slots
    filled (writer) or drained (reader); acked counts slots the reader
    gave back."""
    HEAD = 4096    # the cookie's page; keeps the slots page aligned

    def __init__(self, path, mm, k, slot, fd=None):
        self.path, self.mm, self.k, self.slot = path, mm, k, slot
        self.fd = fd   # the creator's descriptor, until release()
        self.arr = np.frombuffer(mm, np.uint8, k * slot, self.HEAD)
        self.seq = self.acked = 0

    @classmethod
    def create(cls, k, slot):
        cookie = os.urandom(16)
        size = cls.HEAD + k * slot
        fd, path = shm.anonymous_file(size, 'tcp')
        try:
            mm = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            raise
        mm[:16] = cookie
        return cls(path, mm, k, slot, fd), cookie

    @classmethod
    def attach(cls, path, cookie, k, slot):
        """The neighbour's ring, or None when this rank cannot see it."""
        size = cls.HEAD + k * slot
        fd = shm.open_anonymous(path, size, writable=False)
        if fd is None:
            return None
        try:
            mm = mmap.mmap(fd, size, prot=mmap.PROT_READ)
        except OSError:
            return None
        finally:
            os.close(fd)
        if mm[:16] != cookie:
            mm.close()
            return None
        return cls(path, mm, k, slot)

    def release(self):
        """Close the creator's descriptor: once the neighbour has opened
        the file (or never will), only the mappings keep it."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
