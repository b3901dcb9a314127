"""What runs inside a DataLoader worker process, and how batches cross the
process boundary.

Transport. Each worker talks to the main process over its own Unix socket
pair: indices go down, batches come back, in task order (so the main
process reads the result of task ``t`` from the worker it sent ``t`` to,
with no reordering buffer). Arrays of a batch above ``_SHM_MIN_BYTES`` are
not pickled: the worker's collate writes them straight into anonymous
shared memory (``memfd_create``), and the file descriptors travel with the
message (``SCM_RIGHTS``); the main process maps them and closes the
descriptors. An anonymous memfd has no name in ``/dev/shm``, so nothing is
left behind whatever dies when: a descriptor in flight or a mapping is
released by the kernel with the last process that holds it.

dtorch tensors refuse pickling on purpose, so a worker turns every tensor
of a batch into a ``_TensorPayload``; the main process rebuilds tensors
that share the mapped memory (no copy).

State. After each batch a worker attaches its RNG states (Python's
``random``, NumPy's global, dtorch's default generator) and its dataset
iterator's position, so the main process knows, for every worker, the
state right after the last batch it handed to the user: what a resumed
worker restores (see ``DataLoader.state_dict``).
"""
import array
import mmap
import os
import pickle
import random
import socket
import struct
import sys
import traceback

import numpy as np

from ... import _backend as B
from ...tensor import Tensor

# how often a blocked worker checks that its parent is still alive
STATUS_CHECK_INTERVAL = 1.0
# smaller arrays are pickled inline: a memfd + mmap costs more than a copy
_SHM_MIN_BYTES = 64 * 1024
# at most this many descriptors per message (the kernel's limit is 253)
_MAX_FDS = 200
_HEADER = struct.Struct("<QI")       # body length, number of descriptors

_worker_info = None


class WorkerInfo:
    """Inside a worker: ``id``, ``num_workers``, ``seed`` and this
    worker's copy of ``dataset``."""

    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)

    def __repr__(self):
        items = ", ".join(f"{k}={v!r}" for k, v in self.__dict__.items()
                          if k != "dataset")
        return f"WorkerInfo({items})"


def get_worker_info():
    """The current worker's ``WorkerInfo``; ``None`` in the main process.

    Example (an IterableDataset that splits its range among workers)::

        info = get_worker_info()
        lo, step = (0, 1) if info is None else (info.id, info.num_workers)
    """
    return _worker_info


class ExceptionWrapper:
    """An exception caught in a worker, carried to the parent as its type
    and formatted traceback."""

    def __init__(self, exc_info, where):
        self.exc_type = exc_info[0]
        self.exc_msg = "".join(traceback.format_exception(*exc_info))
        self.where = where

    def reraise(self):
        msg = (f"Caught {self.exc_type.__name__} {self.where}.\n"
               f"Original {self.exc_msg}")
        if self.exc_type is KeyError:
            # KeyError would repr() the text and hide the newlines
            msg = _KeyErrorMessage(msg)
        try:
            exc = self.exc_type(msg)
        except Exception:   # an exception type that takes other arguments
            raise RuntimeError(msg) from None
        raise exc


class _KeyErrorMessage(str):
    def __repr__(self):
        return self


class _TensorPayload:
    """A tensor in transit: its (CPU) array and requires_grad flag."""

    __slots__ = ("array", "requires_grad")

    def __init__(self, array, requires_grad):
        self.array = array
        self.requires_grad = requires_grad

    def __reduce__(self):
        return _TensorPayload, (self.array, self.requires_grad)


class _ShmArray:
    """An array in transit in shared memory: which descriptor of the
    message, where in it, and its layout."""

    __slots__ = ("fd_index", "offset", "shape", "strides", "dtype")

    def __init__(self, fd_index, offset, shape, strides, dtype):
        self.fd_index = fd_index
        self.offset = offset
        self.shape = shape
        self.strides = strides
        self.dtype = dtype

    def __reduce__(self):
        return _ShmArray, (self.fd_index, self.offset, self.shape,
                           self.strides, self.dtype)


class _IterableDatasetStopIteration:
    def __init__(self, worker_id):
        self.worker_id = worker_id


class _ResumeIteration:
    """Sent to persistent workers at the start of a new epoch, with what
    each should restore (``None``: start the dataset afresh)."""

    def __init__(self, resume=None, epoch=None):
        self.resume = resume
        self.epoch = epoch


