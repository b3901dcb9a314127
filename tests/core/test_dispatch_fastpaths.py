"""The dispatch fast paths (issue 18: per-op overhead on tiny tensors) give
exactly what the general paths give: promote_meta against promote + _meta
over operand kinds and dtypes, the engine's alias check for one array sent
to several inputs, matmul and permute gradients (PyTorch as oracle), and
float32_compute's 2-byte-float detection."""
import itertools

import numpy as np
import pytest

import dtorch
from dtorch import ops as P
from dtorch.ops.base import promote, promote_meta, _meta, float32_compute


def _low_np_dtypes():
    # the 2-byte floats float32_compute widens: float16, and bfloat16 (its
    # NumPy dtype loads ml_dtypes, which dtorch imports lazily)
    return (np.dtype(np.float16), dtorch.bfloat16.np)


class _Ctx:
    pass


_DTYPES = [np.float32, np.float64, np.float16, np.int64, np.int32, np.uint8,
           np.bool_]
_OPERANDS = ([np.ones(3, dt) for dt in _DTYPES]
             + [np.ones((), np.float32), np.ones((2, 1), np.int64),
                2, 2.5, True])


@pytest.mark.parametrize("true_div", [False, True])
def test_promote_meta_equals_promote_then_meta(true_div):
    for x, y in itertools.product(_OPERANDS, repeat=2):
        a, b = _Ctx(), _Ctx()
        try:
            want = promote(x, y, "op", true_div)
        except TypeError as e:        # two numbers
            with pytest.raises(TypeError, match=str(e)):
                promote_meta(b, x, y, "op", true_div)
            continue
        _meta(a, x, y)
        got = promote_meta(b, x, y, "op", true_div)
        assert vars(a) == vars(b)
        for w, g in zip(want, got):
            assert type(w) is type(g)
            if isinstance(w, np.ndarray):
                assert w.dtype == g.dtype and w.shape == g.shape


def test_same_dtype_fast_path_keeps_int_true_division_float():
    x = np.arange(3, dtype=np.int64)
    x2, y2 = promote(x, x, "div", true_div=True)
    assert x2.dtype == np.float32 and y2.dtype == np.float32
    a = dtorch.tensor([1, 2, 3]) / dtorch.tensor([2, 2, 2])
    assert a.dtype == dtorch.float32
    assert a.tolist() == [0.5, 1.0, 1.5]


def test_one_gradient_to_two_leaves_is_two_arrays():
    # Add.backward returns the same array for both inputs
    a = dtorch.ones(3, requires_grad=True)
    b = dtorch.ones(3, requires_grad=True)
    (a + b).sum().backward()
    assert a.grad._data is not b.grad._data
    a.grad.add_(1)
    assert b.grad.tolist() == [1.0, 1.0, 1.0]
    x = dtorch.ones(3, requires_grad=True)
    (x + x).sum().backward()
    assert x.grad.tolist() == [2.0, 2.0, 2.0]


def test_one_gradient_to_three_inputs_is_three_arrays():
    class Same(dtorch.autograd.Function):
        _array_api = True     # the engine's array path, as dtorch's ops

        @staticmethod
        def forward(ctx, x, y, z):
            return x + y + z

        @staticmethod
        def backward(ctx, g):
            return g, g, g
    ts = [dtorch.ones(2, requires_grad=True) for _ in range(3)]
    Same.apply(*ts).sum().backward()
    ids = {id(t.grad._data) for t in ts}
    assert len(ids) == 3
    ts[0].grad.add_(1)
    assert ts[1].grad.tolist() == [1.0, 1.0] == ts[2].grad.tolist()


@pytest.mark.parametrize("sa,sb", [((3,), (3, 4)), ((2, 3), (3,)),
                                   ((3,), (3,)), ((5, 2, 3), (3, 4)),
                                   ((2, 3), (4, 3, 2)),
                                   ((1, 2, 3), (5, 3, 2)),
                                   ((3,), (2, 3, 4)), ((2, 4, 3), (3,))])
