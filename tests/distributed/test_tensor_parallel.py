"""Tensor parallel layers (dtorch.nn.parallel.tensor_parallel): the sharded
layers equal the plain ones (float64, 1e-10) in forward, input and weight
gradients and training; DP x TP equals single-process training; the
regions' backward is the adjoint of their forward; checkpoints gather and
cut again. Threads backend here; the MPI variant under mpiexec; and
examples/tp_digits.py end to end under mpiexec -n 2."""
import copy
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import dtorch
import dtorch.distributed as dist
from dtorch import nn
from dtorch.nn.parallel import DistributedDataParallel as DDP
from dtorch.nn.parallel import tensor_parallel as tp
from helpers import mpi_env

F64 = dtorch.float64
TOL = 1e-10
UNDER_MPI = "OMPI_COMM_WORLD_SIZE" in os.environ
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def arr(t):
    return t.detach().numpy().copy()


def close(a, b, what, tol=TOL):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0,
                               atol=tol, err_msg=what)


def shard(a, dim, rank, size):
    k = a.shape[dim] // size
    return np.take(a, range(rank * k, (rank + 1) * k), axis=dim)


def linear(i, o, seed):
    dtorch.manual_seed(seed)
    return nn.Linear(i, o).to(F64)


def randn(*shape, seed=1):
    return dtorch.tensor(np.random.default_rng(seed).standard_normal(shape),
                         requires_grad=True)


# ===================================================== shared test bodies ==

def column_row_body(rank, size, full_c, full_r, x0, g0):
    """Every variant of Column and Row against nn.Linear: output, input
    gradient, this rank's shard of the weight and bias gradients. Returns
    the number of checks done (the caller makes sure all ran)."""
    xs = x0.detach().numpy()
    gs = g0.detach().numpy()
    # each rank's own copy: thread ranks share full_c/full_r, and zero_grad +
    # backward on a shared layer let one rank's reference gradient take in
    # another's (a doubled dW seen once in a full-suite run)
    lin_c, lin_r = copy.deepcopy(full_c), copy.deepcopy(full_r)
    # the reference: plain layers, full input
    refs = {}
    for name, lin, x in (("col", lin_c, xs), ("row", lin_r, None)):
        if x is None:
            x = np.random.default_rng(2).standard_normal(
                (xs.shape[0], lin.in_features))
        xt = dtorch.tensor(x, requires_grad=True)
        lin.zero_grad()
        y = lin(xt)
        g = gs[:, :lin.out_features]
        (y * dtorch.tensor(g)).sum().backward()
        refs[name] = (x, arr(y), arr(xt.grad), arr(lin.weight.grad),
                      arr(lin.bias.grad), g)
    checks = 0
    for gather in (True, False):
        x, y, gx, gw, gb, g = refs["col"]
        m = tp.ColumnParallelLinear.from_linear(lin_c, gather_output=gather)
        xt = dtorch.tensor(x, requires_grad=True)
        out = m(xt)
        want_y = y if gather else shard(y, 1, rank, size)
        want_g = g if gather else shard(g, 1, rank, size)
        close(arr(out), want_y, f"column gather={gather} output")
        (out * dtorch.tensor(want_g)).sum().backward()
        close(arr(xt.grad), gx, f"column gather={gather} input grad")
        close(arr(m.weight.grad), shard(gw, 0, rank, size), "column dW")
        close(arr(m.bias.grad), shard(gb, 0, rank, size), "column db")
        checks += 1
    for parallel in (False, True):
        x, y, gx, gw, gb, g = refs["row"]
        m = tp.RowParallelLinear.from_linear(lin_r,
                                             input_is_parallel=parallel)
        xin = shard(x, 1, rank, size) if parallel else x
        xt = dtorch.tensor(xin, requires_grad=True)
        out = m(xt)
        close(arr(out), y, f"row input_is_parallel={parallel} output")
        (out * dtorch.tensor(g)).sum().backward()
        want_gx = shard(gx, 1, rank, size) if parallel else gx
        close(arr(xt.grad), want_gx, f"row parallel={parallel} input grad")
        close(arr(m.weight.grad), shard(gw, 1, rank, size), "row dW")
        close(arr(m.bias.grad), gb, "row db")
        checks += 1
    # the full layers come back from the shards
    close(arr(tp.ColumnParallelLinear.from_linear(lin_c).to_linear()
              .weight), arr(lin_c.weight), "to_linear column")
    close(arr(tp.RowParallelLinear.from_linear(lin_r).to_linear().weight),
          arr(lin_r.weight), "to_linear row")
    return checks


