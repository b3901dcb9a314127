"""cupy.cuda of the stand-in: devices, streams, events, the runtime.

The current device and each device's current stream are per thread, as
CUDA's are. There is deliberately no ``nccl`` here: ``from cupy.cuda
import nccl`` raises ImportError, as on a CuPy built without NCCL.
"""
import os
import threading

_tls = threading.local()


def _count():
    return int(os.environ.get("DTORCH_FAKE_CUDA_DEVICES", "2"))


def _current_device():
    return getattr(_tls, "device", 0)


class CUDARuntimeError(RuntimeError):
    pass


def _check_id(i):
    if not 0 <= i < _count():
        raise CUDARuntimeError("cudaErrorInvalidDevice: invalid device "
                               "ordinal")


class _Runtime:
    CUDARuntimeError = CUDARuntimeError
    is_hip = False

    @staticmethod
    def getDeviceCount():
        return _count()

    @staticmethod
    def getDevice():
        return _current_device()

    @staticmethod
    def setDevice(i):
        _check_id(int(i))
        _tls.device = int(i)

    @staticmethod
    def getDeviceProperties(i):
        _check_id(int(i))
        return {"name": b"dtorch fake CUDA device (NumPy)",
                "totalGlobalMem": 16 << 30, "major": 9, "minor": 0,
                "multiProcessorCount": 1}

    @staticmethod
    def runtimeGetVersion():
        return 12040

    @staticmethod
    def deviceSynchronize():
        pass

    @staticmethod
    def memGetInfo():
        return (16 << 30, 16 << 30)


runtime = _Runtime()


class Device:
    """cupy.cuda.Device: a context manager that makes a device current."""

    def __init__(self, device=None):
        if device is None:
            device = _current_device()
        elif isinstance(device, Device):
            device = device.id
        self.id = int(device)
        self._prev = []

    def use(self):
        _check_id(self.id)
        _tls.device = self.id

    def __enter__(self):
        _check_id(self.id)
        self._prev.append(_current_device())
        _tls.device = self.id
        return self

    def __exit__(self, *exc):
        _tls.device = self._prev.pop()

    def synchronize(self):
        _check_id(self.id)

    @property
    def compute_capability(self):
        return "90"

    def __int__(self):
        return self.id

    def __index__(self):
        return self.id

    def __eq__(self, other):
        return isinstance(other, Device) and other.id == self.id

    def __hash__(self):
        return hash(self.id)

    def __repr__(self):
        return f"<CUDA Device {self.id}>"


def get_device_id():
    return _current_device()


def is_available():
    return _count() > 0


_ptr = [0x1000]
_ptr_lock = threading.Lock()


def _new_ptr():
    with _ptr_lock:
        _ptr[0] += 0x100
        return _ptr[0]


class Stream:
    """A stream on the device current at its creation. Work completes at
    once (NumPy), so events are always done; what is checked is that
    streams and events are used on their own device."""

    def __init__(self, null=False, non_blocking=False, ptds=False):
        self.device_id = _current_device()
        _check_id(self.device_id)
        self.ptr = 0 if null else _new_ptr()
        self._prev = []

    @property
    def done(self):
        return True

    def synchronize(self):
        pass

    def use(self):
        _check_same(self.device_id, "use a stream")
        _streams()[self.device_id] = self
        return self

    def __enter__(self):
        _check_same(self.device_id, "use a stream")
        s = _streams()
        self._prev.append(s.get(self.device_id))
        s[self.device_id] = self
        return self

    def __exit__(self, *exc):
        prev = self._prev.pop()
        s = _streams()
        if prev is None:
            s.pop(self.device_id, None)
        else:
            s[self.device_id] = prev

    def record(self, event=None):
        event = event or Event()
        event.record(self)
        return event

    def wait_event(self, event):
        if not event._recorded:
            return   # CUDA: waiting on an unrecorded event is a no-op
        # cross-device waits are allowed in CUDA
        self._waited = event

    def __repr__(self):
        return f"<Stream {self.ptr} (device {self.device_id})>"


