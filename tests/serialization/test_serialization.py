"""dtorch.save / dtorch.load: round trips, safetensors format, clear errors
for bad files, atomic writes, map_location."""
import collections
import contextlib
import errno
import io
import json
import os
import stat
import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest
import safetensors.numpy
import xxhash

import dtorch
from dtorch.serialization import ChecksumError, SerializationError

HCRC = "dtorch.header_crc32"
SUMS = "dtorch.tensor_xxh3_64"


def _same(a, b):
    assert type(a) is type(b), (a, b)
    if isinstance(a, dtorch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.requires_grad == b.requires_grad
        np.testing.assert_array_equal(a.detach().numpy(),
                                      b.detach().numpy())
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    elif isinstance(a, float) and np.isnan(a):
        assert np.isnan(b)
    else:
        assert a == b


def test_round_trip_nested(tmp_path):
    obj = {
        "model": collections.OrderedDict(
            [("fc.weight", dtorch.randn(3, 2)),
             ("fc.bias", dtorch.zeros(3))]),
        "optimizer": {"state": {0: {"step": dtorch.tensor(5.0),
                                    "exp_avg": dtorch.ones(3, 2)}},
                      "param_groups": [{"lr": 0.1, "betas": (0.9, 0.999),
                                        "params": [0, 1], "amsgrad": False,
                                        "name": None}]},
        "epoch": 7,
        "best": float("inf"),
        "nan": float("nan"),
        "tags": ["a", "b", ("c", 1)],
        "ints": dtorch.arange(5),
        "bools": dtorch.tensor([True, False]),
        "half": dtorch.randn(4).half(),
        "f64": dtorch.randn(2, dtype=dtorch.float64),
        "empty": dtorch.zeros(0, 3),
        "scalar": dtorch.tensor(3),
        "leaf": dtorch.randn(2, requires_grad=True),
        (1, 2): "tuple key",
        2.5: "float key",
        None: "none key",
    }
    path = tmp_path / "obj.pt"
    dtorch.save(obj, path)
    _same(obj, dtorch.load(path))
    _same(obj, dtorch.load(str(path), weights_only=False))


def test_bfloat16_round_trips_bit_exact(tmp_path):
    x = dtorch.randn(5, 7).bfloat16()
    dtorch.save({"x": x}, tmp_path / "b.pt")
    y = dtorch.load(tmp_path / "b.pt")["x"]
    assert y.dtype == dtorch.bfloat16
    assert x.numpy().view(np.uint16).tolist() == \
        y.numpy().view(np.uint16).tolist()


def test_views_and_shared_tensors(tmp_path):
    base = dtorch.arange(12.0).reshape(3, 4)
    view = base.t()                  # not contiguous
    obj = {"a": base, "b": base, "v": view}
    dtorch.save(obj, tmp_path / "v.pt")
    out = dtorch.load(tmp_path / "v.pt")
    assert out["a"] is out["b"]      # one tensor saved under two keys
    np.testing.assert_array_equal(out["v"].numpy(), view.numpy())
    out["a"].add_(1)                 # loaded tensors are writable
    assert out["a"].sum().item() == base.sum().item() + 12


def test_file_objects_and_numpy_arrays():
    buf = io.BytesIO()
    obj = {"arr": np.arange(6, dtype=np.int32).reshape(2, 3),
           "np_scalar": np.float32(1.5), "dtype": dtorch.float16,
           "device": dtorch.device("cpu")}
    dtorch.save(obj, buf)
    buf.seek(0)
    out = dtorch.load(buf)
    np.testing.assert_array_equal(out["arr"], obj["arr"])
    assert out["arr"].dtype == np.int32
    assert out["np_scalar"] == 1.5 and out["dtype"] is dtorch.float16
    assert out["device"] == dtorch.device("cpu")


def test_file_is_plain_safetensors(tmp_path):
    path = tmp_path / "sd.pt"
    w = dtorch.randn(2, 3)
    dtorch.save({"w": w, "step": 3}, path)
    with open(path, "rb") as f:
        arrays = safetensors.numpy.load(f.read())
    assert list(arrays) == ["w"]
    np.testing.assert_array_equal(arrays["w"], w.numpy())


def test_foreign_safetensors_loads_as_dict(tmp_path):
    path = tmp_path / "hf.safetensors"
    safetensors.numpy.save_file({"emb": np.ones((2, 2), np.float32),
                                 "b": np.zeros(3, np.int64)}, str(path))
    out = dtorch.load(path)
    assert sorted(out) == ["b", "emb"]
    assert out["emb"].dtype == dtorch.float32
    assert out["b"].dtype == dtorch.int64


def test_unsupported_objects_are_refused(tmp_path):
    class Foo:
        pass
    with pytest.raises(SerializationError, match=r"obj\['x'\]\[1\].*Foo"):
        dtorch.save({"x": [1, Foo()]}, tmp_path / "f.pt")
    assert not os.listdir(tmp_path)          # nothing written, no temp


def test_map_location(tmp_path):
    path = tmp_path / "m.pt"
    dtorch.save({"w": dtorch.ones(2)}, path)
    for loc in ("cpu", dtorch.device("cpu"), {"cpu": "cpu"}):
        assert dtorch.load(path, map_location=loc)["w"].device.type == "cpu"
    seen = []

    def fn(t, location):
        seen.append(location)
        return t * 2
    assert dtorch.load(path, map_location=fn)["w"].tolist() == [2.0, 2.0]
    assert seen == ["cpu"]


def test_cuda_file_on_cpu_machine(tmp_path):
    if dtorch.cuda.is_available():
        pytest.skip("needs a machine without CUDA")
    path = tmp_path / "gpu.pt"
    dtorch.save({"x": dtorch.ones(2)}, path)
    # as if saved from cuda:0
    _rewrite_header(path, lambda h: h["__metadata__"].update(dtorch=(
        h["__metadata__"]["dtorch"].replace(
            '{"tensor": "x"}', '{"tensor": "x", "device": "cuda:0"}'))))
    with pytest.raises(RuntimeError, match="map_location=dtorch.device"):
        dtorch.load(path)
    assert dtorch.load(path, map_location="cpu")["x"].tolist() == [1, 1]


def test_cuda_round_trip(tmp_path):
    if not dtorch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    x = dtorch.randn(3, device="cuda")
    dtorch.save({"x": x}, tmp_path / "g.pt")
    assert dtorch.load(tmp_path / "g.pt")["x"].device.type == "cuda"
    y = dtorch.load(tmp_path / "g.pt", map_location="cpu")["x"]
    assert y.device.type == "cpu"
    np.testing.assert_array_equal(y.numpy(), x.cpu().numpy())
    z = dtorch.load(tmp_path / "g.pt", map_location={"cuda:0": "cpu"})["x"]
    assert z.device.type == "cpu"


# -------------------------------------------------------- tensor names --

def test_state_dict_keys_are_the_safetensors_names(tmp_path):
    # other safetensors tools read a dtorch checkpoint by name
    model = dtorch.nn.Sequential(dtorch.nn.Linear(3, 4), dtorch.nn.ReLU(),
                                 dtorch.nn.Linear(4, 2))
    sd = model.state_dict()
    dtorch.save(sd, tmp_path / "sd.pt")
    arrays = safetensors.numpy.load_file(str(tmp_path / "sd.pt"))
    assert sorted(arrays) == sorted(sd) == ["0.bias", "0.weight",
                                            "2.bias", "2.weight"]
    for k, v in sd.items():
        np.testing.assert_array_equal(arrays[k], v.numpy())
    # nested: dotted paths; optimizer state's int keys in decimal
    opt = dtorch.optim.Adam(model.parameters(), lr=0.1)
    model(dtorch.randn(5, 3)).sum().backward()
    opt.step()
    dtorch.save({"model": sd, "optimizer": opt.state_dict(), "epoch": 1,
                 "hist": [dtorch.ones(2)]}, tmp_path / "ck.pt")
    arrays = safetensors.numpy.load_file(str(tmp_path / "ck.pt"))
    assert sorted(arrays) == sorted(
        [f"model.{k}" for k in sd] + ["hist.0"]
        + [f"optimizer.state.{i}.{s}" for i in range(4)
           for s in ("step", "exp_avg", "exp_avg_sq")])
    np.testing.assert_array_equal(arrays["optimizer.state.1.exp_avg"],
                                  opt.state_dict()["state"][1]["exp_avg"])
    _same(sd, dtorch.load(tmp_path / "ck.pt")["model"])


def test_ambiguous_keys_get_unique_names_and_round_trip(tmp_path):
    g = np.random.default_rng(3)

    def t(n):
        return dtorch.from_numpy(g.standard_normal(n))
    shared = t(2)
    obj = {"a.b": t(1), "a": {"b": t(2), "b#1": t(3)}, "a.b#1": t(4),
           0: t(5), "0": t(6), "__metadata__": t(7), "": t(8),
           "x": shared, "y": [shared, t(9)], "s\ud800": t(10),
           None: t(11), (1, "2"): t(12), True: t(13)}
    path = tmp_path / "amb.pt"
    dtorch.save(obj, path)
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(n))
    tree = json.loads(header["__metadata__"]["dtorch"])
    where = {json.dumps(k): v for k, v in tree["dict"]}
    names = {k: v.get("tensor") or v.get("dict")
             for k, v in where.items() if isinstance(v, dict)}
    # the first of each ambiguous pair keeps the plain dotted name
    assert names['"a.b"'] == "a.b"
    assert dict(names['"a"']) == {"b": {"tensor": "a.b#1"},
                                  "b#1": {"tensor": "a.b#1#1"}}
    assert names['"a.b#1"'] == "a.b#1#2"
    assert names["0"] == "0" and names['"0"'] == "0#1"
    assert names['"__metadata__"'] == "__metadata__#1"
    assert names['""'] == "#1"
    assert names['"x"'] == "x"                  # shared: its first path
    assert where['"y"'] == [{"tensor": "x"}, {"tensor": "y.1"}]
    assert names['"s\\ud800"'] == "s\\ud800#1"  # not UTF-8: escaped
    assert names["null"] == "None" and names["true"] == "True"
    assert names['{"tuple": [1, "2"]}'] == "(1, '2')"
    arrays = safetensors.numpy.load_file(str(path))   # the Rust parser
    assert len(arrays) == 14 and "__metadata__" not in arrays
    np.testing.assert_array_equal(arrays["a.b#1#2"], obj["a.b#1"].numpy())
    out = dtorch.load(path)
    _same(obj, out)
    assert out["x"] is out["y"][0]