def column_row_inputs(size):
    # feature counts divisible by 2 and 3: one set of data for every size
    lin_c = linear(5, 12, seed=3)
    lin_r = linear(12, 6, seed=4)
    return lin_c, lin_r, randn(4, 5), dtorch.tensor(
        np.random.default_rng(5).standard_normal((4, 12)))


@pytest.mark.skipif(UNDER_MPI, reason="single-process test")
@pytest.mark.parametrize("size", [2, 3])
def test_column_and_row_equal_linear(size):
    args = column_row_inputs(size)
    res = dist.spawn_threads(lambda r, n: column_row_body(r, n, *args),
                             size, timeout=60)
    assert res == [4] * size


def mlp_pair(seed=0):
    dtorch.manual_seed(seed)
    return (nn.Linear(6, 12).to(F64), nn.Linear(12, 4).to(F64))


def serial_mlp(l1, l2):
    return nn.Sequential(l1, nn.Tanh(), l2)


def tp_mlp(l1, l2, group=None):
    return nn.Sequential(
        tp.ColumnParallelLinear.from_linear(l1, group, gather_output=False),
        nn.Tanh(),
        tp.RowParallelLinear.from_linear(l2, group, input_is_parallel=True))


def sgd_steps(model, x, y, steps):
    opt = dtorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    outs = []
    for _ in range(steps):
        opt.zero_grad()
        out = model(x)
        nn.functional.mse_loss(out, y).backward()
        opt.step()
        outs.append(arr(out))
    return outs


@pytest.mark.skipif(UNDER_MPI, reason="single-process test")
@pytest.mark.parametrize("size", [2, 3])
def test_column_row_mlp_trains_like_serial_mlp(size):
    l1, l2 = mlp_pair()
    x, y = randn(8, 6).detach(), randn(8, 4, seed=7).detach()
    ref = serial_mlp(*mlp_pair())
    ref_outs = sgd_steps(ref, x, y, 4)
    ref_sd = {k: arr(v) for k, v in ref.state_dict().items()}

    def body(rank, n):
        m = tp_mlp(l1, l2)
        outs = sgd_steps(m, x, y, 4)
        for a, b in zip(outs, ref_outs):
            close(a, b, f"rank {rank} output")
        full = tp.gather_state_dict(m)
        for k, v in ref_sd.items():
            close(arr(full[k]), v, f"rank {rank} trained {k}")
        # and cut again: the same shards as the trained model
        back = tp_mlp(l1, l2)
        back.load_state_dict(tp.shard_state_dict(back, full))
        for (k, a), b in zip(m.state_dict().items(),
                             back.state_dict().values()):
            close(arr(a), arr(b), f"shard_state_dict {k}")
        return True
    assert all(dist.spawn_threads(body, size, timeout=60))


@pytest.mark.skipif(UNDER_MPI, reason="single-process test")
@pytest.mark.parametrize("size", [2, 3])
def test_vocab_parallel_embedding_equals_embedding(size):
    dtorch.manual_seed(0)
    emb = nn.Embedding(12, 5).to(F64)
    ids = dtorch.tensor([[0, 3, 11, 4], [7, 7, 2, 9]])
    g = dtorch.tensor(np.random.default_rng(0).standard_normal((2, 4, 5)))
    out = emb(ids)
    (out * g).sum().backward()
    ref_y, ref_g = arr(out), arr(emb.weight.grad)

    def body(rank, n):
        m = tp.VocabParallelEmbedding.from_embedding(emb)
        y = m(ids)
        close(arr(y), ref_y, f"rank {rank} embedding output")
        (y * g).sum().backward()
        close(arr(m.weight.grad), shard(ref_g, 0, rank, n),
              f"rank {rank} embedding grad (rows {m.vocab_start}:"
              f"{m.vocab_end})")
        return True
    assert all(dist.spawn_threads(body, size, timeout=60))


