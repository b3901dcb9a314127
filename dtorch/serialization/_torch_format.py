"""PyTorch's own checkpoint files, read and written without torch.

Zip format (``torch.save``'s default): ``ARCHIVE/data.pkl`` is a pickle
in which every tensor is ``torch._utils._rebuild_tensor_v2(storage,
offset, size, stride, requires_grad, hooks)`` and every storage a
persistent id ``('storage', torch.FloatStorage, key, location, numel)``
whose bytes are the stored (uncompressed) entry ``ARCHIVE/data/KEY``;
``byteorder``, ``version`` and friends are small entries beside it.
Legacy format (``_use_new_zipfile_serialization=False``): four pickles in
a row (magic number, protocol 1001, sys_info, the object) followed by a
pickled list of storage keys and, per key, an int64 element count and the
raw bytes.

Reading maps PyTorch's names to dtorch's (``torch.FloatStorage`` ->
float32 storage, ``torch.Size`` -> ``dtorch.Size``, ...): with
``weights_only=True`` through the allow-list interpreter of
``_weights_only`` (PyTorch's list: tensor and parameter rebuilds,
containers, dtypes, devices, sizes; plus the user's safe globals), with
``weights_only=False`` through ``pickle.Unpickler``, any ``torch.X``
global standing for ``dtorch.X``. Sizes from the file are checked
against the file before anything is allocated; zip entries are read by
exact name only, never extracted.

Writing that format is ``_torch_write``.
"""
import collections
import importlib
import math
import pickle
import struct
import sys
import zipfile

import numpy as np

from .. import _backend as B
from ..nn.parameter import Parameter
from ..tensor import Size, Tensor
from . import _weights_only as W
from ._errors import SerializationError
from ._files import fresh
from ._safetensors import _place

MAGIC = 0x1950A86A20F9469CFC6C
LEGACY_HEAD = b"\x80\x02\x8a\x0a" + MAGIC.to_bytes(10, "little")

# torch's typed storage classes <-> dtorch dtypes
_STORAGES = {"DoubleStorage": "float64", "FloatStorage": "float32",
             "HalfStorage": "float16", "BFloat16Storage": "bfloat16",
             "LongStorage": "int64", "IntStorage": "int32",
             "ShortStorage": "int16", "CharStorage": "int8",
             "ByteStorage": "uint8", "BoolStorage": "bool"}
# torch dtypes and storages that dtorch has no dtype for
_FOREIGN = (["uint16", "uint32", "uint64", "complex32", "complex64",
             "complex128", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
             "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2",
             "qint8", "quint8", "qint32", "quint4x2", "quint2x4", "bits1x8",
             "bits2x4", "bits4x2", "bits8", "bits16"]
            + [f"int{i}" for i in range(1, 8)]
            + [f"uint{i}" for i in range(1, 8)])
_FOREIGN_STORAGES = {"ComplexFloatStorage": "complex64",
                     "ComplexDoubleStorage": "complex128",
                     "ComplexHalfStorage": "complex32",
                     "QInt8Storage": "qint8", "QUInt8Storage": "quint8",
                     "QInt32Storage": "qint32",
                     "QUInt4x2Storage": "quint4x2",
                     "QUInt2x4Storage": "quint2x4"}
# rebuild functions on PyTorch's list that dtorch cannot honour
_CANNOT = {"_rebuild_qtensor": "quantized tensors",
           "_rebuild_sparse_tensor": "sparse tensors",
           "_rebuild_nested_tensor": "nested tensors",
           "_rebuild_wrapper_subclass": "tensor subclasses",
           "_rebuild_meta_tensor_no_storage": "meta tensors",
           "_rebuild_device_tensor_from_numpy": "XLA/device tensors",
           "_rebuild_device_tensor_from_cpu_tensor": "XLA/device tensors"}


def _dtorch_dtypes():
    return ", ".join(d.name for d in B.ALL_DTYPES)


class _TorchName:
    """A PyTorch global (``torch._utils._rebuild_tensor_v2``) that the
    writer puts in a pickle without importing torch."""

    def __init__(self, module, name):
        self.module, self.name = module, name

    def __repr__(self):
        return f"{self.module}.{self.name}"

    def __call__(self, *args):      # (the pickler wants a callable)
        raise TypeError(f"{self!r} is a name written into pickles")


