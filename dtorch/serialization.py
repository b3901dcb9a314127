"""``dtorch.save`` / ``dtorch.load``: nested containers of tensors in one
safetensors file, never pickle.

The tensors go into the safetensors body (written with the ``safetensors``
package); everything else (dicts with their key types, lists, tuples,
numbers, strings, None, each tensor's device and requires_grad) is a JSON
tree stored as the ``dtorch`` entry of the header's ``__metadata__``. Loading
therefore runs no code from the file. The header is checked (length against
file size, every ``data_offsets`` inside the body) before safetensors sees
it, so a truncated, garbage or foreign file fails with a
``SerializationError`` that names the file. Saving to a path is atomic: a
temporary file in the same directory, fsync, then ``os.replace``.

A plain safetensors file written by another tool loads as a ``dict`` of
tensors.
"""
import collections
import json
import math
import os
import struct
import tempfile

import numpy as np
import safetensors
import safetensors.numpy

from . import _backend as B
from .tensor import Tensor

__all__ = ["save", "load", "SerializationError"]

_FORMAT = "dtorch.save/1"

# safetensors dtype names -> NumPy dtypes (bfloat16 through ml_dtypes)
_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16,
           "I64": np.int64, "I32": np.int32, "I16": np.int16,
           "I8": np.int8, "U8": np.uint8, "U16": np.uint16,
           "U32": np.uint32, "U64": np.uint64, "BOOL": np.bool_}
if B._np_bfloat16 is not None:
    _DTYPES["BF16"] = B._np_bfloat16


class SerializationError(RuntimeError):
    """A file that ``dtorch.load`` cannot read, or an object that
    ``dtorch.save`` cannot write."""


# --------------------------------------------------------------- encode --

class _Encoder:
    """Turns an object into a JSON tree plus a dict of named arrays."""

    def __init__(self):
        self.arrays = {}
        self.names = {}       # id(tensor) -> name: shared tensors once

    def tensor(self, t, kind):
        name = self.names.get(id(t))
        if name is None:
            name = self.names[id(t)] = str(len(self.names))
            a = t._data if kind == "tensor" else t
            if B.is_cupy_array(a):
                a = a.get()
            # (np.ascontiguousarray would turn 0-d arrays into 1-d)
            self.arrays[name] = np.asarray(a, order="C")
        node = {kind: name}
        if kind == "tensor":
            if t.device.type != "cpu":
                node["device"] = str(t.device)
            if t.requires_grad:
                node["requires_grad"] = True
        return node

    def __call__(self, obj, path="obj"):
        if obj is None or isinstance(obj, (bool, str)):
            return obj
        if isinstance(obj, Tensor):
            return self.tensor(obj, "tensor")
        if isinstance(obj, np.ndarray):
            return self.tensor(obj, "ndarray")
        if isinstance(obj, (int, np.integer)):
            return int(obj)
        if isinstance(obj, (float, np.floating)):
            obj = float(obj)
            # JSON has no inf/nan
            return obj if math.isfinite(obj) else {"float": repr(obj)}
        if isinstance(obj, (list, tuple)):
            items = [self(v, f"{path}[{i}]") for i, v in enumerate(obj)]
            # lists stay JSON arrays; tuples (named ones too) are tagged
            return items if isinstance(obj, list) else {"tuple": items}
        if isinstance(obj, dict):
            pairs = [[self._key(k, path), self(v, f"{path}[{k!r}]")]
                     for k, v in obj.items()]
            kind = ("odict" if isinstance(obj, collections.OrderedDict)
                    else "dict")
            return {kind: pairs}
        if isinstance(obj, B.dtype):
            return {"dtype": obj.name}
        if isinstance(obj, B.device):
            return {"device": str(obj)}
        raise SerializationError(
            f"dtorch.save cannot store {path} of type "
            f"{type(obj).__module__}.{type(obj).__qualname__}: only tensors, "
            "arrays, dicts, lists, tuples, numbers, strings and None "
            "(dtorch.save never pickles)")

    def _key(self, k, path):
        if k is None or isinstance(k, (bool, str, int, float, tuple)):
            return self(k, path)
        raise SerializationError(
            f"dtorch.save cannot store a dict key of type "
            f"{type(k).__name__} in {path}")