def test_bare_tensor_and_list_names(tmp_path):
    x = dtorch.arange(3.0)
    dtorch.save(x, tmp_path / "t.pt")
    assert list(safetensors.numpy.load_file(str(tmp_path / "t.pt"))) == \
        ["#1"]
    _same(x, dtorch.load(tmp_path / "t.pt"))
    dtorch.save([x, (x * 2, {"k": x * 3})], tmp_path / "l.pt")
    assert sorted(safetensors.numpy.load_file(str(tmp_path / "l.pt"))) == \
        ["0", "1.0", "1.1.k"]


# ------------------------------------------------------------- errors --

@pytest.fixture
def good(tmp_path):
    path = tmp_path / "good.pt"
    dtorch.save({"w": dtorch.randn(16, 16), "b": dtorch.zeros(16)}, path)
    return path


def test_truncated_files(good, tmp_path):
    data = good.read_bytes()
    for cut in (0, 5, 8, 40, len(data) - 1):
        bad = tmp_path / f"cut{cut}.pt"
        bad.write_bytes(data[:cut])
        with pytest.raises(SerializationError, match="cut%d.pt" % cut) as e:
            dtorch.load(bad)
        assert isinstance(e.value, RuntimeError)
        assert "truncated" in str(e.value) or "not JSON" in str(e.value)


