"""One test body for every collectives backend (mlx's common-testcase idea).

Each CASES entry is fn(group) that asserts; tests run it on threads (in one
process), under mpiexec (pytest-mpi) and in tcp processes that this file
runs as a script:

    python tests/collectives_helpers.py MODE RANK WORLD PORT TOKEN

MODE: cases (print a JSON {case: 'ok' | error}), die (rank 1 exits after
one collective), skip (the last rank skips a collective). ``run_ranks``
starts such a job (of this file or of another rank script).
"""
import json
import os
import subprocess
import sys
import time

import numpy as np

_TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# tests/ (the shared helpers) and the checkout above it: run as a script
# under an editable install, a rank would otherwise import tests/collectives
# and tests/launch (namespace directories) as the packages of those names
sys.path[:0] = [_TESTS, os.path.dirname(_TESTS)]
import collectives  # noqa: E402
from collectives import (CollectiveTimeoutError,  # noqa: E402
                         RankFailureError)
from helpers import finish, free_port  # noqa: E402


def _vals(g, dtype=np.float32, n=5):
    """Rank-dependent input whose reductions are exact."""
    return (np.arange(n) % 3 + g.rank + 1).astype(dtype)


def case_all_reduce_ops(g):
    per = [_vals(type('G', (), {'rank': r}), np.float64)
           for r in range(g.size)]
    want = {'sum': sum(per), 'avg': sum(per) / g.size,
            'max': np.max(per, 0), 'min': np.min(per, 0),
            'product': np.prod(per, 0)}
    for dtype in (np.float32, np.float64, np.int32):
        for op, w in want.items():
            if op == 'avg' and dtype == np.int32:
                continue
            x = _vals(g, dtype)
            g.all_reduce(x, op=op)
            assert x.dtype == dtype
            np.testing.assert_allclose(x, w.astype(dtype), rtol=1e-6,
                                       err_msg=f"{op} {dtype}")
    x = _vals(g, np.float32)
    g.all_reduce(x, collectives.ReduceOp.SUM)
    np.testing.assert_allclose(x, want['sum'])


def case_all_reduce_large_and_odd(g):
    # > 64 KiB takes the ring path on tcp; an odd length splits unevenly
    n = 50_001
    x = np.arange(n, dtype=np.float32) * (g.rank + 1)
    g.all_reduce(x)
    tot = g.size * (g.size + 1) / 2
    np.testing.assert_allclose(x, np.arange(n, dtype=np.float32) * tot)
    y = np.full((3, 7), g.rank, np.float64)
    g.all_reduce(y, 'max')
    assert (y == g.size - 1).all()
    z = np.array(g.rank, np.float32)   # 0-d
    g.all_reduce(z)
    assert z == g.size * (g.size - 1) / 2


def case_all_reduce_bitwise_equal(g):
    _assert_bitwise_equal_sums(g, 40_000)


def _assert_bitwise_equal_sums(g, n):
    rng = np.random.default_rng(g.rank)
    x = rng.standard_normal(n).astype(np.float32)
    g.all_reduce(x)
    allx = g.all_gather_object(x.tobytes())
    assert all(b == allx[0] for b in allx), "ranks disagree bitwise"


def case_all_reduce_big_chunks(g):
    # past the mpi backend's shared-memory threshold (256 KiB) and over
    # more than one 4 MiB slot, odd length; every op, bitwise agreement
    n = 1_500_001
    x = (np.arange(n) % 7 + g.rank).astype(np.float32)
    g.all_reduce(x)
    want = g.size * (np.arange(n) % 7) + g.size * (g.size - 1) / 2
    np.testing.assert_array_equal(x, want.astype(np.float32))
    y = (np.arange(70_001) % 5 * (g.rank + 1)).astype(np.float64)
    g.all_reduce(y, 'avg')
    np.testing.assert_allclose(y, np.arange(70_001) % 5 * (g.size + 1) / 2)
    for op, f in (('max', max), ('min', min)):
        z = np.full(70_000, g.rank, np.int64)
        g.all_reduce(z, op)
        assert (z == f(range(g.size))).all(), op
    _assert_bitwise_equal_sums(g, 300_000)