# --------------------------------------------------------------- decode --

class _Decoder:
    def __init__(self, arrays, where, map_location):
        self.arrays = arrays
        self.where = where
        self.map_location = map_location
        self.done = {}

    def __call__(self, node):
        if node is None or isinstance(node, (bool, int, float, str)):
            return node
        if isinstance(node, list):
            return [self(v) for v in node]
        if not isinstance(node, dict) or len(node) == 0:
            raise self.bad(f"unexpected entry {node!r}")
        if "tensor" in node:
            return self.tensor(node)
        if "ndarray" in node:
            return self.array(node["ndarray"])
        if "tuple" in node:
            return tuple(self(v) for v in node["tuple"])
        if "dict" in node or "odict" in node:
            cls = dict if "dict" in node else collections.OrderedDict
            pairs = node.get("dict", node.get("odict"))
            return cls((_hashable(self(k)), self(v)) for k, v in pairs)
        if "float" in node:
            return float(node["float"])
        if "dtype" in node:
            return B.to_dtype(node["dtype"])
        if "device" in node:
            return B.device(node["device"])
        raise self.bad(f"unexpected entry {node!r}")

    def bad(self, what):
        return SerializationError(
            f"{self.where}: corrupt dtorch structure metadata: {what}")

    def array(self, name):
        if name not in self.arrays:
            raise self.bad(f"it names tensor {name!r}, which the file "
                           "does not hold")
        return self.arrays[name]

    def tensor(self, node):
        name = node["tensor"]
        if name in self.done:     # the same tensor saved under two keys
            return self.done[name]
        saved = node.get("device", "cpu")
        t = _place(Tensor._wrap(self.array(name)), saved, self.map_location)
        if node.get("requires_grad"):
            t.requires_grad_(True)
        self.done[name] = t
        return t


def _hashable(k):
    return tuple(_hashable(v) for v in k) if isinstance(k, list) else k


def _place(t, saved, map_location):
    """Move a loaded CPU tensor where ``map_location`` says (torch's
    forms: None = the saved device, a device/str, a {from: to} dict, or a
    callable ``f(tensor, saved_location)``)."""
    if callable(map_location):
        out = map_location(t, saved)
        return t if out is None else out
    if isinstance(map_location, dict):
        target = map_location.get(saved, saved)
    else:
        target = saved if map_location is None else map_location
    dev = B.to_device(target)
    if dev.type == "cpu":
        return t
    if not B.cupy_available():
        raise RuntimeError(
            "Attempting to deserialize object on a CUDA device but "
            "dtorch.cuda.is_available() is False. If you are running on a "
            "CPU-only machine, please use dtorch.load with "
            "map_location=dtorch.device('cpu') to map your storages to "
            "the CPU.")
    return Tensor._wrap(dev.send(t._data))


# ----------------------------------------------------------------- save --

def save(obj, f):
    """Save ``obj`` (tensors in nested dicts/lists/tuples with plain Python
    values) to ``f``, a path or a binary file object.

    Example::

        dtorch.save({"model": model.state_dict(),
                     "optim": opt.state_dict(), "epoch": 3}, "ckpt.pt")
    """
    enc = _Encoder()
    tree = enc(obj)
    meta = {"format": _FORMAT, "dtorch": json.dumps(tree, allow_nan=False)}
    if not isinstance(f, (str, os.PathLike)):
        f.write(safetensors.numpy.save(enc.arrays, metadata=meta))
        return
    path = os.fspath(f)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp",
                               prefix="." + os.path.basename(path) + ".")
    os.close(fd)
    try:
        safetensors.numpy.save_file(enc.arrays, tmp, metadata=meta)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        # the previous file at ``path`` is untouched
        if os.path.exists(tmp):
            os.unlink(tmp)
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

