"""Hostile PyTorch-format files against dtorch.load(weights_only=True):
code-execution gadgets (os.system, eval, exec, getattr, open, __import__
through __reduce__, nested and inside a tensor's persistent id, in the zip
and the legacy format), path traversal in the zip, storages past the end
of the file, huge declared sizes, nesting bombs. None runs code (each
gadget would create a marker file, and does so under weights_only=False),
none allocates more than the file's size, each error names the file and
the reason."""
import builtins
import importlib
import io
import os
import pickle
import struct
import tracemalloc
import zipfile

import pytest

import dtorch
from dtorch.serialization import SerializationError
from dtorch.serialization import _torch_format as TF
from dtorch.serialization import _weights_only as W


class Gadget:
    """Pickles as ``func(*args)``: what an attacker's file calls."""

    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args

    def __call__(self, *args):     # (pickle wants a callable; unpickling
        raise AssertionError      # calls the function this stands for)


class PidPickler(pickle.Pickler):
    """Puts a gadget inside a storage's persistent id."""

    def __init__(self, f, gadget):
        super().__init__(f, protocol=2)
        self.gadget = gadget

    def persistent_id(self, obj):
        if isinstance(obj, Marker):
            return ("storage", self.gadget, "0", "cpu", 1)
        return None


class Marker:
    pass


def _zip(pkl, extra=(), prefix="archive"):
    b = io.BytesIO()
    with zipfile.ZipFile(b, "w", zipfile.ZIP_STORED) as z:
        z.writestr(f"{prefix}/data.pkl", pkl)
        z.writestr(f"{prefix}/byteorder", "little")
        z.writestr(f"{prefix}/version", "3\n")
        for name, data in extra:
            z.writestr(name, data)
    return b.getvalue()


def _legacy(pkl, tail=b""):
    head = b"".join(pickle.dumps(v, protocol=2) for v in (
        TF.MAGIC, 1001, {"protocol_version": 1001, "little_endian": True,
                         "type_sizes": {"short": 2, "int": 4, "long": 4}}))
    return head + pkl + tail


def _gadgets(marker):
    """(name, object whose unpickling creates ``marker``)."""
    cmd = f"touch {marker}"
    code = f"open({str(marker)!r}, 'w').close()"
    return [
        ("os.system", Gadget(os.system, cmd)),
        ("eval", Gadget(builtins.eval, code)),
        ("exec", Gadget(builtins.exec, code)),
        ("open", Gadget(builtins.open, str(marker), "w")),
        ("getattr", Gadget(Gadget(builtins.getattr, Gadget(
            importlib.import_module, "os"), "system"), cmd)),
        ("__import__", Gadget(Gadget(builtins.getattr, Gadget(
            builtins.__import__, "os"), "system"), cmd)),
    ]


def _hostile_files(tmp_path, marker):
    """{name: bytes} of files whose gadgets would create ``marker``."""
    files = {}
    for name, g in _gadgets(marker):
        files[f"zip-{name}"] = _zip(pickle.dumps({"w": g}, protocol=2))
        nested = {"model": {"layers": [1, (2, {"deep": [g]})]}}
        files[f"zip-nested-{name}"] = _zip(pickle.dumps(nested, protocol=2))
        files[f"legacy-{name}"] = _legacy(pickle.dumps([g], protocol=2))
        b = io.BytesIO()
        PidPickler(b, g).dump({"t": Marker()})
        files[f"pid-{name}"] = _zip(b.getvalue())
        # protocol 4: STACK_GLOBAL and frames
        files[f"zip-p4-{name}"] = _zip(pickle.dumps([g], protocol=4))
    return files


def _load_bounded(path):
    """dtorch.load's error, and the peak memory it allocated."""
    tracemalloc.start()
    try:
        with pytest.raises(SerializationError) as e:
            dtorch.load(path)
        return e.value, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _all_refused(tmp_path, cases):
    """Load each file: each fails naming itself, within the file's size
    (plus 1 MiB for the interpreter); {name: message}."""
    msgs = {}
    for name, data in cases.items():
        path = tmp_path / f"{name}.pt"
        path.write_bytes(data)
        err, peak = _load_bounded(path)
        msgs[name] = str(err)
        assert str(path) in msgs[name], (name, err)
        assert peak < len(data) + (1 << 20), (name, peak)
    return msgs