def case_all_reduce_coalesced(g):
    shapes = [(3,), (1000, 3), (), (200_000,), (7, 1)]
    arrs = [np.full(s, g.rank + 1.0, np.float32) for s in shapes]
    ids = [id(a) for a in arrs]
    g.all_reduce_coalesced(arrs)
    assert [id(a) for a in arrs] == ids
    for a, s in zip(arrs, shapes):
        assert a.shape == s and (a == g.size * (g.size + 1) / 2).all()
    arrs = [np.arange(n, dtype=np.float64) * (g.rank + 1)
            for n in (5, 300_001)]
    g.all_reduce_coalesced(arrs, 'avg')
    for a in arrs:
        np.testing.assert_allclose(a, np.arange(a.size) * (g.size + 1) / 2)
    i = np.ones(4, np.int64)
    g.all_reduce_coalesced([i], async_op=True).wait()
    assert (i == g.size).all()
    for bad, words in (([np.ones(2), np.ones(2, np.float32)], 'one dtype'),
                       ([], 'at least one')):
        try:
            g.all_reduce_coalesced(bad)
        except (TypeError, ValueError) as e:
            assert words in str(e), (words, str(e))
        else:
            raise AssertionError(f"no error for {words}")


def case_all_reduce_odd_dtypes(g):
    b = np.array([g.rank == 0, False, True])
    g.all_reduce(b, 'max')
    assert b.tolist() == [True, False, True]
    h = np.full(4, 1.5, np.float16)
    g.all_reduce(h)
    assert h.dtype == np.float16 and (h == 1.5 * g.size).all()


def case_broadcast(g):
    for src in range(g.size):
        x = np.full(6, g.rank, np.int64)
        g.broadcast(x, src=src)
        assert (x == src).all(), (src, x)
    big = np.full(600_000, g.rank, np.float32)   # 2.4 MB: pipelined
    g.broadcast(big, src=g.size - 1)
    assert (big == g.size - 1).all()


def case_reduce(g):
    dst = g.size - 1
    x = np.full(3, g.rank + 1.0)
    g.reduce(x, dst=dst)
    if g.rank == dst:
        assert (x == g.size * (g.size + 1) / 2).all()
    else:
        assert (x == g.rank + 1).all()


def case_all_gather(g):
    inp = np.full((2, 3), g.rank, np.float32)
    out = np.zeros((g.size, 2, 3), np.float32)
    g.all_gather(out, inp)
    for r in range(g.size):
        assert (out[r] == r).all()
    outl = [np.zeros((2, 3), np.float32) for _ in range(g.size)]
    g.all_gather(outl, inp)
    assert [int(o[0, 0]) for o in outl] == list(range(g.size))


def case_gather_scatter(g):
    dst = g.size // 2
    inp = np.full(4, g.rank * 10, np.int32)
    out = np.zeros((g.size, 4), np.int32) if g.rank == dst else None
    g.gather(out, inp, dst=dst)
    if g.rank == dst:
        assert out[:, 0].tolist() == [10 * r for r in range(g.size)]
    src = g.size - 1
    full = np.arange(g.size * 2, dtype=np.float64).reshape(g.size, 2)
    got = np.zeros(2)
    g.scatter(got, full if g.rank == src else None, src=src)
    assert got.tolist() == full[g.rank].tolist()


def case_reduce_scatter(g):
    inp = np.ones((g.size, 3), np.float32) * (np.arange(g.size)[:, None]
                                              + g.rank).astype(np.float32)
    out = np.zeros(3, np.float32)
    g.reduce_scatter(out, inp)
    want = g.size * g.rank + g.size * (g.size - 1) / 2
    assert (out == want).all(), (out, want)
    outa = np.zeros(3, np.float32)
    g.reduce_scatter(outa, [a.copy() for a in inp], op='avg')
    np.testing.assert_allclose(outa, want / g.size)


def case_all_to_all(g):
    inp = np.array([[g.rank * 100 + j] for j in range(g.size)], np.int64)
    out = np.zeros_like(inp)
    g.all_to_all(out, inp)
    assert out[:, 0].tolist() == [r * 100 + g.rank for r in range(g.size)]


def case_barrier_and_objects(g):
    g.barrier()
    objs = g.all_gather_object({'rank': g.rank, 's': 'x' * g.rank})
    assert [o['rank'] for o in objs] == list(range(g.size))
    got = g.broadcast_object({'cfg': [1, 2]} if g.rank == 0 else None)
    assert got == {'cfg': [1, 2]}


