"""Tensor API semantics: dtypes and promotion, factories, views, indexing,
in-place ops, devices and error messages."""
import numpy as np
import pytest

import dtorch
from dtorch import _backend as B


@pytest.mark.parametrize("a,b,expected", [
    (dtorch.int32, dtorch.int64, dtorch.int64),
    (dtorch.float16, dtorch.bfloat16, dtorch.float32),
    (dtorch.bool, dtorch.int32, dtorch.int32),
    (dtorch.int64, dtorch.float16, dtorch.float16),
    (dtorch.float32, dtorch.float64, dtorch.float64),
    (dtorch.uint8, dtorch.int8, dtorch.int16),
])
def test_promote_types(a, b, expected):
    assert dtorch.promote_types(a, b) is expected
    assert dtorch.promote_types(b, a) is expected


def test_promotion_with_scalars_and_zero_dim_tensors():
    i32 = dtorch.tensor([1, 2], dtype=dtorch.int32)
    f16 = dtorch.tensor([1.0], dtype=dtorch.float16)
    assert (i32 + 1).dtype == dtorch.int32
    assert (i32 + 2.5).dtype == dtorch.float32
    assert (i32 + dtorch.tensor(3)).dtype == dtorch.int32     # 0-dim int64
    assert (i32 + dtorch.tensor(3.0, dtype=dtorch.float64)).dtype \
        == dtorch.float64                                    # higher kind
    assert (f16 * 2.0).dtype == dtorch.float16
    assert (f16 + dtorch.tensor(1.0, dtype=dtorch.float64)).dtype \
        == dtorch.float16
    assert (dtorch.tensor([True]) + 1).dtype == dtorch.int64
    assert (i32 / i32).dtype == dtorch.float32
    assert (dtorch.tensor([1, 2]) > 1).dtype == dtorch.bool
    assert dtorch.tensor([1, 2]).float().mean().item() == 1.5


def test_factories_and_dtypes():
    assert dtorch.tensor([1.0, 2.0]).dtype == dtorch.float32
    assert dtorch.tensor([1, 2]).dtype == dtorch.int64
    assert dtorch.tensor([True]).dtype == dtorch.bool
    assert dtorch.tensor(np.ones(2)).dtype == dtorch.float64
    assert dtorch.zeros(2, 3).shape == (2, 3)
    assert dtorch.ones((2, 3), dtype=dtorch.int32).dtype == dtorch.int32
    assert dtorch.full((2,), 7).dtype == dtorch.int64
    assert dtorch.full((2,), 7.0).dtype == dtorch.float32
    assert dtorch.arange(5).tolist() == [0, 1, 2, 3, 4]
    assert dtorch.arange(0, 1, 0.25).dtype == dtorch.float32
    np.testing.assert_allclose(dtorch.linspace(0, 1, 5).numpy(),
                               [0, .25, .5, .75, 1])
    assert dtorch.eye(3).sum().item() == 3
    assert dtorch.empty(4).shape == (4,)
    z = dtorch.zeros_like(dtorch.ones(2, dtype=dtorch.float64))
    assert z.dtype == dtorch.float64
    assert dtorch.full_like(z, 3).sum().item() == 6
    r = dtorch.randint(0, 5, (100,))
    assert r.dtype == dtorch.int64 and 0 <= r.min().item() \
        and r.max().item() < 5
    assert dtorch.tensor([dtorch.tensor(1.0), dtorch.tensor(2.0)]).shape \
        == (2,)
    b = dtorch.ones(2, dtype=dtorch.bfloat16)
    assert (b + b).dtype == dtorch.bfloat16
    assert (b + b).float().tolist() == [2.0, 2.0]


def test_manual_seed_reproducible():
    dtorch.manual_seed(123)
    a = dtorch.randn(5)
    dtorch.manual_seed(123)
    b = dtorch.randn(5)
    assert a.equal(b)
    assert not a.equal(dtorch.randn(5))
    g = dtorch.Generator().manual_seed(1)
    state = g.get_state()
    x = dtorch.rand(3, generator=g)
    g.set_state(state)
    assert x.equal(dtorch.rand(3, generator=g))