def test_gadgets_never_run(tmp_path):
    marker = tmp_path / "PWNED"
    for name, msg in _all_refused(tmp_path, _hostile_files(
            tmp_path, marker)).items():
        assert "was not an allowed global" in msg or "blocked" in msg, \
            (name, msg)
    assert not marker.exists()
    # the corpus is live: the same files do run code when allowed to
    for name in ("zip-open", "legacy-eval", "pid-exec"):
        try:
            out = dtorch.load(tmp_path / f"{name}.pt", weights_only=False)
            del out
        except Exception:       # what follows the gadget may not parse
            pass
        assert marker.exists(), name
        marker.unlink()


def test_allowed_functions_are_not_gadgets(tmp_path):
    # an allowed global called with hostile arguments, or the result of an
    # allowed call used as a function
    cases = {
        "codec": _zip(b"\x80\x02c_codecs\nencode\nX\x03\x00\x00\x00abcX"
                      b"\x05\x00\x00\x00rot13\x86R."),
        "call-result": _zip(b"\x80\x02ccollections\nOrderedDict\n)R)R."),
        "rebuild-no-storage": _zip(
            b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n(K\x01K\x00)),"
            b"\x89ccollections\nOrderedDict\n)RtR."),
        "build-on-dict": _zip(b"\x80\x02}}b."),
        "append-to-tuple": _zip(b"\x80\x02)K\x01a."),
        # allowed constructors asked for a size: 1 TB, not from the file
        "bytearray-count": _zip(b"\x80\x02c__builtin__\nbytearray\n\x8a"
                                b"\x06\x00\x00\x00\x00\x00\x01\x85R."),
        "bytes-count": _zip(b"\x80\x02c__builtin__\nbytes\n\x8a"
                            b"\x06\x00\x00\x00\x00\x00\x01\x85R."),
        "tensor-count": _zip(b"\x80\x02ctorch\nTensor\n\x8a"
                             b"\x06\x00\x00\x00\x00\x00\x01\x85R."),
    }
    _all_refused(tmp_path, cases)


