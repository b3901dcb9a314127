"""Sparse COO tensors against torch: construction and its checks,
to_sparse / to_dense / coalesce / indices / values, sparse @ dense and
dense @ sparse with gradients to the dense operand and to the values
(float64 finite differences too), sums, a two-layer GCN trained a few
steps from the same weights (pytorch/examples gcn's operations), and that
every other (dense) op on a sparse tensor raises NotImplementedError."""
import numpy as np
import pytest

import dtorch
from dtorch.autograd import gradcheck, gradgradcheck
import helpers

torch = pytest.importorskip("torch")

IDX = np.array([[0, 1, 1, 3, 0], [2, 0, 2, 1, 2]])      # (0, 2) repeated
VAL = np.array([3.0, 4.0, 5.0, -1.0, 0.5])


def both(fn):
    return fn(dtorch), fn(torch)


def close(a, b, tol=1e-6):
    helpers.close(a, b, tol)


def make(lib, grad=False, dtype="float64"):
    v = lib.tensor(VAL, dtype=getattr(lib, dtype), requires_grad=grad)
    return lib.sparse_coo_tensor(lib.tensor(IDX), v, (4, 3)), v


def test_construction_and_attributes():
    (d, _), (t, _) = both(make)
    assert d.is_sparse and d.layout is dtorch.sparse_coo
    assert repr(d.layout) == "torch.sparse_coo"   # as memory_format
    assert dtorch.ones(1).layout is dtorch.strided
    assert not dtorch.ones(1).is_sparse
    assert isinstance(d, dtorch.Tensor)
    assert tuple(d.shape) == tuple(t.shape) and d.dtype == dtorch.float64
    assert d._nnz() == t._nnz() == 5
    assert d.sparse_dim() == t.sparse_dim() and d.dense_dim() == 0
    assert d.is_coalesced() == t.is_coalesced() is False
    close(d, t)
    # the size inferred from the indices; dense dims from the values
    i = dtorch.sparse_coo_tensor(IDX, np.ones((5, 2)))
    assert tuple(i.shape) == tuple(torch.sparse_coo_tensor(
        torch.tensor(IDX), torch.ones(5, 2)).shape) == (4, 3, 2)
    # numpy int32 indices and a dtype, as gcn's load_cora
    g = dtorch.sparse_coo_tensor(IDX.astype(np.int32), dtorch.ones(5),
                                 (4, 3), dtype=dtorch.int64)
    assert g.dtype == dtorch.int64 and g._indices().dtype == dtorch.int64
    e = dtorch.sparse_coo_tensor(np.zeros((2, 0), np.int64), np.zeros(0),
                                 (2, 3))
    assert e._nnz() == 0 and e.to_dense().tolist() == [[0.0] * 3] * 2


@pytest.mark.parametrize("indices,values,size,msg", [
    ([[0, 5]], [1.0, 2.0], (3,), "for dim 0, size is 3 but found index 5"),
    ([[0, -1]], [1.0, 2.0], (3,), "negative index -1 for dim 0"),
    ([[0, 1]], [1.0, 2.0, 3.0], (3,), "must have same nnz"),
    ([[0, 1]], [[1.0], [2.0]], (3, 2), "values has incorrect size"),
])
def test_bad_indices_raise(indices, values, size, msg):
    # dtorch checks always (torch only with check_invariants=True)
    with pytest.raises(RuntimeError, match=msg):
        dtorch.sparse_coo_tensor(indices, values, size)
    if "nnz" not in msg:
        with pytest.raises(RuntimeError, match=msg.split(" for")[0]):
            torch.sparse_coo_tensor(indices, values, size,
                                    check_invariants=True)


def test_sparse_names_on_dense_tensors_raise_as_torch():
    for name in ("coalesce", "indices", "values", "is_coalesced"):
        msgs = []
        for lib in (dtorch, torch):
            with pytest.raises(RuntimeError) as e:
                getattr(lib.ones(2, 3), name)()
            msgs.append(str(e.value))
        assert msgs[0] == msgs[1]
    for name in ("_nnz", "_indices", "_values"):
        with pytest.raises(NotImplementedError):
            getattr(dtorch.ones(2, 3), name)()
    x = dtorch.ones(2, 3)
    assert (x.sparse_dim(), x.dense_dim()) == (0, 2)
    assert x.to_dense() is x


def test_coalesce_indices_values_to_dense():
    (d, dv), (t, tv) = both(lambda lib: make(lib, grad=True))
    with pytest.raises(RuntimeError, match="uncoalesced"):
        d.indices()
    with pytest.raises(RuntimeError, match="uncoalesced"):
        d.values()
    dc, tc = d.coalesce(), t.coalesce()
    assert dc.is_coalesced() and dc.coalesce() is dc
    assert dc.indices().tolist() == tc.indices().tolist()
    close(dc.values(), tc.values())
    w = np.arange(12.0).reshape(4, 3)
    for lib, s, v in ((dtorch, dc, dv), (torch, tc, tv)):
        (s.to_dense() * lib.tensor(w)).sum().backward()
    close(dv.grad, tv.grad)
    close(d.to_dense(), t.to_dense())


