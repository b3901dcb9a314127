"""Hierarchical all-reduce of the tcp backend (collectives.hier), with
several "hosts" simulated on one machine: each rank process gets a
DTORCH_HOST_ID, the host identity it reports at group set-up (ranks with
the same id share memory, the others talk over sockets only). Checked:
results equal NumPy's and the flat ring's (exactly, on data whose
reductions are exact), bitwise agreement across ranks, empty and 0-d
buffers, several dtypes and every op, 2x2, 3x2 and 2+1 layouts,
DTORCH_HIERARCHICAL=0, and a rank that dies is named. Only pids started
here are killed.

This file is also the rank program: python test_collectives_hier.py MODE
RANK WORLD PORT TOKEN."""
import hashlib
import json
import os
import sys
import time

import numpy as np
import pytest

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(TESTS))
sys.path.insert(0, TESTS)  # the shared helpers
import collectives  # noqa: E402
from collectives import RankFailureError  # noqa: E402

OPS = ('sum', 'avg', 'max', 'min', 'product')
# element counts: empty, one, odd small, > the 64 KiB recursive-doubling
# limit of a cross part, > one 1 MiB chunk (pipelined, odd split)
SIZES = (0, 1, 7, 40_001, 300_001)


def _inputs(rank, n, dtype, op):
    """Rank r's input; every reduction of these over <= 6 ranks is exact
    in every dtype (small integers; product of +-1 and 2)."""
    i = np.arange(n)
    if op == 'product':
        v = np.where((i + rank) % 5 == 0, 2, np.where((i * 7 + rank) % 3,
                                                      1, -1))
    else:
        v = (i * 13 + rank * 7) % 11 - 5
    if np.dtype(dtype).kind == 'u':
        v = np.abs(v)
    return v.astype(dtype)


def _want(world, n, dtype, op):
    vals = np.stack([_inputs(r, n, dtype, op).astype(np.float64)
                     for r in range(world)])
    w = {'sum': vals.sum(0), 'avg': vals.sum(0) / world,
         'max': vals.max(0), 'min': vals.min(0),
         'product': vals.prod(0)}[op]
    return w.astype(dtype)


def _digest(a):
    return hashlib.sha1(a.tobytes()).hexdigest()


def rank_ops(g, flat):
    """Every op x dtype x size on the hierarchical group g and the flat
    group flat (same ranks): the errors found (empty = all good) and a
    digest per result for the cross-rank bitwise check."""
    errs, digests = [], {}
    for dtype in (np.float32, np.float64, np.int32, np.uint8):
        for op in OPS:
            if op == 'avg' and np.dtype(dtype).kind != 'f':
                continue
            for n in SIZES:
                if n > 7 and dtype == np.uint8:
                    continue
                x = _inputs(g.rank, n, dtype, op)
                y = x.copy()
                g.all_reduce(x, op)
                flat.all_reduce(y, op)
                w = _want(g.size, n, dtype, op)
                what = f"{op} {np.dtype(dtype)} n={n}"
                if not np.array_equal(x, w):
                    errs.append(f"{what}: hier != numpy")
                if not np.array_equal(x, y):
                    errs.append(f"{what}: hier != flat")
    # random floats: not exact, but every rank gets the same bits
    for n in (5, 300_001):
        x = np.random.default_rng(g.rank).standard_normal(n).astype(
            np.float32)
        w = sum(np.random.default_rng(r).standard_normal(n).astype(
            np.float32).astype(np.float64) for r in range(g.size))
        g.all_reduce(x)
        if not np.allclose(x, w, rtol=1e-5, atol=1e-5):
            errs.append(f"random sum n={n}: far from numpy")
        digests[f"random{n}"] = _digest(x)
    # 0-d, int avg, bool, coalesced lists, async
    z = np.array(g.rank + 1.0)
    g.all_reduce(z, 'max')
    if z.shape != () or z != g.size:
        errs.append(f"0-d max gave {z!r}")
    try:
        g.all_reduce(np.ones(3, np.int64), 'avg')
        errs.append("int avg did not raise")
    except TypeError as e:
        if "floating dtype" not in str(e):
            errs.append(f"int avg: {e}")
    b = np.array([g.rank == 0, False, True])
    g.all_reduce(b, 'sum')
    if b.tolist() != [True, False, True]:
        errs.append(f"bool sum gave {b.tolist()}")
    arrs = [np.full(s, g.rank + 1.0, np.float32)
            for s in ((3,), (), (0,), (400_000,), (2, 5))]
    g.all_reduce_coalesced(arrs, 'avg', async_op=True).wait()
    if not all((a == (g.size + 1) / 2).all() for a in arrs):
        errs.append("coalesced avg wrong")
    digests['coalesced'] = _digest(np.concatenate(
        [a.reshape(-1) for a in arrs]))
    # CuPy arrays (the strict NumPy-backed stand-in): staged through host
    # memory, same answer
    sys.path.insert(0, os.path.join(TESTS, 'fakecupy'))
    import cupy
    for n in (7, 300_001):
        x = cupy.asarray(_inputs(g.rank, n, np.float32, 'sum'))
        g.all_reduce(x)
        if not np.array_equal(x.get(), _want(g.size, n, np.float32, 'sum')):
            errs.append(f"cupy sum n={n} wrong")
    g.barrier()
    return errs, digests


