"""The issue-14 ops on every device the suite has (cpu; cuda with CuPy or
under DTORCH_FAKE_CUDA=1): values and input gradients equal the CPU's."""
import numpy as np
import pytest

import dtorch
import dtorch.nn.functional as F

rng = np.random.default_rng(0)
X = rng.standard_normal((4, 6))

OPS = {
    "tril": lambda x, d: x.tril(-1),
    "topk": lambda x, d: x.topk(2).values,
    "topk_partition": lambda x, d: x.repeat(1, 20).topk(3).values,
    "sort": lambda x, d: x.sort(1, descending=True).values,
    "kthvalue": lambda x, d: x.kthvalue(2, 1).values,
    "median": lambda x, d: x.median(0).values,
    "quantile": lambda x, d: x.quantile(0.3, 1),
    "gather": lambda x, d: x.gather(1, dtorch.tensor([[0, 5]] * 4,
                                                     device=d)),
    "scatter_add": lambda x, d: x.scatter_add(
        0, dtorch.tensor([[0] * 6, [3] * 6], device=d), x[:2]),
    "index_select": lambda x, d: x.index_select(
        1, dtorch.tensor([0, 0, 2], device=d)),
    "index_add": lambda x, d: x.index_add(
        0, dtorch.tensor([1, 1], device=d), x[:2]),
    "cumprod": lambda x, d: x.cumprod(1),
    "cummax": lambda x, d: x.cummax(1).values,
    "mode": lambda x, d: (x > 0).long().mode(1).values.to(x.dtype) * x[:, 0],
    "einsum": lambda x, d: dtorch.einsum("ij,kj->ik", x, x),
    "erfinv": lambda x, d: x.tanh().erfinv(),
    "lgamma": lambda x, d: x.abs().lgamma(),
    "atan2": lambda x, d: dtorch.atan2(x, x.flip(0)),
    "diag_embed": lambda x, d: x.diag_embed(),
    "unfold": lambda x, d: x.unfold(1, 2, 2),
    "repeat_interleave": lambda x, d: x.repeat_interleave(2, 0),
    "group_norm": lambda x, d: F.group_norm(x.reshape(2, 4, 3), 2),
    "interpolate": lambda x, d: F.interpolate(x.reshape(1, 1, 4, 6), (5, 7),
                                              mode="bilinear"),
    "im2col": lambda x, d: F.unfold(x.reshape(1, 1, 4, 6), 2),
    "adaptive_max_pool2d": lambda x, d: F.adaptive_max_pool2d(
        x.reshape(1, 1, 4, 6), 3),
    "conv3d": lambda x, d: F.conv3d(x.reshape(1, 1, 2, 2, 6), x[:2, :4]
                                    .reshape(2, 1, 1, 2, 2)),
    "ctc_loss": lambda x, d: F.ctc_loss(x.reshape(4, 1, 6).log_softmax(2),
                                        dtorch.tensor([[1, 2]]), [4], [2]),
    "cdist": lambda x, d: dtorch.cdist(x, x.flip(0) + 1),
    "embedding_bag": lambda x, d: F.embedding_bag(
        dtorch.tensor([0, 1, 3], device=d), x,
        dtorch.tensor([0, 1], device=d), mode="max"),
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_op_on_device_matches_cpu(name, device):
    op = OPS[name]
    xc = dtorch.tensor(X, requires_grad=True)
    xd = dtorch.tensor(X, device=device, requires_grad=True)
    oc, od = op(xc, "cpu"), op(xd, device)
    assert od.device.type == device.split(":")[0]
    np.testing.assert_allclose(od.detach().cpu().numpy(),
                               oc.detach().numpy(), rtol=1e-9, atol=1e-12)
    w = rng.standard_normal(tuple(oc.shape))
    (oc * dtorch.tensor(w)).sum().backward()
    (od * dtorch.tensor(w, device=device)).sum().backward()
    np.testing.assert_allclose(xd.grad.cpu().numpy(), xc.grad.numpy(),
                               rtol=1e-9, atol=1e-12)


def test_multinomial_and_transformer_on_device(device):
    p = dtorch.tensor([[0.1, 0.0, 0.9]], device=device)
    s = p.multinomial(50, True)
    assert s.device.type == device.split(":")[0] and s.dtype == dtorch.int64
    assert not (s == 1).any()
    layer = dtorch.nn.TransformerEncoderLayer(6, 2, 8, 0.0).to(device)
    out = layer(dtorch.tensor(X.reshape(2, 2, 6), dtype=dtorch.float32,
                              device=device))
    assert out.shape == (2, 2, 6)
