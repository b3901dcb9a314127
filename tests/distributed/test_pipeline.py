"""Pipeline parallelism (dtorch.distributed.pipelining) on the threads
backend: GPipe and 1F1B over 2 and 3 stages with 1-8 micro-batches give the
unsplit model's loss and every parameter's gradient (float64, 1e-10); the
micro-batches whose activations are alive on a stage are counted (1F1B: at
most the number of stages); bad input is refused with a clear error; a
stage that raises names its stage and rank; a stage that stops sending
gives the desync report instead of a hang; the splitter keeps names and
ties; the device mesh makes the right groups."""
import copy
import threading

import numpy as np
import pytest

import dtorch
import dtorch.distributed as dist
from dtorch import nn
from dtorch.distributed import CollectiveTimeoutError
from dtorch.distributed.device_mesh import init_device_mesh
from dtorch.distributed.pipelining import (PipelineStage, Schedule1F1B,
                                           ScheduleGPipe,
                                           ScheduleInterleaved1F1B,
                                           SplitPoint, pipeline)

F64 = dtorch.float64
TOL = 1e-10
BATCH = 840                       # divisible by every m in 1..8
SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


class Track(dtorch.autograd.Function):
    """Identity that counts, per rank thread, the micro-batches whose
    forward ran and whose backward has not yet: the activations a stage
    keeps alive."""
    live, peak = {}, {}
    lock = threading.Lock()

    @staticmethod
    def forward(ctx, x, counts=True):
        ctx.counts = counts
        if not counts:
            return x.clone()
        me = threading.get_ident()
        with Track.lock:
            Track.live[me] = Track.live.get(me, 0) + 1
            Track.peak[me] = max(Track.peak.get(me, 0), Track.live[me])
        ctx.me = me
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        if ctx.counts:
            with Track.lock:
                Track.live[ctx.me] -= 1
        return g, None


class Tracker(nn.Module):
    """Counts micro-batches when it is the first Tracker of its stage
    (``counts``)."""
    counts = True

    def forward(self, x):
        return Track.apply(x, self.counts)


def make_model(seed=0):
    """A chain of 8 blocks with a Tracker in every stage of the splits
    used below (after a Linear: autograd runs no backward for an op whose
    inputs need no gradient, so a Tracker on the raw input would never
    count down)."""
    dtorch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(5, 16), Tracker(), nn.Tanh(),
        nn.Linear(16, 16), Tracker(), nn.Tanh(),
        nn.Linear(16, 4), Tracker()).to(F64)


SPLITS = {2: [3], 3: [3, 6]}


def data(seed=1):
    rng = np.random.default_rng(seed)
    x = dtorch.tensor(rng.standard_normal((BATCH, 5)), dtype=F64)
    y = dtorch.tensor(rng.integers(0, 4, BATCH), dtype=dtorch.int64)
    return x, y


def reference(model, x, y):
    ref = copy.deepcopy(model)
    loss = nn.functional.cross_entropy(ref(x), y)
    loss.backward()
    return loss.item(), {n: p.grad.numpy().copy()
                         for n, p in ref.named_parameters()}


def run_step(stage, schedule, x, y):
    losses = []
    if stage.is_first:
        schedule.step(x)
    elif stage.is_last:
        schedule.step(target=y, losses=losses)
    else:
        schedule.step()
    return losses


@pytest.mark.parametrize("sched", sorted(SCHEDULES))
@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("m", range(1, 9))
def test_equals_unsplit_model(sched, stages, m):
    model = make_model()
    x, y = data()
    want_loss, want_grads = reference(model, x, y)
    copies = [copy.deepcopy(model) for _ in range(stages)]
    Track.live.clear()
    Track.peak.clear()

    def body(rank, world):
        pipe = pipeline(copies[rank], split_spec=SPLITS[stages])
        stage = pipe.build_stage(rank, "cpu")
        trackers = [t for t in stage.submod.modules()
                    if isinstance(t, Tracker)]
        for t in trackers[1:]:
            t.counts = False
        schedule = SCHEDULES[sched](stage, m, nn.functional.cross_entropy)
        losses = run_step(stage, schedule, x, y)
        grads = {n: p.grad.numpy() for n, p in
                 stage.submod.named_parameters()}
        return (losses, grads, Track.peak[threading.get_ident()],
                stage.peak_live)

    res = dist.spawn_threads(body, stages, timeout=60)
    seen = {}
    for rank, (losses, grads, peak, peak_live) in enumerate(res):
        seen.update(grads)
        # activations alive at once on this stage, counted in the model
        want_peak = m if sched == "gpipe" else min(m, stages - rank)
        assert peak == want_peak, (rank, peak)
        assert peak_live == want_peak
        assert peak <= (m if sched == "gpipe" else stages)
    assert sorted(seen) == sorted(want_grads)      # every parameter
    for n, g in want_grads.items():
        np.testing.assert_allclose(seen[n], g, rtol=0, atol=TOL,
                                   err_msg=n)
    losses = res[-1][0]
    assert len(losses) == m
    assert abs(np.mean([l.item() for l in losses]) - want_loss) < TOL


