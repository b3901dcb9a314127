"""examples/gpt.py's GPT with context parallelism (threads backend): one
training step on dp2 x cp2 and pp2 x tp2 x cp2 (8 ranks), ring and
Ulysses, equals the single-process step on the replicas' concatenated
batches (loss and every parameter after an SGD step, float64, 1e-10)."""
import numpy as np
import pytest

import dtorch
import dtorch.distributed as dist
from dtorch.distributed.device_mesh import init_device_mesh
from dtorch.distributed.pipelining import Schedule1F1B
from dtorch.distributed.tensor.experimental import set_rotate_method
from dtorch.nn.parallel import tensor_parallel as tp

from test_pipeline_gpt import TINY, TOL, _build_lock, gpt, reference


def cp_step(layout, argv):
    pp, dp, cp, tps = layout
    args = gpt.parse(argv + ["--pp", str(pp), "--tp", str(tps),
                             "--cp", str(cp)])
    mesh = init_device_mesh("cpu", layout,
                            mesh_dim_names=("pp", "dp", "cp", "tp"))
    chars, train, _ = gpt.load_text()
    with _build_lock:
        model = gpt.build_model(args, mesh, len(chars))
    stage, stage_mod, _ = gpt.build_stage(args, mesh, model)
    schedule = Schedule1F1B(stage, args.microbatches, loss_fn=gpt.loss_fn)
    x, y = gpt.get_batch(train, args.batch_size, args.block_size,
                         args.seed, 0, mesh.get_local_rank("dp"))
    opt = dtorch.optim.SGD(stage_mod.parameters(), lr=1.0)
    with gpt.cp_region(args, mesh, stage_mod, x, y):
        assert x.shape[1] == args.block_size // cp      # sharded
        losses = gpt.train_step(stage, schedule, x, y)
    opt.step()
    loss = gpt.mean_loss(losses, stage, mesh.get_group("pp"), mesh)
    full = {k: v.numpy() for k, v in tp.gather_state_dict(stage_mod).items()}
    return loss, full


@pytest.mark.parametrize("layout,algorithm", [
    ((1, 2, 2, 1), "ring"), ((1, 2, 2, 1), "ulysses"),
    ((2, 1, 2, 2), "ring")], ids=lambda v: (
        "pp%d-dp%d-cp%d-tp%d" % v if isinstance(v, tuple) else v))
def test_one_step_equals_single_process(layout, algorithm):
    argv = TINY + ["--cp-algorithm", algorithm]
    args = gpt.parse(argv)
    chars, train, _ = gpt.load_text()
    want_loss, want = reference(args, chars, train, layout[1])
    res = dist.spawn_threads(lambda r, n: cp_step(layout, argv),
                             int(np.prod(layout)), timeout=120)
    seen = {}
    for loss, full in res:
        assert abs(loss - want_loss) < TOL
        for k, v in full.items():
            if k in seen:
                np.testing.assert_allclose(v, seen[k], atol=TOL, rtol=0,
                                           err_msg=k)
            seen[k] = v
    assert sorted(seen) == sorted(want)
    for k, v in want.items():
        np.testing.assert_allclose(seen[k], v, atol=TOL, rtol=0, err_msg=k)


def test_example_trains_with_cp(tmp_path):
    """main() on dp1 x cp2 x tp2 (4 thread ranks, Ulysses, the ring's
    K/V round the ring): it trains, samples and checkpoints the full
    model."""
    ck = str(tmp_path / "gpt.safetensors")
    argv = TINY[:-4] + ["--steps", "2", "--log-every", "2", "--sample", "4",
                        "--checkpoint", ck, "--cp", "2", "--tp", "2",
                        "--cp-algorithm", "ulysses", "--cp-rotate",
                        "alltoall"]
    try:
        res = dist.spawn_threads(lambda r, n: gpt.main(argv), 4,
                                 timeout=120)
    finally:
        set_rotate_method("allgather")      # process-wide, as PyTorch's
    assert len(set(res)) == 1 and np.isfinite(res[0])
    saved = dtorch.load(ck)
    assert saved["layout"] == "DP 1 x TP 2 x PP 1 x CP 2 (ulysses)"


def test_block_size_must_split_evenly():
    with pytest.raises(SystemExit, match="multiple of 2 x --cp"):
        dist.spawn_threads(lambda r, n: gpt.main(
            TINY + ["--cp", "2", "--block-size", "6", "--steps", "1"]), 2,
            timeout=60)
