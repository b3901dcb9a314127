"""PyTorch's checkpoint files in and out, with real torch as the oracle:
every file of a corpus written by torch 2.13 (zip and legacy) loads in
dtorch bitwise equal (dtypes, shapes, strides, storage sharing), and every
file dtorch writes with format="torch" loads in torch with
weights_only=True, bitwise equal to the original."""
import collections
import io
import math
import pickle

import numpy as np
import pytest

import dtorch
from dtorch.serialization import SerializationError, WeightsOnlyError

torch = pytest.importorskip("torch")


# ------------------------------------------------------------- corpus --

def _resnet18_state_dict():
    """ResNet-18's keys, shapes and dtypes (11.7M parameters)."""
    g = torch.Generator().manual_seed(0)
    sd = collections.OrderedDict()

    def conv(name, o, i, k):
        sd[name + ".weight"] = torch.randn(o, i, k, k, generator=g)

    def bn(name, c):
        sd[name + ".weight"] = torch.rand(c, generator=g)
        sd[name + ".bias"] = torch.randn(c, generator=g)
        sd[name + ".running_mean"] = torch.randn(c, generator=g)
        sd[name + ".running_var"] = torch.rand(c, generator=g)
        sd[name + ".num_batches_tracked"] = torch.tensor(7)
    conv("conv1", 64, 3, 7)
    bn("bn1", 64)
    cin = 64
    for layer, c in enumerate([64, 128, 256, 512], 1):
        for b in range(2):
            p = f"layer{layer}.{b}"
            conv(p + ".conv1", c, cin if b == 0 else c, 3)
            bn(p + ".bn1", c)
            conv(p + ".conv2", c, c, 3)
            bn(p + ".bn2", c)
            if b == 0 and layer > 1:
                conv(p + ".downsample.0", c, cin, 1)
                bn(p + ".downsample.1", c)
        cin = c
    sd["fc.weight"] = torch.randn(1000, 512, generator=g)
    sd["fc.bias"] = torch.randn(1000, generator=g)
    return sd


def _optimizer_states():
    out = {}
    for name, make in [
            ("sgd", lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9,
                                              nesterov=True)),
            ("adam", lambda p: torch.optim.Adam(p, lr=1e-3)),
            ("adamw", lambda p: torch.optim.AdamW(p, lr=1e-3,
                                                  amsgrad=True))]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 3),
                                    torch.nn.BatchNorm1d(3))
        opt = make(model.parameters())
        for _ in range(2):
            opt.zero_grad()
            model(torch.randn(5, 4)).square().mean().backward()
            opt.step()
        # a module's state dict carries _metadata (an OrderedDict BUILD)
        out[name] = {"model": model.state_dict(),
                     "optimizer": opt.state_dict()}
    return out


def _small_corpus():
    x = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    base = torch.randn(5, 7)
    special = torch.tensor([0.0, -0.0, 1.0, -1.0, math.inf, -math.inf,
                            math.nan, 1e-30])
    return {
        "nested": {"epoch": 3, "name": "run-1", "big": 2 ** 70, "neg": -5,
                   "lr": 0.1, "inf": math.inf, "none": None,
                   "cfg": {"layers": [1, 2, 3], "flags": (True, False),
                           7: "int key", (1, 2): "tuple key"},
                   "raw": b"\x00\xff", "empty_bytes": b"", "set": {1, 2},
                   "size": torch.Size([2, 3]), "dtype": torch.bfloat16,
                   "device": torch.device("cpu")},
        "dtypes": {str(d): torch.arange(-3, 3).to(d) for d in (
            torch.bfloat16, torch.float16, torch.float32, torch.float64,
            torch.int8, torch.uint8, torch.int16, torch.int32,
            torch.int64, torch.bool)},
        "special": {"f32": special, "bf16": special.bfloat16(),
                    "f16": special.half(), "zero_d": torch.tensor(2.5),
                    "zero_d_int": torch.tensor(-7),
                    "empty": torch.zeros(0, 3),
                    "empty_bf16": torch.zeros(2, 0, dtype=torch.bfloat16)},
        "views": {"x": x, "row": x[1], "col": x[:, 2], "t": x.t(),
                  "slice": x[1:3, ::2], "flat": x.view(-1)},
        "noncontig": {"strided": base[:, ::3], "expanded":
                      torch.ones(3).expand(4, 3), "perm":
                      torch.randn(2, 3, 4).permute(2, 0, 1)},
        "params": {"p": torch.nn.Parameter(torch.randn(3)),
                   "frozen": torch.nn.Parameter(torch.randn(2),
                                                requires_grad=False)},
        "list": [torch.ones(2), (torch.zeros(1), "s"), [1.5, None]],
    }