def test_garbage_and_foreign_files(tmp_path):
    cases = {
        "garbage.pt": os.urandom(4096),
        "text.pt": b"hello, this is not a checkpoint at all" * 10,
        "zip.pt": b"PK\x03\x04" + b"\x00" * 100,
        "pickle.pt": b"\x80\x04\x95" + b"\x00" * 100,
        "json.pt": struct.pack("<Q", 2) + b"[]",
    }
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(SerializationError, match=name):
            dtorch.load(tmp_path / name)
    with pytest.raises(SerializationError, match="zip archive"):
        dtorch.load(tmp_path / "zip.pt")
    with pytest.raises(SerializationError, match="pickle"):
        dtorch.load(tmp_path / "pickle.pt")


def _header_bytes(header, seal=True):
    """Header bytes as dtorch writes them; ``seal``: with a header
    checksum that matches (the raw bytes' CRC-32 with its own digits read
    as zeros), so that a test's edit reaches the checks behind it."""
    meta = header.get("__metadata__")
    sealed = seal and isinstance(meta, dict) and isinstance(meta.get(HCRC),
                                                            str)
    if sealed:
        meta[HCRC] = "00000000"
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    if sealed:
        at = b'"%s":"00000000"' % HCRC.encode()
        crc = b'"%s":"%08x"' % (HCRC.encode(), zlib.crc32(raw))
        raw = raw.replace(at, crc)
    return struct.pack("<Q", len(raw)) + raw


def _split(data):
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + n]), data[8 + n:]


def _rewrite_header(path, edit, seal=True):
    header, body = _split(path.read_bytes())
    edit(header)
    path.write_bytes(_header_bytes(header, seal) + body)


def test_offsets_out_of_bounds(good):
    def grow(h):
        name = next(k for k in h if k != "__metadata__")
        h[name]["data_offsets"][1] += 10 ** 6
    _rewrite_header(good, grow)
    with pytest.raises(SerializationError, match="good.pt.*spans bytes"):
        dtorch.load(good)


def test_shape_disagrees_with_offsets(good):
    def reshape(h):
        name = next(k for k in h if k != "__metadata__")
        h[name]["shape"] = [3]
    _rewrite_header(good, reshape)
    with pytest.raises(SerializationError, match="needs"):
        dtorch.load(good)


def test_corrupt_structure_metadata(good):
    def breaks(h):
        h["__metadata__"]["dtorch"] = '{"tensor": "99"}'
    _rewrite_header(good, breaks)
    with pytest.raises(SerializationError, match="does not hold"):
        dtorch.load(good)


def test_load_never_runs_code(tmp_path):
    # a structure entry naming a callable is just rejected data
    path = tmp_path / "evil.pt"
    dtorch.save({"x": 1}, path)
    _rewrite_header(path, lambda h: h["__metadata__"].update(
        dtorch='{"__reduce__": ["os.system", ["echo hacked"]]}'))
    with pytest.raises(SerializationError, match="unexpected entry"):
        dtorch.load(path)


def test_missing_file():
    with pytest.raises(FileNotFoundError, match="nope.pt"):
        dtorch.load("/nonexistent/nope.pt")


# -------------------------------------------------------- atomic write --

def test_failed_save_keeps_old_file(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.pt"
    dtorch.save({"v": dtorch.ones(3)}, path)
    before = path.read_bytes()

    def crash(*args, **kwargs):
        raise OSError("disk full")
    monkeypatch.setattr(dtorch.serialization._safetensors, "_write", crash)
    with pytest.raises(OSError, match="disk full"):
        dtorch.save({"v": dtorch.zeros(3)}, path)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["ckpt.pt"]     # temp file removed
    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError):
        dtorch.save({"v": dtorch.zeros(3)}, path)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["ckpt.pt"]


def test_overwrite(tmp_path):
    path = tmp_path / "c.pt"
    dtorch.save({"v": 1}, path)
    dtorch.save({"v": 2}, path)
    assert dtorch.load(path) == {"v": 2}


# ------------------------------------------- header length is not a magic --

