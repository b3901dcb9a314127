"""examples/gpt.py's GPT under data x tensor x pipeline parallelism
(threads backend): one training step on any DP x TP x PP layout of 4 (and
8) ranks equals the single-process step on the replicas' concatenated
batches (loss and every parameter after an SGD step, float64, 1e-10); the
example runs end to end on 1 rank and on 2 pipeline stages, and resumes
from its checkpoint only when asked."""
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import dtorch
import dtorch.distributed as dist
from dtorch.distributed.device_mesh import init_device_mesh
from dtorch.distributed.pipelining import Schedule1F1B, ScheduleGPipe
from dtorch.nn.parallel import tensor_parallel as tp

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "examples"))
import gpt  # noqa: E402

TOL = 1e-10
TINY = ["--n-layer", "2", "--n-head", "4", "--d-model", "16",
        "--block-size", "8", "--batch-size", "4", "--microbatches", "2",
        "--dtype", "float64", "--seed", "3"]
_build_lock = threading.Lock()     # the rank threads share one generator


def reference(args, chars, train, dp):
    """Single process: the full model, the DP replicas' batches
    concatenated, one SGD step (lr 1)."""
    dtorch.manual_seed(args.seed)
    model = gpt.GPT(len(chars), args.n_layer, args.n_head, args.d_model,
                    args.block_size, None).to(dtorch.float64)
    xs, ys = zip(*[gpt.get_batch(train, args.batch_size, args.block_size,
                                 args.seed, 0, r) for r in range(dp)])
    loss = gpt.loss_fn(model(dtorch.cat(xs)), dtorch.cat(ys))
    loss.backward()
    opt = dtorch.optim.SGD(model.parameters(), lr=1.0)
    opt.step()
    return loss.item(), {k: v.numpy().copy()
                         for k, v in model.state_dict().items()}


def parallel_step(rank, world, layout, sched, argv, cp=1):
    pp, dp, tps = layout
    args = gpt.parse(argv + ["--pp", str(pp), "--tp", str(tps),
                             "--cp", str(cp)])
    mesh = init_device_mesh("cpu", (pp, dp, cp, tps),
                            mesh_dim_names=("pp", "dp", "cp", "tp"))
    chars, train, _ = gpt.load_text()
    with _build_lock:           # no collective inside: no deadlock
        model = gpt.build_model(args, mesh, len(chars))
    stage, stage_mod, _ = gpt.build_stage(args, mesh, model)
    schedule = sched(stage, args.microbatches, loss_fn=gpt.loss_fn)
    x, y = gpt.get_batch(train, args.batch_size, args.block_size,
                         args.seed, 0, mesh.get_local_rank("dp"))
    opt = dtorch.optim.SGD(stage_mod.parameters(), lr=1.0)
    with gpt.cp_region(args, mesh, stage_mod, x, y):   # CP: shards x, y
        losses = gpt.train_step(stage, schedule, x, y)
    opt.step()
    loss = gpt.mean_loss(losses, stage, mesh.get_group("pp"), mesh)
    full = {k: v.numpy() for k, v in tp.gather_state_dict(stage_mod).items()}
    return loss, full


@pytest.mark.parametrize("layout,sched", [
    ((2, 2, 1), Schedule1F1B), ((2, 1, 2), ScheduleGPipe),
    ((1, 2, 2), Schedule1F1B), ((2, 2, 2), Schedule1F1B),
    ((2, 1, 2), Schedule1F1B)], ids=lambda v: (
        "pp%d-dp%d-tp%d" % v if isinstance(v, tuple) else v.__name__))
def test_one_step_equals_single_process(layout, sched):
    check_one_step(layout, sched, TINY)


