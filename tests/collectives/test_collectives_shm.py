"""collectives.shm_reduce.ShmReducer in one process: n threads, each with
its own mapping of the shared file (as n processes would have), tiny slots so
that chunks, slot reuse and array boundaries inside chunks are all exercised."""
import os
import threading
import time

import numpy as np
import pytest

from collectives import ReduceOp, shm_reduce
from collectives.errors import _Expired
from collectives_helpers import until_no_live_rank_is_late

pytestmark = pytest.mark.skipif(not shm_reduce.usable(),
                                reason="shared-memory reduction is x86-64 "
                                       "+ /dev/shm only")


def run_ranks(n, body, chunk=64):
    """body(rank, reducer) on n threads; returns their results."""
    box, out, errs = {}, [None] * n, []
    bar = threading.Barrier(n)

    def bcast(obj, rank):
        if rank == 0:
            box['v'] = obj
        bar.wait()
        v = box['v']
        bar.wait()
        return v

    def all_true(flag, rank):
        box.setdefault('flags', {})[rank] = flag
        bar.wait()
        v = all(box['flags'].values())
        bar.wait()
        return v

    def thread(r):
        try:
            red = shm_reduce.ShmReducer.setup(r, n, lambda o: bcast(o, r),
                                       lambda f: all_true(f, r), chunk)
            out[r] = body(r, red)
            red.close()
        except BaseException as e:
            errs.append(e)
            bar.abort()
    ts = [threading.Thread(target=thread, args=(r,)) for r in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    if errs:
        raise errs[0]
    return out


@pytest.mark.parametrize("n", [2, 3, 4])
def test_all_ops_many_chunks_and_array_boundaries(n):
    sizes = [1, 7, 0, 33, 5, 64]        # 110 values: several 16-value chunks

    def body(rank, red):
        res = {}
        for op in ReduceOp:
            for dt in (np.float32, np.float64, np.int64, np.float16):
                if op is ReduceOp.AVG and dt == np.int64:
                    continue
                arrs = [(np.arange(s) % 5 + rank + 1).astype(dt)
                        for s in sizes]
                red.all_reduce(arrs, op, time.monotonic() + 30)
                res[op, np.dtype(dt).name] = [a.copy() for a in arrs]
        return res
    out = run_ranks(n, body)
    per = [[(np.arange(s) % 5 + r + 1).astype(np.float64) for s in sizes]
           for r in range(n)]
    ref = {ReduceOp.SUM: np.add, ReduceOp.MAX: np.maximum,
           ReduceOp.MIN: np.minimum, ReduceOp.PRODUCT: np.multiply}
    for key, got in out[0].items():
        op, dt = key
        for i, a in enumerate(got):
            w = per[0][i].copy()
            for r in range(1, n):
                w = (ref.get(op, np.add))(w, per[r][i])
            if op is ReduceOp.AVG:
                w = w / n
            np.testing.assert_allclose(a.astype(np.float64), w,
                                       rtol=1e-3, err_msg=str(key))
        for other in out[1:]:               # bitwise the same everywhere
            for a, b in zip(got, other[key]):
                assert a.tobytes() == b.tobytes(), key


def test_supports_only_what_it_reduces():
    f = np.ones(4, np.float32)
    assert shm_reduce.supports([f, np.ones(2, np.float32)], ReduceOp.SUM)
    assert not shm_reduce.supports([f, np.ones(2)], ReduceOp.SUM)      # dtypes
    assert not shm_reduce.supports([np.ones((4, 4))[:, 0]], ReduceOp.SUM)
    assert not shm_reduce.supports([np.ones(3, bool)], ReduceOp.MAX)
    assert not shm_reduce.supports([np.ones(3, np.int32)], ReduceOp.AVG)


def test_a_rank_that_does_not_come_is_named():
    def attempt(wait):
        def body(rank, red):
            x = np.ones(100, np.float32)
            red.all_reduce([x], ReduceOp.SUM, time.monotonic() + 30)
            if rank == 2:
                return None
            t = time.monotonic()
            with pytest.raises(_Expired) as ei:
                red.all_reduce([x], ReduceOp.SUM, time.monotonic() + wait)
            assert time.monotonic() - t < 5 + wait
            return ei.value.missing
        out = run_ranks(3, body)
        return out, {m for ms in out[:2] for m in ms} - {2}
    out = until_no_live_rank_is_late(attempt, (0.3, 2.0, 8.0))
    assert out == [[2], [2], None]


def test_the_file_is_gone_once_set_up():
    """The file never has a name in /dev/shm (the creator's descriptor
    is closed after set-up; the mappings keep it)."""
    import gc
    import glob

    def fds():      # (number, target): what an earlier test's objects close
        out = set()  # meanwhile (xdist: one process) is not ours
        for fd in os.listdir('/proc/self/fd'):
            try:
                out.add((fd, os.readlink(f'/proc/self/fd/{fd}')))
            except OSError:
                pass
        return out
    gc.collect()
    before = set(glob.glob('/dev/shm/dtorch-ar-*'))
    had = fds()

    def body(rank, red):
        x = np.ones(10)
        red.all_reduce([x], ReduceOp.SUM, time.monotonic() + 30)
        return x.tolist()        # the mapping outlives the name
    assert run_ranks(2, body) == [[2.0] * 10] * 2
    assert set(glob.glob('/dev/shm/dtorch-ar-*')) == before
    assert fds() - had == set()        # no descriptor kept