def _check_same(dev, what):
    cur = _current_device()
    if dev != cur:
        raise CUDARuntimeError(
            f"cudaErrorInvalidResourceHandle: cannot {what} of device "
            f"{dev} while device {cur} is current")


def _streams():
    s = getattr(_tls, "streams", None)
    if s is None:
        s = _tls.streams = {}
    return s


class _NullStreams:
    def __init__(self):
        self._by_dev = {}

    def get(self, dev):
        st = self._by_dev.get(dev)
        if st is None:
            st = Stream.__new__(Stream)
            st.device_id, st.ptr, st._prev = dev, 0, []
            self._by_dev[dev] = st
        return st


_null = _NullStreams()


def get_current_stream(device_id=None):
    dev = _current_device() if device_id is None else int(device_id)
    return _streams().get(dev) or _null.get(dev)


class Event:
    def __init__(self, block=False, disable_timing=False, interprocess=False):
        self.device_id = _current_device()
        self._recorded = False

    def record(self, stream=None):
        stream = stream or get_current_stream()
        if stream.device_id != self.device_id:
            raise CUDARuntimeError(
                f"cudaErrorInvalidResourceHandle: event of device "
                f"{self.device_id} recorded on a stream of device "
                f"{stream.device_id}")
        _check_same(self.device_id, "record an event")
        self._recorded = True

    @property
    def done(self):
        return True

    def synchronize(self):
        pass


class _PooledMemory:
    """A block lent by a pool: back to the pool when the last reference
    to it goes (CuPy's PooledMemory)."""
    __slots__ = ("pool", "size", "device_id", "ptr")

    def __init__(self, pool, size, device_id):
        self.pool, self.size, self.device_id = pool, size, device_id
        self.ptr = _new_ptr()

    def __del__(self):
        self.pool._release(self.device_id, self.size)


class MemoryPointer:
    """cupy.cuda.MemoryPointer: ``mem`` (the block), ``device_id``,
    ``ptr``."""
    __slots__ = ("mem", "device_id", "ptr")

    def __init__(self, mem, offset):
        self.mem, self.device_id = mem, mem.device_id
        self.ptr = mem.ptr + offset

    def __int__(self):
        return self.ptr


class MemoryPool:
    """cupy.cuda.MemoryPool's accounting, per device: ``malloc(size)``
    lends a block of the size rounded up to 512 bytes, taken from the
    pool's free bytes when it holds enough; ``used_bytes`` / ``free_bytes``
    / ``total_bytes`` of the current device; ``free_all_blocks`` gives
    the free bytes back."""

    def __init__(self):
        self._lock = threading.Lock()
        self._used, self._free, self._nfree = {}, {}, {}

    def malloc(self, size):
        size = -(-int(size) // 512) * 512
        dev = _current_device()
        with self._lock:
            self._used[dev] = self._used.get(dev, 0) + size
            if self._free.get(dev, 0) >= size:
                self._free[dev] -= size
                self._nfree[dev] = max(self._nfree.get(dev, 0) - 1, 0)
        return MemoryPointer(_PooledMemory(self, size, dev), 0)

    def _release(self, dev, size):
        with self._lock:
            self._used[dev] -= size
            self._free[dev] = self._free.get(dev, 0) + size
            self._nfree[dev] = self._nfree.get(dev, 0) + 1

    def used_bytes(self):
        return self._used.get(_current_device(), 0)

    def free_bytes(self):
        return self._free.get(_current_device(), 0)

    def total_bytes(self):
        return self.used_bytes() + self.free_bytes()

    def free_all_blocks(self, stream=None):
        dev = _current_device()
        with self._lock:
            self._free[dev] = self._nfree[dev] = 0

    def n_free_blocks(self):
        return self._nfree.get(_current_device(), 0)


_POOL = MemoryPool()
_allocator = [_POOL.malloc]


def set_allocator(allocator=None):
    """The function every new array's memory comes from (size -> a
    MemoryPointer); None: the default pool's malloc."""
    _allocator[0] = _POOL.malloc if allocator is None else allocator


def get_allocator():
    return _allocator[0]


class _Memory:
    MemoryPool = MemoryPool
    MemoryPointer = MemoryPointer


memory = _Memory()
