"""nn's PyTorch arguments act: the in-place activations write into their
input (F and modules), RReLU's module draws random slopes in training,
and the generated activation modules take torch.nn's signatures, refusing
unknown arguments instead of storing them."""
import inspect
import warnings

import numpy as np
import pytest

import dtorch
import dtorch.nn as nn
import dtorch.nn.functional as F

# (name, extra args) of F functions with inplace=, value-checked vs torch
INPLACE = [("hardswish", ()), ("hardsigmoid", ()), ("selu", ()),
           ("celu", (0.7,)), ("threshold", (0.25, -3.0)),
           ("rrelu", (0.1, 0.3))]          # rrelu: eval (training=False)
X = np.array([-4.0, -1.5, -0.2, 0.0, 0.25, 0.7, 2.0, 5.0])


@pytest.mark.parametrize("name,args", INPLACE)
def test_functional_inplace_writes_the_input_as_torch(name, args):
    torch = pytest.importorskip("torch")
    want_in = torch.tensor(X)
    want = getattr(torch.nn.functional, name)(want_in, *args, inplace=True)
    x = dtorch.tensor(X)
    v = x._version
    out = getattr(F, name)(x, *args, inplace=True)
    assert out is x and x._version > v
    np.testing.assert_allclose(x.numpy(), want_in.numpy(), rtol=1e-12)
    np.testing.assert_allclose(out.numpy(), want.numpy(), rtol=1e-12)


@pytest.mark.parametrize("name,args", INPLACE)
def test_functional_inplace_gradient_as_torch(name, args):
    torch = pytest.importorskip("torch")
    tx = torch.tensor(X, requires_grad=True)
    th = tx * 1.5                           # in place on a non-leaf
    getattr(torch.nn.functional, name)(th, *args, inplace=True)
    (th * torch.arange(8.0)).sum().backward()
    dx = dtorch.tensor(X, requires_grad=True)
    dh = dx * 1.5
    getattr(F, name)(dh, *args, inplace=True)
    (dh * dtorch.arange(8.0)).sum().backward()
    np.testing.assert_allclose(dx.grad.numpy(), tx.grad.numpy(),
                               rtol=1e-7, atol=1e-12)


def _inplace_modules():
    torch = pytest.importorskip("torch")
    out = []
    for name in sorted(dir(torch.nn)):
        c = getattr(torch.nn, name)
        if isinstance(c, type) and issubclass(c, torch.nn.Module) and \
                hasattr(nn, name) and "inplace" in \
                inspect.signature(c.__init__).parameters:
            out.append(name)
    return out


@pytest.mark.filterwarnings("ignore:dropout[23]d")
def test_every_inplace_module_writes_its_input():
    # ELU, SiLU, Mish, the alpha dropouts, Threshold, SELU, CELU, ... all
    # stored inplace=True and returned a new tensor
    names = _inplace_modules()
    assert {"ReLU", "ELU", "SiLU", "Mish", "AlphaDropout", "Threshold",
            "SELU", "RReLU", "Dropout2d"} <= set(names)
    xs = np.tile(X, (2, 3, 1))              # (N, C, L): every dropout's
    for name in names:
        args = (0.1, 20.0) if name == "Threshold" else ()
        for train in (False, True):
            dtorch.manual_seed(1)
            ref = getattr(nn, name)(*args).train(train)(dtorch.tensor(xs))
            x = dtorch.tensor(xs)
            dtorch.manual_seed(1)
            out = getattr(nn, name)(*args, inplace=True).train(train)(x)
            assert out is x, (name, train)
            np.testing.assert_array_equal(x.numpy(), ref.numpy(),
                                          err_msg=f"{name} train={train}")


@pytest.mark.parametrize("fn,x", [
    ("dropout", X), ("alpha_dropout", X),
    ("dropout1d", np.tile(X, (3, 1))),      # unbatched (C, L)
    ("dropout2d", np.tile(X, (2, 3, 1, 1))),
    ("feature_alpha_dropout", np.tile(X, (2, 3, 1)))])
def test_inplace_dropout_gradient_sees_the_mask(fn, x):
    # the in-place path copied the result under no_grad: backward went
    # around the dropout (gradient 1 where the output was 0)
    w = dtorch.tensor(np.arange(1, x.size + 1.0).reshape(x.shape))
    grads = []
    for inplace in (False, True):
        a = dtorch.tensor(x, requires_grad=True)
        h = a * 1.0
        dtorch.manual_seed(3)
        out = getattr(F, fn)(h, 0.4, True, inplace=inplace)
        assert (out is h) == inplace
        (out * w).sum().backward()
        grads.append(a.grad.numpy())
    np.testing.assert_array_equal(grads[1], grads[0])
    assert (grads[0] == 0).any()            # something was dropped