_CUDA_IN_WORKER = (
    # PyTorch's words first, so that its answers on the web apply
    "Cannot re-initialize CUDA in forked subprocess: "
    "a DataLoader worker process cannot use CUDA (it was forked from a "
    "process that had initialised CUDA, whose context a child cannot use): "
    "let the dataset return CPU tensors and move batches to the GPU in the "
    "main process, or pass multiprocessing_context='spawn' with a picklable "
    "dataset")


_cuda_forbidden = False


def _forbid_cuda_after_fork():
    """In a worker forked from a process where CuPy was loaded: any CUDA
    use fails at once with a clear error instead of hanging in the driver
    (PyTorch: "Cannot re-initialize CUDA in forked subprocess")."""
    global _cuda_forbidden
    if B._cupy is not None:
        _cuda_forbidden = True
        B._cupy = None
        B._cupy_tried = True
        B._cupy_error = RuntimeError(_CUDA_IN_WORKER)


# ------------------------------------------------------ shared memory ----
_HAS_MEMFD = hasattr(os, "memfd_create") and hasattr(socket, "send_fds")
# in a worker: id(mmap) -> (fd, mmap, base address) of this batch's buffers
_shm_live = None


def shm_empty(shape, dtype):
    """An uninitialised array for a batch: in a worker, large ones live in
    an anonymous shared-memory file that the batch's message carries to the
    main process without a copy; elsewhere an ordinary array."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    nbytes = count * dtype.itemsize
    if _shm_live is None or nbytes < _SHM_MIN_BYTES or \
            len(_shm_live) >= _MAX_FDS or dtype.hasobject:
        return np.empty(shape, dtype)
    fd = os.memfd_create("dtorch-batch", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, nbytes)
        mm = mmap.mmap(fd, nbytes)
    except BaseException:
        os.close(fd)
        raise
    flat = np.frombuffer(mm, dtype=dtype, count=count)
    _shm_live[id(mm)] = (fd, mm, flat.__array_interface__["data"][0])
    return flat.reshape(shape)


def _release_shm():
    """Close this batch's descriptors (sent ones are already duplicated
    into the message); the worker's mappings go with their arrays."""
    if _shm_live:
        for fd, _, _ in _shm_live.values():
            os.close(fd)
        _shm_live.clear()


def _root(a):
    """The object that owns an array's memory (an mmap for ours)."""
    while isinstance(a, np.ndarray) and a.base is not None:
        a = a.base
    if isinstance(a, memoryview):
        a = a.obj
    return a


class _Packer:
    """Turns a batch into a picklable structure plus descriptors."""

    def __init__(self):
        self.fds = []
        self.index = {}       # fd -> its position in self.fds

    def _fd_slot(self, fd):
        i = self.index.get(fd)
        if i is None:
            i = self.index[fd] = len(self.fds)
            self.fds.append(fd)
        return i

    def array(self, a):
        if _shm_live is None or a.dtype.hasobject:
            return a
        root = _root(a)
        entry = _shm_live.get(id(root)) if isinstance(root, mmap.mmap) \
            else None
        if entry is None:
            if a.nbytes < _SHM_MIN_BYTES or len(self.fds) >= _MAX_FDS:
                return a
            copy = shm_empty(a.shape, a.dtype)   # one copy, no pickling
            if copy.base is None:                # fell back to np.empty
                return a
            copy[...] = a
            a, root = copy, _root(copy)
            entry = _shm_live[id(root)]
        fd, _, base = entry
        offset = a.__array_interface__["data"][0] - base
        return _ShmArray(self._fd_slot(fd), offset, a.shape, a.strides,
                         a.dtype.str)

    def pack(self, obj):
        if isinstance(obj, Tensor):
            a = obj._data
            if not isinstance(a, np.ndarray):    # np.memmap is one
                if _cuda_forbidden or not B.is_cupy_array(a):
                    raise RuntimeError(_CUDA_IN_WORKER + f" (got a "
                                       f"{obj.device} tensor)")
                a = a.get()
            return _TensorPayload(self.array(a), obj.requires_grad)
        if isinstance(obj, np.ndarray):
            return self.array(obj)
        return _rebuild(obj, self.pack)


