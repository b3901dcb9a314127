"""Behaviour of the listed API names that other tests do not reach
(tests/core/test_api_coverage.py requires each name dtorch has to be tested):
each case runs the same code with ``lib = dtorch`` and ``lib = torch`` and
compares the results (values, dtypes, shapes; gradients where they
flow)."""
import numpy as np
import pytest

import dtorch

torch = pytest.importorskip("torch")

rng = np.random.default_rng(0)
A = rng.standard_normal((3, 4))
B = rng.standard_normal((4, 5))
P = np.abs(rng.standard_normal((3, 4))) + 0.1
BA = rng.standard_normal((2, 3, 4))
BB = rng.standard_normal((2, 4, 2))
V = rng.standard_normal(4)
NAN = np.array([1.0, np.nan, -np.inf, np.inf, -2.5, 0.0])
C = rng.standard_normal((2, 3, 2))


def T(lib, a, grad=False, dtype=None):
    return lib.tensor(a, dtype=dtype or lib.float64, requires_grad=grad)


def _np(x):
    if isinstance(x, (tuple, list)):
        return [_np(v) for v in x]
    if hasattr(x, "detach"):
        return x.detach().numpy()
    return x


def _cmp(a, b, tol):
    if isinstance(a, list):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _cmp(x, y, tol)
        return
    if isinstance(a, np.ndarray):
        assert a.shape == b.shape, (a.shape, b.shape)
        assert a.dtype == b.dtype, (a.dtype, b.dtype)
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol)
    else:
        assert a == b or (isinstance(a, float) and np.isclose(a, b)), (a, b)