def test_matmul_grads_match_torch(sa, sb):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(sa), rng.standard_normal(sb)
    da = dtorch.tensor(a, requires_grad=True)
    db = dtorch.tensor(b, requires_grad=True)
    ta = torch.tensor(a, requires_grad=True)
    tb = torch.tensor(b, requires_grad=True)
    g = rng.standard_normal((ta @ tb).shape)
    (da @ db).backward(dtorch.tensor(g))
    (ta @ tb).backward(torch.tensor(g))
    for d, t in ((da, ta), (db, tb)):
        assert tuple(d.grad.shape) == tuple(t.grad.shape)
        np.testing.assert_allclose(d.grad.numpy(), t.grad.numpy(),
                                   rtol=1e-12, atol=1e-12)


def test_matmul_gradcheck_with_vectors():
    rng = np.random.default_rng(1)
    for sa, sb in [((3,), (3, 2)), ((2, 3), (3,)), ((3,), (3,))]:
        a = dtorch.tensor(rng.standard_normal(sa), requires_grad=True)
        b = dtorch.tensor(rng.standard_normal(sb), requires_grad=True)
        assert dtorch.autograd.gradcheck(lambda x, y: x @ y, (a, b))


@pytest.mark.parametrize("perm", list(itertools.permutations(range(4)))[::5])
def test_permute_backward_matches_torch(perm):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 3, 4, 5))
    w = rng.standard_normal(tuple((2, 3, 4, 5)[p] for p in perm))
    dx = dtorch.tensor(x, requires_grad=True)
    tx = torch.tensor(x, requires_grad=True)
    (dx.permute(*perm) * dtorch.tensor(w)).sum().backward()
    (tx.permute(*perm) * torch.tensor(w)).sum().backward()
    np.testing.assert_array_equal(dx.grad.numpy(), tx.grad.numpy())


def test_permute_backward_negative_dims_and_transpose():
    x = dtorch.tensor(np.arange(24.).reshape(2, 3, 4), requires_grad=True)
    y = x.permute(-1, 0, -2)
    assert tuple(y.shape) == (4, 2, 3)
    y.backward(dtorch.tensor(np.arange(24.).reshape(4, 2, 3)))
    assert np.array_equal(x.grad.numpy(),
                          np.arange(24.).reshape(4, 2, 3).transpose(1, 2, 0))
    z = dtorch.ones(2, 3, requires_grad=True)
    z.t().backward(dtorch.tensor(np.arange(6.).reshape(3, 2)))
    assert np.array_equal(z.grad.numpy(), np.arange(6.).reshape(3, 2).T)


def test_reshape_size_checks_and_errors():
    x = dtorch.ones(2, 6)
    assert tuple(x.reshape(3, -1).shape) == (3, 4)
    assert tuple(x.reshape(dtorch.tensor(4), 3).shape) == (4, 3)
    with pytest.raises(RuntimeError,
                       match=r"shape '\[5, 2\]' is invalid for input of "
                             r"size 12"):
        x.reshape(5, 2)
    with pytest.raises(RuntimeError, match="only one dimension"):
        x.reshape(-1, -1)
    with pytest.raises(RuntimeError, match="is invalid"):
        x.reshape(-2, -6)
    assert tuple(dtorch.ones(0, 3).reshape(3, 0).shape) == (3, 0)


def test_float32_compute_finds_a_low_precision_operand_anywhere():
    seen = []

    @float32_compute
    class Probe(P.Op):
        _array_api = True

        @staticmethod
        def forward(ctx, x, y):
            seen.append((x.dtype, y.dtype))
            return x + y

        @staticmethod
        def backward(ctx, g):
            return g, g
    for low in _low_np_dtypes():
        seen.clear()
        out = Probe.apply(dtorch.tensor(np.ones(2, np.int64)),
                          dtorch.tensor(np.ones(2).astype(low)))
        # computed in float32, rounded once to the 2-byte dtype
        assert seen == [(np.dtype(np.int64), np.dtype(np.float32))]
        assert out._data.dtype == low
    seen.clear()
    out = Probe.apply(dtorch.ones(2), dtorch.ones(2))
    assert seen == [(np.dtype(np.float32),) * 2]
    assert out._data.dtype == np.float32


