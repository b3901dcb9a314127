"""Shared memory between the processes of one host: the one transport that
collectives' same-host paths use.

Files have no name: the creator makes one with memfd_create and the others
open it through /proc/<pid>/fd/<fd> while the creator holds it open. A
named /dev/shm file outlived any rank killed between creating and
unlinking it; an anonymous one goes with its last mapping. A random cookie
inside the file is checked by whoever opens it, so trying to open it is
the same-host test (another host or pid namespace cannot).

Users: `shm_reduce.ShmReducer` (all ranks of a host all-reduce through
one file) and `tcp.pipe.ShmPipe` (a one-way stream between two ring
neighbours).
"""
import mmap
import os
import re
import secrets
import stat


def anonymous_ok():
    """Whether shared files without a name can be made and opened."""
    return hasattr(os, 'memfd_create') and os.path.isdir('/proc/self/fd')


def anonymous_file(nbytes, tag):
    """(fd, path) of a new shared file of nbytes zero bytes that has no
    name in any file system: it lives while a descriptor or a mapping of
    it does, so a process killed at any moment leaves nothing behind.
    Other processes of this user on this host open it by `path`
    (/proc/<pid>/fd/<fd>) while this process keeps fd open. The pages are
    reserved now: a full tmpfs fails here, not with SIGBUS later."""
    fd = os.memfd_create(f"dtorch-{tag}", os.MFD_CLOEXEC)
    try:
        os.posix_fallocate(fd, 0, nbytes)
    except BaseException:
        os.close(fd)
        raise
    return fd, f"/proc/{os.getpid()}/fd/{fd}"


_PROC_FD = re.compile(r'/proc/[0-9]+/fd/[0-9]+')


def open_anonymous(path, nbytes, writable):
    """A descriptor of another process's `anonymous_file`, or None when
    this process cannot open it (another host or pid namespace, a path of
    another shape, a file of another size or owner)."""
    if not isinstance(path, str) or not _PROC_FD.fullmatch(path):
        return None
    flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_CLOEXEC \
        | os.O_NONBLOCK         # never block on whatever the path names
    try:
        fd = os.open(path, flags)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
    except OSError:
        st = None
    if st is not None and stat.S_ISREG(st.st_mode) and \
            st.st_uid == os.getuid() and st.st_size == nbytes:
        return fd
    os.close(fd)
    return None


def create_mapped(nbytes, tag, cookie_at):
    """(fd, path, mm, cookie): a new `anonymous_file` mapped read-write,
    with a random 16-byte cookie at offset cookie_at. Peers open it by
    path with `attach_mapped` while fd is open; the caller closes fd once
    they have (or never will): the mappings keep the file."""
    fd, path = anonymous_file(nbytes, tag)
    try:
        mm = mmap.mmap(fd, nbytes)
    except BaseException:
        os.close(fd)
        raise
    cookie = secrets.token_bytes(16)
    mm[cookie_at:cookie_at + 16] = cookie
    return fd, path, mm, cookie


def attach_mapped(path, nbytes, cookie, cookie_at, writable):
    """A mapping of another process's `create_mapped` file, or None when
    this process cannot open it or finds another cookie inside: trying is
    the same-host test."""
    fd = open_anonymous(path, nbytes, writable)
    if fd is None:
        return None
    try:
        mm = mmap.mmap(fd, nbytes, prot=mmap.PROT_READ | (
            mmap.PROT_WRITE if writable else 0))
    except OSError:
        return None
    finally:
        os.close(fd)
    if mm[cookie_at:cookie_at + 16] != cookie:
        mm.close()
        return None
    return mm
