"""Deterministic training (issue 26), part 1: each thread rank of
``dist.spawn_threads`` has the process state a process would have of its
own (RNG, default dtype, deterministic flag), so thread ranks stand in for
processes and repeat themselves bitwise."""
import hashlib

import numpy as np
import pytest

import dtorch as torch
import dtorch.distributed as dist
from dtorch import nn


def _digest(tensors):
    h = hashlib.sha256()
    for t in tensors:
        h.update(np.ascontiguousarray(t.detach().numpy()).tobytes())
    return h.hexdigest()


def _build(rank, world):
    torch.manual_seed(0)
    if world > 1:
        dist.barrier()
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.3),
                      nn.Linear(16, 4))
    # draw more, in an order that interleaves with the other ranks'
    out = m(torch.randn(5, 8))
    return _digest(list(m.parameters()) + [out])


@pytest.mark.parametrize("world", [2, 3])
def test_thread_ranks_repeat_themselves(world):
    runs = [dist.spawn_threads(_build, world) for _ in range(3)]
    alone = _build(0, 1)
    # every rank of every run builds what one process builds
    assert {h for r in runs for h in r} == {alone}


def test_each_rank_seeds_its_own_generators():
    def body(rank, world):
        torch.manual_seed(100 + rank)
        dist.barrier()          # every rank has seeded before any draws
        a = torch.rand(1000)
        torch.default_generator.manual_seed(7 + rank)
        dist.barrier()
        b = torch.randint(0, 10 ** 6, (1000,))
        return (torch.initial_seed(), a.numpy(), b.numpy(),
                torch.get_rng_state())

    res = dist.spawn_threads(body, 3)
    for rank, (seed, a, b, state) in enumerate(res):
        assert seed == 7 + rank
        torch.manual_seed(100 + rank)
        np.testing.assert_array_equal(a, torch.rand(1000).numpy())
        torch.default_generator.manual_seed(7 + rank)
        np.testing.assert_array_equal(
            b, torch.randint(0, 10 ** 6, (1000,)).numpy())
        assert torch.get_rng_state() == state


def test_rank_state_starts_fresh_and_stays_in_the_rank():
    torch.manual_seed(5)
    before = torch.get_rng_state()
    torch.set_default_dtype(torch.float64)
    try:
        def body(rank, world):
            fresh = (torch.get_default_dtype(), torch.initial_seed(),
                     torch.are_deterministic_algorithms_enabled())
            if rank == 1:
                torch.set_default_dtype(torch.bfloat16)
                torch.use_deterministic_algorithms(True, warn_only=True)
            dist.barrier()
            return fresh + (torch.get_default_dtype(),
                            torch.are_deterministic_algorithms_enabled(),
                            torch.is_deterministic_algorithms_warn_only_enabled())

        r0, r1 = dist.spawn_threads(body, 2)
        # a rank starts as a fresh process: float32, the default seed
        assert r0[:3] == r1[:3] == (torch.float32, 67280421310721, False)
        assert r0[3:] == (torch.float32, False, False)
        assert r1[3:] == (torch.bfloat16, True, True)
        # nothing leaked into the process
        assert torch.get_default_dtype() == torch.float64
        assert not torch.are_deterministic_algorithms_enabled()
        assert torch.get_rng_state() == before
    finally:
        torch.set_default_dtype(torch.float32)


def test_use_deterministic_algorithms_takes_a_bool():
    with pytest.raises(TypeError, match="bool"):
        torch.use_deterministic_algorithms(1)
