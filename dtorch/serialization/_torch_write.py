"""Writing PyTorch's zip checkpoint format without torch
(``dtorch.save(obj, f, format="torch")``, and any object the safetensors
layout cannot hold): the file that ``torch.load(f, weights_only=True)``
reads, with tensors through torch's rebuild names (``_torch_format``, the
reader, has the layout), views of one array as views of one storage,
storages 64-byte aligned as torch aligns them.
"""
import collections
import io
import os
import pickle
import struct
import zipfile

import numpy as np

from .. import _backend as B
from ..nn.parameter import Parameter
from ..tensor import Size, Tensor
from ._errors import SerializationError
from ._torch_format import _STORAGES, _TorchName, _np

_ALIGN = 64
_CHUNK = 16 << 20
_STORAGE_OF = {v: k for k, v in _STORAGES.items()}

_REBUILD_V2 = _TorchName("torch._utils", "_rebuild_tensor_v2")
_REBUILD_PARAM = _TorchName("torch._utils", "_rebuild_parameter")
_SIZE = _TorchName("torch", "Size")
_DEVICE = _TorchName("torch", "device")
_ENCODE = _TorchName("_codecs", "encode")
# NumPy dtype -> torch's storage name; BFloat16Storage joins once
# ml_dtypes is loaded (the first bfloat16: import dtorch does not load it)
_STORAGE_NAMES = {_np(dt): _TorchName("torch", name)
                  for name, dt in _STORAGES.items() if dt != "bfloat16"}
B.on_bfloat16(lambda np_dtype: _STORAGE_NAMES.__setitem__(
    np_dtype, _TorchName("torch", _STORAGE_OF["bfloat16"])))


class _StorageRef:
    """A storage being written: its key, flat array and location."""

    def __init__(self, key, flat, location):
        self.key, self.flat, self.location = key, flat, location


class _Storages:
    """The storages of one save. Tensors that are views of one array
    share one storage (as in torch, the whole array is written); others
    get their own, a copy only where the layout needs one. A CUDA tensor
    is copied to the host on its own (contiguous), so views of one CUDA
    array are written as separate storages."""

    def __init__(self):
        self.refs = []
        self.by_root = {}
        self.keep = []

    def tensor_args(self, t):
        """(storage, offset, size, stride) of tensor ``t``."""
        a, location = t._data, "cpu"
        if B.is_cupy_array(a):
            location = str(t.device)
            a = a.get()
        root = a                 # the array that owns a's memory
        while isinstance(root.base, np.ndarray):
            root = root.base
        k = a.itemsize
        if a.size and (root.flags.c_contiguous or root.flags.f_contiguous) \
                and root.nbytes % k == 0 and all(
                s >= 0 and s % k == 0 for s in a.strides):
            flat = root.ravel(order="K")
            if flat.dtype != a.dtype:
                flat = flat.view(np.uint8).view(a.dtype)
            off = (a.__array_interface__["data"][0]
                   - flat.__array_interface__["data"][0])
            if 0 <= off and off % k == 0:
                ref = self._ref(root, flat, location)
                return ref, off // k, a.shape, [s // k for s in a.strides]
        if not a.flags.c_contiguous:
            a = np.ascontiguousarray(a)
        flat = a.reshape(-1)
        stride, acc = [], 1
        for n in reversed(a.shape):
            stride.insert(0, acc)
            acc *= n
        return self._ref(a, flat, location), 0, a.shape, stride

    def _ref(self, root, flat, location):
        key = (id(root), flat.dtype, location)
        ref = self.by_root.get(key)
        if ref is None:
            if flat.dtype not in _STORAGE_NAMES:
                raise SerializationError(
                    f"dtorch.save cannot store a tensor of dtype "
                    f"{flat.dtype} in PyTorch's format")
            ref = self.by_root[key] = _StorageRef(str(len(self.refs)), flat,
                                                  location)
            self.refs.append(ref)
            self.keep.append(root)
        return ref