@pytest.fixture(scope="module")
def corpus():
    out = _small_corpus()
    out.update(_optimizer_states())
    out["resnet18"] = _resnet18_state_dict()
    return out


def _torch_file(obj, legacy=False):
    b = io.BytesIO()
    torch.save(obj, b, _use_new_zipfile_serialization=not legacy)
    return b.getvalue()


# ------------------------------------------------------------ compare --

def _bits(a):
    a = np.asarray(a)
    return a.view(np.uint8 if a.itemsize == 1 else f"u{a.itemsize}") \
        .tobytes() if a.size else b""


def _torch_bits(t):
    t = t.detach()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return _bits(t.numpy())


def _same_tensor(t, d, where):
    """torch tensor ``t`` and ``d`` (dtorch's, or torch's read back) are
    bitwise equal, with the same dtype, shape, strides, kind and grad."""
    back = isinstance(d, torch.Tensor)
    assert type(t) is type(d) if back else isinstance(d, dtorch.Tensor) \
        and isinstance(t, torch.nn.Parameter) == isinstance(
            d, dtorch.nn.Parameter), where
    assert str(t.dtype) == str(d.dtype).replace("dtorch", "torch"), where
    assert tuple(t.shape) == tuple(d.shape), where
    assert t.requires_grad == d.requires_grad, where
    if t.numel():
        stride = d.stride() if back else tuple(
            s // d._data.itemsize for s in d._data.strides)
        assert t.stride() == stride, where
    assert _torch_bits(t) == (_torch_bits(d) if back else _bits(d._data)), \
        where


def _same_as_torch(t, d, where="obj"):
    """torch object ``t`` and ``d`` hold the same thing; ``d`` is dtorch's
    (torch's types mapped to dtorch's) or torch's own, read back."""
    back = type(d).__module__.split(".")[0] == "torch"
    if isinstance(t, torch.Tensor):
        _same_tensor(t, d, where)
    elif isinstance(t, torch.Size) and not back:
        assert isinstance(d, dtorch.Size) and tuple(t) == tuple(d), where
    elif isinstance(t, torch.dtype) and not back:
        assert d is getattr(dtorch, str(t).split(".")[1]), where
    elif isinstance(t, torch.device) and not back:
        assert isinstance(d, dtorch.device) and str(t) == str(d), where
    elif isinstance(t, dict):
        assert type(t) is type(d), where
        assert list(t) == list(d), where
        for k in t:
            _same_as_torch(t[k], d[k], f"{where}[{k!r}]")
        assert getattr(t, "_metadata", None) == getattr(d, "_metadata",
                                                         None), where
    elif isinstance(t, (list, tuple)):
        assert type(t) is type(d) and len(t) == len(d), where
        for i, (a, b) in enumerate(zip(t, d)):
            _same_as_torch(a, b, f"{where}[{i}]")
    elif isinstance(t, float) and math.isnan(t):
        assert math.isnan(d), where
    else:
        assert type(t) is type(d) and t == d, where


def _shared(t):
    return t.untyped_storage().data_ptr()


# --------------------------------------------------------------- tests --

SMALL = ["nested", "dtypes", "special", "views", "noncontig", "params",
         "list", "sgd", "adam", "adamw"]


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
@pytest.mark.parametrize("name", SMALL + ["resnet18"])
def test_torch_files_load_bitwise_and_go_back(corpus, name, legacy,
                                              tmp_path):
    obj = corpus[name]
    path = tmp_path / "t.pt"
    path.write_bytes(_torch_file(obj, legacy))
    got = dtorch.load(path)                       # weights_only=True
    _same_as_torch(obj, got)
    if not legacy:
        _same_as_torch(obj, dtorch.load(path, mmap=True))
        with open(path, "rb") as f:               # a file object
            _same_as_torch(obj, dtorch.load(f))
    # and back: dtorch writes PyTorch's format, torch reads it safely
    out = tmp_path / "d.pt"
    dtorch.save(got, out, format="torch")
    back = torch.load(out, weights_only=True)
    _same_as_torch(obj, back)
    if name == "views":
        assert len({_shared(v) for v in back.values()}) == 1
        assert len({id(np.asarray(v._data).base) for v in got.values()}) \
            == 1
        got["x"].add_(1)                      # views share memory here too
        assert got["row"].tolist() == (obj["row"] + 1).tolist()


def test_dtorch_training_state_loads_in_torch(tmp_path):
    dtorch.manual_seed(0)
    model = dtorch.nn.Sequential(dtorch.nn.Linear(4, 3), dtorch.nn.ReLU(),
                                 dtorch.nn.Linear(3, 2))
    opt = dtorch.optim.AdamW(model.parameters(), lr=0.01)
    for _ in range(2):
        opt.zero_grad()
        model(dtorch.randn(5, 4)).square().mean().backward()
        opt.step()
    path = tmp_path / "ckpt.pt"
    dtorch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                 "epoch": 2}, path, format="torch")
    ckpt = torch.load(path, weights_only=True)
    tmodel = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(),
                                 torch.nn.Linear(3, 2))
    tmodel.load_state_dict(ckpt["model"])
    topt = torch.optim.AdamW(tmodel.parameters(), lr=0.01)
    topt.load_state_dict(ckpt["opt"])
    assert ckpt["epoch"] == 2
    for k, v in model.state_dict().items():
        assert _torch_bits(ckpt["model"][k]) == _bits(v._data)
    assert topt.state_dict()["state"][0]["step"].item() == 2
    # the default for state dicts stays dtorch's safetensors file
    dtorch.save(model.state_dict(), tmp_path / "sd.pt")
    assert (tmp_path / "sd.pt").read_bytes()[:2] != b"PK"