def test_rrelu_module_draws_slopes_in_training_only():
    m = nn.RReLU(0.1, 0.3)
    x = -dtorch.ones(2000)
    dtorch.manual_seed(0)
    slopes = -m(x).numpy()
    assert slopes.min() >= 0.1 and slopes.max() <= 0.3
    assert slopes.std() > 0.03             # uniform(0.1, 0.3): std 0.058
    m.eval()
    np.testing.assert_allclose(-m(x).numpy(), 0.2)


@pytest.mark.parametrize("cls", ["CELU", "GLU", "Hardshrink", "Hardsigmoid",
                                 "Hardswish", "RReLU", "SELU", "Softshrink"])
def test_generated_activation_signatures(cls):
    torch = pytest.importorskip("torch")
    t = inspect.signature(getattr(torch.nn, cls).__init__).parameters
    d = inspect.signature(getattr(nn, cls).__init__).parameters
    assert [(k, p.default) for k, p in d.items()] == \
        [(k, p.default) for k, p in t.items()]
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        getattr(nn, cls)(no_such_option=1)
    with pytest.raises(TypeError, match="too many positional"):
        getattr(nn, cls)(*range(len(t)))


def _loss_inputs(lib, name):
    rng = np.random.default_rng(7)
    a, b, c = (lib.tensor(rng.standard_normal((4, 3))) for _ in range(3))
    sign = lib.tensor(np.array([1.0, -1.0, 1.0, -1.0]))
    return {
        "mse_loss": (a, b),
        "margin_ranking_loss": (a[:, 0], b[:, 0], sign),
        "hinge_embedding_loss": (a, lib.tensor(np.sign(
            rng.standard_normal((4, 3))))),
        "soft_margin_loss": (a, lib.tensor(np.sign(
            rng.standard_normal((4, 3))))),
        "cosine_embedding_loss": (a, b, sign),
        "triplet_margin_loss": (a, b, c),
        "poisson_nll_loss": (a, lib.tensor(rng.poisson(2.0, (4, 3)) * 1.0)),
        "multilabel_soft_margin_loss": (a, lib.tensor(
            (rng.random((4, 3)) > 0.5) * 1.0)),
        "multi_margin_loss": (a, lib.tensor(np.array([0, 2, 1, 2]))),
    }[name]


LEGACY = [dict(size_average=False), dict(reduce=False),
          dict(size_average=True, reduce=True), dict(size_average=False,
                                                     reduce=True)]


@pytest.mark.parametrize("kw", LEGACY)
@pytest.mark.parametrize("name", ["mse_loss", "margin_ranking_loss",
                                  "hinge_embedding_loss", "soft_margin_loss",
                                  "cosine_embedding_loss",
                                  "triplet_margin_loss", "poisson_nll_loss",
                                  "multilabel_soft_margin_loss",
                                  "multi_margin_loss"])
def test_legacy_size_average_and_reduce_as_torch(name, kw):
    # 8 losses ignored them: reduce=False gave the mean, not per-element
    torch = pytest.importorskip("torch")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")     # torch's deprecation notice
        want = getattr(torch.nn.functional, name)(
            *_loss_inputs(torch, name), **kw)
    got = getattr(F, name)(*_loss_inputs(dtorch, name), **kw)
    assert tuple(got.shape) == tuple(want.shape)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-10)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_mse_loss_weight_as_torch(reduction):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    a, b, w = (rng.standard_normal((3, 4)) for _ in range(3))
    w = np.abs(w)
    ta = torch.tensor(a, requires_grad=True)
    want = torch.nn.functional.mse_loss(ta, torch.tensor(b),
                                        reduction=reduction,
                                        weight=torch.tensor(w))
    da = dtorch.tensor(a, requires_grad=True)
    got = F.mse_loss(da, dtorch.tensor(b), reduction=reduction,
                     weight=dtorch.tensor(w))
    np.testing.assert_allclose(got.detach().numpy(),
                               want.detach().numpy(), rtol=1e-12)
    want.sum().backward()
    got.sum().backward()
    np.testing.assert_allclose(da.grad.numpy(), ta.grad.numpy(), rtol=1e-12)
    with pytest.raises(ValueError, match="same size"):
        F.mse_loss(da, dtorch.tensor(b), weight=dtorch.ones(4))


