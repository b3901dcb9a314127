"""Context-parallel attention (dtorch.distributed.tensor.experimental's
context_parallel), threads backend: the output and every gradient (q, k,
v) equal single-rank SDPA for CP 2, 3, 4, ring (both rotate methods) and
Ulysses, causal and not, lengths 1, 7, 64, 129 and 3 heads (divisible by
no CP size here), float64 to 1e-10 and float32 to 1e-5; GQA, boolean and
float masks, dropout (the same mask as one rank under the same seed),
bfloat16 under autocast; a finite-difference check; the errors. A
two-process tcp run is at the end (this file run as a script)."""
import os
import sys

import numpy as np
import pytest

import dtorch
import dtorch.distributed as dist
import dtorch.nn.functional as F
from dtorch.distributed.device_mesh import init_device_mesh
from dtorch.distributed.tensor.experimental import (
    context_parallel, context_parallel_unshard, set_rotate_method)
from dtorch.distributed.tensor.experimental import _ring

_TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# tests/ (the shared helpers) and the checkout above it: run as a script
# under an editable install, a rank would otherwise import tests/collectives
# and tests/launch (namespace directories) as the packages of those names
sys.path[:0] = [_TESTS, os.path.dirname(_TESTS)]
from helpers import finish, start_tcp_ranks  # noqa: E402

TOL = {np.float64: 1e-10, np.float32: 1e-5}
CASES = [(T, c) for T in (1, 7, 64, 129) for c in (False, True)]


@pytest.fixture(autouse=True)
def _default_rotate():
    yield
    set_rotate_method("allgather")


def inputs(T, H=3, Hkv=None, B=2, E=4, dtype=np.float64, seed=0):
    """q, k, v (value head size E + 1) and the output's gradient."""
    rng = np.random.default_rng([seed, T, H])
    Hkv = Hkv or H
    shapes = [(B, H, T, E), (B, Hkv, T, E), (B, Hkv, T, E + 1),
              (B, H, T, E + 1)]
    return [rng.standard_normal(s).astype(dtype) for s in shapes]


def sdpa(arrays, **kw):
    """SDPA's output and q, k, v gradients on the whole sequence (one
    rank), or on this rank's shards inside a context_parallel region."""
    q, k, v = (dtorch.tensor(a).requires_grad_() for a in arrays[:3])
    out = F.scaled_dot_product_attention(q, k, v, **kw)
    (out * dtorch.tensor(arrays[3])).sum().backward()
    return [out, q.grad, k.grad, v.grad]


def cp_sdpa(mesh, arrays, algorithm, mask=None, **kw):
    """The same on this rank's shards, gathered back to whole tensors."""
    bufs = [dtorch.tensor(a) for a in arrays]
    with context_parallel(mesh, buffers=bufs, buffer_seq_dims=[2] * 4,
                          algorithm=algorithm):
        res = sdpa([b.numpy() for b in bufs], attn_mask=mask, **kw)
        res = [r.detach() for r in res]
        return [as_array(t) for t in
                context_parallel_unshard(mesh, res, [2] * 4)]


def as_array(t):
    t = t.detach()
    return (t.float() if t.dtype == dtorch.bfloat16 else t).numpy()


def on_ranks(n, fn):
    """fn(mesh) on n thread ranks of a 1-d "cp" mesh; their results."""
    def body(r, w):
        return fn(init_device_mesh("cpu", (w,), mesh_dim_names=("cp",)))
    return dist.spawn_threads(lambda r, w: body(r, w), n, timeout=120)


def assert_same(results, want, tol, what=""):
    for got in results:
        for g, w, name in zip(got, want, ("out", "dq", "dk", "dv")):
            w = as_array(w) if isinstance(w, dtorch.Tensor) else w
            assert g.shape == w.shape, (what, name)
            np.testing.assert_allclose(g, w, atol=tol, rtol=0,
                                       err_msg=f"{what} {name}")


@pytest.mark.parametrize("dtype", [np.float64, np.float32],
                         ids=["float64", "float32"])
@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("algorithm,rotate", [
    ("ring", "alltoall"), ("ring", "allgather"), ("ulysses", "allgather")])