def test_to_sparse_roundtrip():
    x = np.array([[0.0, 1.5, 0.0], [2.0, 0.0, -3.0]])
    d, t = both(lambda lib: lib.tensor(x).to_sparse())
    assert d.is_coalesced() and d.indices().tolist() == t.indices().tolist()
    close(d.values(), t.values())
    assert d.to_sparse() is d and d.to_dense().tolist() == x.tolist()
    # sparse_dim=1: whole rows, non-zero ones kept
    d1, t1 = both(lambda lib: lib.tensor(x).to_sparse(1))
    assert d1._nnz() == t1._nnz() and d1.dense_dim() == t1.dense_dim() == 1
    close(d1, t1)
    z = dtorch.zeros(2, 2).to_sparse()
    assert z._nnz() == 0


@pytest.fixture(params=["scipy", "numpy"])
def product_path(request, monkeypatch):
    # the product through scipy.sparse when installed, and NumPy's
    # reduceat without it
    from dtorch._tensor_methods import sparse as S
    if request.param == "numpy":
        monkeypatch.setattr(S, "_scipy_sparse", lambda: None)
    elif S._scipy_sparse() is None:
        pytest.skip("scipy is not installed")
    return request.param


@pytest.mark.parametrize("call", ["mm", "spmm", "sparse.mm", "matmul",
                                  "at", "vector"])
def test_sparse_times_dense_gradients(call, product_path):
    dense = np.random.default_rng(0).standard_normal((3, 2))

    def run(lib):
        s, v = make(lib, grad=True)
        x = lib.tensor(dense[:, 0] if call == "vector" else dense,
                       requires_grad=True)
        out = {"mm": lambda: lib.mm(s, x), "spmm": lambda: lib.spmm(s, x),
               "sparse.mm": lambda: lib.sparse.mm(s, x),
               "matmul": lambda: lib.matmul(s, x), "at": lambda: s @ x,
               "vector": lambda: s @ x}[call]()
        (out * out).sum().backward()
        return out, v.grad, x.grad
    for a, b in zip(*both(run)):
        close(a, b)


def test_dense_times_sparse_and_additions(product_path):
    rng = np.random.default_rng(1)
    m = rng.standard_normal((2, 4))

    def run(lib):
        s, v = make(lib, grad=True)
        x = lib.tensor(m, requires_grad=True)
        a = x @ s                          # dense @ sparse
        b = lib.mm(x, s)
        c = lib.ones(4, 3, dtype=lib.float64) + s      # dense + sparse
        e = (s + s * 2).to_dense()         # sparse + sparse, * number
        f = (s * lib.tensor(np.arange(12.0).reshape(4, 3))).to_dense()
        loss = (a * a).sum() + b.sum() + (c * c).sum() + e.sum() + f.sum()
        loss.backward()
        return a, b, c, e, f, v.grad, x.grad
    for a, b in zip(*both(run)):
        close(a, b)
    d, _ = make(dtorch)
    with pytest.raises(RuntimeError, match="add\\(sparse, dense\\) is not"):
        d + dtorch.ones(4, 3, dtype=dtorch.float64)


def test_sums_and_transpose():
    (d, _), (t, _) = both(make)
    close(d.sum(), t.sum())
    close(dtorch.sparse.sum(d), torch.sparse.sum(t))
    for dim in (0, 1, (0, 1)):
        a, b = dtorch.sparse.sum(d, dim), torch.sparse.sum(t, dim)
        assert a.is_sparse == b.is_sparse
        close(a, b)
    close(d.t(), t.t())
    close(d.transpose(0, 1), t.transpose(0, 1))
    close(dtorch.sparse.addmm(dtorch.ones(4, 2, dtype=dtorch.float64), d,
                              dtorch.ones(3, 2, dtype=dtorch.float64),
                              beta=0.5, alpha=2.0),
          torch.sparse.addmm(torch.ones(4, 2, dtype=torch.float64), t,
                             torch.ones(3, 2, dtype=torch.float64),
                             beta=0.5, alpha=2.0))


def test_finite_differences_and_double_backward(product_path):
    idx = dtorch.tensor(IDX)

    def f(v, x):
        return dtorch.sparse.mm(dtorch.sparse_coo_tensor(idx, v, (4, 3)),
                                x).pow(2)
    v = dtorch.tensor(VAL, requires_grad=True)
    x = dtorch.tensor(np.random.default_rng(2).standard_normal((3, 2)),
                      requires_grad=True)
    assert gradcheck(f, (v, x))
    assert gradgradcheck(f, (v, x))