def main(argv):
    mode, rank, world, port, token = argv[:5]
    rank, world = int(rank), int(world)
    g = collectives.init('tcp', rank, world, timeout=float(
        os.environ.get('TEST_TIMEOUT', '60')), master_addr='127.0.0.1',
        master_port=int(port), token=token)
    out = {'hierarchy': g.hierarchy}
    if mode == 'ops':
        os.environ['DTORCH_HIERARCHICAL'] = '0'
        flat = g.new_group(range(world))
        out['flat'] = flat.hierarchy
        out['errors'], out['digests'] = rank_ops(g, flat)
    elif mode == 'flat':
        x = _inputs(rank, 1001, np.float64, 'sum')
        g.all_reduce(x)
        out['ok'] = bool(np.array_equal(x, _want(world, 1001, np.float64,
                                                 'sum')))
    elif mode == 'die':
        g.all_reduce(np.ones(4))
        if rank == world - 1:
            os._exit(3)     # a crash: no cleanup, the kernel closes sockets
        try:
            for _ in range(3):
                g.all_reduce(np.ones(300_000))
            out['error'] = None
        except RankFailureError as e:
            out.update(error=str(e), type='RankFailureError', rank=e.rank)
    elif mode == 'skip':
        g.all_reduce(np.ones(4))
        if rank == world - 1:
            time.sleep(float(os.environ['TEST_TIMEOUT']) + 4)
            os._exit(0)
        try:
            g.all_reduce(np.ones(1024, np.float32))
            out['error'] = None
        except collectives.CollectiveTimeoutError as e:
            out.update(error=str(e), missing=e.missing)
    print(json.dumps(out), flush=True)
    if mode not in ('die', 'skip'):
        g.barrier()     # the store lives in rank 0: keep it up till the end
    os._exit(0)


if __name__ == '__main__':
    main(sys.argv[1:])

# ------------------------------------------------------------ the tests

# a hang is a bug here: fail it instead of stalling the suite
pytestmark = pytest.mark.timeout(180)

if 'OMPI_COMM_WORLD_SIZE' in os.environ or 'PMI_SIZE' in os.environ:
    pytest.skip("single-process tests; not run under mpiexec",
                allow_module_level=True)


def run(mode, hosts, env=None, timeout=150):
    from collectives_helpers import run_ranks
    outs = run_ranks(mode, len(hosts), timeout=timeout, env=env,
                     rank_env={r: {'DTORCH_HOST_ID': h}
                               for r, h in enumerate(hosts)},
                     script=os.path.abspath(__file__))
    return outs


@pytest.mark.parametrize('hosts, shape', [
    ('AABB', '2 hosts x 2+2 ranks, 2 cross-host groups'),
    ('ABAB', '2 hosts x 2+2 ranks, 2 cross-host groups'),
    ('AABBCC', '3 hosts x 2+2+2 ranks, 2 cross-host groups'),
    ('AAB', '2 hosts x 2+1 ranks, 1 cross-host group'),
])
def test_hier_equals_numpy_and_flat(hosts, shape):
    outs = run('ops', list(hosts))
    digests = []
    for r, (res, err, rc) in enumerate(outs):
        assert res is not None, f"rank {r} (rc {rc}) printed nothing:\n" \
            f"{err[-3000:]}"
        assert res['hierarchy'] == f"hierarchical: {shape}"
        assert res['flat'] == "flat: DTORCH_HIERARCHICAL=0"
        assert res['errors'] == [], f"rank {r}: {res['errors']}"
        digests.append(res['digests'])
    assert all(d == digests[0] for d in digests), "ranks disagree bitwise"


def test_hier_off_by_env_and_layouts_without_it():
    for hosts, env, want in (
            ('AABB', {'DTORCH_HIERARCHICAL': '0'},
             "flat: DTORCH_HIERARCHICAL=0"),
            ('ABC', None, "flat: one rank on each of 3 hosts"),
            ('AAA', None, "flat: one host")):
        outs = run('flat', list(hosts), env)
        for r, (res, err, rc) in enumerate(outs):
            assert res is not None, f"{hosts} rank {r}:\n{err[-3000:]}"
            assert res['hierarchy'] == want and res['ok'], (hosts, res)


def test_hier_dead_rank_is_named():
    t = time.monotonic()
    outs = run('die', list('AABB'), env={'TEST_TIMEOUT': '60'})
    # well before the 60 s timeout (no tighter bound: a loaded machine)
    assert time.monotonic() - t < 50
    assert outs[3][2] == 3                      # the rank that crashed
    for r in (0, 1, 2):
        res = outs[r][0]
        assert res and res.get('type') == 'RankFailureError', outs[r]
        # every survivor names rank 3: directly (its socket closed, its
        # process is gone) or as the first failure the group reported
        assert 'rank 3 ' in res['error'], res['error']


def test_hier_skipped_collective_times_out_naming_op_and_rank():
    from collectives_helpers import until_no_live_rank_is_late

    def attempt(t):
        outs = run('skip', list('AABB'), env={'TEST_TIMEOUT': str(t)},
                   timeout=150 + 2 * t)
        return outs, {m for res, _, _ in outs[:3] if res and res.get(
            'missing') for m in res['missing']} - {3}
    outs = until_no_live_rank_is_late(attempt, (3.0, 8.0, 24.0))
    for r in (0, 1, 2):
        res = outs[r][0]
        assert res and res['error'], outs[r]
        assert res['missing'] == [3], res
        msg = res['error']
        assert "all_reduce #2 [1024] float32 on group 'world'" in msg, msg
        assert "rank 3 is not in a collective (last: all_reduce #1" in msg
