"""Pipeline parallelism over the MPI backend.

Under mpiexec -n 2 / -n 3 (marked mpi): a pipeline of world-size stages
equals the unsplit model (GPipe and 1F1B, float64, 1e-10), and the
example GPT's step on a world-size pipeline (-n 2: also TP 2) equals the
single-process step. From the single-process suite: examples/gpt.py
trains under mpiexec -n 4 on DP 2 x PP 2 with a checkpoint, and resumes it
on 2 pipeline stages x TP 2; a stage that raises under mpiexec takes the
job down with its stage and rank named."""
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import dtorch
from dtorch import nn
from dtorch.distributed.pipelining import (Schedule1F1B, ScheduleGPipe,
                                           pipeline)
from helpers import mpi_env
from test_pipeline import run_step

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "examples"))
UNDER_MPI = "OMPI_COMM_WORLD_SIZE" in os.environ
TOL = 1e-10


def _chain(seed=0):
    dtorch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 12), nn.Tanh(), nn.Linear(12, 12),
                         nn.Tanh(), nn.Linear(12, 12), nn.Tanh(),
                         nn.Linear(12, 3)).to(dtorch.float64)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("sched", [ScheduleGPipe, Schedule1F1B])
def test_pipeline_over_mpi_equals_unsplit(mpi_world, sched):
    dist = mpi_world
    world, rank = dist.get_world_size(), dist.get_rank()
    rng = np.random.default_rng(5)
    x = dtorch.tensor(rng.standard_normal((12, 5)))
    y = dtorch.tensor(rng.integers(0, 3, 12))
    ref = _chain()
    want_loss = nn.functional.cross_entropy(ref(x), y)
    want_loss.backward()
    want = {n: p.grad.numpy() for n, p in ref.named_parameters()}
    cuts = {2: [3], 3: [2, 4]}[world] if world <= 3 else list(
        range(1, world))
    stage = pipeline(_chain(), split_spec=cuts).build_stage(rank, "cpu")
    schedule = sched(stage, 4, nn.functional.cross_entropy)
    losses = run_step(stage, schedule, x, y)
    for n, p in stage.submod.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), want[n], atol=TOL,
                                   rtol=0, err_msg=n)
    if stage.is_last:
        assert abs(np.mean([l.item() for l in losses]) -
                   want_loss.item()) < TOL
    dist.barrier()


@pytest.mark.mpi(min_size=2)
def test_gpt_step_over_mpi_equals_single_process(mpi_world):
    """-n 2: PP 2 and TP 2; -n 3: PP 3 and DP 3."""
    import gpt
    from dtorch.distributed.device_mesh import init_device_mesh
    from dtorch.nn.parallel import tensor_parallel as tp
    from test_pipeline_gpt import reference
    dist = mpi_world
    world = dist.get_world_size()
    if world > 3:
        pytest.skip("layouts written for -n 2 and -n 3")
    layouts = [(world, 1, 1), (1, 1, 2) if world == 2 else (1, 3, 1)]
    for pp, dp, tps in layouts:
        argv = ["--n-layer", "3", "--n-head", "2", "--d-model", "8",
                "--block-size", "8", "--batch-size", "4",
                "--microbatches", "2", "--dtype", "float64", "--seed",
                "4", "--pp", str(pp), "--tp", str(tps)]
        args = gpt.parse(argv)
        chars, train, _ = gpt.load_text()
        # the single-process model needs a one-rank TP group here: the
        # default group is the MPI world
        ones = [dist.new_group([r]) for r in range(world)]
        want_loss, want = _reference_on(ones[dist.get_rank()], args, chars,
                                        train, dp, reference)
        mesh = init_device_mesh("cpu", (pp, dp, tps),
                                mesh_dim_names=("pp", "dp", "tp"))
        model = gpt.build_model(args, mesh, len(chars))
        stage, stage_mod, _ = gpt.build_stage(args, mesh, model)
        schedule = Schedule1F1B(stage, args.microbatches, gpt.loss_fn)
        x, y = gpt.get_batch(train, args.batch_size, args.block_size,
                             args.seed, 0, mesh.get_local_rank("dp"))
        opt = dtorch.optim.SGD(stage_mod.parameters(), lr=1.0)
        losses = gpt.train_step(stage, schedule, x, y)
        opt.step()
        loss = gpt.mean_loss(losses, stage, mesh.get_group("pp"), mesh)
        assert abs(loss - want_loss) < TOL
        for k, v in tp.gather_state_dict(stage_mod).items():
            np.testing.assert_allclose(v.numpy(), want[k], atol=TOL,
                                       rtol=0, err_msg=k)
        dist.barrier()