class _StorageType:
    """What ``torch.FloatStorage`` (& co.) stands for: a dtype."""

    def __init__(self, name, dtype):
        self.name, self.dtype = name, dtype      # dtype: a NumPy dtype

    def __repr__(self):
        return f"torch.{self.name}"


class _Storage:
    """One storage of the file: its elements as a flat array (``array``;
    None until a legacy file's bytes are read)."""

    def __init__(self, key, dtype, numel, location, array=None):
        self.key, self.dtype, self.numel = key, dtype, numel
        self.location, self.array = location, array


def _np(name):
    return B.to_dtype(name).np


# ============================================================== reading ==

class _Loader:
    """Rebuilds the objects of one file: the allow-list, the persistent
    ids, and the tensor rebuild functions (bound to this load's file and
    ``map_location``). ``read_storage(key, nbytes)`` gives a storage's
    bytes (zip) or None (legacy: filled in later, see ``fill``)."""

    def __init__(self, where, map_location, read_storage, size):
        self.where, self.map_location = where, map_location
        self.read_storage = read_storage
        self.size = size                     # the file's, in bytes
        self.storages = {}
        self.pending = []          # legacy: (tensor, storage, view args)
        self.pending_ids = {}
        self.table = self._table()

    def err(self, why):
        return SerializationError(f"{self.where}: {why}")

    # the names a file may use -------------------------------------------
    def _table(self):
        t = {"collections.OrderedDict": collections.OrderedDict,
             "collections.Counter": collections.Counter,
             "builtins.set": set, "builtins.frozenset": frozenset,
             "builtins.bytearray": bytearray, "builtins.bytes": bytes,
             "builtins.complex": complex, "_codecs.encode": W.encode,
             "torch.nn.parameter.Parameter": Parameter,
             "torch.Size": Size, "torch.device": B.device,
             "torch.Tensor": Tensor,
             "torch._utils._rebuild_tensor": self.rebuild_tensor,
             "torch._utils._rebuild_tensor_v2": self.rebuild_tensor_v2,
             "torch._utils._rebuild_tensor_v3": self.rebuild_tensor_v3,
             "torch._utils._rebuild_parameter": self.rebuild_parameter,
             "torch._utils._rebuild_parameter_with_state":
                 self.rebuild_parameter_with_state,
             "torch._tensor._rebuild_from_type_v2":
                 self.rebuild_from_type_v2,
             "torch.storage.UntypedStorage":
                 _StorageType("UntypedStorage", np.dtype(np.uint8))}
        for d in B.ALL_DTYPES:
            if d.np is not None:
                t[f"torch.{d.name}"] = d
        for name, dt in _STORAGES.items():
            if B.to_dtype(dt).np is not None:
                t[f"torch.{name}"] = _StorageType(name, _np(dt))
        for name, what in _CANNOT.items():
            t[f"torch._utils.{name}"] = self._cannot(what)
        return t

    def _cannot(self, what):
        def refuse(*args, **kw):
            raise self.err(f"it holds {what}, which dtorch does not have")
        return refuse

    def foreign(self, full):
        """The error for a torch dtype/storage dtorch has no dtype for."""
        tail = full.rpartition(".")[2]
        name = _FOREIGN_STORAGES.get(tail, tail)
        if name in _FOREIGN:
            return self.err(
                f"it holds tensors of dtype torch.{name}, which dtorch does "
                f"not have (dtorch has {_dtorch_dtypes()}); convert them "
                "in PyTorch first (e.g. .to(torch.int64) or .float())")
        return None

    def resolve(self, module, name):
        """weights_only=True: PyTorch's allow-list, then the user's."""
        full = f"{module}.{name}"
        if full in _BOUNDED:
            return _BOUNDED[full]
        if full in self.table:
            return self.table[full]
        user = W.user_globals()
        if full in user:
            return user[full]
        if module in ("sys", "os", "posix", "nt"):
            raise W.refused(self.where, f"it names {full}, whose module "
                            f"{module} is blocked")
        if module == "torch" or module.startswith("torch."):
            e = self.foreign(full)
            if e is not None:
                raise e
            # torch.X where the user allowed dtorch.X (the same object,
            # whatever module defines it); nothing new is imported here
            obj = _dtorch_attr(module, name, import_=False)
            if obj is not None and any(obj is g for g in user.values()):
                return obj
        raise W.unsupported_global(self.where, full)

    def find_class(self, module, name, fallback):
        """weights_only=False: ``torch.X`` means ``dtorch.X``."""
        full = f"{module}.{name}"
        if full in self.table:
            return self.table[full]
        if module != "torch" and not module.startswith("torch."):
            return fallback(module, name)
        e = self.foreign(full)
        if e is not None:
            raise e
        obj = _dtorch_attr(module, name)
        if obj is None:
            raise self.err(f"it needs {full}, which dtorch does not have "
                           f"(no dtorch{full[len('torch'):]})")
        return obj

    # persistent ids: storages ---------------------------------------------
    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) in (5, 6)
                and pid[0] in ("storage", b"storage")):
            raise W.refused(self.where, "persistent id "
                            f"{W._short(pid)} is not a storage")
        stype, key, location, numel = pid[1:5]
        view = pid[5] if len(pid) == 6 else None
        if not isinstance(stype, _StorageType):
            raise self.err(f"storage {W._short(key)} has type "
                           f"{W._short(stype)}, not a torch storage class")
        if not (isinstance(key, str) and isinstance(location, str)
                and type(numel) is int and numel >= 0):
            raise self.err(f"malformed storage id {W._short(pid)}")
        st = self.storages.get(key)
        if st is None:
            array = self.read_storage(key, numel * stype.dtype.itemsize)
            if array is not None:
                array = array.view(stype.dtype)
            st = self.storages[key] = _Storage(key, stype.dtype, numel,
                                                location, array)
        if st.dtype != stype.dtype or st.numel != numel:
            raise self.err(f"storage {key!r} is named with two types or "
                           "sizes")
        if view is not None:        # old legacy files: a storage view
            vkey, off, size = view
            if not (type(off) is int and type(size) is int and off >= 0
                    and size >= 0 and off + size <= numel):
                raise self.err(f"storage view {W._short(view)} is out of "
                               f"the bounds of storage {key!r}")
            return ("view", st, off, size)
        return st

    # tensor rebuilds (their signatures are torch._utils') -------------------
    def rebuild_tensor(self, storage, storage_offset, size, stride):
        return self._tensor(storage, storage_offset, size, stride, False)

    def rebuild_tensor_v2(self, storage, storage_offset, size, stride,
                          requires_grad, backward_hooks, metadata=None):
        self._plain(backward_hooks, metadata)
        return self._tensor(storage, storage_offset, size, stride,
                            requires_grad)

    def rebuild_tensor_v3(self, storage, storage_offset, size, stride,
                          requires_grad, backward_hooks, dtype,
                          metadata=None):
        self._plain(backward_hooks, metadata)
        if not isinstance(dtype, B.dtype):
            raise self.err(f"tensor dtype {W._short(dtype)} is not a dtype")
        if isinstance(storage, _Storage) and storage.dtype != dtype.np:
            if storage.array is None or storage.array.nbytes % \
                    dtype.itemsize:
                raise self.err(f"storage {storage.key!r} does not hold "
                               f"whole {dtype} elements")
            storage = _Storage(storage.key, dtype.np,
                               storage.array.nbytes // dtype.itemsize,
                               storage.location,
                               storage.array.view(dtype.np))
        return self._tensor(storage, storage_offset, size, stride,
                            requires_grad)

    def rebuild_parameter(self, data, requires_grad, backward_hooks):
        self._plain(backward_hooks, None)
        if not isinstance(data, Tensor):
            raise self.err(f"a parameter's data is {W._short(data)}")
        p = Parameter(data, requires_grad)
        spec = self.pending_ids.get(id(data))
        if spec is not None:       # legacy: its bytes come later
            self._defer(p, *spec)
        return p

    def rebuild_parameter_with_state(self, data, requires_grad,
                                     backward_hooks, state):
        p = self.rebuild_parameter(data, requires_grad, backward_hooks)
        self._set_state(p, state)
        return p

    def rebuild_from_type_v2(self, func, new_type, args, state):
        if func not in (self.rebuild_tensor, self.rebuild_tensor_v2,
                        self.rebuild_tensor_v3, self.rebuild_parameter,
                        self.rebuild_parameter_with_state) \
                or type(args) is not tuple:
            raise self.err(f"_rebuild_from_type_v2 of {W._short(func)}")
        t = func(*args)
        if new_type is Parameter and not isinstance(t, Parameter):
            t = Parameter(t, t.requires_grad)
        elif new_type not in (Tensor, Parameter, _TENSOR):
            raise self.err(f"it holds a tensor subclass {new_type!r}, "
                           "which dtorch does not have")
        self._set_state(t, state)
        return t

    def _set_state(self, t, state):
        if state:
            if not isinstance(state, dict):
                raise self.err(f"tensor state {W._short(state)}")
            for k, v in state.items():
                try:
                    setattr(t, k, v)
                except (AttributeError, TypeError):
                    raise self.err(f"a tensor carries attribute {k!r}, "
                                   "which a dtorch tensor cannot hold"
                                   ) from None

    def _plain(self, hooks, metadata):
        if hooks:
            raise self.err("a tensor carries backward hooks; they are code "
                           "and are not loaded")
        if metadata:
            raise self.err(f"a tensor carries metadata {W._short(metadata)}"
                           " (conjugate/negative bits?), which dtorch does "
                           "not have")

    def _tensor(self, storage, offset, size, stride, requires_grad):
        if isinstance(storage, tuple) and storage[:1] == ("view",):
            _, storage, voff, vsize = storage
            offset, limit = voff + offset, voff + vsize
        else:
            limit = getattr(storage, "numel", 0)
        if not isinstance(storage, _Storage):
            raise self.err(f"a tensor is rebuilt from {W._short(storage)}, "
                           "not a storage")
        size, stride = tuple(size), tuple(stride)
        ok = (type(offset) is int and offset >= 0 and len(size) == len(stride)
              and all(type(n) is int and n >= 0 for n in size + stride)
              and type(requires_grad) is bool)
        if not ok:
            raise self.err(f"malformed tensor (offset {W._short(offset)}, "
                           f"size {W._short(size)}, stride "
                           f"{W._short(stride)})")
        numel = math.prod(size)
        end = offset + sum((n - 1) * s for n, s in zip(size, stride)) + 1
        if numel and end > limit:
            raise self.err(f"a tensor of size {list(size)}, stride "
                           f"{list(stride)} at offset {offset} reaches "
                           f"element {end - 1} of storage {storage.key!r}, "
                           f"which has {limit}")
        if storage.array is None:                   # legacy: later
            t = Tensor._wrap(np.broadcast_to(np.zeros((), storage.dtype),
                                             size))
            self._defer(t, storage, offset, size, stride)
        else:
            t = Tensor._wrap(_view(storage.array, offset, size, stride))
            t = _place(t, storage.location, self.map_location)
        if requires_grad:
            t.requires_grad_(True)
        return t

    def _defer(self, t, *spec):
        self.pending.append((t, spec))
        self.pending_ids[id(t)] = spec

    def fill(self):
        """Legacy files: give the tensors their bytes, now read."""
        for t, (st, offset, size, stride) in self.pending:
            placed = _place(Tensor._wrap(_view(st.array, offset, size,
                                               stride)),
                            st.location, self.map_location)
            t._data = placed._data