def _obj_with_header_length(match, bufsize=600):
    """A saved object whose 8-byte header length ``n`` has ``match(n)``:
    grow a string in the structure until the length hits."""
    for k in range(0, 8 * bufsize, 1):
        obj = {"w": dtorch.arange(6.0).reshape(2, 3), "pad": "x" * k,
               "state": {0: {"step": dtorch.tensor(3.0)}}}
        buf = io.BytesIO()
        dtorch.save(obj, buf)
        (n,) = struct.unpack("<Q", buf.getvalue()[:8])
        if match(n):
            return obj, buf.getvalue()
    raise AssertionError("no padding hits the header length")


@pytest.mark.parametrize("what,match", [
    ("low byte 0x80 (pickle's first byte)", lambda n: n & 0xFF == 0x80),
    ("low half 0x4B50 ('PK', zip's)", lambda n: n & 0xFFFF == 0x4B50),
])
def test_header_lengths_that_look_like_magic_numbers_load(tmp_path, what,
                                                          match):
    obj, data = _obj_with_header_length(match, 3000)
    _same(obj, dtorch.load(io.BytesIO(data)))
    path = tmp_path / "ckpt.pt"
    path.write_bytes(data)
    _same(obj, dtorch.load(path))
    _same(obj, dtorch.load(path, mmap=True))


def test_foreign_safetensors_with_magic_looking_length(tmp_path):
    # a file from another tool, whose header length starts with 0x80
    for k in range(400):
        data = safetensors.numpy.save({"emb": np.ones(3, np.float32)},
                                      metadata={"note": "x" * k})
        if data[0] == 0x80:
            break
    else:
        raise AssertionError("no metadata length gives a 0x80 low byte")
    (tmp_path / "hf.safetensors").write_bytes(data)
    out = dtorch.load(tmp_path / "hf.safetensors")
    assert out["emb"].tolist() == [1.0, 1.0, 1.0]


# ------------------------------------------------------------ checksums --

def _small_file(tmp_path):
    path = tmp_path / "small.pt"
    obj = {"model": {"fc.weight": dtorch.arange(6.0).reshape(2, 3),
                     "fc.bias": dtorch.tensor([1, 2], dtype=dtorch.int16)},
           "step": 3}
    dtorch.save(obj, path)
    return path, obj


def test_flipped_data_byte_names_file_and_tensor(tmp_path):
    path, obj = _small_file(tmp_path)
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    # which saved tensor sits where in the data section
    labels = {"F32": r"obj\['model'\]\['fc.weight'\]",
              "I16": r"obj\['model'\]\['fc.bias'\]"}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        for pos in range(begin, end):
            bad = bytearray(data)
            bad[8 + n + pos] ^= 0x10
            path.write_bytes(bytes(bad))
            with pytest.raises(ChecksumError, match=r"small\.pt.*checksum "
                               r"mismatch in tensor " + labels[info["dtype"]]):
                dtorch.load(path)


def test_every_single_byte_flip_is_caught(tmp_path):
    """No flipped byte anywhere in a file (length, header, data) loads:
    each fails with a SerializationError that names the file."""
    path, obj = _small_file(tmp_path)
    data = path.read_bytes()
    for pos in range(len(data)):
        for flip in (0x01, 0x80):
            bad = bytearray(data)
            bad[pos] ^= flip
            path.write_bytes(bytes(bad))
            with pytest.raises(SerializationError, match="small.pt"):
                dtorch.load(path)
    path.write_bytes(data)
    _same(obj, dtorch.load(path))


def test_header_checksum_catches_altered_names(tmp_path):
    path, obj = _small_file(tmp_path)
    _rewrite_header(path, lambda h: h["__metadata__"].update(
        dtorch=h["__metadata__"]["dtorch"].replace("fc.bias", "fc.bias2")),
        seal=False)
    with pytest.raises(ChecksumError, match="small.pt.*header checksum"):
        dtorch.load(path)


@pytest.mark.parametrize("to", ["path", "file object"])
def test_tensor_checksum_definition(tmp_path, to):
    """The stored checksums, computed here independently: each tensor's
    bytes in the file hashed with xxhash's XXH3 64-bit (seed 0), 16 hex
    digits as ``xxhsum -H3`` prints them, under dtorch.tensor_xxh3_64;
    the header's CRC-32 with its own 8 digits read as zeros. Sizes span
    the 1 MiB pieces a save hashes and writes (one, several, a ragged
    last one), and empty tensors."""
    g = np.random.default_rng(0)
    obj = {"x": g.standard_normal(1000), "e": np.zeros((0, 3), np.float32),
           "big": g.standard_normal(3 * 2 ** 17 + 5),       # 3 MiB + 40 B
           "mib": g.integers(0, 256, 2 ** 20, np.uint8),
           "n": {"h": dtorch.arange(7).half()}}
    path = tmp_path / "c.pt"
    if to == "path":
        dtorch.save(obj, path)
    else:
        with open(path, "wb") as fh:
            dtorch.save(obj, fh)
    data = path.read_bytes()
    header, body = _split(data)
    meta = header.pop("__metadata__")
    stored = json.loads(meta["dtorch.tensor_xxh3_64"])
    want = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        want[name] = xxhash.xxh3_64(body[begin:end], seed=0).hexdigest()
    assert stored == want
    assert sorted(want) == ["big", "e", "mib", "n.h", "x"]
    assert want["x"] == xxhash.xxh3_64_hexdigest(obj["x"].tobytes())
    assert want["e"] == "2d06800538d394c2"      # XXH3-64 of no bytes
    (n,) = struct.unpack("<Q", data[:8])
    raw = data[8:8 + n]
    at = b'"%s":"%s"' % (HCRC.encode(), meta[HCRC].encode())
    assert raw.count(at) == 1
    zeroed = raw.replace(at, b'"%s":"00000000"' % HCRC.encode())
    assert meta[HCRC] == "%08x" % zlib.crc32(zeroed)
    out = dtorch.load(path)
    for k in ("x", "e", "big", "mib"):
        assert out[k].dtype == obj[k].dtype
        np.testing.assert_array_equal(out[k], obj[k])
    _same(obj["n"], out["n"])


