"""dtorch's own file format (the default of ``dtorch.save`` for tensors
and containers of them): nested containers of tensors in one safetensors
file, never pickle. (The file plumbing every format shares, atomic saves
and opened files, is ``_files``.)

File layout (plain safetensors, readable by the ``safetensors`` package):
an 8-byte little-endian header length, a JSON header, then the tensors'
bytes. Everything that is not a tensor (dicts with their key types, lists,
tuples, numbers, strings, None, each tensor's device and requires_grad) is
a JSON tree stored as the ``dtorch`` entry of the header's ``__metadata__``,
so loading runs no code from the file.

Tensor names: a tensor is stored under the path of dict keys and
list/tuple indices that leads to it, joined with dots (a str key as it
is, any other key as its ``repr``): ``dtorch.save(model.state_dict())``
names them ``fc.weight``, ...; ``{"model": sd, "optimizer": osd}`` gives
``model.fc.weight`` and ``optimizer.state.0.exp_avg``, so other
safetensors tools read the tensors by name. A tensor reached twice is
stored once, under its first path. A name that is empty, reserved
(``__metadata__``), not UTF-8 (a lone surrogate) or already taken by an
earlier tensor (ambiguous keys: ``{"a.b": x, "a": {"b": y}}``) gets
``#N`` appended, with the smallest N >= 1 that is free; the structure
metadata records which name is which tensor, so every object
round-trips exactly whatever its keys.

Integrity: ``__metadata__`` also holds each tensor's checksum
(``dtorch.tensor_xxh3_64``: a JSON map from tensor name to the XXH3
64-bit hash, seed 0, of its bytes in the file, as 16 hex digits, as
``xxhsum -H3`` prints it; ~20 GB/s, so it costs little next to the
write) and a CRC-32 of the header itself (``dtorch.header_crc32``, over
the raw header bytes with that entry's 8 hex digits read as zeros; the
header is small, and ``dtorch.distributed.checkpoint`` records this
value). ``load`` checks the framing (header length, tensor extents that
tile the data section, dtypes, shapes) and both checksums; any flaw
raises a ``SerializationError`` that names the file (and, for a data
checksum, the tensor). Files without checksums (older dtorch, other
tools) still load.

A plain safetensors file written by another tool loads as a ``dict`` of
tensors.
"""
import collections
import json
import math
import re
import struct
import zlib

import numpy as np
import xxhash

from .. import _backend as B
from ..tensor import Tensor
from ._errors import ChecksumError, NotPlainError, SerializationError, \
    json_document
from ._files import _CHUNK, _BufferSource, _FileSource


_FORMAT = "dtorch.save/1"
_CRC_KEY = "dtorch.tensor_xxh3_64"     # JSON {tensor name: 16 hex digits}
_HEADER_CRC_KEY = "dtorch.header_crc32"
_DTORCH_META = {"format", "dtorch", _CRC_KEY, _HEADER_CRC_KEY}
_MAX_HEADER = 100_000_000               # the safetensors package's limit

# safetensors dtype names <-> NumPy dtypes (BF16 once ml_dtypes is loaded:
# by the first bfloat16 tensor, or by a file that holds one)
_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16,
           "I64": np.int64, "I32": np.int32, "I16": np.int16,
           "I8": np.int8, "U8": np.uint8, "U16": np.uint16,
           "U32": np.uint32, "U64": np.uint64, "BOOL": np.bool_}
_DTYPES = {k: np.dtype(v) for k, v in _DTYPES.items()}
_CODES = {v: k for k, v in _DTYPES.items()}
# dtypes whose in-memory bytes are the file's (little-endian)
_LITTLE = {v for v in _DTYPES.values() if v.byteorder != ">"
           and v == v.newbyteorder("<")}


def _add_bf16(np_dtype):
    _DTYPES["BF16"] = np_dtype
    _CODES[np_dtype] = "BF16"
    _LITTLE.add(np_dtype)


B.on_bfloat16(_add_bf16)


# --------------------------------------------------------------- encode --

