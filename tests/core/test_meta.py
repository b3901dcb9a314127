"""The meta device: tensors with a shape, a dtype and strides but no
storage; ops give meta results of torch's shapes and dtypes; models built
under ``with dtorch.device("meta"):`` allocate nothing, and
``to_empty`` + ``reset_parameters`` make them real, with the values a
model built on the CPU from the same seed has."""
import numpy as np
import pytest

import dtorch
from dtorch import nn
from dtorch.utils.memory import track_peak

torch = pytest.importorskip("torch")


def test_meta_linear_allocates_nothing_and_materialises():
    with track_peak() as meta:
        with dtorch.device("meta"):
            lin = nn.Linear(4096, 4096)
    with track_peak() as real:
        nn.Linear(1024, 1024)
    assert lin.weight.is_meta and lin.weight.device.type == "meta"
    assert lin.weight.shape == (4096, 4096) and lin.weight.requires_grad
    assert meta.peak < 64 << 10                 # 64 MiB on the CPU
    assert real.peak > 4 << 20
    with track_peak() as fwd:
        y = lin(dtorch.randn(8, 4096, device="meta"))
    assert fwd.peak < 64 << 10 and y.is_meta and y.shape == (8, 4096)
    dtorch.manual_seed(5)
    ref = nn.Linear(64, 32)
    with dtorch.device("meta"):
        m = nn.Sequential(nn.Linear(64, 32), nn.LayerNorm(32))
    assert m.to_empty(device="cpu") is m
    dtorch.manual_seed(5)
    m[0].reset_parameters()
    m[1].reset_parameters()
    assert not m[0].weight.is_meta and isinstance(m[0].weight, nn.Parameter)
    assert dtorch.equal(m[0].weight, ref.weight)
    assert dtorch.equal(m[0].bias, ref.bias)
    assert dtorch.equal(m[1].weight, dtorch.ones(32))
    out = m(dtorch.randn(4, 64))
    out.sum().backward()
    assert m[0].weight.grad.shape == (32, 64)
    # recurse=False leaves the children alone
    with dtorch.device("meta"):
        s = nn.Sequential(nn.Linear(2, 2))
    s.to_empty(device="cpu", recurse=False)
    assert s[0].weight.is_meta


def test_device_context_for_factories():
    with dtorch.device("meta"):
        a = dtorch.zeros(3, 4)
        b = dtorch.randn(2)
        c = dtorch.tensor([1.0, 2.0])
        with dtorch.device("cpu"):
            d = dtorch.ones(2)
        e = dtorch.ones(2, device="cpu")
    assert a.is_meta and b.is_meta and c.is_meta
    assert not d.is_meta and not e.is_meta
    assert not dtorch.zeros(1).is_meta        # the block is over


CASES = {
    "linear": lambda T, x, w, i: T.nn.functional.linear(x, w),
    "matmul_broadcast": lambda T, x, w, i: x.unsqueeze(0) @ w.t(),
    "sum_dim": lambda T, x, w, i: x.sum(dim=1, keepdim=True),
    "mean": lambda T, x, w, i: x.mean(),
    "reshape": lambda T, x, w, i: x.reshape(-1, 2).transpose(0, 1),
    "softmax": lambda T, x, w, i: T.softmax(x, dim=-1),
    "layer_norm": lambda T, x, w, i: T.nn.functional.layer_norm(x, (8,)),
    "gelu": lambda T, x, w, i: T.nn.functional.gelu(x),
    "cat": lambda T, x, w, i: T.cat([x, x], dim=0),
    "stack": lambda T, x, w, i: T.stack([x, x], dim=1),
    "index": lambda T, x, w, i: x[1:, None, ::2],
    "int_plus_float": lambda T, x, w, i: i + 1.5,
    "int_times_int": lambda T, x, w, i: i * 3,
    "compare": lambda T, x, w, i: x > 0,
    "where": lambda T, x, w, i: T.where(x > 0, x, 0.0),
    "half": lambda T, x, w, i: x.half() * 2,
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_meta_ops_shapes_and_dtypes_as_torch(name):
    res = []
    for T in (dtorch, torch):
        x = T.empty(4, 8, device="meta", requires_grad=True)
        w = T.empty(6, 8, device="meta")
        i = T.empty(3, 2, dtype=T.int64, device="meta")
        y = CASES[name](T, x, w, i)
        assert y.is_meta
        res.append((tuple(y.shape), str(y.dtype).split(".")[-1],
                    y.requires_grad))
    assert res[0] == res[1]


def test_meta_repr_and_no_data_errors_as_torch():
    for T in (dtorch, torch):
        x = T.empty(2, 3, device="meta")
        assert repr(x) == "tensor(..., device='meta', size=(2, 3))"
        n = T.ones(2, dtype=T.int64, device="meta")
        assert repr(n).endswith("dtype=" + repr(T.int64) + ")")
        with pytest.raises(NotImplementedError, match="Cannot copy out of "
                           "meta tensor; no data!"):
            x.cpu()
        with pytest.raises(NotImplementedError, match="Cannot copy out"):
            x.tolist()
    y = dtorch.empty(2, device="meta")
    assert y.to("meta").is_meta
    assert dtorch.empty(2).to("meta").is_meta
    with pytest.raises(RuntimeError, match="Expected one of cpu, cuda, "
                       "meta device type"):
        dtorch.device("tpu")