# ============================================================== DP x TP ==

def train_serial_adam(l1, l2, x, y, steps):
    m = serial_mlp(l1, l2)
    opt = dtorch.optim.Adam(m.parameters(), lr=0.01)
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.mse_loss(m(x), y).backward()
        opt.step()
    return m, opt


@pytest.mark.skipif(UNDER_MPI, reason="single-process test")
def test_dp_x_tp_equals_single_process_on_concatenated_batch():
    tp_size, world = 2, 4
    x, y = randn(8, 6).detach(), randn(8, 4, seed=7).detach()
    ref, ref_opt = train_serial_adam(*mlp_pair(), x, y, steps=3)
    ref_sd = {k: arr(v) for k, v in ref.state_dict().items()}
    ref_osd = ref_opt.state_dict()
    l1, l2 = mlp_pair()

    def body(rank, n):
        dp_group, tp_group = tp.make_dp_tp_groups(tp_size)
        assert tp_group.ranks == [rank - rank % 2, rank - rank % 2 + 1]
        assert dp_group.ranks == [rank % 2, rank % 2 + 2]
        mlp = tp_mlp(l1, l2, tp_group)
        model = DDP(mlp, process_group=dp_group)
        opt = dtorch.optim.Adam(model.parameters(), lr=0.01)
        b = x.shape[0] // dp_group.size
        lo = dp_group.rank * b
        for _ in range(3):
            opt.zero_grad()
            nn.functional.mse_loss(model(x[lo:lo + b]),
                                   y[lo:lo + b]).backward()
            opt.step()
        full = tp.gather_state_dict(mlp)
        for k, v in ref_sd.items():
            close(arr(full[k]), v, f"rank {rank} {k}")
        osd = tp.gather_optimizer_state_dict(mlp, opt)
        for i, st in ref_osd["state"].items():
            for k in ("exp_avg", "exp_avg_sq"):
                close(arr(osd["state"][i][k]), arr(st[k]),
                      f"rank {rank} optimizer state {i} {k}")
        # and cut again: the optimizer state of this rank's shards
        cut = tp.shard_optimizer_state_dict(mlp, osd)
        for i, st in opt.state_dict()["state"].items():
            close(arr(cut["state"][i]["exp_avg"]), arr(st["exp_avg"]),
                  f"rank {rank} shard_optimizer_state_dict {i}")
        return True
    assert all(dist.spawn_threads(body, world, timeout=60))


@pytest.mark.skipif(UNDER_MPI, reason="single-process test")
def test_make_dp_tp_groups_layout_and_error():
    def body(rank, n):
        out = {}
        for t in (1, 2, 3, 6):
            dp, tpg = tp.make_dp_tp_groups(t)
            out[t] = (dp.ranks, tpg.ranks)
        with pytest.raises(ValueError, match="tp_size 4 does not divide "
                                             "the world size 6"):
            tp.make_dp_tp_groups(4)
        return out
    res = dist.spawn_threads(body, 6, timeout=60)
    assert res[4][2] == ([0, 2, 4], [4, 5])
    assert res[4][3] == ([1, 4], [3, 4, 5])
    assert res[5][1] == (list(range(6)), [5])
    assert res[5][6] == ([5], list(range(6)))


# =============================================================== regions ==

def input_gradient_penalty(model, x):
    """WGAN-GP's penalty on a model's input gradient, and its backward:
    double backward through every layer (create_graph=True)."""
    x = x.detach().requires_grad_(True)
    g, = dtorch.autograd.grad(model(x).sum(), x, create_graph=True)
    pen = ((g.norm(2, dim=1) - 1) ** 2).mean()
    pen.backward()
    return arr(pen), arr(x.grad)


