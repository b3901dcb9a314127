"""dtorch.save / dtorch.load: round trips, safetensors format, clear errors
for bad files, atomic writes, map_location."""
import collections
import io
import json
import os
import struct
import zlib

import numpy as np
import pytest
import safetensors.numpy

import dtorch
from dtorch.serialization import ChecksumError, SerializationError

HCRC = "dtorch.header_crc32"


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
    assert len(arrays) == 1
    np.testing.assert_array_equal(list(arrays.values())[0], w.numpy())


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
            '{"tensor": "0"}', '{"tensor": "0", "device": "cuda:0"}'))))
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
    sealed = seal and isinstance(meta, dict) and HCRC in meta
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
    monkeypatch.setattr(dtorch.serialization, "_write", crash)
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