class _Encoder:
    """Turns an object into a JSON tree plus a dict of named arrays.

    ``enc(obj, path)``: ``path`` names the object in messages. Inside,
    a node's place is its ``trail``, the tuple of dict keys and sequence
    indices that lead to it: messages (``obj['a'][0]``) and tensor names
    (``a.0``) are both made from it, only when needed."""

    def __init__(self):
        self.arrays = {}
        self.names = {}       # id(tensor) -> name: shared tensors once
        self.keep = []        # holds the tensors so their ids stay unique
        self.root = "obj"

    def __call__(self, obj, path="obj"):
        self.root = path
        return self.encode(obj, ())

    def where(self, trail):
        return self.root + "".join(["[%r]" % k for k in trail])

    def tensor(self, t, kind, trail):
        name = self.names.get(id(t))
        a = t._data if kind == "tensor" else t
        gpu = B.is_cupy_array(a)
        if name is None:
            if gpu:
                a = a.get()
            if not (a.flags.c_contiguous and a.dtype in _LITTLE):
                a = self._convert(a, self.where(trail))
            name = self.names[id(t)] = self._name(trail)
            self.arrays[name] = a
            self.keep.append(t)
        node = {kind: name}
        if kind == "tensor":
            if gpu:
                node["device"] = str(t.device)
            if t.requires_grad:
                node["requires_grad"] = True
        return node

    def _name(self, trail):
        """The tensor's name: its trail joined with dots (str keys as they
        are, others by repr), made unique (see the module docstring)."""
        name = ".".join([k if isinstance(k, str) else repr(k)
                         for k in trail])
        try:
            name.encode("utf-8")
            plain = (name not in ("", "__metadata__")
                     and name not in self.arrays)
        except UnicodeEncodeError:
            # lone surrogates: JSON parsers such as safetensors' refuse
            # them; escaped, then suffixed (an escape could be a key too)
            name = name.encode("utf-8", "backslashreplace").decode()
            plain = False
        if plain:
            return name
        i = 1
        while f"{name}#{i}" in self.arrays:
            i += 1
        return f"{name}#{i}"

    @staticmethod
    def _convert(a, path):
        """A C-contiguous little-endian copy (the file's byte order)."""
        # (np.ascontiguousarray would turn 0-d arrays into 1-d)
        a = np.asarray(a, order="C")
        dt = a.dtype.newbyteorder("=") if a.dtype.byteorder == ">" \
            else a.dtype
        if dt not in _CODES:
            raise SerializationError(
                f"dtorch.save cannot store {path}: arrays of dtype "
                f"{a.dtype} have no safetensors encoding")
        return np.asarray(a, dtype=dt.newbyteorder("<"), order="C")

    def encode(self, obj, trail):
        if obj is None or isinstance(obj, (bool, str)):
            return obj
        if isinstance(obj, Tensor):
            return self.tensor(obj, "tensor", trail)
        if isinstance(obj, np.ndarray):
            return self.tensor(obj, "ndarray", trail)
        if isinstance(obj, (int, np.integer)):
            return int(obj)
        if isinstance(obj, (float, np.floating)):
            obj = float(obj)
            # JSON has no inf/nan
            return obj if math.isfinite(obj) else {"float": repr(obj)}
        if isinstance(obj, (list, tuple)):
            items = [self.encode(v, trail + (i,))
                     for i, v in enumerate(obj)]
            # lists stay JSON arrays; tuples (named ones too) are tagged
            return items if isinstance(obj, list) else {"tuple": items}
        if isinstance(obj, dict):
            pairs = [[self._key(k, trail), self.encode(v, trail + (k,))]
                     for k, v in obj.items()]
            kind = ("odict" if isinstance(obj, collections.OrderedDict)
                    else "dict")
            return {kind: pairs}
        if isinstance(obj, B.dtype):
            return {"dtype": obj.name}
        if isinstance(obj, B.device):
            return {"device": str(obj)}
        path = self.where(trail)
        if callable(getattr(obj, "state_dict", None)):
            # a Module or Optimizer: torch.save would pickle the object
            var = ("model" if any(c.__name__ == "Module"
                                  for c in type(obj).__mro__)
                   else "optimizer" if any(c.__name__ == "Optimizer"
                                           for c in type(obj).__mro__)
                   else "obj")
            raise NotPlainError(
                f"a safetensors file cannot store {path}, a whole "
                f"{type(obj).__qualname__} (only a pickle can); save its "
                f"state_dict: dtorch.save({var}.state_dict(), PATH), and "
                f"load it with {var}.load_state_dict(dtorch.load(PATH))")
        raise NotPlainError(
            f"a safetensors file cannot store {path} of type "
            f"{type(obj).__module__}.{type(obj).__qualname__}: only tensors, "
            "arrays, dicts, lists, tuples, numbers, strings and None")

    def _key(self, k, trail):
        if type(k) is str:
            return k
        if k is None or isinstance(k, (bool, int, float, tuple)):
            return self.encode(k, trail)
        raise NotPlainError(
            f"a safetensors file cannot store a dict key of type "
            f"{type(k).__name__} in {self.where(trail)}")