def check_one_step(layout, sched, argv, cp=1):
    """The step on ``layout`` (pp, dp, tp) x ``cp`` equals the single
    process's."""
    args = gpt.parse(argv)
    chars, train, _ = gpt.load_text()
    world = int(np.prod(layout)) * cp
    want_loss, want = reference(args, chars, train, layout[1])
    res = dist.spawn_threads(
        lambda r, n: parallel_step(r, n, layout, sched, argv, cp), world,
        timeout=120)
    seen = {}
    for loss, full in res:
        assert abs(loss - want_loss) < TOL
        for k, v in full.items():
            if k in seen:        # replicas and the tied copies agree
                np.testing.assert_allclose(v, seen[k], atol=TOL, rtol=0,
                                           err_msg=k)
            seen[k] = v
    assert sorted(seen) == sorted(want)
    for k, v in want.items():
        np.testing.assert_allclose(seen[k], v, atol=TOL, rtol=0, err_msg=k)


def _run(argv, timeout=240):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               PYTHONPATH=ROOT)
    env.pop("DTORCH_RESTART_COUNT", None)
    p = subprocess.run([sys.executable, os.path.join(ROOT, "examples",
                                                     "gpt.py")] + argv,
                       capture_output=True, text=True, timeout=timeout,
                       env=env, cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def test_example_one_rank_trains_and_resumes(tmp_path):
    ck = str(tmp_path / "gpt.safetensors")
    small = ["--n-layer", "2", "--d-model", "32", "--block-size", "16",
             "--batch-size", "8", "--log-every", "2", "--sample", "10",
             "--checkpoint", ck, "--checkpoint-every", "3"]
    out = _run(small + ["--steps", "4"])
    lines = [l for l in out.splitlines() if l.startswith("step")]
    assert len(lines) == 2 and all("tokens/s" in l for l in lines)
    first = float(lines[0].split()[3])
    assert 2.0 < first < 5.0          # about ln(vocab) at the start
    assert "sample: 'Once upon a time" in out
    assert os.path.exists(ck)
    out = _run(small + ["--steps", "6", "--resume"])
    assert "resuming from" in out and "at step 4 of 6" in out
    assert "step     6" in out
    out = _run(small + ["--steps", "2"])   # not asked: starts fresh
    assert "starting fresh" in out


def test_example_two_stages_on_threads(tmp_path):
    """main() of the example on 2 pipeline stages x 2 TP ranks (threads
    backend: the same code as under mpiexec)."""
    ck = str(tmp_path / "gpt.safetensors")
    argv = TINY[:-4] + ["--steps", "3", "--log-every", "3", "--sample",
                        "5", "--checkpoint", ck, "--pp", "2", "--tp", "2"]
    res = dist.spawn_threads(lambda r, n: gpt.main(argv), 4, timeout=120)
    assert len(set(res)) == 1 and np.isfinite(res[0])
    saved = dtorch.load(ck)
    assert saved["step"] == 3 and saved["layout"] == "DP 1 x TP 2 x PP 2"
    # the full model: the padded vocabulary's rows, not a TP shard
    assert saved["model"]["embed.tok.weight"].shape[0] % 8 == 0


def test_gpt_example_pipeline_and_tp_with_activation_checkpointing(
        monkeypatch):
    """examples/gpt.py --activation-checkpointing on 2 pipeline stages x
    TP 2 (4 thread ranks): the same step as the single-process run
    without checkpointing."""
    from dtorch.utils.checkpoint import checkpoint
    calls = []

    def counted(*a, **k):
        calls.append(1)
        return checkpoint(*a, **k)
    monkeypatch.setattr(gpt, "checkpoint", counted)
    argv = TINY + ["--activation-checkpointing"]
    chars, train, _ = gpt.load_text()
    want_loss, want = reference(gpt.parse(TINY), chars, train, 1)
    assert not calls
    res = dist.spawn_threads(
        lambda r, n: parallel_step(r, n, (2, 1, 2), Schedule1F1B, argv),
        4, timeout=120)
    assert calls
    seen = {}
    for loss, full in res:
        assert abs(loss - want_loss) < 1e-10
        seen.update(full)
    assert sorted(seen) == sorted(want)
    for k, v in want.items():
        np.testing.assert_allclose(seen[k], v, atol=1e-10, rtol=0,
                                   err_msg=k)
