"""Peak host memory (dtorch.utils.memory.track_peak) and the owners' check
of activation checkpointing: 8 residual blocks (LayerNorm, Linear
256->1024, GELU, Linear 1024->256, Dropout), each under
checkpoint(use_reentrant=False): traced peak of forward + backward at most
half of the run without, gradients bitwise equal. Measured here at batch
64 with the gradients already allocated (a step of gradient accumulation,
so the peak is the activations'); benchmarks/activation_checkpoint.py
gives the batch-1024 figure counting the gradients' allocation too."""
import functools

import numpy as np

import dtorch
from dtorch import nn
from dtorch.utils.checkpoint import (checkpoint,
                                     create_selective_checkpoint_contexts)
from dtorch.utils.memory import track_peak


def test_track_peak_counts_numpy_allocations_and_nests():
    with track_peak() as outer:
        a = np.ones(1 << 20)                    # 8 MiB
        with track_peak() as inner:
            b = np.ones(1 << 19)                # 4 MiB, freed inside
            del b
        del a
        with track_peak() as later:
            pass
    assert 4 << 20 <= inner.peak < (4 << 20) + (64 << 10)
    assert abs(inner.allocated) < 64 << 10
    assert outer.peak >= 12 << 20               # both at once
    assert later.peak < 64 << 10
    with track_peak() as t:
        x = dtorch.empty(256, 1024)             # allocated, never written
    assert t.allocated >= x.numel() * 4


def test_owners_check_checkpoint_halves_peak_gradients_bitwise_equal():
    dtorch.manual_seed(0)
    blocks = [nn.Sequential(nn.LayerNorm(256), nn.Linear(256, 1024),
                            nn.GELU(), nn.Linear(1024, 256), nn.Dropout(0.1))
              for _ in range(8)]
    params = [p for b in blocks for p in b.parameters()]
    x0 = dtorch.randn(64, 256)
    sac = functools.partial(create_selective_checkpoint_contexts,
                            [dtorch.ops.Linear])

    def step(mode):
        dtorch.manual_seed(1)
        for p in params:
            p.grad = dtorch.zeros_like(p)
        x = x0.clone().requires_grad_()
        with track_peak() as mem:
            h = x
            for b in blocks:
                if mode == "none":
                    h = h + b(h)
                elif mode == "sac":
                    h = h + checkpoint(b, h, use_reentrant=False,
                                       context_fn=sac)
                else:
                    h = h + checkpoint(b, h, use_reentrant=False)
            h.sum().backward()
            del h
        return mem.peak, [x.grad.numpy()] + [p.grad.numpy() for p in params]
    step("none")                        # first-use allocations off the books
    none, g_none = step("none")
    full, g_full = step("full")
    sel, g_sel = step("sac")
    assert full <= 0.5 * none, (full, none)
    assert full < sel < none, (full, sel, none)
    for g in (g_full, g_sel):
        assert all(np.array_equal(a, b) for a, b in zip(g, g_none))


def test_initialisers_draw_in_place_same_values():
    """nn.Linear's initialisation peaks at about its parameters' bytes
    (1x the weight, not 3x: no full float64 draw, no cast copy), and the
    in-place fills give the values of NumPy's one whole float64 draw cast
    to the tensor's dtype, bit for bit, at sizes across the chunks."""
    with track_peak() as mem:
        lin = nn.Linear(512, 1024)
    own = (lin.weight.numel() + lin.bias.numel()) * 4
    assert own <= mem.peak <= 1.1 * own, (mem.peak, own)
    fills = [("uniform_", "uniform", (-0.25, 0.5)),
             ("normal_", "normal", (1.0, 3.0)),
             ("exponential_", "exponential", (0.5,)),
             ("log_normal_", "lognormal", (1.0, 0.5)),
             ("cauchy_", None, (0.5, 2.0))]
    for n in (0, 1, 8193, 3 * 8192 + 5):
        for dt in (dtorch.float32, dtorch.float64, dtorch.float16):
            for meth, np_name, args in fills:
                dtorch.manual_seed(7)
                t = getattr(dtorch.empty(n, dtype=dt), meth)(*args)
                rng = np.random.Generator(np.random.PCG64(7))
                if np_name is None:        # median + sigma * cauchy
                    want = args[0] + args[1] * rng.standard_cauchy(size=n)
                elif meth == "exponential_":
                    want = rng.exponential(1 / args[0], size=n)
                else:
                    want = getattr(rng, np_name)(*args, size=n)
                assert np.array_equal(t.numpy(), want.astype(t.numpy().dtype),
                                      equal_nan=True), (meth, n, dt)
                # the stream goes on where one whole draw leaves it
                assert dtorch.rand(1).item() == \
                    np.float32(rng.random()).item()
    # a non-contiguous tensor is filled whole (same values, in its order)
    dtorch.manual_seed(3)
    w = dtorch.empty(40, 30).t().uniform_()
    want = np.random.Generator(np.random.PCG64(3)).uniform(size=(30, 40))
    assert np.array_equal(w.numpy(), want.astype(np.float32))