def _rebuild(obj, fn):
    """A namedtuple, list, tuple or dict rebuilt (as its own type where
    that allows) over ``fn`` of its elements; anything else as it is."""
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(fn(o) for o in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(fn(o) for o in obj)
    if isinstance(obj, dict):
        try:
            return type(obj)((k, fn(v)) for k, v in obj.items())
        except TypeError:
            return {k: fn(v) for k, v in obj.items()}
    return obj


def to_payload(obj):
    """Replace tensors in a nested batch by picklable payloads (arrays in
    shared memory are referenced, not copied; see ``send``)."""
    return _Packer().pack(obj)


class _Unpacker:
    def __init__(self, fds):
        self.maps = []
        try:
            for fd in fds:
                size = os.fstat(fd).st_size
                self.maps.append(mmap.mmap(fd, size) if size else b"")
        finally:
            for fd in fds:
                os.close(fd)

    def array(self, s):
        buf = self.maps[s.fd_index]
        return np.ndarray(s.shape, np.dtype(s.dtype), buffer=buf,
                          offset=s.offset, strides=s.strides)

    def unpack(self, obj):
        if isinstance(obj, _TensorPayload):
            a = obj.array
            if isinstance(a, _ShmArray):
                a = self.array(a)
            t = Tensor._wrap(a)
            if obj.requires_grad:
                t.requires_grad_(True)
            return t
        if isinstance(obj, _ShmArray):
            return self.array(obj)
        return _rebuild(obj, self.unpack)


def from_payload(obj, fds=()):
    """The inverse of ``to_payload``, in the parent; closes ``fds``."""
    return _Unpacker(fds).unpack(obj)


# ------------------------------------------------------------ channel ----
def frame(obj, nfds=0):
    """A message's bytes: a header, then the pickled body."""
    body = pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(body), nfds) + body


