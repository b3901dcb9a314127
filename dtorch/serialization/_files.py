"""How dtorch.save and dtorch.load touch files, for every format.

Saving to a path is atomic (``write_to``): a temporary file in the same
directory, fsync, ``os.replace``. A temporary file carries its writer's
host and pid and is flock-ed until the rename, so a later save into the
folder removes the ones whose process died mid-save (and no live one).
Saved files get the process umask (or keep the mode of the file they
replace). Loading opens a path or a binary file object once
(``open_file``), and reads tensors into fresh buffers or serves them
from a copy-on-write mapping (``_FileSource`` / ``_BufferSource``).
"""
import contextlib
import errno
import io
import mmap as _mmap
import os
import re
import socket
import stat
import zlib

import numpy as np

try:
    import fcntl
except ImportError:        # not POSIX: stale temporary files are kept
    fcntl = None

from ._errors import SerializationError

_CHUNK = 1 << 20    # piece hashed then written / read then hashed

# ----------------------------------------------------------------- save --


_TMP_RE = re.compile(r"^\..*\.dtorch-([0-9a-f]{8})-([0-9]+)-[0-9a-f]{8}\.tmp$")


def _host_tag():
    return "%08x" % zlib.crc32(socket.gethostname().encode())


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:       # EPERM: alive, another user's
        return True
    return True


def _lock(fd):
    """A saver holds an exclusive flock on its temporary file until the
    rename: the kernel drops it when the process dies, however it dies,
    and it is seen from other pid namespaces (containers sharing the
    hostname and the folder), where the pid in the name means nothing.
    Blocking: only a cleaner can hold it first, for an instant."""
    with contextlib.suppress(OSError):   # no locks here: never cleaned
        fcntl.flock(fd, fcntl.LOCK_EX)


def _create_tmp(path, folder):
    """Create and lock the temporary file of a save to ``path``: (name,
    fd). Between the creation and the lock, a cleaner in another pid
    namespace (where our pid is not alive) may take the new file for a
    dead saver's and remove it; once locked, a file whose name no longer
    leads to it was taken that way, and another name is tried."""
    for _ in range(100):
        # (the name is cut so that the temporary name fits NAME_MAX)
        tmp = os.path.join(folder, "." + os.path.basename(path)[:200]
                           + f".dtorch-{_host_tag()}-{os.getpid()}-"
                           f"{os.urandom(4).hex()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL
                     | getattr(os, "O_CLOEXEC", 0), 0o666)  # umask applies
        if fcntl is None:
            return tmp, fd
        try:
            _lock(fd)
            if os.path.samestat(os.fstat(fd), os.stat(tmp)):
                return tmp, fd
        except FileNotFoundError:
            pass
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        os.close(fd)
    raise OSError(errno.EAGAIN, "every temporary file created for the save "
                  "was removed by another process before it was locked",
                  tmp)


def _remove_stale_tmps(folder):
    """Delete temporary files of dtorch.save whose writer is gone (a save
    killed mid-write never cleans up after itself): ours by name, written
    on this host by a pid that is not alive, and locked by no process.
    Files from other hosts stay: over NFS a lock may be local only, and a
    live save there must never lose its file."""
    if fcntl is None:
        return
    try:
        names = os.listdir(folder)
    except OSError:
        return
    host = _host_tag()
    for name in names:
        m = _TMP_RE.match(name)
        if m is None:
            continue
        pid = int(m.group(2))
        if m.group(1) != host or pid == os.getpid() or _pid_alive(pid):
            continue
        full = os.path.join(folder, name)
        try:
            fd = os.open(full, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
                         | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.unlink(full)          # held by nobody: its saver is gone
        except OSError:              # locked (a live save), or no locks
            pass
        finally:
            os.close(fd)


def _named(e, path, atomic=True):
    """The OSError ``e`` of writing ``path``, with the path in it."""
    msg = f"{e.strerror or e} (dtorch.save of this file failed" + (
        "; a previous file there is untouched)" if atomic else ")")
    if e.errno is None:
        return OSError(f"{msg}: {path!r}")
    return OSError(e.errno, msg, path)   # errno picks the subclass


def write_to(f, write):
    """Run ``write(fh, seekable)`` against ``f``: a binary file object as
    it is; a path atomically (a temporary file in the same folder, fsync,
    rename: a previous file there stays whole if anything fails)."""
    if not isinstance(f, (str, os.PathLike)):
        try:
            write(f, False)
            if callable(getattr(f, "flush", None)):
                f.flush()     # a full disk shows here, not at close
        except OSError as e:
            where = getattr(f, "name", None) or f"<{type(f).__name__}>"
            raise _named(e, str(where), atomic=False) from e
        return
    path = os.fspath(f)
    folder = os.path.dirname(os.path.abspath(path))
    _remove_stale_tmps(folder)
    try:
        tmp, fd = _create_tmp(path, folder)
    except OSError as e:
        raise _named(e, path) from e
    fh = os.fdopen(fd, "wb")
    try:
        if fcntl is not None:
            # overwriting keeps the file's mode, as open(path, "wb")
            with contextlib.suppress(FileNotFoundError):
                os.fchmod(fd, stat.S_IMODE(os.stat(path).st_mode))
        write(fh, True)
        fh.flush()
        os.fsync(fd)
        if fcntl is None:        # (Windows renames no open file)
            fh.close()
        os.replace(tmp, path)    # still locked: no cleaner takes it
        fh.close()
    except BaseException as e:
        with contextlib.suppress(OSError):
            fh.close()
        # the previous file at ``path`` is untouched
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError):
            raise _named(e, path) from e
        raise
    _fsync_dir(folder)