def test_equals_single_rank(algorithm, rotate, n, dtype):
    set_rotate_method(rotate)
    data = {c: inputs(c[0], dtype=dtype) for c in CASES}
    want = {c: sdpa(data[c], is_causal=c[1]) for c in CASES}
    res = on_ranks(n, lambda mesh: {
        c: cp_sdpa(mesh, data[c], algorithm, is_causal=c[1])
        for c in CASES})
    for c in CASES:
        assert_same([r[c] for r in res], want[c], TOL[dtype], c)


@pytest.mark.parametrize("algorithm", ["ring", "ulysses"])
def test_gqa(algorithm):
    """4 query heads over 2 key/value heads: they divide CP 2, not 3 or 4
    (Ulysses then repeats the key/value heads)."""
    set_rotate_method("alltoall")
    cases = [(T, c) for T in (7, 64) for c in (False, True)]
    data = {c: inputs(c[0], H=4, Hkv=2) for c in cases}
    want = {c: sdpa(data[c], is_causal=c[1], enable_gqa=True)
            for c in cases}
    for n in (2, 3, 4):
        res = on_ranks(n, lambda mesh: {
            c: cp_sdpa(mesh, data[c], algorithm, is_causal=c[1],
                       enable_gqa=True) for c in cases})
        for c in cases:
            assert_same([r[c] for r in res], want[c], 1e-10, (n, c))


def test_gqa_matches_pytorch():
    torch = pytest.importorskip("torch")
    q, k, v, g = inputs(11, H=4, Hkv=2)
    res = on_ranks(3, lambda mesh: cp_sdpa(mesh, [q, k, v, g], "ring",
                                           is_causal=True, enable_gqa=True))
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(
        tq, tk, tv, is_causal=True, enable_gqa=True)
    (out * torch.tensor(g)).sum().backward()
    want = [t.detach().numpy() for t in (out, tq.grad, tk.grad, tv.grad)]
    assert_same(res, want, 1e-10)


@pytest.mark.parametrize("algorithm", ["ring", "ulysses"])
def test_masks(algorithm):
    """A boolean mask with fully masked rows (they give 0, as one rank),
    a float mask per head and a key-padding mask, all of the whole
    sequence."""
    T = 13
    data = inputs(T)
    rng = np.random.default_rng(5)
    bool_mask = rng.random((2, 1, T, T)) > 0.4
    bool_mask[0, 0, 3] = False
    float_mask = rng.standard_normal((1, 3, T, T))
    pad = np.ones((2, 1, 1, T), bool)
    pad[1, ..., 9:] = False
    masks = [bool_mask, float_mask, pad]
    want = [sdpa(data, attn_mask=dtorch.tensor(m)) for m in masks]
    for n in (2, 3):
        res = on_ranks(n, lambda mesh: [
            cp_sdpa(mesh, data, algorithm, mask=dtorch.tensor(m))
            for m in masks])
        for i in range(len(masks)):
            assert_same([r[i] for r in res], want[i], 1e-10, (n, i))


@pytest.mark.parametrize("algorithm", ["ring", "ulysses"])
def test_dropout_draws_what_one_rank_draws(algorithm):
    """Under the same seed the ranks' dropout masks are the one-rank
    mask's pieces (output and gradients equal), and the generator moves on
    as one rank's would."""
    set_rotate_method("alltoall")
    cases = [(7, False), (33, True)]
    data = {c: inputs(c[0]) for c in cases}
    want, after = {}, {}
    for c in cases:
        dtorch.manual_seed(11)
        want[c] = sdpa(data[c], is_causal=c[1], dropout_p=0.3)
        after[c] = dtorch.rand(3).numpy()
    def rank(mesh, c):
        # each thread rank owns its RNG, as a process: seeded differently
        # but for CP rank 0, whose state the region shares
        r = dist.get_rank()
        dtorch.manual_seed(11 if r == 0 else 1000 + r)
        out = cp_sdpa(mesh, data[c], algorithm, is_causal=c[1],
                      dropout_p=0.3)
        return out, dtorch.rand(3).numpy()
    for n in (2, 3):
        for c in cases:
            res = on_ranks(n, lambda mesh: rank(mesh, c))
            assert_same([r[0] for r in res], want[c], 1e-10, (n, c))
            for _, nxt in res:      # every rank's generator moved on alike
                np.testing.assert_array_equal(nxt, after[c])
    # dropout did drop: the output is not the one without it
    assert not np.allclose(as_array(want[cases[0]][0]),
                           as_array(sdpa(data[cases[0]])[0]))