def test_from_numpy_shares_memory():
    a = np.zeros(3, dtype=np.float32)
    t = dtorch.from_numpy(a)
    t[0] = 5
    t.add_(1)
    assert a.tolist() == [6, 1, 1]
    a[2] = 9
    assert t[2].item() == 9
    assert dtorch.as_tensor(a)._data is a


def test_properties_and_conversions():
    t = dtorch.arange(6, dtype=dtorch.float32).reshape(2, 3)
    assert t.shape == dtorch.Size([2, 3]) and t.size(1) == 3 \
        and t.size(-1) == 3
    assert t.dim() == 2 and t.ndim == 2 and t.numel() == 6
    assert t.device == dtorch.device("cpu") and not t.is_cuda
    assert t[1, 2].item() == 5.0
    assert t.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert t.to(dtorch.float64).dtype == dtorch.float64
    assert t.long().dtype == dtorch.int64 and t.half().dtype \
        == dtorch.float16
    assert t.double().float().dtype == dtorch.float32
    assert t.to("cpu") is t
    assert isinstance(t.numpy(), np.ndarray)
    with pytest.raises(RuntimeError, match="requires grad"):
        t.requires_grad_().numpy()
    with pytest.raises(RuntimeError, match="cannot be converted to Scalar"):
        t.item()


def test_views_share_memory_and_version_counter():
    base = dtorch.zeros(2, 3)
    v = base.view(3, 2)
    tt = base.t()
    row = base[1]
    v[0, 0] = 1
    row.add_(2)
    assert base[0, 0].item() == 1 and base[1].tolist() == [2, 2, 2]
    assert tt[0, 0].item() == 1
    assert base._version == v._version == row._version == 2
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        base.t().view(6)
    assert base.t().reshape(6).shape == (6,)
    assert base.t().contiguous().is_contiguous()


def test_shape_ops():
    t = dtorch.zeros(2, 1, 3)
    assert t.squeeze().shape == (2, 3)
    assert t.squeeze(1).shape == (2, 3) and t.squeeze(0).shape == (2, 1, 3)
    assert t.unsqueeze(-1).shape == (2, 1, 3, 1)
    assert t.permute(2, 0, 1).shape == (3, 2, 1)
    assert t.transpose(0, 2).shape == (3, 1, 2)
    assert t.expand(4, 2, 5, 3).shape == (4, 2, 5, 3)
    assert t.expand(-1, 4, -1).shape == (2, 4, 3)
    assert t.flatten().shape == (6,) and t.flatten(1).shape == (2, 3)
    assert t.view(-1, 3).shape == (2, 3)
    assert dtorch.arange(6).repeat(2, 1).shape == (2, 6)
    assert dtorch.arange(3).repeat(2).tolist() == [0, 1, 2, 0, 1, 2]
    a = dtorch.arange(10)
    assert [p.tolist() for p in a.split(4)] == [[0, 1, 2, 3], [4, 5, 6, 7],
                                                [8, 9]]
    assert [len(p) for p in a.chunk(3)] == [4, 4, 2]
    assert a.roll(2).tolist()[:3] == [8, 9, 0]
    with pytest.raises(RuntimeError, match="invalid for input of size 10"):
        a.view(3, 4)
    with pytest.raises(RuntimeError, match="expanded size"):
        t.expand(2, 2, 4)


