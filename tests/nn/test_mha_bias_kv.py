"""nn.MultiheadAttention(add_bias_kv=True, add_zero_attn=True) equal to
torch's with the same weights: parameters and state_dict keys (bias_k /
bias_v), outputs, attention weights and gradients, with and without
need_weights, with key-padding and attention masks, batch_first."""
import numpy as np
import pytest

import dtorch

torch = pytest.importorskip("torch")


def pair(add_bias_kv, add_zero_attn, batch_first=False, kdim=None):
    torch.manual_seed(0)
    t = torch.nn.MultiheadAttention(8, 2, add_bias_kv=add_bias_kv,
                                    add_zero_attn=add_zero_attn,
                                    batch_first=batch_first, kdim=kdim,
                                    vdim=kdim)
    d = dtorch.nn.MultiheadAttention(8, 2, add_bias_kv=add_bias_kv,
                                     add_zero_attn=add_zero_attn,
                                     batch_first=batch_first, kdim=kdim,
                                     vdim=kdim)
    assert list(d.state_dict()) == list(t.state_dict())
    d.load_state_dict({k: dtorch.tensor(v.numpy())
                       for k, v in t.state_dict().items()})
    return d, t


@pytest.mark.parametrize("bias_kv,zero_attn", [(True, False), (False, True),
                                               (True, True)])
@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("masks", [False, True])
def test_equal_to_torch(bias_kv, zero_attn, need_weights, masks):
    d, t = pair(bias_kv, zero_attn)
    rng = np.random.default_rng(1)
    q = rng.standard_normal((3, 2, 8)).astype(np.float32)
    kv = rng.standard_normal((4, 2, 8)).astype(np.float32)
    kpm = np.array([[False, False, True, False], [False, True, True, False]])
    am = np.where(rng.random((3, 4)) > 0.7, -np.inf, 0.0).astype(np.float32)
    am[:, 0] = 0.0
    res = []
    for lib, m in ((dtorch, d), (torch, t)):
        xq = lib.tensor(q, requires_grad=True)
        xk = lib.tensor(kv, requires_grad=True)
        kw = {}
        if masks:
            kw = {"key_padding_mask": lib.tensor(kpm),
                  "attn_mask": lib.tensor(am)}
        out, w = m(xq, xk, xk, need_weights=need_weights, **kw)
        out.pow(2).sum().backward()
        grads = [p.grad.numpy() for _, p in sorted(m.named_parameters())]
        res.append([out.detach().numpy(), xq.grad.numpy(), xk.grad.numpy()]
                   + ([w.detach().numpy()] if need_weights else [])
                   + grads)
    for a, b in zip(*res):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)


def test_parameters_and_init():
    d, t = pair(True, True)
    assert d.bias_k.shape == (1, 1, 8) and d.bias_v.requires_grad
    assert d.add_zero_attn is True
    plain = dtorch.nn.MultiheadAttention(8, 2)
    assert plain.bias_k is None and "bias_k" not in plain.state_dict()
    # xavier_normal_ init, as torch: not zeros, std near sqrt(2 / 16)
    m = dtorch.nn.MultiheadAttention(64, 4, add_bias_kv=True)
    assert abs(float(m.bias_k.std()) - np.sqrt(2 / 128)) < 0.06


def test_batch_first_and_separate_kdim():
    d, t = pair(True, True, batch_first=True, kdim=6)
    rng = np.random.default_rng(2)
    q = rng.standard_normal((2, 3, 8)).astype(np.float32)
    k = rng.standard_normal((2, 5, 6)).astype(np.float32)
    od, wd = d(dtorch.tensor(q), dtorch.tensor(k), dtorch.tensor(k))
    ot, wt = t(torch.tensor(q), torch.tensor(k), torch.tensor(k))
    np.testing.assert_allclose(od.detach().numpy(), ot.detach().numpy(),
                               rtol=2e-5, atol=2e-6)
    assert tuple(wd.shape) == tuple(wt.shape) == (2, 3, 7)