def test_keep_mask_pieces_are_the_whole_draw():
    g = dtorch.Generator().manual_seed(4)
    st = g.get_state()
    whole = g.rng.random((2, 3, 5, 5)) >= 0.5
    keep = _ring.KeepMask(st, 6, 5, 0.5)
    rows, cols = [1, 2, 4], [0, 3, 4]
    part = keep.draw(range(6), rows, cols).reshape(2, 3, 3, 3)
    np.testing.assert_array_equal(
        part, whole[:, :, rows][..., cols])
    assert keep.state_after() == g.get_state()


@pytest.mark.parametrize("algorithm", ["ring", "ulysses"])
def test_bfloat16_under_autocast(algorithm):
    data = inputs(24, dtype=np.float32)
    with dtorch.autocast("cpu", dtype=dtorch.bfloat16):
        want = sdpa(data, is_causal=True)
        res = on_ranks(2, lambda mesh: _autocast_cp(mesh, data, algorithm))
    assert want[0].dtype == dtorch.bfloat16
    for got in res:
        assert got[0] == "bfloat16"
    # the blocks merge in float32 and round once, as one rank does: a few
    # bfloat16 ulps
    assert_same([r[1:] for r in res], want, 0.03)


def _autocast_cp(mesh, data, algorithm):
    with dtorch.autocast("cpu", dtype=dtorch.bfloat16):
        bufs = [dtorch.tensor(a) for a in data]
        with context_parallel(mesh, buffers=bufs, buffer_seq_dims=[2] * 4,
                              algorithm=algorithm):
            q, k, v = (b.clone().requires_grad_() for b in bufs[:3])
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            (out * bufs[3]).sum().backward()
            res = context_parallel_unshard(
                mesh, [out.detach().float(), q.grad, k.grad, v.grad],
                [2] * 4)
            return [str(out.dtype).split(".")[-1]] + [t.numpy()
                                                     for t in res]


@pytest.mark.parametrize("algorithm", ["ring", "ulysses"])
def test_gradients_match_finite_differences(algorithm):
    """A directional derivative of sum(out * g) over the whole sequence,
    by central differences of context-parallel forwards."""
    q, k, v, g = inputs(9, H=2, B=1)
    rng = np.random.default_rng(1)
    dirs = [rng.standard_normal(a.shape) for a in (q, k, v)]
    eps = 1e-6

    def f(mesh, arrays):
        return float((cp_sdpa(mesh, arrays + [g], algorithm,
                              is_causal=True)[0] * g).sum())

    def body(mesh):
        grads = cp_sdpa(mesh, [q, k, v, g], algorithm, is_causal=True)[1:]
        plus = f(mesh, [a + eps * d for a, d in zip((q, k, v), dirs)])
        minus = f(mesh, [a - eps * d for a, d in zip((q, k, v), dirs)])
        return (plus - minus) / (2 * eps), sum(
            float((gr * d).sum()) for gr, d in zip(grads, dirs))
    for fd, an in on_ranks(3, body):
        assert abs(fd - an) < 1e-6 * max(1.0, abs(an))


@pytest.mark.parametrize("rotate", ["alltoall", "allgather"])
def test_ring_messages_and_overlap(rotate, monkeypatch):
    """What each rank sends: forward passes K and V n - 1 times
    ("alltoall"; "allgather": one all-gather each), backward K/V n - 1
    times and dK/dV n times (the last hop takes them home); each step's
    sends are posted before that step's blocks compute (the overlap)."""
    import threading
    set_rotate_method(rotate)
    log = {}

    def wrap(name, fn):
        def f(*a, **kw):
            log.setdefault(threading.get_ident(), []).append(name)
            return fn(*a, **kw)
        return f
    monkeypatch.setattr(_ring.dist, "isend", wrap("isend", dist.isend))
    monkeypatch.setattr(_ring.dist, "all_gather_into_tensor",
                        wrap("gather", dist.all_gather_into_tensor))
    monkeypatch.setattr(_ring, "_block", wrap("block", _ring._block))
    data = inputs(12)
    n = 3
    on_ranks(n, lambda mesh: cp_sdpa(mesh, data, "ring", is_causal=True))
    assert len(log) == n
    for events in log.values():
        fwd = events[:events.index("block") + 1]
        if rotate == "alltoall":
            assert fwd == ["isend", "isend", "block"]     # posted first
            assert events.count("isend") == 2 * (n - 1) + 2 * (2 * n - 1)
        else:
            assert fwd == ["gather", "gather", "block"]
            assert events.count("isend") == 2 * (2 * n - 1)