def test_map_location_and_keywords(tmp_path):
    path = tmp_path / "t.pt"
    torch.save({"w": torch.ones(2), "v": torch.arange(3)}, path)
    seen = []

    def fn(t, location):
        seen.append(location)
        return t * 2
    out = dtorch.load(path, map_location=fn)
    assert out["w"].tolist() == [2.0, 2.0] and seen == ["cpu", "cpu"]
    for loc in ("cpu", dtorch.device("cpu"), {"cpu": "cpu"}):
        assert dtorch.load(path, map_location=loc)["v"].tolist() == [0, 1, 2]
    assert dtorch.load(path, weights_only=False, encoding="latin1")[
        "v"].tolist() == [0, 1, 2]
    with pytest.raises(RuntimeError, match="pickle_module"):
        dtorch.load(path, pickle_module=pickle, weights_only=True)
    legacy = tmp_path / "l.pt"
    torch.save({"w": torch.ones(2)}, legacy,
               _use_new_zipfile_serialization=False)
    with pytest.raises(RuntimeError, match="mmap can only be used"):
        dtorch.load(legacy, mmap=True)


def test_foreign_dtypes_are_named(tmp_path):
    path = tmp_path / "u.pt"
    torch.save({"u": torch.zeros(2, dtype=torch.uint16)}, path)
    with pytest.raises(SerializationError,
                       match=r"u\.pt.*torch\.uint16.*dtorch has bool"):
        dtorch.load(path)
    torch.save({"c": torch.zeros(2, dtype=torch.complex64)}, path)
    with pytest.raises(SerializationError, match=r"u\.pt.*complex64"):
        dtorch.load(path)