def test_files_without_checksums_load(tmp_path):
    # as dtorch wrote them before checksums: safetensors + structure
    w = np.arange(4, dtype=np.float32)
    tree = {"dict": [["w", {"tensor": "0"}], ["epoch", 2]]}
    safetensors.numpy.save_file(
        {"0": w}, str(tmp_path / "old.pt"),
        metadata={"format": "dtorch.save/1", "dtorch": json.dumps(tree)})
    out = dtorch.load(tmp_path / "old.pt")
    assert out["epoch"] == 2 and out["w"].tolist() == [0, 1, 2, 3]


def test_checksums_on_large_tensors_and_all_io_paths(tmp_path):
    # several 1 MiB pieces and a ragged last one, every dtype width, a
    # path (data hashed and written piece by piece, header last) and a
    # file object (hashed first, written front to back): same bytes
    g = np.random.default_rng(1)
    obj = {"tiny": dtorch.from_numpy(g.standard_normal(3)),
           "big": dtorch.from_numpy(g.standard_normal(300_001)),
           "half": dtorch.from_numpy(g.standard_normal(1001)).half(),
           "flags": dtorch.from_numpy(g.random(77) > 0.5),
           # starts at an odd offset: its words are read unaligned
           "bytes": dtorch.from_numpy(g.integers(0, 256, 9001, np.uint8))}
    path = tmp_path / "big.pt"
    dtorch.save(obj, path)
    buf = io.BytesIO()
    dtorch.save(obj, buf)
    assert buf.getvalue() == path.read_bytes()     # same bytes both ways
    for out in (dtorch.load(path), dtorch.load(path, mmap=True),
                dtorch.load(io.BytesIO(buf.getvalue()))):
        _same(obj, out)
    data = bytearray(path.read_bytes())
    header, body = _split(bytes(data))
    begin, end = header["big"]["data_offsets"]
    data[len(data) - len(body) + end - 5000] ^= 4
    path.write_bytes(bytes(data))
    for kw in ({}, {"mmap": True}):
        with pytest.raises(ChecksumError, match=r"big.pt.*obj\['big'\]"):
            dtorch.load(path, **kw)


# ------------------------------------------------ malformed files: fuzz --

def _mutations():
    """(label, edit of the parsed header) for every way a crafted header
    can lie; each must fail with a SerializationError naming the file."""
    def entry(h):
        return h[next(k for k in sorted(h) if k != "__metadata__")]

    def tree_edit(new):
        return lambda h: h["__metadata__"].update(dtorch=new)

    out = []
    for field in ("dtype", "shape", "data_offsets"):
        for bad in (None, "F32x", 3, -1, 2.5, True, [], {}, ["a"],
                    [1, -2], [2 ** 70, 0], [[1]]):
            out.append((f"{field}={bad!r}",
                        lambda h, f=field, b=bad: entry(h).__setitem__(f, b)))
        out.append((f"no {field}",
                    lambda h, f=field: entry(h).pop(f)))
    out += [
        ("entry not a dict", lambda h: h.__setitem__("0", [1, 2])),
        ("extra field", lambda h: entry(h).__setitem__("x", 1)),
        ("offsets beyond", lambda h: entry(h)["data_offsets"].__setitem__(
            1, entry(h)["data_offsets"][1] + 10 ** 9)),
        ("offsets reversed", lambda h: entry(h)["data_offsets"].reverse()),
        ("overlap", lambda h: [h[k].__setitem__("data_offsets", [0, 64])
                               for k in h if k != "__metadata__"]),
        ("shape mismatch", lambda h: entry(h).__setitem__("shape", [3])),
        ("huge shape", lambda h: entry(h).__setitem__("shape",
                                                      [2 ** 40, 2 ** 40])),
        ("metadata list", lambda h: h.__setitem__("__metadata__", [1])),
        ("metadata int value", lambda h: h["__metadata__"].__setitem__(
            "dtorch", 5)),
        ("unknown dtorch key", lambda h: h["__metadata__"].__setitem__(
            "dtorch.extra", "1")),
        ("checksums not JSON", lambda h: h["__metadata__"].__setitem__(
            SUMS, "{")),
        ("checksums list", lambda h: h["__metadata__"].__setitem__(
            SUMS, "[1]")),
        ("checksum missing", lambda h: h["__metadata__"].__setitem__(
            SUMS, "{}")),
        ("checksum not hex", lambda h: h["__metadata__"].__setitem__(
            SUMS, json.dumps({k: "zz" * 8 for k in h
                              if k != "__metadata__"}))),
        ("checksum short", lambda h: h["__metadata__"].__setitem__(
            SUMS, json.dumps({k: "00000001" for k in h
                              if k != "__metadata__"}))),
        ("checksum wrong", lambda h: h["__metadata__"].__setitem__(
            SUMS, json.dumps({k: "0" * 15 + "1" for k in h
                              if k != "__metadata__"}))),
        ("old checksum entry", lambda h: h["__metadata__"].__setitem__(
            "dtorch.checksums", "{}")),
        ("header crc not hex", lambda h: h["__metadata__"].__setitem__(
            HCRC, 7)),
    ]
    for tree in ("{", "[" * 100000 + "]" * 100000,
                 "[" * 900 + "]" * 900, "[1, {}]", '{"tensor": 1}',
                 '{"tensor": ["0"]}', '{"tensor": "0", "device": 3}',
                 '{"tensor": "0", "device": "tpu:9"}',
                 '{"tensor": "0", "requires_grad": "yes"}',
                 '{"tensor": "0", "x": 1}', '{"ndarray": {}}',
                 '{"dict": 3}', '{"dict": [[1]]}', '{"dict": [1]}',
                 '{"dict": [[{"dict": []}, 1]]}', '{"odict": [[[], 2, 3]]}',
                 '{"tuple": 5}', '{"float": "abc"}', '{"float": 2}',
                 '{"dtype": "float99"}', '{"dtype": []}',
                 '{"device": "warp:1"}', '{"device": 7}', '{}',
                 '{"a": 1, "b": 2}', '{"dict": [["k", {"nope": 1}]]}'):
        out.append((f"tree {tree[:30]}", tree_edit(tree)))
    return out