def _no_size(cls):
    """``cls`` as the weights-only unpickler may call it: from data in
    the file (``bytes(str, "latin1")``), never from a count
    (``bytearray(10**12)`` would allocate past the file's size)."""
    def make(*args):
        if args and isinstance(args[0], int):
            raise ValueError(f"{cls.__name__}(int) is not loaded (it "
                             "allocates a size the file declares)")
        return cls(*args)
    make.__name__ = cls.__name__
    return make


# weights_only=True only: what PyTorch allows, made unable to allocate
# from a declared size (torch.Tensor(n) would; it is only ever a type)
_TENSOR = _TorchName("torch", "Tensor")
_BOUNDED = {"builtins.bytes": _no_size(bytes),
            "builtins.bytearray": _no_size(bytearray),
            "torch.Tensor": _TENSOR}


def _view(flat, offset, size, stride):
    """The strided view of a flat array, sharing its memory."""
    if math.prod(size) == 0:
        return np.zeros(size, flat.dtype)
    k = flat.itemsize
    return np.ndarray(size, flat.dtype, buffer=flat, offset=offset * k,
                      strides=[s * k for s in stride])


def _dtorch_attr(module, name, import_=True):
    """dtorch's object for ``torch.<module...>.<name>``, or None
    (``import_=False``: only from modules already imported)."""
    mod = "dtorch" + module[len("torch"):]
    try:
        obj = importlib.import_module(mod) if import_ else sys.modules[mod]
        for part in name.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError, KeyError, ValueError, TypeError):
        return None
    return obj