@pytest.mark.parametrize("dims", [1, 2])
def test_conv_transpose_output_size_as_torch(dims):
    # ConvTranspose1d ignored forward's output_size (one size too small)
    torch = pytest.importorskip("torch")
    cls = f"ConvTranspose{dims}d"
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 3) + (5,) * dims)
    tm = getattr(torch.nn, cls)(3, 2, 3, stride=2, padding=1).double()
    dm = getattr(nn, cls)(3, 2, 3, stride=2, padding=1, dtype=dtorch.float64)
    dm.load_state_dict({k: dtorch.tensor(v.detach().numpy())
                        for k, v in tm.state_dict().items()})
    size = [10] * dims                     # 9 by default, 10 is valid
    want = tm(torch.tensor(x), output_size=size)
    got = dm(dtorch.tensor(x), output_size=size)
    assert list(got.shape) == list(want.shape) == [2, 2] + size
    np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(),
                               rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="valid sizes range from 9 to 10"):
        dm(dtorch.tensor(x), output_size=[12] * dims)


def test_sdpa_enable_gqa_as_torch():
    # enable_gqa was ignored: 4 query heads over 2 key/value heads failed
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    q = rng.standard_normal((2, 4, 3, 8))
    k, v = (rng.standard_normal((2, 2, 5, 8)) for _ in range(2))
    want = torch.nn.functional.scaled_dot_product_attention(
        *(torch.tensor(a) for a in (q, k, v)), enable_gqa=True)
    args = [dtorch.tensor(a, requires_grad=True) for a in (q, k, v)]
    got = F.scaled_dot_product_attention(*args, enable_gqa=True)
    np.testing.assert_allclose(got.detach().numpy(), want.numpy(),
                               rtol=1e-10, atol=1e-12)
    assert dtorch.autograd.gradcheck(
        lambda a, b, c: F.scaled_dot_product_attention(a, b, c,
                                                       enable_gqa=True),
        args)
    with pytest.raises(RuntimeError, match="multiple of the key/value"):
        F.scaled_dot_product_attention(
            dtorch.tensor(q[:, :3]), *args[1:], enable_gqa=True)