def test_outputs_and_eval():
    """step() returns the last stage's outputs merged along dim 0; eval()
    runs forward only and fills ``losses``."""
    model = make_model()
    x, y = data()
    with dtorch.no_grad():
        want = model(x).numpy()
    copies = [copy.deepcopy(model) for _ in range(2)]

    def body(rank, world):
        stage = pipeline(copies[rank], split_spec=[3]).build_stage(rank,
                                                                   "cpu")
        sch = Schedule1F1B(stage, 4, nn.functional.cross_entropy)
        losses = []
        out = sch.step(x) if rank == 0 else sch.step(target=y)
        ev = sch.eval(x) if rank == 0 else sch.eval(target=y,
                                                    losses=losses)
        grads_none = all(p.grad is not None for p in
                         stage.submod.parameters())
        return out, ev, losses, grads_none

    res = dist.spawn_threads(body, 2, timeout=60)
    assert res[0][0] is None and res[0][1] is None
    np.testing.assert_allclose(res[1][0].numpy(), want, atol=TOL, rtol=0)
    np.testing.assert_allclose(res[1][1].numpy(), want, atol=TOL, rtol=0)
    assert len(res[1][2]) == 4 and res[1][3]


def test_microbatches_must_divide_batch():
    model = make_model()
    stage = PipelineStage(model, 0, 1, "cpu")
    sch = ScheduleGPipe(stage, 4, nn.functional.cross_entropy)
    x = dtorch.zeros(10, 5, dtype=F64)
    with pytest.raises(ValueError, match=r"batch size 10 .* not divisible "
                                         r"by n_microbatches=4"):
        sch.step(x, target=dtorch.zeros(10, dtype=dtorch.int64))
    with pytest.raises(ValueError, match="n_microbatches must be >= 1"):
        ScheduleGPipe(stage, 0)
    with pytest.raises(ValueError, match="needs target="):
        sch.step(dtorch.zeros(8, 5, dtype=F64))


def test_one_stage_is_gradient_accumulation():
    """One stage, m micro-batches: the whole batch's gradient (no
    process group needed)."""
    model = make_model()
    x, y = data()
    want_loss, want = reference(model, x, y)
    stage = PipelineStage(model, 0, 1, "cpu")
    losses = []
    Schedule1F1B(stage, 7, nn.functional.cross_entropy).step(
        x, target=y, losses=losses)
    for n, p in model.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), want[n], atol=TOL,
                                   rtol=0)
    assert abs(np.mean([l.item() for l in losses]) - want_loss) < TOL


def test_stage_arguments_are_checked():
    model = make_model()
    with pytest.raises(ValueError, match="stage_index 3 is out of range"):
        PipelineStage(model, 3, 3, "cpu")

    def body(rank, world):
        with pytest.raises(ValueError, match="group has 2 ranks and the "
                                             "pipeline 3 stages"):
            PipelineStage(model, rank, 3, "cpu")
        with pytest.raises(ValueError, match=f"stage {1 - rank} built on "
                                             f"rank {rank}"):
            PipelineStage(model, 1 - rank, 2, "cpu")
        return True
    assert all(dist.spawn_threads(body, 2, timeout=30))