class Config:
    """A user class in a checkpoint (module level: picklable)."""

    def __init__(self, depth):
        self.depth = depth


def test_safe_globals_open_the_list(tmp_path):
    path = tmp_path / "c.pt"
    torch.save({"cfg": Config(3), "w": torch.ones(1)}, path)
    ser = dtorch.serialization
    with pytest.raises(pickle.UnpicklingError) as e:
        dtorch.load(path)
    msg = str(e.value)
    assert isinstance(e.value, WeightsOnlyError) and "c.pt" in msg
    assert f"GLOBAL {__name__}.Config was not an allowed global" in msg
    assert "dtorch.serialization.add_safe_globals([" in msg
    assert "weights_only` set to `False`" in msg
    with ser.safe_globals([Config]):
        assert dtorch.load(path)["cfg"].depth == 3
    assert ser.get_safe_globals() == []
    with pytest.raises(WeightsOnlyError):
        dtorch.load(path)
    ser.add_safe_globals([(Config, f"{__name__}.Config")])
    try:
        assert dtorch.load(path)["cfg"].depth == 3
    finally:
        ser.clear_safe_globals()
    assert dtorch.load(path, weights_only=False)["cfg"].depth == 3


def test_torch_whole_module_loads_with_weights_only_false(tmp_path):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU(),
                            torch.nn.LayerNorm(2))
    path = tmp_path / "m.pt"
    torch.save(m, path)
    with pytest.raises(WeightsOnlyError, match="torch.nn.modules"):
        dtorch.load(path)
    # torch's names in the file, dtorch's classes in the list
    nn = dtorch.nn
    with dtorch.serialization.safe_globals([
            nn.Sequential, nn.Linear, nn.ReLU, nn.LayerNorm]):
        d = dtorch.load(path)
    assert type(d[2]) is nn.LayerNorm
    d = dtorch.load(path, weights_only=False)
    assert type(d[0]) is dtorch.nn.Linear
    x = torch.randn(4, 3)
    np.testing.assert_allclose(d(dtorch.tensor(x.numpy())).detach().numpy(),
                               m(x).detach().numpy(), rtol=1e-6, atol=1e-6)


def test_pickle_protocols(tmp_path):
    obj = {"w": torch.arange(4.0), "n": [1, (2, "x")]}
    for proto in (2, 4, 5):
        path = tmp_path / f"p{proto}.pt"
        torch.save(obj, path, pickle_protocol=proto)
        _same_as_torch(obj, dtorch.load(path))
        dtorch.save(dtorch.load(path), path, format="torch",
                    pickle_protocol=proto)
        _same_as_torch(obj, torch.load(path, weights_only=proto == 2))


@pytest.mark.gpu
@pytest.mark.skipif(not dtorch.cuda.is_available(),
                    reason="needs CuPy (or DTORCH_FAKE_CUDA=1)")
def test_cuda_tensors_in_pytorch_format(tmp_path):
    w = dtorch.arange(6.0, device="cuda").reshape(2, 3)
    path = tmp_path / "g.pt"
    dtorch.save({"w": w, "v": w[1]}, path, format="torch")
    back = torch.load(path, weights_only=True, map_location="cpu")
    assert back["w"].tolist() == w.tolist()
    assert back["v"].tolist() == [3, 4, 5]      # (a storage of its own)
    out = dtorch.load(path)                     # to its saved device
    assert out["w"].device == w.device and out["v"].tolist() == [3, 4, 5]
    assert dtorch.load(path, map_location="cpu")["w"].device.type == "cpu"