def test_causal_work_is_even():
    """The load balance: under a causal mask every rank computes the same
    number of scores (T divisible by 2 CP), where contiguous shards would
    give the last rank 2 CP - 1 times the first's."""
    for n in (2, 3, 4):
        T = 16 * n

        def area(mesh):
            plan = _ring.Plan(mesh.get_group(), T, (), True, 1.0, 1)
            return sum(len(qp[2]) * len(kp[2]) for s in range(n)
                       for qp, kp, _ in plan.blocks(s))
        areas = on_ranks(n, area)
        assert len(set(areas)) == 1, areas
        c = T // (2 * n)
        # 2n + 1 chunk pairs each, two of them the (full) diagonals
        assert areas[0] == (2 * n + 1) * c * c


def test_empty_batch_and_layout():
    assert _ring.chunk_bounds(7, 2) == [(0, 2), (2, 4), (4, 6), (6, 7)]
    assert list(_ring.positions(7, 2, 0)) == [0, 1, 6]
    assert list(_ring.positions(7, 2, 1)) == [2, 3, 4, 5]
    data = inputs(6, B=0)
    res = on_ranks(2, lambda mesh: cp_sdpa(mesh, data, "ring",
                                           is_causal=True))
    assert all(a.shape[0] == 0 for r in res for a in r)


def test_region_without_buffers_learns_the_length():
    """A region with no buffers (a pipeline stage that holds none) takes
    the sequence length from the ranks' shards."""
    data = inputs(11)
    want = sdpa(data, is_causal=True)

    def body(mesh):
        n, r = mesh.size(), mesh.get_local_rank()
        mine = [a[:, :, _ring.positions(11, n, r)] for a in data]
        with context_parallel(mesh):
            got = [t.detach() for t in sdpa(mine, is_causal=True)]
        return [as_array(t) for t in
                context_parallel_unshard(mesh, got, [2] * 4)]
    assert_same(on_ranks(3, body), want, 1e-10)


def test_buffers_are_sharded_and_restored():
    def body(mesh):
        x, keep = dtorch.arange(10).reshape(1, 10), dtorch.arange(10)
        with context_parallel(mesh, buffers=[x, keep],
                              buffer_seq_dims=[1, 0],
                              no_restore_buffers=[keep]):
            inside = x.numpy().copy()
        return inside, x.numpy(), keep.numpy()
    (i0, x0, k0), (i1, _, k1) = on_ranks(2, body)
    # chunks of 10 over 2 x 2: [0, 3) [3, 6) [6, 8) [8, 10)
    assert i0.tolist() == [[0, 1, 2, 8, 9]] and k0.tolist() == [0, 1, 2, 8, 9]
    assert i1.tolist() == [[3, 4, 5, 6, 7]] and k1.tolist() == [3, 4, 5, 6, 7]
    assert x0.tolist() == [list(range(10))]