def case_send_recv(g):
    if g.size == 1:
        return
    right, left = (g.rank + 1) % g.size, (g.rank - 1) % g.size
    a = np.full(3, g.rank, np.float32)
    b = np.arange(4.0) + g.rank
    g.send(a, right, tag=1)
    g.send(b, right, tag=2)
    rb, ra = np.zeros(4), np.zeros(3, np.float32)
    w = g.irecv(rb, left, tag=2)       # out of order: tag 2 first
    g.recv(ra, left, tag=1)
    w.wait()
    assert (ra == left).all() and (rb == np.arange(4.0) + left).all()


def case_async(g):
    x = np.full(1000, 1.0)
    y = np.full(3, g.rank, np.int64)
    w1 = g.all_reduce(x, async_op=True)
    w2 = g.broadcast(y, src=0, async_op=True)
    assert w2.wait() is True and w1.wait(timeout=30) is True
    assert w1.is_completed() and (x == g.size).all() and (y == 0).all()
    w3 = g.barrier(async_op=True)
    w3.wait()


def case_new_group(g):
    evens = [r for r in g.ranks if r % 2 == 0]
    sub = g.new_group(evens)
    if g.rank % 2:
        assert sub is None
    else:
        assert sub.size == len(evens) and sub.ranks == evens
        x = np.full(2, float(g.rank))
        sub.all_reduce(x)
        assert (x == sum(evens)).all()
        sub.barrier()
    g.barrier()


def case_bad_input(g):
    x = np.zeros((4, 4), np.float32)
    for call, words in [
        (lambda: g.all_reduce(x[:, :2]), 'contiguous'),
        (lambda: g.broadcast(x, src=g.size), 'out of range'),
        (lambda: g.all_reduce(x, op='mean'), 'unknown reduce op'),
        (lambda: g.all_gather(np.zeros((g.size + 1, 4, 4), np.float32),
                              x), 'expected'),
        (lambda: g.all_gather(np.zeros((g.size, 4, 4)), x), 'float32'),
    ]:
        try:
            call()
        except (ValueError, TypeError) as e:
            assert words in str(e), (words, str(e))
        else:
            raise AssertionError(f"no error for {words}")
    try:
        g.all_reduce(np.ones(2, np.int32), 'avg')
    except TypeError as e:
        assert 'floating' in str(e)
    else:
        raise AssertionError("avg on int32 accepted")
    g.barrier()   # the failed avg must not have desynchronised the ranks


def _empty_and_scalar_ops(g, shape):
    """Every op with buffers of `shape`: (0,), (2, 0) (empty) or ()
    (a 0-d scalar). Values are exact, so equality is the check."""
    n, r = g.size, g.rank
    tri = n * (n - 1) / 2
    full = np.zeros(shape).size > 0
    for dtype in (np.float32, np.float64, np.int64, np.bool_):
        ops = ('sum', 'avg', 'max', 'min', 'product')
        for op in ops:
            if op == 'avg' and dtype in (np.int64, np.bool_):
                continue
            x = np.full(shape, r + 1, dtype)
            g.all_reduce(x, op=op)
            assert x.shape == shape and x.dtype == dtype, (op, x)
            if full and dtype is not np.bool_:
                want = {'sum': n * (n + 1) / 2, 'avg': (n + 1) / 2,
                        'max': n, 'min': 1,
                        'product': float(np.prod(np.arange(1, n + 1)))}[op]
                assert (x == want).all(), (op, dtype, x, want)
    x = np.full(shape, r, np.float32)
    g.all_reduce(x, async_op=True).wait()
    assert x.shape == shape and (not full or (x == tri).all())
    for src in range(n):
        b = np.full(shape, r, np.int32)
        g.broadcast(b, src=src)
        assert b.shape == shape and (not full or (b == src).all())
    b = np.full(shape, r, np.int32)
    g.broadcast(b, src=n - 1, async_op=True).wait()
    assert not full or (b == n - 1).all()
    x = np.full(shape, r + 1.0)
    g.reduce(x, dst=n - 1)
    assert not full or (x == (n * (n + 1) / 2 if r == n - 1 else r + 1)).all()
    inp = np.full(shape, r, np.float32)
    out = np.full((n,) + shape, -1, np.float32)
    g.all_gather(out, inp)
    assert out.shape == (n,) + shape
    assert not full or all((out[q] == q).all() for q in range(n))
    outl = [np.full(shape, -1, np.float32) for _ in range(n)]
    g.all_gather(outl, inp, async_op=True).wait()
    assert not full or [float(o) for o in outl] == list(range(n))
    out = np.full((n,) + shape, -1, np.float32) if r == 0 else None
    g.gather(out, inp, dst=0)
    if r == 0 and full:
        assert [float(o) for o in out] == list(range(n))
    sc = np.arange(n, dtype=np.float64).reshape((n,) + (1,) * len(shape)) \
        * np.ones(shape)
    got = np.full(shape, -1.0)
    g.scatter(got, sc if r == n - 1 else None, src=n - 1)
    assert got.shape == shape and (not full or (got == r).all())
    rs_in = np.full((n,) + shape, r + 1, np.float32)
    rs_out = np.full(shape, -1, np.float32)
    g.reduce_scatter(rs_out, rs_in)
    assert not full or (rs_out == n * (n + 1) / 2).all()
    g.reduce_scatter(rs_out, [rs_in[q, ...].copy() for q in range(n)],
                     op='avg',
                     async_op=True).wait()
    assert not full or (rs_out == (n + 1) / 2).all()
    a_in = np.full((n,) + shape, r, np.int64)
    a_out = np.full((n,) + shape, -1, np.int64)
    g.all_to_all(a_out, a_in)
    assert not full or [int(o) for o in a_out] == list(range(n))
    c = [np.full(shape, r + 1.0, np.float32), np.full(3, r + 1.0, np.float32),
         np.full(shape, r + 1.0, np.float32)]
    g.all_reduce_coalesced(c)
    assert [a.shape for a in c] == [shape, (3,), shape]
    assert all((a == n * (n + 1) / 2).all() for a in c)
    c = [np.full(shape, r + 1.0) for _ in range(3)]
    g.all_reduce_coalesced(c, 'avg', async_op=True).wait()
    assert all((a == (n + 1) / 2).all() for a in c)
    g.barrier()
    if n > 1:
        right, left = (r + 1) % n, (r - 1) % n
        s = np.full(shape, r, np.float32)
        g.send(s, right, tag=3)
        g.send(np.full(4, r, np.float32), right, tag=4)
        g.isend(s, right, tag=5).wait()
        got4 = np.zeros(4, np.float32)
        w = g.irecv(got4, left, tag=4)
        got = np.full(shape, -1, np.float32)
        g.recv(got, left, tag=3)
        got5 = np.full(shape, -1, np.float32)
        g.irecv(got5, left, tag=5).wait()
        w.wait()
        assert (got4 == left).all() and got.shape == shape
        assert not full or ((got == left).all() and (got5 == left).all())
    g.barrier()