def _pickler_class(pickle_module):
    base = getattr(pickle_module, "Pickler", pickle._Pickler)
    if pickle_module is None or not issubclass(base, pickle._Pickler):
        base = pickle._Pickler

    class Pickler(base):
        """Python's pickler, with tensors, dtypes, sizes and devices
        written under PyTorch's names."""

        def __init__(self, file, protocol, storages):
            super().__init__(file, protocol)
            self.storages = storages

        def persistent_id(self, obj):
            if isinstance(obj, _StorageRef):
                return ("storage", _STORAGE_NAMES[obj.flat.dtype], obj.key,
                        obj.location, obj.flat.size)
            return None

        def reducer_override(self, obj):
            if isinstance(obj, Tensor):
                ref, off, size, stride = self.storages.tensor_args(obj)
                args = (ref, off, tuple(size), tuple(stride))
                if isinstance(obj, Parameter):
                    plain = _Plain(args)
                    return (_REBUILD_PARAM, (plain, obj.requires_grad,
                                             collections.OrderedDict()))
                return (_REBUILD_V2, args + (
                    obj.requires_grad, collections.OrderedDict()))
            if isinstance(obj, _Plain):
                return (_REBUILD_V2, obj.args + (
                    False, collections.OrderedDict()))
            if isinstance(obj, (_TorchName, B.dtype)):
                return obj.name
            if isinstance(obj, Size):
                return (_SIZE, (tuple(obj),))
            if type(obj) is bytes and not obj and self.proto < 3:
                # (Python writes b"" as builtins.bytes(), which torch's
                # weights_only unpickler refuses; this is what it allows)
                return (_ENCODE, ("", "latin1"))
            if isinstance(obj, B.device):
                return (_DEVICE, (str(obj),))
            return NotImplemented

        def save_global(self, obj, name=None):
            if isinstance(obj, _TorchName):
                where = (obj.module, obj.name)
            elif isinstance(obj, B.dtype):
                where = ("torch", obj.name)
            else:
                return super().save_global(obj, name)
            self.write(pickle.GLOBAL + f"{where[0]}\n{where[1]}\n".encode())
            self.memoize(obj)

    return Pickler


class _Plain:
    """A Parameter's data: the same storage view, as a plain tensor."""

    def __init__(self, args):
        self.args = args


def writer(obj, pickle_module=None, protocol=None):
    """Pickle ``obj`` now (so nothing is written if that fails) and
    return ``write(fh, seekable)`` for the zip file."""
    storages = _Storages()
    out = io.BytesIO()
    Pickler = _pickler_class(pickle_module)
    try:
        Pickler(out, 2 if protocol is None else protocol, storages).dump(obj)
    except (pickle.PicklingError, TypeError, AttributeError) as e:
        raise SerializationError(
            f"dtorch.save cannot pickle {type(obj).__module__}."
            f"{type(obj).__qualname__}: {e}") from e
    pkl = out.getvalue()

    def write(fh, seekable):
        _write_zip(fh, pkl, storages.refs)
    return write


def _write_zip(fh, pkl, refs, prefix="archive"):
    records = [("data.pkl", pkl), (".format_version", b"1"),
               (".storage_alignment", str(_ALIGN).encode()),
               ("byteorder", b"little")]
    records += [(f"data/{r.key}", r.flat) for r in refs]
    records += [("version", b"3\n"),
                (".data/serialization_id", os.urandom(20).hex().encode())]
    with zipfile.ZipFile(fh, "w", zipfile.ZIP_STORED,
                         allowZip64=True) as zf:
        for name, data in records:
            _write_entry(zf, f"{prefix}/{name}", data)


def _write_entry(zf, name, data):
    """One stored entry whose data start at a multiple of 64 bytes (the
    padding goes in an extra field, as torch's writer does)."""
    mv = data if isinstance(data, bytes) else _flat_bytes(data)
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_STORED
    info.file_size = len(mv)
    zip64 = info.file_size * 1.05 > zipfile.ZIP64_LIMIT
    at = zf.fp.tell() + 30 + len(name.encode()) + 4 + (20 if zip64 else 0)
    pad = -at % _ALIGN
    info.extra = b"FB" + struct.pack("<H", pad) + b"Z" * pad
    with zf.open(info, "w", force_zip64=zip64) as w:
        for i in range(0, len(mv), _CHUNK):
            w.write(mv[i:i + _CHUNK])


def _flat_bytes(a):
    try:
        return memoryview(a).cast("B")
    except (TypeError, ValueError):      # bfloat16: no buffer format
        return memoryview(a.view(np.uint8))
