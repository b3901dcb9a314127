"""dtorch.distributed.clip_grad_norm_: the global norm of a model split over
ranks equals single-process clipping of the unsplit model (tensor parallel
with replicated parameters counted once, pipeline stages, both at once);
every norm type, NaN/inf as nn.utils.clip_grad_norm_. Threads backend with
2 and 3 ranks; the MPI variant under mpiexec."""
import math

import numpy as np
import pytest

import dtorch
import dtorch.distributed as dist
from dtorch import nn
from dtorch.distributed.clip_grad import clip_grad_norm_, get_total_norm
from dtorch.nn.parallel import tensor_parallel as tp

F64 = dtorch.float64
NORMS = [2.0, 1.0, 3.0, math.inf, -math.inf]


def _build():
    dtorch.manual_seed(0)
    m = nn.Sequential(nn.Linear(5, 12), nn.Tanh(), nn.Linear(12, 4),
                      nn.LayerNorm(4)).to(F64)
    with dtorch.no_grad():      # LayerNorm's affine away from 1/0
        m[3].weight.uniform_(0.5, 1.5)
        m[3].bias.uniform_(-0.5, 0.5)
    return {k: v.numpy().copy() for k, v in m.state_dict().items()}


_STATE = _build()


def mlp():
    """The same model in every thread (no shared RNG between threads)."""
    m = nn.Sequential(nn.Linear(5, 12), nn.Tanh(), nn.Linear(12, 4),
                      nn.LayerNorm(4)).to(F64)
    m.load_state_dict({k: dtorch.tensor(v) for k, v in _STATE.items()})
    return m


def data():
    rng = np.random.default_rng(3)
    return (dtorch.tensor(rng.standard_normal((7, 5))),
            dtorch.tensor(rng.standard_normal((7, 4))))


def reference(norm_type, max_norm, poison=None):
    """Single-process clipping of the unsplit model: (norm, grads)."""
    m = mlp()
    x, y = data()
    ((m(x) - y) ** 2).sum().backward()
    if poison is not None:
        m[0].weight.grad._data[1, 2] = poison
    n = nn.utils.clip_grad_norm_(m.parameters(), max_norm, norm_type)
    return float(n), [p.grad.numpy().copy() for p in m.parameters()]


def tp_body(norm_type, max_norm, poison=None):
    """Column(5->12) + Row(12->4) + LayerNorm over the TP world: returns
    (norm, full gradients gathered) on every rank."""
    def body(rank, size):
        m = mlp()
        col = tp.ColumnParallelLinear.from_linear(m[0], gather_output=False)
        row = tp.RowParallelLinear.from_linear(m[2], input_is_parallel=True)
        ln = m[3]
        model = nn.Sequential(col, nn.Tanh(), row, ln)
        x, y = data()
        ((model(x) - y) ** 2).sum().backward()
        if poison is not None and rank == size - 1:
            # element [1, 2] of the full weight lives on some rank; poison
            # one element of the last rank's shard instead: same norm
            col.weight.grad._data[0, 0] = poison
        g = dist.group.WORLD
        reps = [row.bias, ln.weight, ln.bias]
        n = clip_grad_norm_(model.parameters(), max_norm, norm_type,
                            groups=(g,), replicated={g: reps})
        full = [tp._unshard(col.weight.grad._data, 0, g),
                tp._unshard(col.bias.grad._data, 0, g),
                tp._unshard(row.weight.grad._data, 1, g),
                row.bias.grad.numpy(), ln.weight.grad.numpy(),
                ln.bias.grad.numpy()]
        return float(n), [np.array(a) for a in full]
    return body


@pytest.mark.parametrize("size", [2, 3])
@pytest.mark.parametrize("norm_type", NORMS)
def test_tensor_parallel_equals_unsplit(size, norm_type):
    # out_features 12 divides by 2 and 3
    ref_n, ref_g = reference(norm_type, 0.5)
    for n, grads in dist.spawn_threads(tp_body(norm_type, 0.5), size,
                                       timeout=60):
        assert n == pytest.approx(ref_n, rel=1e-12)
        for a, b in zip(grads, ref_g):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def test_replicated_counted_once_regression():
    """Without `replicated` the replicated bias/LayerNorm are counted on
    every TP rank (PyTorch #156842): the norm is larger than the truth."""
    ref_n, _ = reference(2.0, 1e9)

    def body(rank, size):
        m = mlp()
        col = tp.ColumnParallelLinear.from_linear(m[0], gather_output=False)
        row = tp.RowParallelLinear.from_linear(m[2], input_is_parallel=True)
        model = nn.Sequential(col, nn.Tanh(), row, m[3])
        x, y = data()
        ((model(x) - y) ** 2).sum().backward()
        return float(get_total_norm(model.parameters(), 2.0,
                                    groups=(dist.group.WORLD,)))
    for n in dist.spawn_threads(body, 2, timeout=60):
        assert n > ref_n * (1 + 1e-6)


def stages(size):
    """The mlp's parameters cut into `size` pipeline stages (in order)."""
    cuts = {2: [[0, 1], [2, 3, 4, 5]], 3: [[0, 1], [2, 3], [4, 5]]}[size]
    return cuts