@pytest.mark.parametrize("seal", [True, False])
def test_crafted_headers_raise_serialization_errors(tmp_path, seal):
    src = tmp_path / "src.pt"
    dtorch.save({"w": dtorch.randn(4, 4), "b": dtorch.zeros(4),
                 "n": dtorch.tensor([1, 2], dtype=dtorch.int8)}, src)
    header, body = _split(src.read_bytes())
    for i, (label, edit) in enumerate(_mutations()):
        h = json.loads(json.dumps(header))
        edit(h)
        path = tmp_path / f"crafted{i}.pt"
        path.write_bytes(_header_bytes(h, seal) + body)
        with pytest.raises(SerializationError, match=f"crafted{i}.pt"):
            dtorch.load(path)
        path.unlink()


def test_truncated_and_huge_lengths_raise_serialization_errors(tmp_path):
    data = _small_file(tmp_path)[0].read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    cases = [data[:cut] for cut in range(0, len(data), 7)]
    cases += [struct.pack("<Q", v) + data[8:]
              for v in (0, 1, n - 8, n + 8, 2 ** 31, 2 ** 63, 2 ** 64 - 1)]
    cases += [struct.pack("<Q", 2 ** 40) + b"{" + b" " * 100]
    for i, bad in enumerate(cases):
        path = tmp_path / f"t{i}.pt"
        path.write_bytes(bad)
        with pytest.raises(SerializationError, match=f"t{i}.pt"):
            dtorch.load(path)
        with pytest.raises(SerializationError, match=f"t{i}.pt"):
            dtorch.load(path, mmap=True)


# ------------------------------------------------- disk full, temp files --