@pytest.mark.skipif(UNDER_MPI, reason="single-process test")
@pytest.mark.parametrize("size", [2, 3])
def test_tp_double_backward_equals_serial(size):
    """Each region's backward is its conjugate region, so create_graph=True
    gradients through column/row-parallel layers are differentiable: the
    penalty, its input gradient and the sharded weight gradients equal the
    serial model's."""
    l1, l2 = mlp_pair()
    x = randn(5, 6).detach()
    ref = serial_mlp(*mlp_pair())
    ref_pen, ref_gx = input_gradient_penalty(ref, x)
    # the last bias does not change d out / dx: no gradient in either
    ref_grads = {k: None if p.grad is None else arr(p.grad)
                 for k, p in ref.named_parameters()}
    assert ref_grads["2.bias"] is None

    def body(rank, n):
        m = tp_mlp(l1, l2)
        pen, gx = input_gradient_penalty(m, x)
        close(pen, ref_pen, f"rank {rank} penalty")
        close(gx, ref_gx, f"rank {rank} input gradient")
        for k, p in m.named_parameters():
            full = ref_grads[k]
            if full is None:
                assert p.grad is None, k
                continue
            dim = 0 if k.startswith("0.") else (1 if k == "2.weight"
                                                 else None)
            want = full if dim is None else shard(full, dim, rank, n)
            close(arr(p.grad), want, f"rank {rank} grad of {k}")
        return True
    assert all(dist.spawn_threads(body, size, timeout=60))


REGIONS = [tp.CopyToTP, tp.ReduceFromTP, tp.ScatterToTP, tp.GatherFromTP]


@pytest.mark.skipif(UNDER_MPI, reason="single-process test")
@pytest.mark.parametrize("op", REGIONS, ids=lambda c: c.__name__)
def test_region_gradcheck_world_size_one(op):
    def body(rank, n):
        g = dist._group(None)
        x = randn(3, 4)
        return dtorch.autograd.gradcheck(lambda t: op.apply(t, group=g),
                                         (x,))
    assert dist.spawn_threads(body, 1) == [True]


# (input, output) replicated on the ranks? A replicated value is one
# value: the same on every rank, counted once in an inner product.
LAYOUT = {tp.CopyToTP: (True, False), tp.ReduceFromTP: (False, True),
          tp.ScatterToTP: (True, False), tp.GatherFromTP: (False, True)}