# name, fn(lib) -> result (tensor, number or sequence)
CASES = [
    ("ones_like", lambda L: L.ones_like(T(L, A), dtype=L.int32)),
    ("empty_like", lambda L: L.empty_like(T(L, A)).shape),
    ("bmm", lambda L: L.bmm(T(L, BA), T(L, BB))),
    ("Tensor.bmm", lambda L: T(L, BA).bmm(T(L, BB))),
    ("mm", lambda L: L.mm(T(L, A), T(L, B))),
    ("Tensor.mm", lambda L: T(L, A).mm(T(L, B))),
    ("mv", lambda L: L.mv(T(L, A), T(L, V))),
    ("vdot", lambda L: L.vdot(T(L, V), T(L, V[::-1].copy()))),
    ("baddbmm", lambda L: L.baddbmm(T(L, C),
                                    T(L, BA), T(L, BB), beta=0.5, alpha=2)),
    ("isinf", lambda L: L.isinf(T(L, NAN))),
    ("Tensor.isinf", lambda L: T(L, NAN).isinf()),
    ("nan_to_num", lambda L: L.nan_to_num(T(L, NAN), nan=7.0, posinf=9.0)),
    ("Tensor.nan_to_num", lambda L: T(L, NAN).nan_to_num()),
    ("floor", lambda L: L.floor(T(L, A * 3))),
    ("Tensor.floor", lambda L: T(L, A * 3).floor()),
    ("ceil", lambda L: L.ceil(T(L, A * 3))),
    ("Tensor.ceil", lambda L: T(L, A * 3).ceil()),
    ("trunc", lambda L: L.trunc(T(L, A * 3))),
    ("Tensor.trunc", lambda L: T(L, A * 3).trunc()),
    ("std_mean", lambda L: L.std_mean(T(L, A), 1)),
    ("lerp", lambda L: L.lerp(T(L, A), T(L, A * 2), 0.3)),
    ("Tensor.lerp", lambda L: T(L, A).lerp(T(L, P), T(L, P / 10))),
    ("clamp_max", lambda L: L.clamp_max(T(L, A), 0.2)),
    ("tan", lambda L: L.tan(T(L, A))),
    ("log1p", lambda L: L.log1p(T(L, P))),
    ("Tensor.log1p", lambda L: T(L, P).log1p()),
    ("log2", lambda L: L.log2(T(L, P))),
    ("log10", lambda L: L.log10(T(L, P))),
    ("expm1", lambda L: L.expm1(T(L, A))),
    ("Tensor.expm1", lambda L: T(L, A).expm1()),
    ("logical_and", lambda L: L.logical_and(T(L, A) > 0, T(L, A) < 1)),
    ("Tensor.logical_and", lambda L: (T(L, A) > 0).logical_and(T(L, A) < 1)),
    ("logical_or", lambda L: L.logical_or(T(L, A) > 1, T(L, A) < -1)),
    ("Tensor.logical_or", lambda L: (T(L, A) > 1).logical_or(T(L, A) < -1)),
    ("logical_not", lambda L: L.logical_not(T(L, A) > 0)),
    ("Tensor.logical_not", lambda L: (T(L, A) > 0).logical_not()),
    ("logical_xor", lambda L: L.logical_xor(T(L, A) > 0, T(L, A) > 0.5)),
    ("bitwise_not", lambda L: L.bitwise_not(L.tensor([0, 5, -3]))),
    ("isclose", lambda L: L.isclose(T(L, A), T(L, A + 1e-9))),
    ("Tensor.isclose", lambda L: T(L, A).isclose(T(L, A + 1e-3))),
    ("count_nonzero", lambda L: L.count_nonzero(T(L, A) > 0)),
    ("Tensor.count_nonzero", lambda L: (T(L, A) > 0).count_nonzero()),
    ("addcmul", lambda L: L.addcmul(T(L, A), T(L, A), T(L, P), value=0.5)),
    ("addcdiv", lambda L: L.addcdiv(T(L, A), T(L, A), T(L, P), value=0.5)),
    ("concat", lambda L: L.concat([T(L, A), T(L, A)], 1)),
    ("logspace", lambda L: L.logspace(0, 2, 5)),
    ("nanmean", lambda L: L.nanmean(T(L, NAN[[0, 1, 4, 5]]))),
    ("nansum", lambda L: L.nansum(T(L, NAN[[0, 1, 4, 5]]))),
    ("heaviside", lambda L: L.heaviside(T(L, np.array([-1., 0., 2.])),
                                        T(L, np.array([0.5])))),
    ("signbit", lambda L: L.signbit(T(L, np.array([-0.0, 0.0, -1.0])))),
    ("copysign", lambda L: L.copysign(T(L, A), -1.0)),
    ("short", lambda L: L.tensor([1, 2], dtype=L.short)),
    ("get_default_dtype", lambda L: str(L.get_default_dtype())[-7:]),
    ("Tensor.type_as", lambda L: T(L, A).type_as(L.tensor([1]))),
    ("Tensor.new_zeros", lambda L: T(L, A).new_zeros(2, 3)),
    ("Tensor.new_ones", lambda L: T(L, A).new_ones((2,))),
    ("Tensor.new_full", lambda L: T(L, A).new_full((2, 2), 3.5)),
    ("Tensor.new_empty", lambda L: T(L, A).new_empty((2, 2)).shape),
    ("Tensor.new_tensor", lambda L: T(L, A).new_tensor([1, 2])),
    ("Tensor.view_as", lambda L: T(L, A).view_as(T(L, A.reshape(4, 3)))),
    ("Tensor.expand_as", lambda L: T(L, V).expand_as(T(L, A))),
    ("Tensor.reshape_as", lambda L: T(L, A).reshape_as(T(L, B[:, :3]))),
    ("Tensor.element_size", lambda L: T(L, A).float().element_size()),
    ("Tensor.storage_offset", lambda L: T(L, A)[1:, 2:].storage_offset()),
    ("Tensor.float_power", lambda L: T(L, P).float().float_power(2)),
    ("Tensor.sum_to_size", lambda L: T(L, BA).sum_to_size(1, 3, 1)),
    ("Tensor.mT", lambda L: T(L, BA).mT),
    ("Tensor.get_device", lambda L: T(L, A).get_device()),
    ("Tensor.div_", lambda L: T(L, A).div_(2.0)),
    ("Tensor.addcdiv_", lambda L: T(L, A).addcdiv_(T(L, A), T(L, P), value=2)),
    ("Tensor.masked_fill_", lambda L: T(L, A).masked_fill_(T(L, A) > 0, 0.)),
    ("Tensor.clip_", lambda L: T(L, A).clip_(-0.5, 0.5)),
    ("Tensor.index_add_", lambda L: T(L, A).index_add_(
        1, L.tensor([0, 0]), T(L, A[:, :2]))),
    ("Tensor.index_copy_", lambda L: T(L, A).index_copy_(
        0, L.tensor([2, 0]), T(L, B[:2])[:, :4])),
    ("Tensor.index_fill_", lambda L: T(L, A).index_fill_(1, L.tensor([3]),
                                                         -1.)),
    ("Tensor.index_put_", lambda L: T(L, A).index_put_(
        (L.tensor([0, 0, 2]), L.tensor([1, 1, 3])), T(L, np.ones(3)),
        accumulate=True)),
    ("Tensor.squeeze_", lambda L: T(L, A[None]).squeeze_(0)),
    ("Tensor.unsqueeze_", lambda L: T(L, A).unsqueeze_(1)),
    ("Tensor.transpose_", lambda L: T(L, A).transpose_(0, 1)),
    ("Tensor.detach_", lambda L: (T(L, A, True) * 2).detach_().requires_grad),
    ("Softmin", lambda L: L.nn.Softmin(1)(T(L, A))),
    ("HuberLoss", lambda L: L.nn.HuberLoss(delta=0.5)(T(L, A), T(L, A * 0))),
    ("KLDivLoss", lambda L: L.nn.KLDivLoss(reduction="batchmean")(
        L.log_softmax(T(L, A), 1), L.softmax(T(L, A * 2), 1))),
    ("MaxPool1d", lambda L: L.nn.MaxPool1d(2)(T(L, BA))),
    ("AvgPool1d", lambda L: L.nn.AvgPool1d(2)(T(L, BA))),
    ("functional.avg_pool1d", lambda L: L.nn.functional.avg_pool1d(
        T(L, BA), 3, 1, 1)),
    ("AdaptiveAvgPool1d", lambda L: L.nn.AdaptiveAvgPool1d(3)(T(L, BA))),
    ("functional.adaptive_avg_pool1d",
     lambda L: L.nn.functional.adaptive_avg_pool1d(T(L, BA), 2)),
    ("functional.conv_transpose1d",
     lambda L: L.nn.functional.conv_transpose1d(T(L, BA),
                                                T(L, BB[:, :3].reshape(
                                                    3, 2, 2)[:, :, :2]))),
    ("functional.instance_norm",
     lambda L: L.nn.functional.instance_norm(T(L, BA))),
    ("functional.dropout3d", lambda L: L.nn.functional.dropout3d(
        T(L, BA[None]), 0.5, training=False)),
    ("functional.feature_alpha_dropout",
     lambda L: L.nn.functional.feature_alpha_dropout(T(L, BA), 0.5, False)),
    ("functional.multi_head_attention_forward",
     lambda L: L.nn.functional.multi_head_attention_forward(
         T(L, BA.transpose(1, 0, 2)), T(L, BA.transpose(1, 0, 2)),
         T(L, BA.transpose(1, 0, 2)), 4, 2, T(L, np.eye(12, 4)),
         T(L, np.zeros(12)), None, None, False, 0.0, T(L, np.eye(4)),
         T(L, np.zeros(4)), need_weights=True)),
]