def _fsync_dir(folder):
    # make the rename itself durable; not possible on every platform
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# ----------------------------------------------------------------- load --


class Opened:
    """A file being loaded: ``where`` (its name for messages), ``size``,
    ``head`` (its first bytes, to tell the formats apart), ``fh`` (a
    seekable binary file at offset 0), and ``mm`` (a copy-on-write
    mapping, with ``mmap=True``) or ``data`` (the bytes a file object
    gave), else None."""

    def __init__(self, where, size, fh, mm=None, data=None):
        self.where, self.size, self.fh = where, size, fh
        self.mm, self.data = mm, data
        self.head = fh.read(64)
        fh.seek(0)


@contextlib.contextmanager
def open_file(f, mmap=False):
    """``Opened`` for a path or a binary file object (read whole)."""
    if not isinstance(f, (str, os.PathLike)):
        if mmap:
            raise ValueError("f must be a file path in order to use the "
                             "mmap argument")
        where = str(getattr(f, "name", None) or f"<{type(f).__name__}>")
        data = f.read()
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise SerializationError(
                f"{where}: dtorch.load needs a binary file object (read() "
                f"returned {type(data).__name__})")
        data = memoryview(data)
        yield Opened(where, len(data), io.BytesIO(data), data=data)
        return
    where = os.fspath(f)
    if isinstance(where, bytes):
        where = os.fsdecode(where)
    try:
        fh = open(where, "rb", buffering=0)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"[Errno 2] No such file or directory: '{where}'") from None
    with fh:
        size = os.fstat(fh.fileno()).st_size
        mm = None
        if mmap and size > 0:
            mm = memoryview(_mmap.mmap(fh.fileno(), 0,
                                       access=_mmap.ACCESS_COPY))
        yield Opened(where, size, fh, mm=mm)


_ANON = 32 << 20


# anonymous private memory, its pages allocated at once (Linux only)
_POPULATE = {"flags": _mmap.MAP_PRIVATE | _mmap.MAP_ANONYMOUS
             | _mmap.MAP_POPULATE} if hasattr(_mmap, "MAP_POPULATE") else {}


def fresh(nbytes):
    """A new uint8 buffer to read ``nbytes`` of a file into. From 32 MiB
    on, anonymous mmap memory with its pages populated at once. Measured
    reading 1 GB from the page cache (3 runs, load 7-12, 2 cores): into
    np.empty 1.2-2.5 s of CPU (NumPy asks for transparent huge pages, and
    with THP defrag "madvise" on a busy machine the kernel compacts memory
    to find them), into plain mmap memory 0.65-0.70 s (a fault per page),
    populated 0.42-0.44 s (torch.load: 0.41-0.47 s). Smaller buffers come
    from np.empty, whose freed memory the allocator hands out again without
    faults: a 105 MB file of 4 MB tensors loads in 13 ms of CPU that way,
    61 ms through fresh mappings (benchmarks/save_load.py)."""
    if nbytes < _ANON:
        return np.empty(nbytes, np.uint8)
    try:
        mm = _mmap.mmap(-1, nbytes, **_POPULATE)
    except (OSError, ValueError):
        return np.empty(nbytes, np.uint8)
    return np.frombuffer(mm, np.uint8)


class _FileSource:
    """Reads a file front to back into fresh arrays (one copy)."""

    def __init__(self, fh, size):
        self.fh, self.size = fh, size

    def read(self, n):
        return self.fh.read(n)

    def tensor(self, nbytes, name, sums):
        buf = fresh(nbytes)
        mv = memoryview(buf)
        # each piece hashed right after its read, while in the CPU cache
        for i in range(0, nbytes, _CHUNK):
            piece = mv[i:i + _CHUNK]
            got = 0
            while got < len(piece):
                k = self.fh.readinto(piece[got:])
                if not k:
                    return None          # the file shrank under us
                got += k
            if sums is not None and nbytes > _CHUNK:
                sums.add(name, piece)
        if sums is not None and nbytes <= _CHUNK:
            sums.whole(name, mv)
        return buf


class _BufferSource:
    """Serves the file from memory: bytes (copied out) or a copy-on-write
    mapping (tensors are views of it)."""

    def __init__(self, mv, views):
        self.mv, self.size, self.pos, self.views = mv, len(mv), 0, views

    def read(self, n):
        out = bytes(self.mv[self.pos:self.pos + n])
        self.pos += len(out)
        return out

    def tensor(self, nbytes, name, sums):
        piece = self.mv[self.pos:self.pos + nbytes]
        if len(piece) < nbytes:
            return None
        self.pos += nbytes
        if sums is not None:
            sums.whole(name, piece)
        buf = np.frombuffer(piece, np.uint8)
        return buf if self.views else buf.copy()