def test_splitter_names_ties_and_errors():
    model = make_model()
    pipe = pipeline(model, split_spec={"3": SplitPoint.BEGINNING,
                                       "5": SplitPoint.END})
    assert pipe.num_stages == 3 and pipe.split_points == [0, 3, 6]
    names = [n for i in range(3)
             for n in pipe.get_stage_module(i).state_dict()]
    assert names == list(model.state_dict())
    with pytest.raises(ValueError, match="'nope', which is not a block"):
        pipeline(model, split_spec={"nope": SplitPoint.BEGINNING})
    with pytest.raises(ValueError, match="would leave a stage without"):
        pipeline(model, split_spec=[0])
    with pytest.raises(ValueError, match="would leave a stage without"):
        pipeline(model, split_spec=[8])

    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(6, 4)
            self.mid = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])
            self.head = nn.Linear(4, 6, bias=False)
            self.head.weight = self.emb.weight

        def forward(self, x):
            h = self.emb(x)
            for b in self.mid:
                h = b(h)
            return self.head(h)
    t = Tied()
    pipe = pipeline(t, (dtorch.tensor([[1, 2]]),),
                    split_spec={"mid.1": SplitPoint.BEGINNING})
    assert [p.shape for p, h in pipe.tied_parameters(0)] == [(6, 4)]
    assert pipe.tied_parameters(0)[0][1] == [0, 1]
    assert pipe.tied_parameters(1)[0][0] is t.emb.weight

    class NotAChain(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x):
            return self.a(x) + self.b(x)       # not b(a(x))
    with pytest.raises(ValueError, match="not the chain of its blocks"):
        pipeline(NotAChain(), (dtorch.ones(2, 4),), split_spec=[1])


def test_tied_gradients_summed_across_stages():
    """A head tied to the embedding on another stage: after the step both
    copies hold the unsplit model's gradient of the shared weight."""
    dtorch.manual_seed(3)
    emb, lin = nn.Embedding(7, 4).to(F64), nn.Linear(4, 4).to(F64)
    head = nn.Linear(4, 7, bias=False).to(F64)
    head.weight = emb.weight
    model = nn.Sequential(emb, lin, head)
    x = dtorch.tensor(np.random.default_rng(0).integers(0, 7, (8, 3)))
    y = dtorch.tensor(np.random.default_rng(1).integers(0, 7, (8, 3)))

    def lf(out, t):
        return nn.functional.cross_entropy(out.reshape(-1, 7),
                                           t.reshape(-1))
    ref = copy.deepcopy(model)
    lf(ref(x), y).backward()
    want = ref[0].weight.grad.numpy()
    copies = [copy.deepcopy(model) for _ in range(2)]

    def body(rank, world):
        stage = pipeline(copies[rank], split_spec=[2]).build_stage(rank,
                                                                   "cpu")
        run_step(stage, ScheduleGPipe(stage, 2, lf), x, y)
        (p, holders), = stage.tied_parameters
        return p.grad.numpy()
    g0, g1 = dist.spawn_threads(body, 2, timeout=30)
    np.testing.assert_allclose(g0, want, atol=TOL, rtol=0)
    assert np.array_equal(g0, g1)          # bitwise the same on both


def test_stage_that_raises_names_its_stage_and_rank():
    model = make_model()
    copies = [copy.deepcopy(model) for _ in range(3)]

    class Boom(nn.Module):
        def forward(self, x):
            raise RuntimeError("boom in the model")
    copies[1][4] = Boom()
    x, y = data()

    def body(rank, world):
        stage = pipeline(copies[rank], split_spec=SPLITS[3]).build_stage(
            rank, "cpu")
        run_step(stage, Schedule1F1B(stage, 4, nn.functional.cross_entropy),
                 x, y)
    with pytest.raises(RuntimeError, match="boom in the model") as ei:
        dist.spawn_threads(body, 3, timeout=30)
    notes = " ".join(getattr(ei.value, "__notes__", []))
    assert "pipeline stage 1 of 3 (global rank 1), forward of " \
           "micro-batch 0" in notes
    assert "rank 1" in notes


