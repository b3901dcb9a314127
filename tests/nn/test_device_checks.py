"""Input checks on device tensors do not stop the host at every forward
(issue 20): embedding indices, class targets and BCE's probability ranges
are checked on the device and raised at the next synchronisation (item(),
tolist(), .cpu(), cuda.synchronize()); on the CPU they raise at once, with
the same messages."""
import pytest

import dtorch
from dtorch import _backend as B
from dtorch.nn import functional as F

CASES = {
    "embedding": (lambda d: F.embedding(dtorch.tensor([0, 5], device=d),
                                        dtorch.ones(3, 2, device=d)),
                  IndexError, "index out of range in self"),
    "cross_entropy": (lambda d: F.cross_entropy(
        dtorch.zeros(2, 3, device=d), dtorch.tensor([1, 3], device=d)),
        IndexError, "Target 3 is out of bounds"),
    "nll_negative": (lambda d: F.nll_loss(
        dtorch.zeros(2, 3, device=d), dtorch.tensor([-2, 0], device=d)),
        IndexError, "Target -2 is out of bounds"),
    "bce_input": (lambda d: F.binary_cross_entropy(
        dtorch.tensor([0.5, 1.5], device=d), dtorch.ones(2, device=d)),
        RuntimeError, "input should be between 0 and 1"),
    "bce_target": (lambda d: F.binary_cross_entropy(
        dtorch.tensor([0.5, 0.5], device=d),
        dtorch.tensor([0.0, float("nan")], device=d)),
        RuntimeError, "target should be between 0 and 1"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_inputs_raise_on_cpu_at_once_on_device_at_the_next_sync(
        case, device):
    fn, exc, msg = CASES[case]
    B._pending_checks.clear()
    if device == "cpu":
        with pytest.raises(exc, match=msg):
            fn(device)
        return
    out = fn(device)                      # no host sync here
    assert len(B._pending_checks) >= 1
    with pytest.raises(exc, match=msg):
        out.sum().item()
    assert not B._pending_checks
    fn(device)
    with pytest.raises(exc, match=msg):
        dtorch.cuda.synchronize()
    fn(device)
    with pytest.raises(exc, match=msg):
        out.cpu()


def test_good_inputs_leave_nothing_to_raise(device):
    B._pending_checks.clear()
    w = dtorch.ones(3, 2, device=device)
    F.embedding(dtorch.tensor([0, 2], device=device), w)
    loss = F.cross_entropy(dtorch.zeros(2, 3, device=device),
                           dtorch.tensor([1, 2], device=device))
    assert loss.item() == pytest.approx(1.0986, abs=1e-3)
    assert not B._pending_checks


def test_checks_are_flushed_in_batches(device):
    if device == "cpu":
        pytest.skip("CPU checks are immediate")
    B._pending_checks.clear()
    w = dtorch.ones(3, 2, device=device)
    i = dtorch.tensor([0, 1], device=device)
    for _ in range(B._CHECK_BATCH + 3):
        F.embedding(i, w)
    assert len(B._pending_checks) < B._CHECK_BATCH