def _reference_on(one, args, chars, train, dp, reference):
    import gpt
    saved = gpt.GPT.__init__

    def init(self, vocab, n_layer=4, n_head=4, d_model=64, block_size=64,
             tp_group=None):
        saved(self, vocab, n_layer, n_head, d_model, block_size,
              one if tp_group is None else tp_group)
    gpt.GPT.__init__ = init
    try:
        return reference(args, chars, train, dp)
    finally:
        gpt.GPT.__init__ = saved


# ============================================= mpiexec from the suite ==

def _mpiexec():
    m = shutil.which("mpiexec", path=os.path.dirname(sys.executable))
    if m is None:
        pytest.fail("mpiexec not found next to the interpreter: install "
                    "with pip install -e '.[dev]'")
    return m


def _env():
    return mpi_env(PYTHONPATH=ROOT, DTORCH_RESTART_COUNT=None)


@pytest.mark.skipif(UNDER_MPI, reason="starts its own mpiexec job")
def test_gpt_example_under_mpiexec_4_then_resume_on_another_layout(
        tmp_path):
    ck = str(tmp_path / "gpt.safetensors")
    base = [sys.executable, "-m", "mpi4py",
            os.path.join(ROOT, "examples", "gpt.py"), "--n-layer", "2",
            "--d-model", "16", "--block-size", "16", "--batch-size", "8",
            "--log-every", "1", "--sample", "4", "--checkpoint", ck]
    p = subprocess.run([_mpiexec(), "-n", "4"] + base +
                       ["--dp", "2", "--pp", "2", "--steps", "2"],
                       capture_output=True, text=True, timeout=300,
                       env=_env(), cwd=ROOT)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[:6000]
    assert "DP 2 x TP 1 x PP 2 on 4 ranks" in p.stdout
    assert p.stdout.count("tokens/s") == 2
    p = subprocess.run([_mpiexec(), "-n", "4"] + base +
                       ["--tp", "2", "--pp", "2", "--steps", "3",
                        "--resume"],
                       capture_output=True, text=True, timeout=300,
                       env=_env(), cwd=ROOT)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[:6000]
    assert "at step 2 of 3" in p.stdout and "step     3" in p.stdout
    assert dtorch.load(ck)["layout"] == "DP 1 x TP 2 x PP 2"


@pytest.mark.skipif(UNDER_MPI, reason="starts its own mpiexec job")
def test_stage_that_raises_under_mpiexec_names_itself(tmp_path):
    script = tmp_path / "boom.py"
    script.write_text(textwrap.dedent("""
        import dtorch, dtorch.distributed as dist
        from dtorch import nn
        from dtorch.distributed.pipelining import pipeline, Schedule1F1B

        class Boom(nn.Module):
            def forward(self, x):
                raise RuntimeError("boom in stage one")

        dist.init_process_group("mpi")
        model = nn.Sequential(nn.Linear(4, 4), Boom())
        stage = pipeline(model, split_spec=[1]).build_stage(
            dist.get_rank(), "cpu")
        sch = Schedule1F1B(stage, 2, nn.functional.mse_loss)
        x = dtorch.randn(4, 4)
        sch.step(x) if stage.is_first else sch.step(target=x)
    """))
    p = subprocess.run([_mpiexec(), "-n", "2", sys.executable, "-m",
                        "mpi4py", str(script)], capture_output=True,
                       text=True, timeout=120, env=_env(), cwd=ROOT)
    assert p.returncode != 0
    err = p.stderr + p.stdout
    assert "boom in stage one" in err
    assert "pipeline stage 1 of 2 (global rank 1), forward of " \
           "micro-batch 0" in err, err[-3000:]