def case_empty_tensors(g):
    # 0-element buffers move nothing, but every rank must still agree
    # and return at once (tcp used to wait for bytes that never came)
    _empty_and_scalar_ops(g, (0,))
    _empty_and_scalar_ops(g, (2, 0))


def case_scalar_tensors(g):
    _empty_and_scalar_ops(g, ())


CASES = {k[5:]: v for k, v in sorted(globals().items())
         if k.startswith('case_')}


def run_cases(g):
    res = {}
    for name, fn in CASES.items():
        try:
            fn(g)
            res[name] = 'ok'
        except Exception as e:  # report, the parent test asserts
            res[name] = f"{type(e).__name__}: {e}"
            break   # the group may be out of step now
    return res


def _lagging_store_calls(seconds):
    """Every store request of this rank waits first, as on a loaded
    machine: the end of its group set-up then comes after rank 0's."""
    from collectives import store
    real = store.TCPStore._request

    def slow(self, *a, **k):
        time.sleep(seconds)
        return real(self, *a, **k)
    store.TCPStore._request = slow


def _slow_drain(seconds):
    """This rank takes the shm-pipe slots one at a time and late, as a
    loaded rank would: its neighbour finishes the ring step first, and
    the acks go back one by one."""
    from collectives.tcp.transport import SocketTransport
    real = SocketTransport._recv_tokens

    def slow(self, si, toks, most):
        time.sleep(seconds)
        return real(self, si, toks, 1)
    SocketTransport._recv_tokens = slow


# ---- a skipped collective's timeout report, on a loaded machine
def until_no_live_rank_is_late(run, timeouts=(1.5, 6.0, 24.0)):
    """``run(timeout)`` returns (result, the ranks a timeout report named
    missing that did not skip the collective). A live rank is named when
    it reached the collective more than ``timeout`` after the reporting
    rank, which a short timeout sees on a loaded machine (2 cores, load
    > 10): run again with the next, longer timeout while that is so.
    Returns the last result; the test asserts the report on it (so a
    report that names a live rank at every timeout still fails)."""
    for t in timeouts:
        result, late = run(t)
        if not late:
            break
    return result