def test_stage_that_stops_sending_gives_the_desync_report():
    """Stage 0 forwards one micro-batch and then stops: stage 1's receive
    times out with the collectives' report naming rank 0, no hang."""
    model = make_model()
    copies = [copy.deepcopy(model) for _ in range(2)]
    x, y = data()

    def body(rank, world):
        stage = pipeline(copies[rank], split_spec=SPLITS[2]).build_stage(
            rank, "cpu")
        if rank == 0:
            stage.forward_one_chunk(0, (x[:BATCH // 4],))
            stage.finish_step(False)
            return "stopped"
        ScheduleGPipe(stage, 4, nn.functional.cross_entropy).step(
            target=y)
    with pytest.raises(CollectiveTimeoutError) as ei:
        dist.spawn_threads(body, 2, timeout=1.5)
    msg = str(ei.value)
    assert "recv" in msg and "did not arrive: [0]" in msg
    assert "Desync report" in msg
    notes = " ".join(getattr(ei.value, "__notes__", []))
    assert "pipeline stage 1 of 2 (global rank 1), forward of " \
           "micro-batch 1" in notes


# ============================================================ device mesh ==

def test_device_mesh_groups():
    def body(rank, world):
        mesh = init_device_mesh("cpu", (2, 3, 2),
                                mesh_dim_names=("pp", "dp", "tp"))
        assert mesh.shape == (2, 3, 2) and mesh.size() == 12
        pp, dp, tp = mesh.get_coordinate()
        assert rank == pp * 6 + dp * 2 + tp
        assert dist.get_process_group_ranks(mesh.get_group("tp")) == \
            [pp * 6 + dp * 2 + i for i in range(2)]
        assert dist.get_process_group_ranks(mesh["dp"].get_group()) == \
            [pp * 6 + i * 2 + tp for i in range(3)]
        assert dist.get_process_group_ranks(mesh.get_group(0)) == \
            [i * 6 + dp * 2 + tp for i in range(2)]
        assert mesh.get_local_rank("dp") == dp
        sub = mesh["dp", "tp"]
        assert sub.shape == (3, 2) and sub.get_group("tp") is \
            mesh.get_group("tp")
        assert mesh["tp", "dp"].mesh.tolist() == sub.mesh.T.tolist()
        with pytest.raises(KeyError, match="'ep' not found"):
            mesh["ep"]
        with pytest.raises(RuntimeError, match="needs mesh_dim"):
            mesh.get_group()
        # the groups work: a sum over the dp group
        t = dtorch.tensor([float(rank)])
        dist.all_reduce(t, group=mesh.get_group("dp"))
        assert t.item() == sum(pp * 6 + i * 2 + tp for i in range(3))
        return True
    assert all(dist.spawn_threads(body, 12, timeout=60))


def test_device_mesh_bad_shape():
    def body(rank, world):
        with pytest.raises(ValueError, match=r"mesh dp=2 x tp=2 has 4 "
                                             r"ranks but the world has 3"):
            init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        with pytest.raises(ValueError, match="must name each"):
            init_device_mesh("cpu", (3,), mesh_dim_names=("dp", "tp"))
        return True
    assert all(dist.spawn_threads(body, 3, timeout=30))


def test_stages_on_a_device(device):
    """Stages computing on ``device`` (cuda: CuPy arrays cross the stage
    boundary, received into buffers on the device) give the CPU
    reference's gradients."""
    model = make_model()
    x, y = data()
    _, want = reference(model, x, y)
    copies = [copy.deepcopy(model) for _ in range(2)]

    def body(rank, world):
        stage = pipeline(copies[rank], split_spec=SPLITS[2]).build_stage(
            rank, device)
        run_step(stage, Schedule1F1B(stage, 4, nn.functional.cross_entropy),
                 x, y)
        return {n: (p.grad.device.type, p.grad.cpu().numpy())
                for n, p in stage.submod.named_parameters()}
    for grads in dist.spawn_threads(body, 2, timeout=60):
        for n, (dev, g) in grads.items():
            assert dev == device
            np.testing.assert_allclose(g, want[n], atol=TOL, rtol=0,
                                       err_msg=n)


def _deep_chain(seed=0):
    dtorch.manual_seed(seed)
    layers = []
    for _ in range(6):
        layers += [nn.Linear(6, 6), nn.Tanh()]
    return nn.Sequential(*layers, nn.Linear(6, 3)).to(F64)


@pytest.mark.parametrize("p,v", [(2, 2), (3, 2), (2, 3)])
@pytest.mark.parametrize("rounds", [1, 2, 4])
def test_interleaved_1f1b_equals_unsplit(p, v, rounds):
    """p ranks x v stages each (stage i on rank i % p): the unsplit
    model's gradients and loss; the micro-batches a stage holds do not
    grow with m."""
    model = _deep_chain()
    rng = np.random.default_rng(2)
    x = dtorch.tensor(rng.standard_normal((24, 6)), dtype=F64)
    y = dtorch.tensor(rng.integers(0, 3, 24))
    want_loss, want = reference(model, x, y)
    n = p * v
    cuts = [round(i * 13 / n) for i in range(1, n)]
    m = p * rounds
    copies = [copy.deepcopy(model) for _ in range(p)]

    def body(rank, world):
        pipe = pipeline(copies[rank], split_spec=cuts)
        stages = [PipelineStage(pipe.get_stage_module(i), i, n, "cpu")
                  for i in range(rank, n, world)]
        sch = ScheduleInterleaved1F1B(stages, m,
                                      nn.functional.cross_entropy)
        losses = []
        kw = {"losses": losses, "target": y} \
            if (n - 1) % world == rank else {}
        sch.step(*((x,) if rank == 0 else ()), **kw)
        grads = {k: g.grad.numpy() for s in stages
                 for k, g in s.submod.named_parameters()}
        return grads, losses, [s.peak_live for s in stages]
    res = dist.spawn_threads(body, p, timeout=60)
    seen = {}
    for rank, (grads, losses, peaks) in enumerate(res):
        seen.update(grads)
        # Megatron's warm-up: (p - rank - 1) * 2 + (v - 1) * p forwards
        assert max(peaks) <= min(m, 2 * (p - rank - 1) + (v - 1) * p + 1)
    assert sorted(seen) == sorted(want)
    for k, g in want.items():
        np.testing.assert_allclose(seen[k], g, atol=TOL, rtol=0, err_msg=k)
    losses = res[(n - 1) % p][1]
    assert len(losses) == m
    assert abs(np.mean([l.item() for l in losses]) - want_loss) < TOL


def test_interleaved_needs_a_multiple_of_the_ranks():
    model = _deep_chain()

    def body(rank, world):
        pipe = pipeline(copy.deepcopy(model), split_spec=[3, 6, 9])
        stages = [PipelineStage(pipe.get_stage_module(i), i, 4, "cpu")
                  for i in range(rank, 4, world)]
        with pytest.raises(ValueError, match="n_microbatches=3 is not a "
                                             "multiple of the 2 pipeline"):
            ScheduleInterleaved1F1B(stages, 3, nn.functional.mse_loss)
        with pytest.raises(ValueError, match="runs on rank i % 2"):
            PipelineStage(pipe.get_stage_module(1 - rank), 1 - rank, 4,
                          "cpu")
        return True
    assert all(dist.spawn_threads(body, 2, timeout=30))


def _simulated_bubble(orders, n_stages, m, v, tf=1.0, tb=2.0):
    """Run every rank's (kind, stage, micro-batch) list against the data
    dependencies with zero-cost communication; the idle share of the step
    (an error if the lists deadlock)."""
    done, pos = {}, [0] * len(orders)
    t = [0.0] * len(orders)
    moved = True
    while moved:
        moved = False
        for r, order in enumerate(orders):
            while pos[r] < len(order):
                kind, s, mb = order[pos[r]]
                if kind == "F":
                    dep = ("F", s - 1, mb) if s > 0 else None
                else:
                    dep = ("B", s + 1, mb) if s < n_stages - 1 \
                        else ("F", s, mb)
                if dep is not None and dep not in done:
                    break
                t[r] = max(t[r], done.get(dep, 0.0)) + \
                    (tf if kind == "F" else tb)
                done[(kind, s, mb)] = t[r]
                pos[r] += 1
                moved = True
    assert all(pos[r] == len(o) for r, o in enumerate(orders)), "deadlock"
    return 1 - m * v * (tf + tb) / max(t)


@pytest.mark.parametrize("p", [2, 3, 4])
@pytest.mark.parametrize("v", [1, 2, 3])
def test_interleaved_order_reaches_the_theoretical_bubble(p, v):
    """The order each rank runs has no deadlock and, with any forward /
    backward times, idles (p-1)/(v m + p - 1) of the step."""
    for m in (p, 2 * p, 3 * p):
        orders = []
        for r in range(p):
            sch = ScheduleInterleaved1F1B.__new__(ScheduleInterleaved1F1B)
            sch._p, sch._v, sch._n_microbatches, sch._rank = p, v, m, r
            orders.append(sch._order())
            assert sorted(orders[-1]) == sorted(
                (k, c * p + r, i) for k in "FB" for c in range(v)
                for i in range(m))
        want = (p - 1) / (v * m + p - 1)
        assert abs(_simulated_bubble(orders, p * v, m, v) - want) < 1e-12