def test_mha_forward_refuses_bias_v_and_static_v_alone():
    # only bias_k/static_k were checked; bias_v/static_v alone were dropped.
    # bias_k/bias_v are supported now (tests/nn/test_mha_bias_kv.py): one
    # without the other is torch's AssertionError; static_v is not there
    E, H = 4, 2
    x = dtorch.randn(3, 1, E)
    w, b = dtorch.randn(3 * E, E), dtorch.zeros(3 * E)
    ow, ob = dtorch.randn(E, E), dtorch.zeros(E)
    for kw, err in ((dict(bias_v=dtorch.zeros(1, 1, E)), AssertionError),
                    (dict(static_v=dtorch.zeros(H, 3, E // H)),
                     NotImplementedError)):
        args = dict(bias_k=None, bias_v=None, add_zero_attn=False,
                    dropout_p=0.0, out_proj_weight=ow, out_proj_bias=ob)
        args.update(kw)
        with pytest.raises(err, match="bias_v is set|static_v"):
            F.multi_head_attention_forward(x, x, x, E, H, w, b, **args)


def test_load_state_dict_assign_as_torch():
    # assign=True was ignored: values were copied into float32 parameters
    torch = pytest.importorskip("torch")
    for lib in (torch, dtorch):
        m = lib.nn.Sequential(lib.nn.Linear(2, 3), lib.nn.BatchNorm1d(3))
        m[0].bias.requires_grad_(False)
        sd = {k: v.detach().clone().double() + 1
              for k, v in m.state_dict().items()}
        r = m.load_state_dict(sd, assign=True)
        assert not r.missing_keys and not r.unexpected_keys
        assert m[0].weight.dtype == lib.float64
        assert isinstance(m[0].weight, lib.nn.Parameter)
        assert m[0].weight.requires_grad and not m[0].bias.requires_grad
        assert m[1].running_mean is sd["1.running_mean"]
        sd["0.weight"].add_(5)            # the parameter is that memory
        assert float(m[0].weight.detach().sum()) == \
            float(sd["0.weight"].sum())
        assert "weight" in dict(m[0].named_parameters())
    m = nn.Linear(2, 3)
    w = m.weight
    m.load_state_dict({"weight": dtorch.ones(3, 2), "bias": dtorch.ones(3)})
    assert m.weight is w and m.weight.tolist() == [[1.0, 1.0]] * 3


def test_forward_hook_always_call_runs_when_forward_raises():
    seen = []

    class Boom(nn.Module):
        def forward(self, x, k=0):
            raise ValueError("boom")

    m = Boom()
    m.register_forward_hook(lambda mod, a, out: seen.append(("plain", out)))
    m.register_forward_hook(lambda mod, a, out: seen.append(("always", out)),
                            always_call=True)
    m.register_forward_hook(lambda mod, a, kw, out: seen.append(("kw", kw)),
                            with_kwargs=True, always_call=True)
    with pytest.raises(ValueError, match="boom"):
        m(1, k=2)
    assert seen == [("always", None), ("kw", {"k": 2})]
    # an always hook's own error is a warning: forward's error propagates;
    # a hook that raised itself is not run again
    seen.clear()
    b = Boom()

    def bad(mod, a, out):
        raise KeyError("hook")
    b.register_forward_hook(bad, always_call=True)
    b.register_forward_hook(lambda mod, a, out: seen.append(1),
                            always_call=True)
    with pytest.warns(UserWarning, match="always_call.*'hook'"):
        with pytest.raises(ValueError, match="boom"):
            b(1)
    assert seen == [1]
    lin = nn.Linear(2, 2)
    lin.register_forward_hook(bad, always_call=True)
    calls = []
    lin.register_forward_hook(lambda mod, a, out: calls.append(out),
                              always_call=True)
    with pytest.raises(KeyError):
        lin(dtorch.ones(2))
    assert len(calls) == 1 and tuple(calls[0].shape) == (2,)
    seen.clear()
    lin2 = nn.Linear(2, 2)
    lin2.register_forward_hook(lambda mod, a, out: seen.append(out.shape),
                               always_call=True)
    lin2(dtorch.ones(2))                    # once on success
    assert seen == [(2,)]


def test_ddp_load_state_dict_assign_warns_and_copies():
    import dtorch.distributed as dist
    from dtorch import _ignored
    from dtorch.nn.parallel import DistributedDataParallel as DDP
    _ignored._warned.discard(("DistributedDataParallel.load_state_dict",
                              "assign"))

    def body(rank, world):
        ddp = DDP(nn.Linear(2, 2))
        w = ddp.module.weight
        sd = {k: v.detach() + 1 for k, v in ddp.state_dict().items()}
        with pytest.warns(UserWarning, match="assign=True has no effect"):
            ddp.load_state_dict(sd, assign=True)
        return ddp.module.weight is w and \
            ddp.module.weight.tolist() == sd["module.weight"].tolist()

    assert dist.spawn_threads(body, 1) == [True]


@pytest.mark.parametrize("cls", ["Embedding", "EmbeddingBag"])
def test_embedding_sparse_warns_once_and_gives_the_dense_gradient(cls):
    from dtorch import _ignored
    _ignored._warned.clear()
    idx = dtorch.tensor([[0, 2], [2, 3]])
    grads = []
    for sparse in (False, True, True):
        dtorch.manual_seed(0)
        m = getattr(nn, cls)(5, 3, sparse=sparse)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            m(idx).sum().backward()
        grads.append(m.weight.grad.numpy())
        msgs = [str(x.message) for x in w]
        if sparse and len(grads) == 2:
            assert len(msgs) == 1 and "sparse=True has no effect" in \
                msgs[0] and "dense" in msgs[0], msgs
        else:
            assert not msgs, msgs           # off, or already warned
    np.testing.assert_array_equal(grads[1], grads[0])
    _ignored._warned.clear()


def test_clip_grad_foreach_changes_nothing():
    from dtorch.nn.utils import clip_grad_norm_, clip_grad_value_
    from dtorch.nn.utils.clip_grad import get_total_norm

    def params():
        rng = np.random.default_rng(0)
        ps = [dtorch.zeros(3, 2, requires_grad=True),
              dtorch.zeros(4, requires_grad=True)]
        for p in ps:
            p.grad = dtorch.tensor(rng.standard_normal(p.shape) * 5)
        return ps

    for foreach in (True, False):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            base, got = params(), params()
            n0 = clip_grad_norm_(base, 1.0, norm_type=3.0)
            n1 = clip_grad_norm_(got, 1.0, norm_type=3.0, foreach=foreach)
            assert n0.item() == n1.item()
            clip_grad_value_(base, 0.1)
            clip_grad_value_(got, 0.1, foreach=foreach)
            for a, b in zip(base, got):
                np.testing.assert_array_equal(a.grad.numpy(), b.grad.numpy())
            assert get_total_norm([p.grad for p in got], foreach=foreach) \
                .item() == get_total_norm([p.grad for p in base]).item()


def test_packed_sequence_cuda_takes_the_device_index():
    # PackedSequence.cuda(1) went to the current device (arguments dropped)
    if dtorch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices (DTORCH_FAKE_CUDA=1 has two)")
    from dtorch.nn.utils.rnn import pack_sequence
    ps = pack_sequence([dtorch.ones(3, 2), dtorch.ones(2, 2)])
    assert str(ps.cuda(1).data.device) == "cuda:1"
    assert str(ps.cuda(device=1).batch_sizes.device) == "cpu"
    assert str(ps.cuda().data.device) == "cuda:0"