# ---- the tcp rank processes (this file, or another rank script)
def run_ranks(mode, world, timeout=60, env=None, rank_env=None,
              script=os.path.abspath(__file__), port=None):
    """Start `world` processes of `script` (argv: mode rank world port
    token); return their (parsed last JSON line, stderr, exit code).
    rank_env: {rank: {VAR: value}} on top of env for single ranks.

    free_port() only finds a port that was free: another process on the
    machine (a concurrent test run) may bind it before rank 0 does. Rank 0
    then cannot serve the store and the other ranks meet the stranger
    (refused: wrong token), so the launch is retried on a fresh port."""
    for attempt in range(5):
        outs = _launch(mode, world, timeout, env, rank_env, script,
                       port or free_port())
        if "cannot serve the rendezvous store" not in outs[0][1]:
            return outs
        port = None
    return outs


def _launch(mode, world, timeout, env, rank_env, script, port):
    token = os.urandom(8).hex()
    e = dict(os.environ, OMP_NUM_THREADS='1', **(env or {}))
    rank_env = rank_env or {}
    procs = [subprocess.Popen(
        [sys.executable, script, mode, str(r), str(world), str(port), token],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(e, **rank_env.get(r, {})))
        for r in range(world)]
    # rank 0 first: when it could not bind, the others need not be waited
    # for (finish kills them)
    outs = finish(procs, timeout, stop_when=lambda outs: (
        "cannot serve the rendezvous store" in outs[0][2]))
    return [(_last_json_line(out), err, rc) for rc, out, err in outs]


def _last_json_line(out):
    lines = [ln for ln in out.splitlines() if ln.startswith('{')]
    return json.loads(lines[-1]) if lines else None


def main(argv):
    mode, rank, world, port, token = argv[:5]
    rank, world = int(rank), int(world)
    if mode == 'empty_bcast' and rank > 0:
        _lagging_store_calls(0.05)
    g = collectives.init('tcp', rank, world, timeout=float(
        os.environ.get('TEST_TIMEOUT', '20')), master_addr='127.0.0.1',
        master_port=int(port), token=token)
    if mode == 'cases':
        print(json.dumps(run_cases(g)), flush=True)
    elif mode == 'die':
        g.all_reduce(np.ones(4))
        if rank == 1:
            os._exit(3)     # a crash: no cleanup, the kernel closes sockets
        t = time.monotonic()
        try:
            for _ in range(3):
                g.all_reduce(np.ones(100_000))
            print(json.dumps({'error': None}), flush=True)
        except RankFailureError as e:
            print(json.dumps({'error': str(e), 'type': 'RankFailureError',
                              'rank': e.rank, 't': time.monotonic() - t}),
                  flush=True)
    elif mode == 'skip':
        g.all_reduce(np.ones(4))
        if rank == world - 1:
            # away until the others' timeout has fired
            time.sleep(float(os.environ['TEST_TIMEOUT']) + 2.5)
            print(json.dumps({'skipped': True}), flush=True)
            os._exit(0)
        try:
            g.all_reduce(np.ones(1024, np.float32))
            print(json.dumps({'error': None}), flush=True)
        except CollectiveTimeoutError as e:
            print(json.dumps({'error': str(e), 'missing': e.missing}),
                  flush=True)
    elif mode in ('rs_exit', 'ag_exit'):
        # big messages (the same-host shm pipe) and then a normal exit
        # with no barrier: the last ring step's acks may still be on the
        # wire when the first rank to finish closes its sockets
        n = int(os.environ.get('TEST_ELEMS', '400000'))
        if os.environ.get('TEST_SLOW_DRAIN'):
            _slow_drain(float(os.environ['TEST_SLOW_DRAIN']))
        for _ in range(3):
            full = np.full((world, n), rank + 1.0, np.float32)
            part = np.full(n, rank + 1.0, np.float32)
            if mode == 'rs_exit':
                g.reduce_scatter(part, full)
            else:
                g.all_gather(full, part)
        print(json.dumps({'ok': True}), flush=True)
        return
    elif mode == 'empty_bcast':
        # the job's only collective moves nothing: rank 0 is done at once
        g.broadcast(np.zeros(0, np.float32), 0)
        print(json.dumps({'ok': True}), flush=True)
        return      # a normal exit (atexit runs): the case under test
    # the store lives in rank 0: keep it up until the others are done
    if mode == 'cases':
        g.barrier()
    sys.stdout.flush()
    os._exit(0)


if __name__ == '__main__':
    main(sys.argv[1:])
