"""Deterministic mode does not depend on the BLAS thread count (issue 26).

OpenBLAS threads a float32 GEMM from about 32 x 256 x 256 on, and the
threaded product sums in another order than the 1-thread one (45% of the
elements of a 32 x 256 x 256 product differ in the last bits; figures in
dtorch/_blas_threads.py), so a 1-process run with 2 BLAS threads and a
2-process run with 1 thread each gave different bits. Under the switch the
BLAS pool is pinned to one thread (and given back when it is turned off)."""
import gc
import os
import subprocess
import sys
import time

import pytest
from threadpoolctl import ThreadpoolController, threadpool_limits

import dtorch as torch
import dtorch.distributed as dist
from dtorch import nn
from dtorch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_determinism_ddp import state_digest  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def blas_threads():
    """The thread counts of numpy's BLAS (the one dtorch's GEMMs use; a
    library loaded later, as scipy's by scipy.special, is not pinned)."""
    return {c.num_threads for c in ThreadpoolController().lib_controllers
            if c.user_api == "blas" and "numpy" in c.filepath}


def train_wide(rank, world, steps=3, det=True):
    """An MLP whose shard GEMMs (32 x 256 x 256, float32) OpenBLAS
    threads, with AdamW and clip_grad_norm_ (a BLAS dot)."""
    torch.use_deterministic_algorithms(det)
    try:
        torch.manual_seed(0)
        g = torch.Generator().manual_seed(1)
        X = torch.randn(steps, 64, 256, generator=g)
        Y = torch.randn(steps, 64, 8, generator=g)
        model = nn.Sequential(nn.Linear(256, 256), nn.GELU(),
                              nn.Linear(256, 256), nn.GELU(),
                              nn.Linear(256, 8))
        ddp = DDP(model, virtual_shards=2)
        opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
        for s in range(steps):
            # rows of a rank: DistributedSampler's q mod W, as shards need
            x, y = X[s, rank::world], Y[s, rank::world]
            opt.zero_grad()
            loss = ((ddp(x) - y) ** 2).mean()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(ddp.parameters(), 1.0)
            opt.step()
        return state_digest(model, opt), blas_threads()
    finally:
        torch.use_deterministic_algorithms(False)


def _hash(world, threads):
    with threadpool_limits(threads, user_api="blas"):
        outs = dist.spawn_threads(train_wide, world)
        assert blas_threads() == {threads}   # given back after the switch
    hashes = {h for h, _ in outs}
    assert len(hashes) == 1
    return hashes.pop(), set().union(*(t for _, t in outs))


def test_blas_thread_count_does_not_change_the_bits():
    one, used = _hash(1, 1)
    two, used2 = _hash(1, 2)
    assert two == one
    assert used == used2 == {1}       # pinned while the switch was on
    # thread ranks share the process's pool; 2 ranks at 2 threads each
    assert _hash(2, 2)[0] == one


def test_normal_mode_keeps_the_threads():
    with threadpool_limits(2, user_api="blas"):
        _, used = dist.spawn_threads(
            lambda r, w: train_wide(r, w, steps=1, det=False), 1)[0]
    assert used == {2}


def test_hold_ends_with_the_thread_rank_and_repins():
    """A thread rank that never turns the switch off gives the threads back
    when its state is collected (its flags die with it: DDP's reference
    cycles wait for the collector); a count set after the switch is put
    back to one at the next deterministic forward."""
    from dtorch import _blas_threads     # (here: the file runs on main)
    def rank(r, w):
        torch.use_deterministic_algorithms(True)
        inside = blas_threads()
        dist.barrier()
        if r == 0:       # a script sets 2 threads after the switch
            for lib in _blas_threads._blas_libs():
                _blas_threads._set(lib, 2)
            assert blas_threads() == {2}
        dist.barrier()
        ddp = DDP(nn.Linear(4, 4), virtual_shards=2)
        ddp(torch.randn(2, 4)).sum().backward()
        return inside, blas_threads()
    with threadpool_limits(2, user_api="blas"):
        assert dist.spawn_threads(rank, 2) == [({1}, {1})] * 2
        for _ in range(50):      # DDP's helper threads may still end
            gc.collect()
            if blas_threads() == {2}:
                break
            time.sleep(0.1)
        assert blas_threads() == {2}


_SCRIPT = """
import sys
sys.path.insert(0, sys.argv[1])
import dtorch.distributed as dist
from test_determinism_blas_threads import train_wide
print(dist.spawn_threads(train_wide, int(sys.argv[2]))[0][0])
"""


def test_openblas_num_threads_env_in_processes():
    """OPENBLAS_NUM_THREADS=2 on 1 rank and =1 on 2 ranks, each its own
    process: one hash."""
    here = os.path.dirname(os.path.abspath(__file__))
    out = set()
    for threads, world in (("2", 1), ("1", 2)):
        env = dict(os.environ, OPENBLAS_NUM_THREADS=threads)
        r = subprocess.run([sys.executable, "-c", _SCRIPT, here, str(world)],
                           env=env, capture_output=True, text=True,
                           timeout=100)
        assert r.returncode == 0, r.stderr[-3000:]
        out.add(r.stdout.split()[-1])
    assert len(out) == 1
