"""dtorch.cuda's memory statistics over CuPy's default memory pool (per
device: allocated = lent blocks, reserved = plus free blocks, peaks kept
by dtorch's allocator in front of the pool) and activation checkpointing
on a CUDA device (the device RNG replayed). Run with a GPU or
DTORCH_FAKE_CUDA=1 (the stand-in's pool keeps CuPy's accounting)."""
import pytest

import dtorch
from dtorch.utils.checkpoint import checkpoint

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not dtorch.cuda.is_available(), reason="needs CuPy or DTORCH_FAKE_CUDA=1")]

MB = 1 << 20


def test_allocated_peak_reset_and_stats_per_device():
    c = dtorch.cuda
    dtorch.cuda.synchronize()
    base = c.memory_allocated()
    c.reset_peak_memory_stats()
    assert c.max_memory_allocated() == base
    x = dtorch.empty(MB, device="cuda")               # 4 MiB of float32
    assert c.memory_allocated() - base >= 4 * MB
    y = x * 2                                         # another 4 MiB
    del y
    now = c.memory_allocated()
    assert now - base < 4 * MB + 4096
    assert c.max_memory_allocated() - base >= 8 * MB
    assert c.memory_reserved() >= c.memory_allocated()
    assert c.max_memory_reserved() >= c.memory_reserved()
    st = c.memory_stats()
    assert st["allocated_bytes.all.current"] == now
    assert st["allocated_bytes.all.peak"] == c.max_memory_allocated("cuda")
    c.reset_peak_memory_stats()
    assert c.max_memory_allocated() == now
    del x
    assert c.memory_allocated() < now
    if c.device_count() > 1:
        before = c.memory_allocated(1)
        z = dtorch.empty(MB, device="cuda:1")
        assert c.memory_allocated("cuda:1") - before >= 4 * MB
        assert c.memory_allocated(0) < now
        del z
    with pytest.raises(ValueError, match="Expected a cuda device"):
        c.memory_allocated("cpu")


def test_checkpoint_on_cuda_replays_dropout_and_saves_memory():
    # the recomputation draws the forward's mask: d sum(y)/dx = y for
    # y = dropout(x) at x = 1 (a different mask would break it)
    x = dtorch.ones(4096, device="cuda", requires_grad=True)
    y = checkpoint(lambda v: dtorch.nn.functional.dropout(v * 1, 0.5), x,
                   use_reentrant=False)
    y.sum().backward()
    assert dtorch.equal(x.grad, y.detach())
    assert 0 < int((y == 0).sum()) < 4096
    # capturing a CUDA generator's state re-keys its stream (cuRAND's
    # state cannot be read back, dtorch.random): bitwise equality with
    # the run without checkpointing holds for blocks without dropout
    dtorch.manual_seed(0)
    blocks = [dtorch.nn.Sequential(dtorch.nn.Linear(64, 256),
                                   dtorch.nn.GELU(),
                                   dtorch.nn.Linear(256, 64)).to("cuda")
              for _ in range(4)]
    params = [p for b in blocks for p in b.parameters()]
    x0 = dtorch.randn(256, 64, device="cuda")

    def step(ck):
        dtorch.manual_seed(1)
        for p in params:
            p.grad = dtorch.zeros_like(p)
        x = x0.clone().requires_grad_()
        dtorch.cuda.reset_peak_memory_stats()
        base = dtorch.cuda.memory_allocated()
        h = x
        for b in blocks:
            h = h + (checkpoint(b, h, use_reentrant=False) if ck else b(h))
        h.sum().backward()
        del h
        peak = dtorch.cuda.max_memory_allocated() - base
        return peak, [x.grad.cpu().numpy()] + [p.grad.cpu().numpy()
                                               for p in params]
    step(False)
    p0, g0 = step(False)
    p1, g1 = step(True)
    assert p1 < 0.6 * p0, (p1, p0)
    assert all((a == b).all() for a, b in zip(g0, g1))