def test_full_disk_raises_oserror_naming_the_file(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.pt"
    dtorch.save({"v": dtorch.ones(3)}, path)
    before = path.read_bytes()
    real_write = dtorch.serialization._safetensors._write

    def full(fh, *args, **kwargs):
        real_write(fh, *args, **kwargs)
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(dtorch.serialization._safetensors, "_write", full)
    with pytest.raises(OSError, match="No space left") as e:
        dtorch.save({"v": dtorch.zeros(1000)}, path)
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(path)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["ckpt.pt"]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_full_device_file_object_names_it():
    fh = open("/dev/full", "wb")
    try:
        with pytest.raises(OSError, match="/dev/full") as e:
            dtorch.save({"v": dtorch.ones(3)}, fh)
        assert e.value.errno == errno.ENOSPC
    finally:
        with contextlib.suppress(OSError):
            fh.close()


def _tmp_name(target, pid):
    host = dtorch.serialization._files._host_tag()
    return f".{target}.dtorch-{host}-{pid}-0123abcd.tmp"


def test_stale_temp_files_of_dead_savers_are_removed(tmp_path):
    # a save killed between writing and renaming leaves its temp file
    script = ("import os, sys, dtorch, dtorch.serialization._files as s\n"
              "s.os.replace = lambda *a: os._exit(9)\n"
              "dtorch.save({'x': dtorch.ones(1000)}, sys.argv[1])\n")
    r = subprocess.run([sys.executable, "-c", script,
                        str(tmp_path / "ckpt.pt")], timeout=120)
    assert r.returncode == 9
    left = os.listdir(tmp_path)
    assert len(left) == 1 and left[0].endswith(".tmp")
    live = subprocess.Popen([sys.executable, "-c",
                             "import time; time.sleep(120)"])
    try:
        keep = [_tmp_name("ckpt.pt", live.pid),          # a live saver
                _tmp_name("other.pt", os.getpid()),      # this process
                ".ckpt.pt.dtorch-00000000-1-0123abcd.tmp",  # another host
                ".ckpt.pt.k3j4h5.tmp",                   # not dtorch's
                "notes.tmp"]
        for name in keep:
            (tmp_path / name).write_bytes(b"x")
        dtorch.save({"x": dtorch.zeros(2)}, tmp_path / "ckpt.pt")
        assert sorted(os.listdir(tmp_path)) == sorted(keep + ["ckpt.pt"])
        assert dtorch.load(tmp_path / "ckpt.pt")["x"].tolist() == [0, 0]
    finally:
        live.kill()
        live.wait()


@pytest.mark.skipif(os.name != "posix", reason="flock")
def test_locked_temp_file_of_a_pid_we_cannot_see_is_kept(tmp_path):
    # a saver in another pid namespace (a container with our hostname):
    # its pid is not alive here, but it holds the file's lock
    dead = subprocess.run([sys.executable, "-c", "import os; "
                           "print(os.getpid())"], capture_output=True,
                          text=True, timeout=60)
    name = _tmp_name("ckpt.pt", int(dead.stdout))
    (tmp_path / name).write_bytes(b"partial")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, sys, time\n"
         "f = open(sys.argv[1], 'rb')\n"
         "fcntl.flock(f, fcntl.LOCK_EX)\n"
         "print('locked', flush=True)\n"
         "time.sleep(120)", str(tmp_path / name)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        dtorch.save({"x": 1}, tmp_path / "ckpt.pt")
        assert name in os.listdir(tmp_path)        # a live save's file
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    dtorch.save({"x": 2}, tmp_path / "ckpt.pt")     # its saver is gone now
    assert os.listdir(tmp_path) == ["ckpt.pt"]


@pytest.mark.skipif(os.name != "posix", reason="flock")
def test_a_cleaner_between_create_and_lock_costs_no_save(tmp_path,
                                                         monkeypatch):
    # A cleaner in another pid namespace (our pid is not alive there)
    # that runs after a save created its temporary file but before it
    # locked it takes the file for a dead saver's and removes it; the
    # save must go on with another file, not fail at the rename.
    cleaner = ("import sys, dtorch.serialization._files as s\n"
               "s._pid_alive = lambda pid: False\n"
               "s._remove_stale_tmps(sys.argv[1])\n")
    real_lock = dtorch.serialization._files._lock
    calls = []

    def late_lock(fd):
        if not calls:
            r = subprocess.run([sys.executable, "-c", cleaner,
                                str(tmp_path)], timeout=120)
            assert r.returncode == 0
            assert not [n for n in os.listdir(tmp_path)
                        if n.endswith(".tmp")]       # it took ours
        calls.append(fd)
        real_lock(fd)
    monkeypatch.setattr(dtorch.serialization._files, "_lock", late_lock)
    dtorch.save({"x": dtorch.arange(3.0)}, tmp_path / "c.pt")
    assert len(calls) == 2 and os.listdir(tmp_path) == ["c.pt"]
    assert dtorch.load(tmp_path / "c.pt")["x"].tolist() == [0, 1, 2]


def test_concurrent_saves_to_one_path_and_loads_never_see_a_bad_file(
        tmp_path):
    # two processes (ranks) saving to the same path in a loop while this
    # one loads it: every load gets one complete save, never a torn,
    # partial or checksum-failing file, and no temporary file is left
    path = tmp_path / "ck.pt"
    script = ("import sys, dtorch\n"
              "v = float(sys.argv[2])\n"
              "x = dtorch.full((300_000,), v)\n"
              "for i in range(25):\n"
              "    dtorch.save({'v': v, 'i': i, 'x': x}, sys.argv[1])\n")
    dtorch.save({"v": 0.0, "i": -1, "x": dtorch.zeros(300_000)}, path)
    writers = [subprocess.Popen([sys.executable, "-c", script, str(path),
                                 str(v)]) for v in (1.0, 2.0)]
    try:
        while any(w.poll() is None for w in writers):
            out = dtorch.load(path)
            x = out["x"].numpy()
            assert x[0] == x[-1] == out["v"]
    finally:
        for w in writers:
            if w.poll() is None:
                w.kill()
            w.wait()
    assert [w.returncode for w in writers] == [0, 0]
    assert os.listdir(tmp_path) == ["ck.pt"]
    assert dtorch.load(path)["i"] == 24


@pytest.mark.skipif(os.name != "posix", reason="flock")
def test_a_save_holds_the_lock_on_its_temp_file(tmp_path, monkeypatch):
    import fcntl
    real_write = dtorch.serialization._safetensors._write
    seen = []

    def check(fh, *args, **kwargs):
        (tmp,) = [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
        with open(tmp_path / tmp, "rb") as other:
            with pytest.raises(BlockingIOError):
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        seen.append(tmp)
        return real_write(fh, *args, **kwargs)
    monkeypatch.setattr(dtorch.serialization._safetensors, "_write", check)
    dtorch.save({"x": dtorch.ones(3)}, tmp_path / "c.pt")
    assert len(seen) == 1 and os.listdir(tmp_path) == ["c.pt"]


@pytest.mark.skipif(os.name != "posix", reason="POSIX modes")
def test_saved_files_follow_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        for mask, mode in ((0o022, 0o644), (0o077, 0o600), (0o002, 0o664)):
            os.umask(mask)
            path = tmp_path / f"m{mask:o}.pt"
            dtorch.save({"x": 1}, path)
            assert stat.S_IMODE(os.stat(path).st_mode) == mode
        # overwriting keeps the mode the file had, as open(path, "wb")
        os.umask(0o022)
        path = tmp_path / "keep.pt"
        dtorch.save({"x": 1}, path)
        os.chmod(path, 0o640)
        dtorch.save({"x": 2}, path)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o640
    finally:
        os.umask(old)


# ------------------------------------------------- PyTorch's signatures --

def test_whole_module_in_safetensors_is_refused_with_the_state_dict_way(
        tmp_path):
    model = dtorch.nn.Linear(2, 3)
    with pytest.raises(SerializationError) as e:
        dtorch.save(model, tmp_path / "m.pt", format="safetensors")
    msg = str(e.value)
    assert "dtorch.save(model.state_dict(), PATH)" in msg
    assert "model.load_state_dict(dtorch.load(PATH))" in msg
    assert "\n" not in msg
    opt = dtorch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(SerializationError,
                       match=r"optimizer\.state_dict\(\)"):
        dtorch.save({"opt": opt}, tmp_path / "o.pt", format="safetensors")
    assert not os.listdir(tmp_path)
    # by default a whole module is pickled in PyTorch's format instead
    dtorch.save(model, tmp_path / "m.pt")
    with open(tmp_path / "m.pt", "rb") as f:
        assert f.read(4) == b"PK\x03\x04"
    back = dtorch.load(tmp_path / "m.pt", weights_only=False)
    assert back.weight.tolist() == model.weight.tolist()


def test_safe_globals_list(tmp_path):
    ser = dtorch.serialization
    path = tmp_path / "x.pt"
    dtorch.save({"x": dtorch.ones(2)}, path)

    class Config:
        pass
    ser.clear_safe_globals()
    with ser.safe_globals([Config]):
        assert ser.get_safe_globals() == [Config]
        assert dtorch.load(path)["x"].tolist() == [1, 1]
    assert ser.get_safe_globals() == []
    ser.add_safe_globals([Config, np.dtype])
    try:
        assert ser.get_safe_globals() == [Config, np.dtype]
    finally:
        ser.clear_safe_globals()
    assert ser.get_safe_globals() == []


def test_load_keywords_as_pytorch(tmp_path):
    path = tmp_path / "k.pt"
    obj = {"w": dtorch.arange(4.0), "n": 1}
    dtorch.save(obj, path, pickle_protocol=4,
                _use_new_zipfile_serialization=True)
    for kw in ({"weights_only": True}, {"weights_only": False},
               {"weights_only": None}, {"mmap": False},
               {"mmap": True, "weights_only": True, "map_location": "cpu"},
               {"map_location": dtorch.device("cpu"), "encoding": "latin1"}):
        if "encoding" in kw:          # torch warns of it too
            with pytest.warns(UserWarning, match="pickle_load_args"):
                _same(obj, dtorch.load(path, **kw))
            continue
        _same(obj, dtorch.load(path, **kw))
    before = path.read_bytes()
    mapped = dtorch.load(path, mmap=True)
    mapped["w"].add_(1)                       # copy-on-write
    assert mapped["w"].tolist() == [1, 2, 3, 4]
    assert path.read_bytes() == before
    with pytest.raises(ValueError, match="file path.*mmap"):
        dtorch.load(io.BytesIO(before), mmap=True)


def test_array_dtypes_byte_order_and_layout(tmp_path):
    path = tmp_path / "a.pt"
    big_endian = np.arange(6, dtype=">i4").reshape(2, 3)
    strided = np.arange(12.0).reshape(3, 4)[:, ::2]
    dtorch.save({"be": big_endian, "st": strided}, path)
    out = dtorch.load(path)
    assert out["be"].dtype == np.int32 and out["be"].tolist() == \
        big_endian.tolist()
    np.testing.assert_array_equal(out["st"], strided)
    with pytest.raises(SerializationError, match=r"obj\['c'\].*complex64"):
        dtorch.save({"c": np.zeros(2, np.complex64)}, tmp_path / "c.pt")
    assert sorted(os.listdir(tmp_path)) == ["a.pt"]


def test_unsigned_wide_dtypes_name_file_tensor_and_dtype(tmp_path):
    # issue 25 item 10: valid safetensors files with U16/U32/U64 tensors
    # (PyTorch 2.13 loads them as torch.uint16/32/64; dtorch has no such
    # dtypes) raise an error naming the file, the tensor and the dtype
    for dt, code in ((np.uint16, "U16"), (np.uint32, "U32"),
                     (np.uint64, "U64")):
        path = tmp_path / f"{code}.safetensors"
        safetensors.numpy.save_file({"ok": np.ones(2, np.float32),
                                     "ids": np.arange(3, dtype=dt)},
                                    str(path))
        with pytest.raises(SerializationError,
                           match=rf"{code}\.safetensors: tensor 'ids' has "
                           rf"dtype {code} \({np.dtype(dt)}\).*int64"):
            dtorch.load(path)
    # NumPy arrays of those dtypes (not tensors) still round-trip
    arr = np.arange(4, dtype=np.uint32)
    dtorch.save({"a": arr}, tmp_path / "np.pt")
    assert dtorch.load(tmp_path / "np.pt")["a"].dtype == np.uint32