def test_mm_is_matmul_bitwise_over_layouts():
    from dtorch.ops.matmul import _mm
    rng = np.random.default_rng(3)
    for dt in (np.float32, np.float64, np.int64, np.float16):
        for trial in range(120):
            m, k, p = rng.integers(1, 40, 3)
            if trial % 5 == 0:
                p = 1
            if trial % 7 == 0:
                m = 1
            a = (rng.standard_normal((m, 2 * k)) * 10).astype(dt)
            b = (rng.standard_normal((k, p)) * 10).astype(dt)
            for aa in (a[:, :k], np.asfortranarray(a[:, :k]), a[:, ::2]):
                for bb in (b, np.asfortranarray(b), b.T.copy().T):
                    got, want = _mm(aa, bb), aa @ bb
                    # same dtype and memory layout (view() depends on it)
                    assert got.dtype == want.dtype
                    assert got.strides == want.strides
                    np.testing.assert_array_equal(got, want)
    # batched and 1-D operands are matmul's
    x, y = rng.standard_normal((2, 3, 4)), rng.standard_normal(4)
    np.testing.assert_array_equal(_mm(x, y), x @ y)
    with pytest.raises(ValueError):
        _mm(np.ones((2, 3)), np.ones((2, 3)))


def _kinds():
    return {"leaf": lambda: dtorch.ones(3, requires_grad=True),
            "inner": lambda: dtorch.ones(3, requires_grad=True) * 1.0,
            "const": lambda: dtorch.ones(3),
            "number": lambda: 2.0}


@pytest.mark.parametrize("grad", [True, False])
@pytest.mark.parametrize("kx,ky", list(itertools.product(_kinds(), repeat=2)))
def test_binary_dispatch_records_what_the_general_path_does(kx, ky, grad):
    """Two-argument ops take their own path through _apply_array: the same
    result, graph edges, needs_input_grad, saved versions and gradients as
    the general path (here: PyTorch's rules, written out)."""
    x, y = _kinds()[kx](), _kinds()[ky]()
    if kx == ky == "number":
        with pytest.raises(TypeError, match="at least one tensor argument"):
            P.Mul.apply(x, y)
        return
    with dtorch.set_grad_enabled(grad):
        out = P.Mul.apply(x, y)
    req = [isinstance(a, dtorch.Tensor) and a.requires_grad for a in (x, y)]
    assert out.tolist() == [2.0 if "number" in (kx, ky) else 1.0] * 3
    if not (grad and any(req)):
        assert out.grad_fn is None and not out.requires_grad
        return
    fn = out.grad_fn
    assert out.requires_grad and type(fn) is P.Mul
    assert list(fn.needs_input_grad) == req
    for a, r, e in zip((x, y), req, fn.next_edges):
        if not r:
            assert e is None
        elif a.grad_fn is not None:
            assert e == (a.grad_fn, a._output_nr)
        else:
            assert e == (a._accum, 0)
    # each needed gradient's saved operand is version-checked
    saved = [a for a, r in zip((y, x), req) if r and
             isinstance(a, dtorch.Tensor)]
    assert len(fn._versions or ()) == len(saved)
    out.sum().backward()
    for a, b, r in ((x, y, req[0]), (y, x, req[1])):
        if r and a.grad_fn is None:
            want = b.tolist() if isinstance(b, dtorch.Tensor) else [b] * 3
            assert a.grad.tolist() == want


def test_binary_dispatch_version_check_and_no_grad_leaves():
    x = dtorch.ones(3, requires_grad=True)
    y = dtorch.ones(3)
    z = x * y
    y.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace"):
        z.sum().backward()
    w = dtorch.ones(3, requires_grad=True)
    with dtorch.no_grad():
        w * w
    assert w._accum is None       # no accumulator made without a graph