class _Reader:
    """A memoryview read as a file (for ``pickle.Unpickler``)."""

    def __init__(self, mv, pos=0):
        self.mv, self.pos = mv, pos

    def read(self, n=-1):
        end = len(self.mv) if n < 0 else min(self.pos + n, len(self.mv))
        out = bytes(self.mv[self.pos:end])
        self.pos = end
        return out

    def readinto(self, b):
        out = self.read(len(b))
        b[:len(out)] = out
        return len(out)

    def readline(self):
        end = bytes(self.mv[self.pos:self.pos + 65536]).find(b"\n")
        return self.read(len(self.mv) - self.pos if end < 0 else end + 1)


def _unpickle(buf, pos, loader, weights_only, pickle_module, load_args):
    """(object, end) of the pickle at ``buf[pos]``."""
    if weights_only:
        enc = load_args.get("encoding", "utf-8")
        return W.Unpickler(buf, loader.where, loader.resolve,
                           loader.persistent_load, enc,
                           W.budget(loader.size)).load(pos)
    base = (pickle_module or pickle).Unpickler

    class Unpickler(base):
        def find_class(self, module, name):
            return loader.find_class(module, name, super().find_class)

        def persistent_load(self, pid):
            return loader.persistent_load(pid)

    r = _Reader(memoryview(buf), pos)
    return Unpickler(r, **load_args).load(), r.pos