def test_to_dtype_detach_clone_grad():
    s, v = make(dtorch, grad=True)
    f = s.float()
    assert f.is_sparse and f.dtype == dtorch.float32
    assert not s.detach().requires_grad and s.requires_grad
    c = s.clone()
    assert c._values() is not s._values()
    (s @ dtorch.ones(3, dtype=dtorch.float64)).sum().backward()
    assert s.grad.is_sparse and s.grad._values().tolist() == [1.0] * 5
    h = s.detach().half() @ dtorch.ones(3, 2, dtype=dtorch.float16)
    assert h.dtype == dtorch.float16     # no CSR for 2-byte floats
    np.testing.assert_allclose(h.float().numpy(), (s.detach().to_dense()
                               @ dtorch.ones(3, 2, dtype=dtorch.float64))
                               .numpy(), rtol=1e-3)
    leaf = dtorch.ones(3, 3).to_sparse().requires_grad_()
    assert leaf.requires_grad and leaf.is_leaf


def test_mm_checks():
    s, _ = make(dtorch)
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        s @ dtorch.ones(4, 2, dtype=dtorch.float64)
    with pytest.raises(RuntimeError, match="expected scalar type Double "
                                           "but found Float"):
        s @ dtorch.ones(3, 2)
    with pytest.raises(NotImplementedError, match="sparse @ sparse"):
        s @ s.t().coalesce()
    with pytest.raises(RuntimeError, match="expected a sparse COO"):
        dtorch.sparse.mm(dtorch.ones(2, 2), dtorch.ones(2, 2))


@pytest.mark.parametrize("op", [
    lambda s: s.exp(), lambda s: dtorch.exp(s), lambda s: s.view(12),
    lambda s: s.reshape(12), lambda s: s[0], lambda s: s.numpy(),
    lambda s: s.mean(), lambda s: dtorch.nn.functional.relu(s),
    lambda s: dtorch.cat([s, s]), lambda s: s.tolist(),
    lambda s: dtorch.ones(4, 3) * s.float() + s.exp(),
    lambda s: s.max(), lambda s: s.abs(), lambda s: dtorch.linalg.inv(s),
])
def test_dense_ops_on_sparse_raise(op):
    s, _ = make(dtorch)
    with pytest.raises(NotImplementedError, match="sparse COO tensors .*"
                                                  "to_dense"):
        op(s)


def test_gcn_trains_like_torch(product_path):
    """pytorch/examples gcn on a 6-node graph: sparse adjacency with
    self-loops and D^-1/2 A D^-1/2 normalisation built with to_sparse,
    sparse features, torch.mm / torch.spmm in the layers, Adam; the same
    weights give the same losses for 5 steps."""
    rng = np.random.default_rng(3)
    edges = np.array([[0, 1], [1, 2], [2, 0], [3, 4], [4, 5], [5, 3],
                      [2, 3]], np.int32)
    feats = (rng.random((6, 5)) > 0.5).astype(np.float32)
    labels = np.array([0, 0, 0, 1, 1, 1])
    w1 = rng.standard_normal((5, 4)).astype(np.float32)
    w2 = rng.standard_normal((4, 2)).astype(np.float32)

    def train(lib):
        n = 6
        adj = lib.sparse_coo_tensor(edges.T, lib.ones(len(edges)), (n, n),
                                    dtype=lib.int64)
        adj = lib.eye(n) + adj
        deg = lib.sum(adj, dim=1)
        deg = lib.sqrt(1 / deg)
        dm = lib.diag(deg).to_sparse()
        adj = (dm @ adj @ dm).to_sparse()
        x = lib.tensor(feats)
        scale = lib.diag(1 / x.sum(1).clamp_min(1)).to_sparse()
        x = (scale @ x).to_sparse()
        p1 = lib.nn.Parameter(lib.tensor(w1))
        p2 = lib.nn.Parameter(lib.tensor(w2))
        opt = lib.optim.Adam([p1, p2], lr=0.05)
        y = lib.tensor(labels)
        losses = []
        for _ in range(5):
            opt.zero_grad()
            h = lib.relu(lib.spmm(adj, lib.mm(x, p1)))
            out = lib.nn.functional.log_softmax(
                lib.spmm(adj, lib.mm(h, p2)), dim=1)
            loss = lib.nn.functional.nll_loss(out, y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses, p1.detach().numpy()
    (ld, pd), (lt, pt) = both(train)
    np.testing.assert_allclose(ld, lt, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(pd, pt, rtol=1e-5, atol=1e-6)


def test_cuda_path(device):
    s = dtorch.sparse_coo_tensor(IDX, VAL, (4, 3), device=device,
                                 requires_grad=True)
    x = dtorch.ones(3, 2, dtype=dtorch.float64, device=device,
                    requires_grad=True)
    out = s @ x
    out.sum().backward()
    assert out.device.type == device and x.grad.device.type == device
    ref = s.detach().cpu().to_dense().numpy() @ np.ones((3, 2))
    np.testing.assert_allclose(out.detach().cpu().numpy(), ref)
    np.testing.assert_allclose(s.to_dense().detach().cpu().numpy(),
                               s.cpu().coalesce().to_dense().detach()
                               .numpy())
    c = s.coalesce()
    assert c.indices().device.type == device
    back = c.to_dense().to_sparse()
    assert back.indices().tolist() == c.indices().tolist()
    assert (dtorch.ones(2, 4, dtype=dtorch.float64, device=device)
            @ s).device.type == device