# ------------------------------------------------------------ checksums --

_HCRC_AT = json.dumps(_HEADER_CRC_KEY).encode() + b':"'
_HEX8 = re.compile("[0-9a-f]{8}").fullmatch
_HCRC_ZERO = b"00000000"


def _header_crc(raw, value):
    """CRC-32 of the raw header bytes with its own entry's 8 hex digits
    (``value``) read as zeros; None where that entry is not found exactly
    once. In valid JSON the key followed by ``:"`` can only be the entry
    itself (inside a string a quote is escaped)."""
    at = _HCRC_AT + value.encode() + b'"'
    if raw.count(at) != 1:
        return None
    i = raw.index(at) + len(_HCRC_AT)
    return zlib.crc32(raw[i + 8:], zlib.crc32(_HCRC_ZERO, zlib.crc32(
        raw[:i])))


_HEX16 = re.compile("[0-9a-f]{16}").fullmatch


class _Checksums:
    """Per-tensor XXH3 64-bit hashes (seed 0), as ints in ``crc``: a
    tensor is given whole (``whole``) or in pieces, in order (``add``)."""

    def __init__(self):
        self.done = {}
        self.open = {}          # name -> hasher of a tensor fed in pieces

    def whole(self, name, data):
        self.done[name] = xxhash.xxh3_64_intdigest(data)

    def add(self, name, piece):
        h = self.open.get(name)
        if h is None:
            h = self.open[name] = xxhash.xxh3_64()
        h.update(piece)

    @property
    def crc(self):
        """{name: int digest} (a name never fed: none of its bytes)"""
        out = dict(self.done)
        out.update((n, h.intdigest()) for n, h in self.open.items())
        return out


def _bytes_of(a):
    """A flat byte view of a C-contiguous array (0-d ones too)."""
    try:
        return memoryview(a).cast("B")
    except (TypeError, ValueError):     # e.g. bfloat16: no buffer format
        return memoryview(a.reshape(-1).view(np.uint8))


# ----------------------------------------------------------------- save --

