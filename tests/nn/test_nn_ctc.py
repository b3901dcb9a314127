"""CTC loss against PyTorch: losses, gradients (through log_softmax and
PyTorch's own gradient w.r.t. log_probs), padded and concatenated targets,
blank index, zero_infinity, unbatched input."""
import numpy as np
import pytest

import dtorch
import dtorch.nn as nn

torch = pytest.importorskip("torch")

rng = np.random.default_rng(0)
T, N, C = 8, 4, 6
LOGITS = rng.standard_normal((T, N, C))
TG = np.array([[1, 2, 2, 3], [3, 0, 0, 0], [4, 1, 5, 0], [5, 5, 5, 0]])
TL = [4, 1, 3, 3]
IL = [8, 5, 6, 7]


def _run(lib, fn, logits, *args, softmax=True, **kw):
    x = lib.tensor(logits, requires_grad=True)
    lp = x.log_softmax(-1) if softmax else x
    loss = fn(lib)(lp, *[lib.tensor(a) for a in args], **kw)
    w = np.arange(1, loss.numel() + 1, dtype=np.float64).reshape(
        tuple(loss.shape))
    (loss * lib.tensor(w)).sum().backward()
    return loss.detach().numpy(), x.grad.numpy()


def _F(lib):
    return lib.nn.functional.ctc_loss


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("softmax", [True, False])
def test_ctc_matches_torch(reduction, softmax):
    logits = LOGITS if softmax else \
        np.log(np.exp(LOGITS) / np.exp(LOGITS).sum(-1, keepdims=True))
    a = _run(dtorch, _F, logits, TG, IL, TL, reduction=reduction,
             softmax=softmax)
    b = _run(torch, _F, logits, TG, IL, TL, reduction=reduction,
             softmax=softmax)
    for x, y in zip(a, b):
        np.testing.assert_allclose(x, y, rtol=1e-10, atol=1e-12)


def test_ctc_concatenated_targets_blank_and_module():
    flat = np.concatenate([TG[i, :TL[i]] for i in range(N)])
    a = _run(dtorch, _F, LOGITS, flat, IL, TL, reduction="none")
    b = _run(torch, _F, LOGITS, flat, IL, TL, reduction="none")
    for x, y in zip(a, b):
        np.testing.assert_allclose(x, y, rtol=1e-10, atol=1e-12)
    tg5 = np.where(TG == 5, 0, TG)     # blank = 5: labels avoid it
    kw = dict(blank=5, reduction="sum")
    a = _run(dtorch, _F, LOGITS, tg5, IL, TL, **kw)
    b = _run(torch, _F, LOGITS, tg5, IL, TL, **kw)
    for x, y in zip(a, b):
        np.testing.assert_allclose(x, y, rtol=1e-10, atol=1e-12)
    m = nn.CTCLoss(blank=5)
    x = dtorch.tensor(LOGITS).log_softmax(-1)
    np.testing.assert_allclose(
        m(x, dtorch.tensor(tg5), dtorch.tensor(IL), dtorch.tensor(TL)).item(),
        torch.nn.CTCLoss(blank=5)(torch.tensor(LOGITS).log_softmax(-1),
                                  torch.tensor(tg5), torch.tensor(IL),
                                  torch.tensor(TL)).item(), rtol=1e-10)


def test_ctc_impossible_alignment_and_zero_infinity():
    tg = np.array([[1, 1, 1, 1]])
    il, tl = [4], [4]        # repeats need blanks between: 7 steps needed
    x = LOGITS[:, :1]
    for zi in (False, True):
        a = _run(dtorch, _F, x, tg, il, tl, reduction="sum",
                 zero_infinity=zi)
        b = _run(torch, _F, x, tg, il, tl, reduction="sum",
                 zero_infinity=zi)
        np.testing.assert_array_equal(a[0], b[0])
        if zi:
            np.testing.assert_array_equal(a[1], b[1])


def test_ctc_unbatched_and_errors():
    a = _run(dtorch, _F, LOGITS[:, 0], TG[0], [8], [4], reduction="none")
    b = _run(torch, _F, LOGITS[:, 0], TG[0], [8], [4], reduction="none")
    for x, y in zip(a, b):
        np.testing.assert_allclose(x, y, rtol=1e-10, atol=1e-12)
    with pytest.raises(RuntimeError, match="at most"):
        dtorch.nn.functional.ctc_loss(dtorch.zeros(3, 1, 4), dtorch.tensor(
            [[1]]), [5], [1])