@pytest.mark.parametrize("name,fn", CASES, ids=[c[0] for c in CASES])
def test_matches_torch(name, fn):
    _cmp(_np(fn(dtorch)), _np(fn(torch)), 1e-10)


def test_random_functions_and_fills():
    dtorch.manual_seed(3)
    assert dtorch.initial_seed() == 3
    a = dtorch.randperm(10)
    assert sorted(a.tolist()) == list(range(10))
    x = dtorch.randn_like(dtorch.zeros(2000, dtype=dtorch.float64))
    assert x.dtype == dtorch.float64 and abs(x.std().item() - 1) < 0.1
    u = dtorch.rand_like(dtorch.zeros(2000))
    assert 0 <= u.min().item() and u.max().item() < 1
    p = dtorch.poisson(dtorch.full((4000,), 3.0))
    assert abs(p.mean().item() - 3) < 0.15
    t = dtorch.empty(4000)
    assert abs(t.uniform_(2, 4).mean().item() - 3) < 0.05
    assert set(t.bernoulli_(0.5).unique().tolist()) == {0.0, 1.0}
    r = dtorch.empty(4000).random_(0, 5)
    assert set(r.unique().tolist()) == {0., 1., 2., 3., 4.}
    g = dtorch.empty(4000).geometric_(0.5)
    assert g.min().item() >= 1 and abs(g.mean().item() - 2) < 0.15
    ln = dtorch.empty(4000, dtype=dtorch.float64).log_normal_(0.0, 0.5)
    assert abs(ln.log().mean().item()) < 0.05
    c = dtorch.empty(4001).cauchy_()
    assert abs(c.median().item()) < 0.1
    assert dtorch.default_generator.initial_seed() == 3
    dtorch.set_default_dtype(dtorch.float64)
    try:
        assert dtorch.tensor([1.0]).dtype == dtorch.float64
    finally:
        dtorch.set_default_dtype(dtorch.float32)