def _layout(arrays):
    """Tensor header entries in file order: wider dtypes first, so every
    tensor starts at a multiple of its item size (the data section starts
    8-aligned)."""
    order = sorted(arrays, key=lambda n: -arrays[n].itemsize)
    entries, off = {}, 0
    for n in order:
        a = arrays[n]
        entries[n] = {"dtype": _CODES[a.dtype], "shape": list(a.shape),
                      "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
    return order, entries


class _Header:
    """The length field and the header: tensor entries, the metadata, the
    per-tensor checksums and the header's own CRC-32, padded with spaces
    so that the data section starts 8-aligned. The entries and metadata
    are encoded once; ``bytes(crcs)`` ({name: int digest}, missing ones
    written as zeros) has the same length whatever the digests."""

    def __init__(self, entries, meta):
        head = json.dumps(dict(entries, __metadata__=meta),
                          separators=(",", ":"))
        # (head ends with the metadata's and the header's closing braces)
        self.head = head[:-2].encode() + b"," + json.dumps(
            _CRC_KEY).encode() + b":"
        self.names = list(entries)

    def bytes(self, crcs):
        table = json.dumps(dict(zip(self.names, [
            "%016x" % crcs.get(n, 0) for n in self.names])),
            separators=(",", ":"))
        raw = b"".join((self.head, json.dumps(table).encode(), b",",
                        _HCRC_AT, _HCRC_ZERO, b'"}}'))
        if len(raw) > _MAX_HEADER:
            raise SerializationError(
                f"dtorch.save: the header would take {len(raw)} bytes, "
                f"over safetensors' limit of {_MAX_HEADER} (too many "
                "tensors)")
        raw += b" " * (-len(raw) % 8)
        crc = b"%08x" % _header_crc(raw, _HCRC_ZERO.decode())
        raw = raw.replace(_HCRC_AT + _HCRC_ZERO, _HCRC_AT + crc)
        return struct.pack("<Q", len(raw)) + raw


def _header_bytes(entries, meta, crcs):
    """The header of a file with these entries, metadata and checksums
    (see ``_Header``)."""
    return _Header(entries, meta).bytes(crcs)


def _write(fh, arrays, meta, seekable=False):
    """Write the file to ``fh``. Where ``fh`` can seek (a save to a path),
    the data go first, behind room left for the header, each piece hashed
    just before it is written (so the write copies it from the CPU
    cache), and the header with the checksums goes in last. Otherwise the
    checksums take a pass of their own before a front-to-back write."""
    order, entries = _layout(arrays)
    views = [_bytes_of(arrays[n]) for n in order]
    header = _Header(entries, meta)
    if seekable:
        fh.seek(len(header.bytes({})))
        sums = _write_data(fh, order, views, _Checksums())
        fh.seek(0)
        fh.write(header.bytes(sums.crc))
        return
    sums = _Checksums()
    for n, v in zip(order, views):
        sums.whole(n, v)
    fh.write(header.bytes(sums.crc))
    _write_data(fh, order, views, None)


def _write_data(fh, order, views, sums):
    """Write the tensors' bytes in order, hashing them into ``sums`` (if
    given) piece by piece; many small tensors go in one write per batch,
    not one per tensor."""
    batch, size = [], 0
    for n, v in zip(order, views):
        if len(v) <= _CHUNK:
            if sums is not None:
                sums.whole(n, v)
            batch.append(v)
            size += len(v)
            if size >= _CHUNK:
                fh.write(b"".join(batch))
                batch, size = [], 0
            continue
        if batch:
            fh.write(b"".join(batch))
            batch, size = [], 0
        for i in range(0, len(v), _CHUNK):
            piece = v[i:i + _CHUNK]
            if sums is not None:
                sums.add(n, piece)
            fh.write(piece)
    if batch:
        fh.write(b"".join(batch))
    return sums


def encode(obj):
    """The safetensors writer of ``obj``: a function ``write(fh,
    seekable)``. Raises ``NotPlainError`` for an object the layout cannot
    hold (a Module, a user class), ``SerializationError`` for one it
    cannot store (a complex array)."""
    enc = _Encoder()
    tree = enc(obj)
    meta = {"format": _FORMAT, "dtorch": json.dumps(tree, allow_nan=False)}
    return lambda fh, seekable: _write(fh, enc.arrays, meta, seekable)


# ----------------------------------------------------------------- load --


def load_opened(src, map_location):
    """Load a safetensors file (dtorch's or another tool's)."""
    source = (_BufferSource(src.mm, True) if src.mm is not None
              else _BufferSource(src.data, False) if src.data is not None
              else _FileSource(src.fh, src.size))
    return _load(source, src.where, map_location)


def _load(src, where, map_location):
    header, order = _read_header(src, where)
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(
            isinstance(v, str) for v in meta.values()):
        raise SerializationError(
            f"{where}: the safetensors __metadata__ is not a map of "
            "strings")
    dtorch_file = meta.get("format") == _FORMAT and "dtorch" in meta
    _check_metadata(header, meta, dtorch_file, where)
    stored = meta.get(_CRC_KEY)
    if stored is not None:
        stored = _parse_crcs(stored, header, where)
    arrays = _read_tensors(src, header, order, stored, meta, where)
    if not dtorch_file:
        # a foreign safetensors file: its tensors by name
        dec = _Decoder(arrays, where, map_location)
        return {k: dec.tensor({"tensor": k}) for k in sorted(arrays)}
    try:
        tree = json.loads(meta["dtorch"])
    except (ValueError, RecursionError) as e:
        raise SerializationError(
            f"{where}: the dtorch structure metadata is not valid JSON "
            f"({type(e).__name__}: {e})") from None
    try:
        return _Decoder(arrays, where, map_location)(tree)
    except RecursionError:
        raise SerializationError(
            f"{where}: the dtorch structure metadata nests too deeply"
        ) from None


def _read_header(src, where):
    """Read and validate the header: its length, JSON object, and tensor
    entries whose extents tile the data section. Foreign formats are
    named only where the length cannot be a safetensors one (a length of
    0x...80 or 0x...4B50 is as good as any other)."""
    size = src.size
    head = src.read(8)
    n = struct.unpack("<Q", head)[0] if len(head) == 8 else None
    first = b""
    if n is not None and 2 <= n <= min(size - 8, _MAX_HEADER):
        raw = src.read(n)
        first = raw[:1]
    if first != b"{":
        foreign = ("a zip archive (a PyTorch torch.save checkpoint? "
                   "convert it with torch and safetensors.torch.save_file)"
                   if head[:2] == b"PK" else "a Python pickle"
                   if head[:1] == b"\x80" else None)
        never = "; dtorch.load never unpickles"
        if n is None:
            raise SerializationError(
                f"{where} is truncated or not a dtorch/safetensors file: "
                f"{size} bytes, fewer than the 8-byte header length")
        if foreign and (n > _MAX_HEADER or n <= size - 8):
            raise SerializationError(
                f"{where} is {foreign}, not a dtorch/safetensors file"
                + never)
        if n > size - 8 or n > _MAX_HEADER:
            raise SerializationError(
                f"{where} is truncated or not a dtorch/safetensors file: "
                f"the header claims {n} bytes but the file has only "
                f"{size - 8} after the length field"
                + (f" (it starts like {foreign}{never})" if foreign else
                   f" (safetensors allows at most {_MAX_HEADER})"
                   if n > _MAX_HEADER else ""))
    not_json = (f"{where} is corrupt or not a dtorch/safetensors file: its "
                "header is not JSON")
    if first != b"{":
        raise SerializationError(not_json)
    header = json_document(raw, not_json)
    if not isinstance(header, dict):
        raise SerializationError(f"{where}: the safetensors header is not "
                                 "a JSON object")
    _check_header_crc(header.get("__metadata__"), raw, where)
    body = size - 8 - n
    extents = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape = info["dtype"], info["shape"]
            begin, end = info["data_offsets"]
            ok = (len(info) == 3 and type(dtype) is str
                  and type(shape) is list and type(begin) is int
                  and type(end) is int
                  and type(info["data_offsets"]) is list
                  and all([type(d) is int and d >= 0 for d in shape]))
        except (TypeError, KeyError, ValueError):
            ok = False
        if not ok:
            raise SerializationError(
                f"{where}: tensor {name!r} has a bad header entry "
                f"{_short(info)}")
        if info["dtype"] == "BF16":
            B.bfloat16.np                   # loads ml_dtypes (_add_bf16)
        if info["dtype"] not in _DTYPES:
            raise SerializationError(
                f"{where}: tensor {name!r} has dtype {info['dtype']!r}, "
                f"which dtorch cannot read (it reads {sorted(_DTYPES)})")
        need = math.prod(shape) * _DTYPES[info["dtype"]].itemsize
        if not 0 <= begin <= end <= body:
            raise SerializationError(
                f"{where} is truncated or corrupt: tensor {name!r} spans "
                f"bytes [{begin}, {end}) of a {body}-byte data section")
        if end - begin != need:
            raise SerializationError(
                f"{where} is corrupt: tensor {name!r} of shape {shape} "
                f"and dtype {info['dtype']} needs {need} bytes, the header "
                f"gives {end - begin}")
        extents.append((begin, end, name))
    # safetensors: the tensors tile the data section, no gap, no overlap
    extents.sort()
    at = 0
    for begin, end, name in extents:
        if begin != at:
            raise SerializationError(
                f"{where} is corrupt: tensor {name!r} starts at byte "
                f"{begin} of the data section, expected {at} "
                f"({'overlap' if begin < at else 'gap'})")
        at = end
    if at != body:
        raise SerializationError(
            f"{where} is corrupt: the tensors cover {at} bytes of a "
            f"{body}-byte data section")
    return header, [name for _, _, name in extents]


def _short(v):
    r = repr(v)
    return r if len(r) <= 200 else r[:200] + "..."


def _check_metadata(header, meta, dtorch_file, where):
    if dtorch_file:
        unknown = set(meta) - _DTORCH_META
        if unknown:
            raise SerializationError(
                f"{where}: unknown dtorch metadata entries "
                f"{sorted(unknown)!r} (a corrupt file, or one written by "
                "another dtorch version)")


def _check_header_crc(meta, raw, where):
    """Before anything in the header is trusted: its checksum, if any."""
    want = meta.get(_HEADER_CRC_KEY) if isinstance(meta, dict) else None
    if want is None:
        return
    got = None
    if isinstance(want, str) and _HEX8(want):
        got = _header_crc(raw, want)
    if got is None or "%08x" % got != want:
        raise ChecksumError(
            f"{where} is corrupt: the header checksum does not match "
            f"(stored {_short(want)}, computed "
            f"{'none' if got is None else '%08x' % got}); tensor names, "
            "shapes or structure may have been altered")


def _parse_crcs(text, header, where):
    try:
        stored = json.loads(text)
    except (ValueError, RecursionError):
        stored = None
    if (not isinstance(stored, dict) or set(stored) != set(header)
            or not all([isinstance(v, str) and _HEX16(v)
                        for v in stored.values()])):
        raise SerializationError(
            f"{where} is corrupt: the {_CRC_KEY} metadata does not list "
            "one checksum per tensor")
    return {k: int(v, 16) for k, v in stored.items()}


def _read_tensors(src, header, order, stored, meta, where):
    arrays = {}
    sums = _Checksums() if stored is not None else None
    for name in order:
        info = header[name]
        begin, end = info["data_offsets"]
        buf = src.tensor(end - begin, name, sums)
        if buf is None:
            raise SerializationError(
                f"{where} is truncated: it ended inside tensor {name!r}")
        arrays[name] = buf.view(_DTYPES[info["dtype"]]).reshape(
            info["shape"])
    if stored is not None:
        crcs = sums.crc
        for name in order:
            if crcs[name] != stored[name]:
                begin, end = header[name]["data_offsets"]
                raise ChecksumError(
                    f"{where} is corrupt: checksum mismatch in tensor "
                    f"{_tensor_label(meta, name)} (bytes [{begin}, {end}) "
                    f"of the data section; XXH3-64 stored "
                    f"{stored[name]:016x}, computed {crcs[name]:016x})")
    return arrays


def _tensor_label(meta, name):
    """Where tensor ``name`` sits in the saved object, e.g.
    ``obj['model']['fc.weight']``, for error messages."""
    def walk(node, path):
        if isinstance(node, list):
            for i, v in enumerate(node):
                yield from walk(v, f"{path}[{i}]")
        elif isinstance(node, dict):
            if node.get("tensor") == name or node.get("ndarray") == name:
                yield path
            for kind in ("dict", "odict"):
                for pair in node.get(kind) or ():
                    k = pair[0]
                    k = k if isinstance(k, (str, int, float, bool)) \
                        or k is None else "..."
                    yield from walk(pair[1], f"{path}[{k!r}]")
            if isinstance(node.get("tuple"), list):
                yield from walk(node["tuple"], path)
    try:
        for path in walk(json.loads(meta.get("dtorch", "null")), "obj"):
            return f"{path} (stored as {name!r})"
    except Exception:    # a label is best effort; the mismatch is the news
        pass
    return repr(name)


# --------------------------------------------------------------- decode --

_ONE_KEY = {"ndarray": str, "tuple": list, "dict": list, "odict": list,
            "float": str, "dtype": str, "device": str}


class _Decoder:
    """Rebuilds the object from the JSON tree; every entry is checked, so
    crafted metadata fails with a SerializationError naming the file."""

    def __init__(self, arrays, where, map_location):
        self.arrays = arrays
        self.where = where
        self.map_location = map_location
        self.done = {}
        self.devices = {"cpu"}      # saved device strings checked valid

    def __call__(self, node):
        if node is None or isinstance(node, (bool, int, float, str)):
            return node
        if isinstance(node, list):
            return [self(v) for v in node]
        if not isinstance(node, dict) or len(node) == 0:
            raise self.bad(f"unexpected entry {_short(node)}")
        if "tensor" in node:
            return self.tensor(node)
        (kind, val), = node.items() if len(node) == 1 else [(None, None)]
        if kind not in _ONE_KEY or not isinstance(val, _ONE_KEY[kind]):
            raise self.bad(f"unexpected entry {_short(node)}")
        if kind == "ndarray":
            return self.array(val)
        if kind == "tuple":
            return tuple(self(v) for v in val)
        if kind in ("dict", "odict"):
            out = dict() if kind == "dict" else collections.OrderedDict()
            for pair in val:
                if not (isinstance(pair, list) and len(pair) == 2):
                    raise self.bad(f"a {kind} item {_short(pair)} is not a "
                                   "[key, value] pair")
                k = _hashable(self(pair[0]))
                try:
                    hash(k)
                except TypeError:
                    raise self.bad(f"unhashable dict key {_short(pair[0])}"
                                   ) from None
                out[k] = self(pair[1])
            return out
        try:
            if kind == "float":
                return float(val)
            if kind == "dtype":
                return B.to_dtype(val)
            return B.device(val)
        except (TypeError, ValueError, KeyError, RuntimeError):
            raise self.bad(f"bad {kind} {val!r}") from None

    def bad(self, what):
        return SerializationError(
            f"{self.where}: corrupt dtorch structure metadata: {what}")

    def array(self, name):
        if not isinstance(name, str) or name not in self.arrays:
            raise self.bad(f"it names tensor {_short(name)}, which the file "
                           "does not hold")
        return self.arrays[name]

    def tensor(self, node):
        name = node["tensor"]
        saved = node.get("device", "cpu")
        grad = node.get("requires_grad", False)
        if not (len(node) == 1 or (
                set(node) <= {"tensor", "device", "requires_grad"}
                and isinstance(saved, str) and isinstance(grad, bool))):
            raise self.bad(f"unexpected entry {_short(node)}")
        a = self.array(name)
        if name in self.done:     # the same tensor saved under two keys
            return self.done[name]
        if a.dtype not in B._BY_NP:
            # U16/U32/U64: PyTorch 2.13 has these dtypes (with few ops),
            # dtorch does not
            raise SerializationError(
                f"{self.where}: tensor {name!r} has dtype {_CODES[a.dtype]} "
                f"({a.dtype}), which dtorch does not have (PyTorch loads it "
                f"as torch.{a.dtype}; dtorch has "
                f"{', '.join(B._BY_NAME)}); convert it where it is written, "
                "e.g. to int32 or int64")
        if saved not in self.devices:
            try:
                B.device(saved)
            except (TypeError, ValueError, RuntimeError):
                raise self.bad(f"bad device {saved!r}") from None
            self.devices.add(saved)
        if grad and a.dtype.kind not in "fc" and not B.is_bfloat16_np(a.dtype):
            raise self.bad(f"tensor {name!r} of dtype {a.dtype} cannot "
                           "require grad")
        t = _place(Tensor._wrap(a), saved, self.map_location)
        if grad:
            t.requires_grad_(True)
        self.done[name] = t
        return t


def _hashable(k):
    return tuple(_hashable(v) for v in k) if isinstance(k, list) else k


def _place(t, saved, map_location):
    """Move a loaded CPU tensor where ``map_location`` says (torch's
    forms: None = the saved device, a device/str, a {from: to} dict, or a
    callable ``f(tensor, saved_location)``)."""
    if map_location is None and saved == "cpu":
        return t
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