def _storage_pickle(numel, key="0", pkl_dtype=b"FloatStorage"):
    """A tensor of ``numel`` elements of storage ``key``."""
    return (b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n((X\x07\x00\x00\x00"
            b"storagectorch\n" + pkl_dtype + b"\nX" + struct.pack(
                "<I", len(key)) + key.encode() + b"X\x03\x00\x00\x00cpu"
            b"\x8a\x08" + struct.pack("<q", numel) + b"tQK\x00\x8a\x08"
            + struct.pack("<q", numel) + b"\x85K\x01\x85\x89ccollections\n"
            b"OrderedDict\n)RtR.")


def test_sizes_past_the_file_allocate_nothing(tmp_path):
    huge = 1 << 40
    ok = _zip(_storage_pickle(4), [("archive/data/0", b"\0" * 16)])
    (tmp_path / "ok.pt").write_bytes(ok)
    assert dtorch.load(tmp_path / "ok.pt").shape == (4,)   # the template
    cases = {
        "storage-past-entry": _zip(_storage_pickle(huge),
                                   [("archive/data/0", b"\0" * 16)]),
        "view-past-storage": _zip(_storage_pickle(4).replace(
            b"\x8a\x08" + struct.pack("<q", 4) + b"\x85",
            b"\x8a\x08" + struct.pack("<q", huge) + b"\x85"),
            [("archive/data/0", b"\0" * 16)]),
        "missing-storage": _zip(_storage_pickle(4)),
        "huge-string": _zip(b"\x80\x02\x8d" + struct.pack("<Q", huge)
                            + b"abc"),
        "huge-bytes": _zip(b"\x80\x02B" + struct.pack("<I", 2 ** 31)
                           + b"abc"),
        "huge-long": _zip(b"\x80\x02\x8b" + struct.pack("<i", 2 ** 30)),
        "legacy-huge-storage": _legacy(
            _storage_pickle(huge, "7"),
            pickle.dumps(["7"], protocol=2) + struct.pack("<q", huge)
            + b"\0" * 64),
        "legacy-truncated": _legacy(
            _storage_pickle(4, "7"),
            pickle.dumps(["7"], protocol=2) + struct.pack("<q", 4) + b"\0"),
        "truncated-zip": ok[:len(ok) // 2],
        "bad-key": _zip(_storage_pickle(1, "../../etc/passwd")),
    }
    # an entry whose central directory claims more bytes than the file has
    cut = bytearray(ok)
    for off in _central_entries(ok):
        if ok[off + 46:off + 46 + 14] == b"archive/data/0":
            cut[off + 20:off + 28] = struct.pack("<II", 1 << 30, 1 << 30)
    cases["entry-past-file"] = bytes(cut)
    _all_refused(tmp_path, cases)


def _central_entries(data):
    """Offsets of the central directory entries of a small zip."""
    out, i = [], data.find(b"PK\x01\x02")
    while i >= 0:
        out.append(i)
        i = data.find(b"PK\x01\x02", i + 4)
    return out


def test_path_traversal_and_compressed_entries(tmp_path):
    good = _storage_pickle(4)
    cases = {
        "traversal": _zip(good, [("archive/../../evil", b"x"),
                                 ("archive/data/0", b"\0" * 16)]),
        "absolute": _zip(good, [("/etc/evil", b"x"),
                                ("archive/data/0", b"\0" * 16)]),
    }
    b = io.BytesIO()
    with zipfile.ZipFile(b, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("archive/data.pkl", good)
        z.writestr("archive/data/0", b"\0" * (1 << 20))   # a small bomb
    cases["deflated"] = b.getvalue()
    for name, msg in _all_refused(tmp_path, cases).items():
        assert ("outside the archive" in msg if name != "deflated"
                else "compressed" in msg), msg
    assert not (tmp_path.parent / "evil").exists()


def test_nesting_and_object_bombs(tmp_path, monkeypatch):
    depth = 3000            # the limit is 1000
    cases = {
        "deep-lists": b"\x80\x02" + b"]" * depth + b"a" * (depth - 1) + b".",
        "deep-tuples": b"\x80\x02)" + b"\x85" * depth + b".",
        # {0: {0: ...}}: EMPTY_DICT, key 0, the inner dict, SETITEM
        "deep-dicts": b"\x80\x02" + b"}K\x00" * depth + b"N" + b"s" * depth
                      + b".",
    }
    for name, pkl in cases.items():
        path = tmp_path / f"{name}.pt"
        path.write_bytes(_zip(pkl))
        err, peak = _load_bounded(path)
        assert str(path) in str(err) and "nest deeper" in str(err), err
        # Python objects: ~50 bytes per one-byte opcode, never a declared
        # size; at most max(16 x the file, 64 MiB) (the opcode budget)
        assert peak < 64 << 20, (name, peak)
    # a flat object bomb past the budget stops there
    monkeypatch.setattr(W, "_OBJECT", 64 << 10)   # a budget of 1024 ops
    (tmp_path / "flat.pt").write_bytes(_zip(b"\x80\x02]" + b"]a" * 2000
                                            + b"."))
    err, _ = _load_bounded(tmp_path / "flat.pt")
    assert "object bomb" in str(err) and "flat.pt" in str(err), err
    # a memo fan-out (10 levels of 10 references: 10**10 leaves if it were
    # expanded) is a small legal object: it loads without expanding
    pkl = b"\x80\x02]q\x00" + b"".join(
        b"(" + (b"h" + bytes([i])) * 10 + b"lq" + bytes([i + 1])
        for i in range(10)) + b"."
    path = tmp_path / "fanout.pt"
    path.write_bytes(_zip(pkl))
    tracemalloc.start()
    try:
        out = dtorch.load(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(out) == 10 and out[0] is out[9]
    assert peak < 1 << 20