# ----------------------------------------------------------- zip format --

class _Zip:
    """The entries of a torch zip file, read by exact name: each one
    stored (torch.save never compresses), inside the file."""

    def __init__(self, src):
        self.src, self.where = src, src.where
        try:
            self.zf = zipfile.ZipFile(src.fh)
        except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError,
                ValueError, EOFError, struct.error) as e:
            raise SerializationError(
                f"{self.where} is a corrupt or truncated zip archive, not a "
                f"readable PyTorch checkpoint ({e})") from None
        names = self.zf.namelist()
        for n in names:
            parts = n.replace("\\", "/").split("/")
            if n.startswith(("/", "\\")) or ".." in parts or ":" in parts[0]:
                raise SerializationError(
                    f"{self.where}: zip entry {n!r} names a path outside "
                    "the archive (path traversal); not a torch.save file")
        pkl = [n for n in names if n.endswith("data.pkl")
               and n.count("/") == 1]
        if len(pkl) != 1:
            raise SerializationError(
                f"{self.where} is a zip archive but not a PyTorch checkpoint"
                f" (it has {len(pkl)} ARCHIVE/data.pkl entries, needs 1)")
        self.prefix = pkl[0][:-len("data.pkl")]

    def span(self, name):
        """(data offset, size) of entry ``prefix + name``, checked."""
        full = self.prefix + name
        try:
            info = self.zf.getinfo(full)
        except KeyError:
            raise SerializationError(f"{self.where}: entry {full!r} is "
                                     "missing (truncated file?)") from None
        if info.compress_type != zipfile.ZIP_STORED:
            raise SerializationError(
                f"{self.where}: entry {full!r} is compressed; torch.save "
                "stores entries uncompressed (refused: it could expand "
                "past the file's size)")
        fh = self.src.fh
        fh.seek(info.header_offset)
        head = fh.read(30)
        if len(head) < 30 or head[:4] != b"PK\x03\x04":
            raise SerializationError(f"{self.where}: entry {full!r} has no "
                                     "local header (corrupt zip)")
        n, m = struct.unpack("<HH", head[26:30])
        start = info.header_offset + 30 + n + m
        if start + info.file_size > self.src.size:
            raise SerializationError(
                f"{self.where} is truncated: entry {full!r} claims "
                f"{info.file_size} bytes at offset {start}, the file has "
                f"{self.src.size}")
        return start, info

    def read(self, name, limit=None):
        start, info = self.span(name)
        if limit is not None and info.file_size > limit:
            raise SerializationError(f"{self.where}: entry {name!r} is "
                                     f"{info.file_size} bytes")
        return self._bytes(start, info, name)

    def _bytes(self, start, info, name):
        """The entry's bytes: a view of the mapping, or a fresh array read
        in one pass. Its CRC-32 is not checked: torch.load does not check
        it either, and zlib's CRC-32 runs at ~2 GB/s here, which would
        halve the load rate (the sizes and the structure are checked)."""
        if self.src.mm is not None:
            return np.frombuffer(self.src.mm, np.uint8, info.file_size,
                                 start)
        buf = fresh(info.file_size)
        mv, fh, got = memoryview(buf), self.src.fh, 0
        fh.seek(start)
        while got < len(mv):
            k = fh.readinto(mv[got:])
            if not k:
                raise SerializationError(
                    f"{self.where} is truncated inside entry {name!r}")
            got += k
        return buf

    def storage(self, key, nbytes):
        if not isinstance(key, str) or "/" in key or key in ("", ".", ".."):
            raise SerializationError(f"{self.where}: storage key "
                                     f"{W._short(key)} is not a plain name")
        start, info = self.span(f"data/{key}")
        if info.file_size != nbytes:
            raise SerializationError(
                f"{self.where}: storage {key!r} is declared as {nbytes} "
                f"bytes but its entry holds {info.file_size}")
        return self._bytes(start, info, f"data/{key}")