def load(f, map_location=None, weights_only=True, **kwargs):
    """Load an object written by ``dtorch.save`` (or any safetensors file,
    as a dict of tensors). Never runs code from the file.

    ``map_location``: None (each tensor's saved device), ``'cpu'``,
    ``'cuda[:i]'``, a ``dtorch.device``, a ``{saved: target}`` dict, or a
    callable ``f(tensor, saved_location)``. ``weights_only`` is accepted
    for PyTorch compatibility; dtorch files hold nothing else.

    Example::

        ckpt = dtorch.load("ckpt.pt", map_location="cpu")
        model.load_state_dict(ckpt["model"])
    """
    if isinstance(f, (str, os.PathLike)):
        where = os.fspath(f)
        try:
            with open(where, "rb") as fh:
                data = fh.read()
        except FileNotFoundError:
            raise FileNotFoundError(
                f"[Errno 2] No such file or directory: '{where}'") from None
    else:
        where = getattr(f, "name", None) or f"<{type(f).__name__}>"
        data = f.read()
    where = str(where)
    header = _check_header(data, where)
    try:
        views = safetensors.deserialize(data)
    except Exception as e:      # SafetensorError and friends
        raise SerializationError(
            f"{where}: not a valid safetensors file ({e})") from None
    arrays = {}
    for name, v in views:
        dt = _DTYPES[v["dtype"]]
        arrays[name] = np.frombuffer(v["data"], dtype=dt).reshape(
            v["shape"])
    meta = header.get("__metadata__") or {}
    if meta.get("format") != _FORMAT or "dtorch" not in meta:
        # a foreign safetensors file: its tensors by name
        dec = _Decoder(arrays, where, map_location)
        return {k: dec.tensor({"tensor": k}) for k in sorted(arrays)}
    try:
        tree = json.loads(meta["dtorch"])
    except ValueError as e:
        raise SerializationError(
            f"{where}: the dtorch structure metadata is not JSON ({e})"
        ) from None
    return _Decoder(arrays, where, map_location)(tree)


def _check_header(data, where):
    """Validate the safetensors framing before the parser sees it: an
    8-byte little-endian header length, a JSON header, and tensor extents
    inside the body. Returns the parsed header."""
    size = len(data)
    if data[:2] == b"PK":
        raise SerializationError(
            f"{where} is a zip archive (a PyTorch torch.save checkpoint?), "
            "not a dtorch/safetensors file; dtorch.load never unpickles. "
            "Convert it with torch and safetensors.torch.save_file")
    if data[:1] == b"\x80":
        raise SerializationError(
            f"{where} is a Python pickle, not a dtorch/safetensors file; "
            "dtorch.load never unpickles")
    if size < 8:
        raise SerializationError(
            f"{where} is truncated or not a dtorch/safetensors file: "
            f"{size} bytes, fewer than the 8-byte header length")
    (n,) = struct.unpack("<Q", data[:8])
    if n > size - 8:
        raise SerializationError(
            f"{where} is truncated or not a dtorch/safetensors file: the "
            f"header claims {n} bytes but the file has only {size - 8} "
            "after the length field")
    try:
        header = json.loads(data[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise SerializationError(
            f"{where} is corrupt or not a dtorch/safetensors file: its "
            "header is not JSON") from None
    if not isinstance(header, dict):
        raise SerializationError(f"{where}: the safetensors header is not "
                                 "a JSON object")
    body = size - 8 - n
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dt = np.dtype(_DTYPES[info["dtype"]])
            shape = [int(d) for d in info["shape"]]
            begin, end = (int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise SerializationError(
                f"{where}: tensor {name!r} has a bad header entry "
                f"{info!r} (or a dtype dtorch cannot read)") from None
        if not 0 <= begin <= end <= body:
            raise SerializationError(
                f"{where} is truncated or corrupt: tensor {name!r} spans "
                f"bytes [{begin}, {end}) of a {body}-byte data section")
        if (end - begin) != math.prod(shape) * dt.itemsize:
            raise SerializationError(
                f"{where} is corrupt: tensor {name!r} of shape {shape} "
                f"and dtype {info['dtype']} needs "
                f"{math.prod(shape) * dt.itemsize} bytes, the header gives "
                f"{end - begin}")
    return header
