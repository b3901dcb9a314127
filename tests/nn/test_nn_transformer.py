"""nn.Transformer* and GroupNorm/InstanceNorm against PyTorch: the same
state_dict keys, and equal outputs and gradients from the same weights."""
import numpy as np
import pytest

import dtorch
import dtorch.nn as nn
from helpers import close

torch = pytest.importorskip("torch")


def _copy_weights(dmod, tmod):
    """Load torch's weights into the dtorch module by state_dict key."""
    sd_t = tmod.state_dict()
    assert list(dmod.state_dict().keys()) == list(sd_t.keys())
    dmod.load_state_dict({k: dtorch.tensor(v.detach().numpy())
                          for k, v in sd_t.items()})


def _close(a, b, tol=1e-10):
    close(a, b, tol)


rng = np.random.default_rng(0)


def _pair(arr):
    return (dtorch.tensor(arr, requires_grad=True),
            torch.tensor(arr, requires_grad=True))


# torch warns that a bool key padding mask with a float attention mask is
# deprecated; both kinds are tested on purpose
@pytest.mark.filterwarnings("ignore:Support for mismatched")
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu", "callable"])
def test_encoder_layer_matches_torch(norm_first, batch_first, activation):
    act_d = dtorch.nn.functional.silu if activation == "callable" \
        else activation
    act_t = torch.nn.functional.silu if activation == "callable" \
        else activation
    kw = dict(d_model=8, nhead=2, dim_feedforward=16, dropout=0.0,
              norm_first=norm_first, batch_first=batch_first)
    torch.manual_seed(0)
    tl = torch.nn.TransformerEncoderLayer(activation=act_t, **kw).double()
    dl = nn.TransformerEncoderLayer(activation=act_d, **kw).double()
    _copy_weights(dl, tl)
    x = rng.standard_normal((3, 5, 8))
    xd, xt = _pair(x)
    mask = np.triu(np.full((5 if batch_first else 3,) * 2, -np.inf), 1)
    kpm = np.zeros((3 if batch_first else 5, 5 if batch_first else 3), bool)
    kpm[0, -1] = True
    od = dl(xd, src_mask=dtorch.tensor(mask),
            src_key_padding_mask=dtorch.tensor(kpm))
    ot = tl(xt, src_mask=torch.tensor(mask),
            src_key_padding_mask=torch.tensor(kpm))
    _close(od, ot)
    w = rng.standard_normal(od.shape)
    (od * dtorch.tensor(w)).sum().backward()
    (ot * torch.tensor(w)).sum().backward()
    _close(xd.grad, xt.grad)
    for (kd, pd), (kt, pt) in zip(dl.named_parameters(),
                                  tl.named_parameters()):
        assert kd == kt
        _close(pd.grad, pt.grad)


def test_decoder_and_full_transformer_match_torch():
    kw = dict(d_model=8, nhead=2, num_encoder_layers=2, num_decoder_layers=2,
              dim_feedforward=16, dropout=0.0, batch_first=True)
    torch.manual_seed(1)
    tm = torch.nn.Transformer(**kw).double()
    dm = nn.Transformer(**kw).double()
    _copy_weights(dm, tm)
    src, tgt = rng.standard_normal((2, 6, 8)), rng.standard_normal((2, 4, 8))
    sd, st = _pair(src)
    td, tt = _pair(tgt)
    md = nn.Transformer.generate_square_subsequent_mask(4, dtype=dtorch.float64)
    mt = torch.nn.Transformer.generate_square_subsequent_mask(
        4, dtype=torch.float64)
    _close(md, mt)
    mkp = np.zeros((2, 6), bool)
    mkp[1, :2] = True
    od = dm(sd, td, tgt_mask=md, memory_key_padding_mask=dtorch.tensor(mkp),
            tgt_is_causal=True)
    ot = tm(st, tt, tgt_mask=mt, memory_key_padding_mask=torch.tensor(mkp),
            tgt_is_causal=True)
    _close(od, ot)
    od.pow(2).sum().backward()
    ot.pow(2).sum().backward()
    _close(sd.grad, st.grad)
    _close(td.grad, tt.grad)
    # a boolean causal mask gives the same result as the float one
    bm = dtorch.ones(4, 4, dtype=dtorch.bool).triu(1)
    _close(dm(sd, td, tgt_mask=bm), tm(st, tt, tgt_mask=mt))
    with pytest.raises(RuntimeError, match="batch number"):
        dm(dtorch.randn(2, 6, 8, dtype=dtorch.float64),
           dtorch.randn(3, 4, 8, dtype=dtorch.float64))
    with pytest.raises(RuntimeError, match="d_model"):
        dm(dtorch.randn(2, 6, 4), dtorch.randn(2, 4, 4))