def test_indexing_and_setitem():
    t = dtorch.arange(12).reshape(3, 4)
    assert t[:, 1].tolist() == [1, 5, 9]
    assert t[t > 9].tolist() == [10, 11]
    assert t[dtorch.tensor([2, 0])][:, 0].tolist() == [8, 0]
    assert t[..., None].shape == (3, 4, 1)
    assert t[[0, 1], [1, 2]].tolist() == [1, 6]
    t[0] = 0
    t[:, -1] = dtorch.tensor([7, 7, 7])
    t[t == 5] = -1
    assert t.tolist() == [[0, 0, 0, 7], [4, -1, 6, 7], [8, 9, 10, 7]]
    with pytest.raises(IndexError, match="shape \\[3, 4\\]"):
        t[5]
    with pytest.raises(IndexError, match="tensors used as indices"):
        t[dtorch.tensor([0.0])]


def test_inplace_semantics():
    t = dtorch.ones(3)
    t.add_(dtorch.tensor([1.0, 2.0, 3.0]), alpha=2).mul_(2).sub_(1)
    assert t.tolist() == [5, 9, 13]
    t.zero_().fill_(2)
    t += 1
    t *= 2
    t /= 3
    assert t.tolist() == [2, 2, 2]
    t.copy_(dtorch.tensor([1.0, 4.0, 9.0])).sqrt_()
    assert t.tolist() == [1, 2, 3]
    t.clamp_(max=2)
    assert t.tolist() == [1, 2, 2]
    i = dtorch.ones(2, dtype=dtorch.int64)
    with pytest.raises(RuntimeError, match="can't be cast"):
        i.add_(1.5)
    with pytest.raises(RuntimeError, match="broadcast shape"):
        dtorch.ones(3).add_(dtorch.ones(2, 3))
    t.addcmul_(dtorch.ones(3), dtorch.ones(3), value=0.5)
    assert t.tolist() == [1.5, 2.5, 2.5]
    t.lerp_(dtorch.zeros(3), 0.5)
    assert t.tolist() == [0.75, 1.25, 1.25]


def test_errors_name_shapes_and_ops():
    with pytest.raises(RuntimeError, match=r"add.*\[2, 3\].*\[4\]"):
        dtorch.ones(2, 3) + dtorch.ones(4)
    with pytest.raises(RuntimeError, match=r"cannot be multiplied \(2x3 and "
                                           r"4x5\)"):
        dtorch.ones(2, 3) @ dtorch.ones(4, 5)
    with pytest.raises(IndexError, match="Dimension out of range"):
        dtorch.ones(2, 3).sum(2)
    with pytest.raises(RuntimeError, match=r"Sizes of tensors must match.*"
                                           r"tensor number 1"):
        dtorch.cat([dtorch.ones(2, 3), dtorch.ones(2, 4)])
    with pytest.raises(RuntimeError, match="stack expects each tensor"):
        dtorch.stack([dtorch.ones(2), dtorch.ones(3)])
    with pytest.raises(RuntimeError, match="boolean mask"):
        dtorch.ones(2).masked_fill(dtorch.ones(2), 0.0)
    with pytest.raises(RuntimeError, match="mean\\(\\): could not infer"):
        dtorch.arange(3).mean()
    with pytest.raises(TypeError, match="not pickled"):
        import pickle
        pickle.dumps(dtorch.ones(2))


def test_devices_and_cuda_without_gpu():
    assert dtorch.device("cuda:1").index == 1
    assert dtorch.device("cuda") == dtorch.device("cuda:0")
    assert str(dtorch.device("cpu")) == "cpu"
    with pytest.raises(RuntimeError, match="Expected one of cpu, cuda"):
        dtorch.device("tpu")
    if not dtorch.cuda.is_available():
        assert dtorch.cuda.device_count() == 0
        assert dtorch.cuda.memory_allocated() == 0
        dtorch.cuda.synchronize()
        dtorch.cuda.empty_cache()
        with pytest.raises(RuntimeError, match="CUDA is not available"):
            dtorch.ones(2).cuda()


@pytest.mark.skipif(not dtorch.cuda.is_available(), reason="needs a GPU")
def test_mixing_devices_names_both():
    with pytest.raises(RuntimeError, match="cpu and cuda:0"):
        dtorch.ones(2) + dtorch.ones(2, device="cuda")