@pytest.mark.parametrize("size", [2, 3])
@pytest.mark.parametrize("norm_type", NORMS)
def test_pipeline_stages_equal_unsplit(size, norm_type):
    ref_n, ref_g = reference(norm_type, 0.5)

    def body(rank, size):
        m = mlp()
        x, y = data()
        ((m(x) - y) ** 2).sum().backward()
        ps = list(m.parameters())
        mine = [ps[i] for i in stages(size)[rank]]
        # the other stages' gradients do not exist on this rank
        for p in ps:
            if not any(p is q for q in mine):
                p.grad = None
        n = clip_grad_norm_(mine, 0.5, norm_type,
                            groups=(dist.group.WORLD,))
        return float(n), {i: ps[i].grad.numpy().copy()
                          for i in stages(size)[rank]}
    got = dist.spawn_threads(body, size, timeout=60)
    for n, grads in got:
        assert n == pytest.approx(ref_n, rel=1e-12)
        for i, a in grads.items():
            np.testing.assert_allclose(a, ref_g[i], rtol=1e-12)


def test_tp_times_pipeline():
    """4 ranks: 2 pipeline stages x TP 2; stage 0 = Column+Tanh+Row (bias
    replicated over TP), stage 1 = LayerNorm (replicated over TP)."""
    ref_n, ref_g = reference(2.0, 0.5)

    def body(rank, size):
        world = dist.group.WORLD
        pp, tpg = tp.make_dp_tp_groups(2, world)    # pp: ranks {0,2},{1,3}
        stage = dist.get_rank(pp)
        m = mlp()
        col = tp.ColumnParallelLinear.from_linear(m[0], gather_output=False,
                                                  process_group=tpg)
        row = tp.RowParallelLinear.from_linear(m[2], input_is_parallel=True,
                                               process_group=tpg)
        model = nn.Sequential(col, nn.Tanh(), row, m[3])
        x, y = data()
        ((model(x) - y) ** 2).sum().backward()
        mine = ([col.weight, col.bias, row.weight, row.bias] if stage == 0
                else [m[3].weight, m[3].bias])
        reps = [row.bias] if stage == 0 else mine
        n = clip_grad_norm_(mine, 0.5, 2.0, groups=(tpg, pp),
                            replicated={tpg: reps})
        return float(n)
    for n in dist.spawn_threads(body, 4, timeout=60):
        assert n == pytest.approx(ref_n, rel=1e-12)


@pytest.mark.filterwarnings("ignore:invalid value")
@pytest.mark.parametrize("poison", [math.nan, math.inf])
@pytest.mark.parametrize("norm_type", [2.0, math.inf, 1.0])
def test_nonfinite_as_pytorch(poison, norm_type):
    ref_n, ref_g = reference(norm_type, 0.5, poison)
    for n, grads in dist.spawn_threads(tp_body(norm_type, 0.5, poison), 2,
                                       timeout=60):
        if math.isnan(ref_n):
            assert math.isnan(n)
        else:
            assert n == ref_n
        # the branch-free scaling: NaN everywhere, or 0 * finite for inf
        finite_ref = all(np.isfinite(g).all() for g in ref_g[3:])
        finite = all(np.isfinite(g).all() for g in grads[3:])
        assert finite == finite_ref


def test_error_if_nonfinite_raises_on_every_rank():
    def body(rank, size):
        p = nn.Parameter(dtorch.ones(3, dtype=F64))
        p.grad = dtorch.ones(3, dtype=F64)
        if rank == 1:
            p.grad._data[0] = math.nan
        with pytest.raises(RuntimeError, match="non-finite"):
            clip_grad_norm_([p], 1.0, groups=(dist.group.WORLD,),
                            error_if_nonfinite=True)
        return True
    assert all(dist.spawn_threads(body, 2, timeout=60))


def test_zero_norm_refused_when_split():
    def body(rank, size):
        p = nn.Parameter(dtorch.ones(3, dtype=F64))
        p.grad = dtorch.ones(3, dtype=F64)
        with pytest.raises(ValueError, match="norm_type=0"):
            get_total_norm([p], 0.0, groups=(dist.group.WORLD,))
        # one rank, nothing split: PyTorch's count of nonzero tensors
        assert float(get_total_norm([p], 0.0)) == 1.0
        return True
    assert all(dist.spawn_threads(body, 2, timeout=60))


def test_replicated_group_must_be_reduced():
    def body(rank, size):
        p = nn.Parameter(dtorch.ones(3, dtype=F64))
        p.grad = dtorch.ones(3, dtype=F64)
        with pytest.raises(ValueError, match="replicated"):
            get_total_norm([p], groups=(),
                           replicated={dist.group.WORLD: [p]})
        return True
    assert all(dist.spawn_threads(body, 2, timeout=60))


def test_float32_torch_oracle():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s).astype(np.float32)
              for s in [(3, 4), (5,), (1,)]]
    ref = float(torch.nn.utils.get_total_norm(
        [torch.tensor(a) for a in arrays], 2.0))

    def body(rank, size):
        ps = []
        for i, a in enumerate(arrays):
            if i % size == rank:
                p = nn.Parameter(dtorch.tensor(a))
                p.grad = dtorch.tensor(a)
                ps.append(p)
        n = get_total_norm(ps, groups=(dist.group.WORLD,))
        assert n.dtype == dtorch.float32
        return float(n)
    for n in dist.spawn_threads(body, 2, timeout=60):
        assert n == pytest.approx(ref, rel=1e-6)


@pytest.mark.mpi(min_size=2)
def test_tensor_parallel_mpi(mpi_world):
    ref_n, ref_g = reference(2.0, 0.5)
    n, grads = tp_body(2.0, 0.5)(dist.get_rank(), dist.get_world_size())
    assert n == pytest.approx(ref_n, rel=1e-12)
    for a, b in zip(grads, ref_g):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