def test_decoder_layer_norm_first_and_encoder_stack():
    kw = dict(d_model=8, nhead=4, dim_feedforward=12, dropout=0.0,
              norm_first=True)
    torch.manual_seed(2)
    tl = torch.nn.TransformerDecoderLayer(**kw).double()
    dl = nn.TransformerDecoderLayer(**kw).double()
    _copy_weights(dl, tl)
    t_, m_ = rng.standard_normal((4, 2, 8)), rng.standard_normal((5, 2, 8))
    _close(dl(dtorch.tensor(t_), dtorch.tensor(m_)),
           tl(torch.tensor(t_), torch.tensor(m_)))
    torch.manual_seed(3)
    te = torch.nn.TransformerEncoder(
        torch.nn.TransformerEncoderLayer(8, 2, 16, 0.0), 3,
        norm=torch.nn.LayerNorm(8), enable_nested_tensor=False).double()
    de = nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, 16, 0.0), 3,
                               norm=nn.LayerNorm(8)).double()
    _copy_weights(de, te)
    x = rng.standard_normal((5, 2, 8))
    causal = nn.Transformer.generate_square_subsequent_mask(
        5, dtype=dtorch.float64)
    _close(de(dtorch.tensor(x), mask=causal, is_causal=True),
           te(torch.tensor(x), mask=torch.nn.Transformer.
              generate_square_subsequent_mask(5, dtype=torch.float64),
              is_causal=True))
    # the layers are independent copies
    assert de.layers[0].linear1.weight is not de.layers[1].linear1.weight
    with pytest.raises(RuntimeError, match="relu/gelu"):
        nn.TransformerEncoderLayer(8, 2, activation="tanh")


def test_transformer_subclassing_at_import_and_dropout_training():
    class MyLayer(nn.TransformerEncoderLayer):
        pass
    layer = MyLayer(8, 2, 16, dropout=0.5)
    x = dtorch.randn(3, 2, 8)
    layer.train()
    assert layer(x).shape == (3, 2, 8)
    layer.eval()
    with dtorch.no_grad():
        np.testing.assert_array_equal(layer(x).numpy(), layer(x).numpy())


@pytest.mark.parametrize("groups,affine", [(1, True), (2, True), (4, False)])
def test_group_norm_matches_torch(groups, affine):
    x = rng.standard_normal((3, 4, 5, 2))
    tg = torch.nn.GroupNorm(groups, 4, affine=affine).double()
    dg = nn.GroupNorm(groups, 4, affine=affine).double()
    if affine:
        with torch.no_grad():
            tg.weight.copy_(torch.tensor(rng.standard_normal(4)))
            tg.bias.copy_(torch.tensor(rng.standard_normal(4)))
    _copy_weights(dg, tg)
    xd, xt = _pair(x)
    od, ot = dg(xd), tg(xt)
    _close(od, ot)
    w = rng.standard_normal(x.shape)
    (od * dtorch.tensor(w)).sum().backward()
    (ot * torch.tensor(w)).sum().backward()
    _close(xd.grad, xt.grad)
    if affine:
        _close(dg.weight.grad, tg.weight.grad)
        _close(dg.bias.grad, tg.bias.grad)
    assert dtorch.autograd.gradcheck(
        lambda t: dtorch.nn.functional.group_norm(t, groups),
        (dtorch.tensor(x[:2, :, :2], requires_grad=True),))
    with pytest.raises(ValueError, match="divisible"):
        nn.GroupNorm(3, 4)


@pytest.mark.parametrize("cls,shape", [("InstanceNorm1d", (2, 3, 6)),
                                       ("InstanceNorm2d", (2, 3, 4, 5))])
@pytest.mark.parametrize("kw", [dict(), dict(affine=True),
                                dict(track_running_stats=True)])
def test_instance_norm_matches_torch(cls, shape, kw):
    x = rng.standard_normal(shape)
    tn = getattr(torch.nn, cls)(3, **kw).double()
    dn = getattr(nn, cls)(3, **kw).double()
    _copy_weights(dn, tn)
    xd, xt = _pair(x)
    _close(dn(xd), tn(xt))
    dn(xd).sum().backward()
    tn(xt).sum().backward()
    _close(xd.grad, xt.grad, 1e-9)
    if kw.get("track_running_stats"):
        _close(dn.running_mean, tn.running_mean)
        _close(dn.running_var, tn.running_var)
        dn.eval()
        tn.eval()
        _close(dn(xd), tn(xt))