def test_device_roundtrip_and_backward(device):
    x = dtorch.randn(4, 3, device=device, requires_grad=True)
    assert x.device.type == device
    y = (x.cpu() * 2).to(device)
    y.sum().backward()
    assert x.grad.device.type == device
    np.testing.assert_allclose(x.grad.cpu().numpy(), 2)


def test_repr_like_pytorch():
    assert repr(dtorch.tensor([1.0, 2.0])) == "tensor([1., 2.])"
    assert repr(dtorch.tensor([1, 2])) == "tensor([1, 2])"
    assert repr(dtorch.tensor([1.5], dtype=dtorch.float64)) == \
        "tensor([1.5000], dtype=dtorch.float64)"
    assert repr(dtorch.ones(1, requires_grad=True)) == \
        "tensor([1.], requires_grad=True)"
    assert "grad_fn=<MulBackward>" in repr(
        dtorch.ones(1, requires_grad=True) * 2)


def test_functions_namespace():
    a = dtorch.tensor([1.0, 4.0])
    assert dtorch.sqrt(a).tolist() == [1, 2]
    assert dtorch.max(a).item() == 4
    assert dtorch.sum(a, 0).item() == 5
    assert dtorch.where(a > 2, a, dtorch.zeros(2)).tolist() == [0, 4]
    assert dtorch.where(a > 2, a, 0.0).tolist() == [0, 4]
    assert dtorch.is_tensor(a) and not dtorch.is_tensor(1)
    assert B.get_array_module(a._data) is np


@pytest.mark.parametrize("data", [
    [[1., 2.]], [[1., 2.], [3., 4.]], [1., 2.], 1., [[1, 2]], [True],
    [[True, 2]], [[1, 2.5]], [], [[]], (1, 2.0), [(1., 2.), (3., 4.)],
    [np.float64(1.0)], [np.int32(3)], [[np.float32(1.0), 2]]])
def test_tensor_infers_pytorch_dtype_from_nested_data(data):
    """Nested Python floats give the default dtype, not NumPy's float64
    (dtorch.tensor([[1., 2.]]) was float64); the leaves' dtypes promote."""
    torch = pytest.importorskip("torch")
    a, b = dtorch.tensor(data), torch.tensor(data)
    assert str(a.dtype) == str(b.dtype).replace("torch", "dtorch"), data
    assert tuple(a.shape) == tuple(b.shape)
    np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_tensor_dtype_of_lists_of_tensors_follows_the_tensors():
    torch = pytest.importorskip("torch")
    for dt in ("float64", "float32", "int32", "int64", "bool"):
        x = dtorch.ones((), dtype=getattr(dtorch, dt))
        y = torch.ones((), dtype=getattr(torch, dt))
        for mk in (lambda t: [t, t], lambda t: [[t], [t]], lambda t: [t, 2.],
                   lambda t: [t, 2]):
            assert str(dtorch.tensor(mk(x)).dtype) == \
                str(torch.tensor(mk(y)).dtype).replace("torch", "dtorch"), dt


def test_bool_subtraction_is_refused_as_pytorch():
    torch = pytest.importorskip("torch")
    t, f, i = (dtorch.tensor([True]), dtorch.tensor([False]),
               dtorch.tensor([1]))
    T, F_, I = torch.tensor([True]), torch.tensor([False]), torch.tensor([1])
    for (a, b), (A, B_) in [((t, f), (T, F_)), ((t, i), (T, I)),
                            ((i, t), (I, T)), ((t, 1), (T, 1)),
                            ((1, t), (1, T)), ((i, True), (I, True))]:
        with pytest.raises(RuntimeError) as want:
            A - B_
        with pytest.raises(RuntimeError) as got:
            a - b
        assert str(got.value) == str(want.value)
    with pytest.raises(RuntimeError, match="bool tensor"):
        dtorch.sub(dtorch.tensor([1.]), t, alpha=2)