def send(sock, obj, fds=()):
    """One message, descriptors attached (blocking)."""
    data = frame(obj, len(fds))
    anc = ([(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
           if fds else [])
    sent = sock.sendmsg([data], anc)
    if sent < len(data):
        sock.sendall(memoryview(data)[sent:])


class ChannelClosed(EOFError):
    pass


def _recv_exact(sock, n):
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ChannelClosed
        got += k
    return buf


def recv(sock):
    """(object, descriptors) of the next message; ``ChannelClosed`` when
    the other end has gone. A timeout set on ``sock`` applies to the
    start of the message only."""
    anc_size = socket.CMSG_SPACE(_MAX_FDS * array.array("i").itemsize)
    head, anc, _, _ = sock.recvmsg(_HEADER.size, anc_size)
    fds = []
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            a = array.array("i")
            a.frombytes(data[:len(data) - len(data) % a.itemsize])
            fds.extend(a)
    try:
        if not head:
            raise ChannelClosed
        timeout = sock.gettimeout()
        sock.settimeout(None)        # the rest of a message is on its way
        try:
            if len(head) < _HEADER.size:
                head = bytes(head) + bytes(
                    _recv_exact(sock, _HEADER.size - len(head)))
            length, _ = _HEADER.unpack(head)
            body = _recv_exact(sock, length)
        finally:
            sock.settimeout(timeout)
        return pickle.loads(body), fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


# ---------------------------------------------------------------- RNG ----
def rng_state():
    """This process's RNG states, as cheap raw objects (converted to a
    plain dict only when a state_dict is asked for)."""
    from ... import random as drandom
    return (random.getstate(), np.random.get_state(),
            drandom.get_rng_state())


def set_rng_state(state):
    from ... import random as drandom
    py, npy, dt = state
    random.setstate(py)
    np.random.set_state(npy)
    drandom.set_rng_state(dt)


def rng_to_plain(state):
    """``rng_state()`` as a nested dict of ints, floats, strings and int64
    arrays (a dtype every checkpoint format carries; the words are
    32-bit)."""
    (ver, keys, gauss), npy, dt = state
    return {"python": {"version": ver,
                       "state": np.asarray(keys, dtype=np.int64),
                       "gauss": [gauss is not None, gauss or 0.0]},
            "numpy": {"keys": np.asarray(npy[1], dtype=np.int64),
                      "pos": int(npy[2]), "has_gauss": int(npy[3]),
                      "cached_gaussian": float(npy[4])},
            "dtorch": dict(dt)}


def rng_from_plain(d):
    py = d["python"]
    g = py["gauss"]
    gauss = float(g[1]) if g[0] else None
    npy = d["numpy"]
    return ((int(py["version"]), tuple(int(k) for k in py["state"]), gauss),
            ("MT19937", np.asarray(npy["keys"], dtype=np.uint32),
             int(npy["pos"]), int(npy["has_gauss"]),
             float(npy["cached_gaussian"])),
            dict(d["dtorch"]))


def _seed_everything(seed, base_seed, worker_id):
    from ... import random as drandom
    random.seed(seed)
    drandom.manual_seed(seed)
    np.random.seed(np.random.SeedSequence(
        [base_seed & 0xFFFF_FFFF_FFFF_FFFF, worker_id]).generate_state(4))


# ------------------------------------------------------------- worker ----
def worker_loop(make_fetcher, dataset, sock, close_in_child, worker_init_fn,
                base_seed, worker_id, num_workers, resume):
    """The body of one worker process: seed, init, then fetch batches for
    the indices that arrive until told to stop (``None``), or until the
    main process has gone (its end of the socket closes)."""
    global _worker_info, _shm_live
    for s in close_in_child:       # other workers' and the parent's ends
        s.close()
    _forbid_cuda_after_fork()
    seed = base_seed + worker_id
    _seed_everything(seed, base_seed, worker_id)
    _worker_info = WorkerInfo(id=worker_id, num_workers=num_workers,
                              seed=seed, dataset=dataset)
    _shm_live = {} if _HAS_MEMFD else None
    where = f"in DataLoader worker process {worker_id}"
    init_error = None
    fetcher = None
    try:
        if worker_init_fn is not None:
            worker_init_fn(worker_id)
        # fast-forward first (it may draw random numbers), then restore
        fetcher = make_fetcher(dataset, resume and resume.get("fetcher"))
        if resume is not None and resume.get("rng") is not None:
            set_rng_state(resume["rng"])
    except Exception:
        init_error = ExceptionWrapper(sys.exc_info(), where)
    parent = os.getppid()
    iteration_end = False
    try:
        while True:
            # waiting for work times out to check on the parent; sending a
            # batch blocks for as long as the main process takes to read
            sock.settimeout(STATUS_CHECK_INTERVAL)
            try:
                msg, _ = recv(sock)
            except socket.timeout:
                if os.getppid() != parent:   # the main process died
                    break
                continue
            if msg is None:
                break
            if isinstance(msg, _ResumeIteration):
                if init_error is None:
                    try:
                        if msg.epoch is not None:
                            dataset.set_epoch(msg.epoch)
                        r = msg.resume
                        fetcher = make_fetcher(dataset,
                                               r and r.get("fetcher"))
                        if r is not None and r.get("rng") is not None:
                            set_rng_state(r["rng"])
                    except Exception:
                        init_error = ExceptionWrapper(sys.exc_info(), where)
                sock.settimeout(None)
                send(sock, (msg, None, None))
                iteration_end = False
                continue
            if iteration_end:
                continue
            idx, index = msg
            state = None
            if init_error is not None:
                data, init_error = init_error, None
            else:
                try:
                    data = fetcher.fetch(index)
                    state = (rng_state(), fetcher.state())
                except StopIteration:
                    # an IterableDataset ran out: tell the parent once
                    data = _IterableDatasetStopIteration(worker_id)
                    iteration_end = True
                except Exception:
                    data = ExceptionWrapper(sys.exc_info(), where)
            sock.settimeout(None)
            _reply(sock, idx, data, state, where)
    except (ChannelClosed, BrokenPipeError, ConnectionResetError):
        pass                                 # the main process has gone
    finally:
        _release_shm()
        sock.close()


def _reply(sock, idx, data, state, where):
    try:
        try:
            packer = _Packer()
            payload = packer.pack(data)
            send(sock, (idx, payload, state), packer.fds)
        except (BrokenPipeError, ConnectionResetError):
            raise
        except Exception:
            if isinstance(data, ExceptionWrapper):
                data.exc_type = RuntimeError  # its own type won't pickle
            else:
                data = ExceptionWrapper(sys.exc_info(), where)
            send(sock, (idx, data, None))
    finally:
        _release_shm()