def test_formats_printing_and_cuda_queries():
    x = dtorch.randn(1, 3, 4, 4)
    assert x.contiguous(memory_format=dtorch.channels_last).shape == x.shape
    assert x.clone(memory_format=dtorch.preserve_format).shape == x.shape
    dtorch.set_printoptions(precision=2)
    try:
        assert "0.12" in repr(dtorch.tensor([0.1234]))
    finally:
        dtorch.set_printoptions(profile="default")
    dtorch.cuda.manual_seed_all(0)      # no GPU: a no-op, not an error
    if not dtorch.cuda.is_available():
        assert dtorch.cuda.max_memory_allocated() == 0
        with pytest.raises(RuntimeError, match="CUDA"):
            dtorch.cuda.get_device_name()
    import multiprocessing
    assert dtorch.multiprocessing.set_start_method is \
        multiprocessing.set_start_method
    assert x.data_ptr() == x.view(-1).data_ptr()


def test_nn_containers_init_and_remaining_modules():
    nn = dtorch.nn
    pd = nn.ParameterDict({"a": nn.Parameter(dtorch.zeros(2))})
    assert list(dict(pd.named_parameters())) == ["a"]
    buf = nn.Buffer(dtorch.ones(3))
    m = nn.Module()
    m.b = buf
    assert list(m.state_dict()) == ["b"]
    w = dtorch.empty(3, 5)
    for fn in ("xavier_normal_", "kaiming_uniform_", "uniform_"):
        getattr(nn.init, fn)(w)
        assert w.abs().sum().item() > 0
    assert nn.init.zeros_(w).abs().sum().item() == 0
    assert nn.init.ones_(w).sum().item() == 15
    d = dtorch.empty(2, 2, 3)
    nn.init.dirac_(d)
    assert d.sum().item() == 2
    s = dtorch.empty(10, 4)
    nn.init.sparse_(s, 0.5)
    assert ((s == 0).sum(0) >= 5).all()
    assert nn.BatchNorm3d(2)(dtorch.randn(2, 2, 2, 2, 2)).shape == (2,) * 5
    assert isinstance(nn.TransformerDecoder(
        nn.TransformerDecoderLayer(4, 2, 8), 2).layers, nn.ModuleList)
    assert nn.PixelShuffle(2)(dtorch.zeros(1, 4, 2, 2)).shape == (1, 1, 4, 4)
    assert nn.ConvTranspose1d(2, 3, 3)(dtorch.zeros(1, 2, 5)).shape == \
        (1, 3, 7)
    a = nn.AlphaDropout(0.5)
    a.eval()
    x = dtorch.randn(4)
    assert a(x) is x
    assert issubclass(dtorch.optim.SGD, dtorch.optim.Optimizer)
    with pytest.warns(UserWarning, match="deprecated"):
        dtorch.nn.functional.upsample(dtorch.zeros(1, 1, 2), scale_factor=2)
    for cls, args in (("AdaptiveMaxPool2d", (2,)),
                      ("PairwiseDistance", ()), ("MarginRankingLoss", ()),
                      ("CosineEmbeddingLoss", ()),
                      ("HingeEmbeddingLoss", ()), ("SoftMarginLoss", ()),
                      ("PoissonNLLLoss", ()), ("GaussianNLLLoss", ()),
                      ("MultiLabelSoftMarginLoss", ()),
                      ("MultiMarginLoss", ())):
        assert repr(getattr(nn, cls)(*args)).startswith(cls)


def test_data_samplers_and_datasets():
    D = dtorch.utils.data
    assert issubclass(D.RandomSampler, D.Sampler)
    dtorch.manual_seed(0)
    s = D.WeightedRandomSampler([0.0, 1.0, 3.0], 4000)
    counts = np.bincount(list(s), minlength=3)
    assert counts[0] == 0 and abs(counts[2] / 4000 - 0.75) < 0.03
    assert len(s) == 4000
    no_rep = list(D.WeightedRandomSampler([1, 1, 1, 1], 4,
                                          replacement=False))
    assert sorted(no_rep) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="num_samples"):
        D.WeightedRandomSampler([1.0], 0)

    class Stream(D.IterableDataset):
        def __init__(self, n):
            self.n = n

        def __iter__(self):
            return iter(range(self.n))

        def __len__(self):
            return self.n
    ch = D.ChainDataset([Stream(2), Stream(3)])
    assert list(ch) == [0, 1, 0, 1, 2] and len(ch) == 5
    st = D.StackDataset(dtorch.arange(3), dtorch.arange(3) * 10)
    assert [int(v) for v in st[2]] == [2, 20] and len(st) == 3
    sd = D.StackDataset(x=[1, 2], y=[3, 4])
    assert sd[1] == {"x": 2, "y": 4}
    with pytest.raises(ValueError, match="Size mismatch"):
        D.StackDataset([1], [1, 2])
    loader = D.DataLoader(st, batch_size=3)
    _, yb = next(iter(loader))
    assert yb.tolist() == [0, 10, 20]