def load_zip(src, map_location, weights_only, pickle_module, load_args):
    z = _Zip(src)
    if z.prefix + "byteorder" in z.zf.namelist() and \
            bytes(z.read("byteorder", 16)).strip() == b"big":
        raise SerializationError(f"{src.where} was written on a big-endian "
                                 "machine; dtorch reads little-endian files")
    loader = _Loader(src.where, map_location, z.storage, src.size)
    obj, _ = _unpickle(z.read("data.pkl"), 0, loader, weights_only,
                       pickle_module, load_args)
    return obj


# -------------------------------------------------------- legacy format --

def is_legacy(head):
    return head.startswith(LEGACY_HEAD)


def load_legacy(src, map_location, weights_only, pickle_module, load_args):
    """The four pickles, the storage keys, then each storage's bytes."""
    if src.mm is not None:
        raise RuntimeError(
            "mmap can only be used with files saved with "
            "`torch.save(_use_new_zipfile_serialization=True), please "
            "torch.save your checkpoint with this option in order to use "
            f"mmap ({src.where} is in the legacy format)")
    buf = src.data if src.data is not None else memoryview(src.fh.read())
    loader = _Loader(src.where, map_location, lambda key, n: None,
                     src.size)
    pos = 0
    head = []
    for _ in range(3):
        value, pos = _unpickle(buf, pos, loader, True, None, {})
        head.append(value)
    magic, proto, info = head
    if magic != MAGIC or proto != 1001:
        raise SerializationError(f"{src.where}: not a PyTorch legacy file "
                                 f"(magic {magic!r}, protocol {proto!r})")
    if not isinstance(info, dict) or not info.get("little_endian", True):
        raise SerializationError(f"{src.where} was written on a big-endian "
                                 "machine; dtorch reads little-endian files")
    obj, pos = _unpickle(buf, pos, loader, weights_only, pickle_module,
                         load_args)
    keys, pos = _unpickle(buf, pos, loader, True, None, {})
    if not isinstance(keys, list):
        raise SerializationError(f"{src.where}: corrupt storage key list")
    for key in keys:
        st = loader.storages.get(key)
        if st is None:
            raise SerializationError(f"{src.where}: storage {key!r} is "
                                     "listed but used by no tensor")
        if pos + 8 > len(buf):
            raise SerializationError(f"{src.where} is truncated before "
                                     f"storage {key!r}")
        n, = struct.unpack("<q", buf[pos:pos + 8])
        nbytes = n * st.dtype.itemsize
        pos += 8
        if n != st.numel or pos + nbytes > len(buf):
            raise SerializationError(
                f"{src.where} is truncated or corrupt: storage {key!r} "
                f"declares {n} elements of {st.dtype} ({st.numel} in the "
                f"pickle), {len(buf) - pos} bytes are left")
        st.array = np.frombuffer(buf, st.dtype, n, pos).copy()
        pos += nbytes
    missing = [k for k, st in loader.storages.items() if st.array is None]
    if missing:
        raise SerializationError(f"{src.where} is truncated: storages "
                                 f"{missing[:5]} have no bytes")
    loader.fill()
    return obj