def test_errors():
    with pytest.raises(NotImplementedError, match="does not support using"):
        set_rotate_method("ring")
    q, k, v, g = inputs(8)

    def body(mesh):
        errs = []
        bufs = [dtorch.tensor(a) for a in (q, k, v)]
        with context_parallel(mesh, buffers=bufs, buffer_seq_dims=[2] * 3):
            full = dtorch.tensor(q)
            for call in (
                    lambda: F.scaled_dot_product_attention(full, full, full),
                    lambda: F.scaled_dot_product_attention(
                        *bufs, attn_mask=dtorch.zeros(4, 4)),
                    lambda: F.scaled_dot_product_attention(
                        *bufs, attn_mask=dtorch.zeros(8, 8,
                                                      requires_grad=True))):
                try:
                    call()
                except Exception as e:
                    errs.append((type(e), str(e)))
        for kw in ({"buffers": [dtorch.zeros(2)], "buffer_seq_dims": []},
                   {"buffers": [dtorch.zeros(2)], "buffer_seq_dims": [0],
                    "no_restore_buffers": [dtorch.zeros(2)]},
                   {"algorithm": "tree"}, {"mesh": "cp"}):
            try:
                with context_parallel(kw.pop("mesh", mesh), **kw):
                    pass
            except Exception as e:
                errs.append((type(e), str(e)))
        with context_parallel(mesh, buffers=[dtorch.zeros(1, 2, 8, 4)
                                             for _ in range(3)],
                              buffer_seq_dims=[2] * 3, algorithm="ulysses"):
            try:
                F.scaled_dot_product_attention(*[dtorch.zeros(4, 4)] * 3)
            except Exception as e:
                errs.append((type(e), str(e)))
        return errs
    errs = on_ranks(2, body)[0]
    kinds = [
        (ValueError, "holds 4 of the sequence's 8 positions, but the query"),
        (RuntimeError, "must be the mask of the whole sequence"),
        (NotImplementedError, "attn_mask that requires grad"),
        (ValueError, "same number of elements"),
        (ValueError, "must be a subset"),
        (ValueError, "'ring' or 'ulysses'"),
        (ValueError, "needs the 1-d mesh"),
        (ValueError, "query and key need a heads dim")]
    assert len(errs) == len(kinds), errs
    for (t, msg), (want_t, want_msg) in zip(errs, kinds):
        assert t is want_t and want_msg in msg, (t, msg)


@pytest.mark.gpu
@pytest.mark.skipif(not dtorch.cuda.is_available(),
                    reason="needs CUDA (or DTORCH_FAKE_CUDA=1)")
@pytest.mark.parametrize("algorithm", ["ring", "ulysses"])
def test_on_cuda(algorithm):
    """The same code on CuPy arrays (dropout refuses: its mask comes from
    the CPU generator's stream)."""
    data = inputs(10, H=4, Hkv=2)
    want = sdpa(data, is_causal=True, enable_gqa=True)

    def body(mesh):
        bufs = [dtorch.tensor(a, device="cuda") for a in data]
        with context_parallel(mesh, buffers=bufs, buffer_seq_dims=[2] * 4,
                              algorithm=algorithm):
            q, k, v = (b.clone().requires_grad_() for b in bufs[:3])
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                 enable_gqa=True)
            (out * bufs[3]).sum().backward()
            res = context_parallel_unshard(
                mesh, [out.detach(), q.grad, k.grad, v.grad], [2] * 4)
            assert all(t.device.type == "cuda" for t in res)
            with pytest.raises(NotImplementedError, match="CPU generator"):
                F.scaled_dot_product_attention(*bufs[:3], dropout_p=0.1,
                                               enable_gqa=True)
            return [t.cpu().numpy() for t in res]
    assert_same(on_ranks(2, body), want, 1e-10)


# =============================================== two processes over tcp ==

def test_two_processes_over_tcp():
    """Ring (round the ring) and Ulysses, causal with dropout, on 2
    processes seeded differently: rank 0's stream is the one drawn, and
    both equal one rank seeded as rank 0."""
    procs = start_tcp_ranks([os.path.abspath(__file__)], 2)
    for rc, out, err in finish(procs, timeout=120):
        assert rc == 0, err[-3000:]
        assert "cp tcp ok" in out


def _tcp_main():
    dist.init_process_group("tcp")
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("cp",))
    set_rotate_method("alltoall")
    data = inputs(21)
    dtorch.manual_seed(7)
    want = sdpa(data, is_causal=True, dropout_p=0.2)
    for algorithm in ("ring", "ulysses"):
        dtorch.manual_seed(7 + dist.get_rank())
        got = cp_sdpa(mesh, data, algorithm, is_causal=True, dropout_p=0.2)
        assert_same([got], want, 1e-10, algorithm)
    dist.destroy_process_group()
    print("cp tcp ok", flush=True)


if __name__ == "__main__":
    _tcp_main()