@pytest.mark.skipif(UNDER_MPI, reason="single-process test")
@pytest.mark.parametrize("op", REGIONS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("size", [2, 3])
def test_region_backward_is_adjoint_of_forward(op, size):
    """<f(x), g> == <x, f^T(g)> over the whole group: the distributed
    backward is the transpose of the distributed forward."""
    rep_in, rep_out = LAYOUT[op]

    def body(rank, n):
        group = dist._group(None)
        rx = np.random.default_rng(10 if rep_in else 10 + rank)
        rg = np.random.default_rng(20 if rep_out else 20 + rank)
        x = dtorch.tensor(rx.standard_normal((3, 6)), requires_grad=True)
        y = op.apply(x, group=group)
        g = dtorch.tensor(rg.standard_normal(tuple(y.shape)))
        (y * g).sum().backward()
        return (float((arr(y) * arr(g)).sum()) / (n if rep_out else 1),
                float((arr(x) * arr(x.grad)).sum()) / (n if rep_in else 1))
    res = dist.spawn_threads(body, size, timeout=60)
    lhs, rhs = sum(r[0] for r in res), sum(r[1] for r in res)
    assert abs(lhs - rhs) < 1e-10 * max(1.0, abs(lhs)), (lhs, rhs)


# ================================================================ errors ==

@pytest.mark.skipif(UNDER_MPI, reason="single-process test")
def test_errors_name_the_numbers():
    def body(rank, n):
        with pytest.raises(ValueError, match=r"out_features=5 is not "
                           r"divisible by the tensor-parallel size 2"):
            tp.ColumnParallelLinear(3, 5)
        with pytest.raises(ValueError, match=r"in_features=7 .* size 2"):
            tp.RowParallelLinear(7, 4)
        with pytest.raises(ValueError, match=r"num_embeddings=9 .* size 2"):
            tp.VocabParallelEmbedding(9, 4)
        m = tp.RowParallelLinear(6, 4, input_is_parallel=True)
        with pytest.raises(RuntimeError, match=r"\[2, 6\] does not end in "
                           r"this rank's slice of in_features=6 \(3"):
            m(dtorch.randn(2, 6))
        with pytest.raises(ValueError, match=r"\[2, 5\] \(5\) is not "
                           r"divisible by the tensor-parallel size 2"):
            tp.scatter_to_tp_region(dtorch.randn(2, 5))
        return True
    assert all(dist.spawn_threads(body, 2, timeout=60))


@pytest.mark.skipif(UNDER_MPI, reason="single-process test")
@pytest.mark.parametrize("size", [1, 2, 3])
def test_same_seed_same_model_at_any_tp_size(size):
    # each rank initialises the full layer and keeps its shard
    dtorch.manual_seed(11)
    ref = nn.Linear(4, 6)

    def body(rank, n):
        m = None
        for turn in range(n):        # threads share the RNG: in turn
            if turn == rank:
                dtorch.manual_seed(11)
                m = tp.ColumnParallelLinear(4, 6)
            dist.barrier()
        close(arr(m.weight), shard(arr(ref.weight), 0, rank, n), "weight")
        close(arr(m.bias), shard(arr(ref.bias), 0, rank, n), "bias")
        return True
    assert all(dist.spawn_threads(body, size, timeout=60))


# =================================================================== MPI ==

@pytest.mark.mpi(min_size=2)
def test_column_row_mpi_equivalence(mpi_world):
    size, rank = dist.get_world_size(), dist.get_rank()
    if 12 % size:
        pytest.skip(f"12 features do not split over {size} ranks")
    args = column_row_inputs(size)
    assert column_row_body(rank, size, *args) == 4
    # and the Column -> Row MLP through a few SGD steps
    l1, l2 = mlp_pair()
    x, y = randn(8, 6).detach(), randn(8, 4, seed=7).detach()
    ref_outs = sgd_steps(serial_mlp(*mlp_pair()), x, y, 3)
    outs = sgd_steps(tp_mlp(l1, l2), x, y, 3)
    for a, b in zip(outs, ref_outs):
        close(a, b, f"rank {rank} MLP output under MPI")


# ============================================================== example ==

@pytest.mark.skipif(UNDER_MPI, reason="starts its own mpiexec job")
def test_tp_digits_example_under_mpiexec(tmp_path):
    mpiexec = shutil.which("mpiexec", path=os.path.dirname(sys.executable))
    if mpiexec is None:
        pytest.fail("mpiexec not found next to the interpreter: install "
                    "with pip install -e '.[dev]'")
    env = mpi_env()
    ck = str(tmp_path / "tp.safetensors")
    cmd = [mpiexec, "-n", "2", sys.executable, "-m", "mpi4py",
           os.path.join(ROOT, "examples", "tp_digits.py"), "--tp-size", "2",
           "--epochs", "2", "--quiet", "--checkpoint", ck]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240,
                       env=env, cwd=ROOT)
    out = p.stdout
    assert p.returncode == 0, out[-3000:] + p.stderr[-3000:]
    assert "DP 1 x TP 2" in out, out
    assert len(re.findall(r"^epoch ", out, re.M)) == 2, out
    acc = float(re.findall(r"final test accuracy ([\d.]+)%", out)[-1])
    assert acc > 80.0, out
    # a distributed checkpoint of the sharded MLP: as one file, the full
    # model (it loads into the unsharded MLP)
    from dtorch.distributed.checkpoint.format_utils import dcp_to_torch_save
    dcp_to_torch_save(ck, ck + ".whole")
    sd = dtorch.load(ck + ".whole")["model"]
    assert list(sd["body.1.weight"].shape) == [256, 64]
    assert list(sd["body.3.weight"].shape) == [128, 256]
