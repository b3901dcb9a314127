"""examples/gpt.py's GPT with context parallelism (threads backend): one
training step on dp2 x cp2 and pp2 x tp2 x cp2 (8 ranks), ring and
Ulysses, equals the single-process step on the replicas' concatenated
batches (loss and every parameter after an SGD step, float64, 1e-10)."""
import numpy as np
import pytest

import dtorch
import dtorch.distributed as dist
from dtorch.distributed.pipelining import Schedule1F1B
from dtorch.distributed.tensor.experimental import set_rotate_method

from test_pipeline_gpt import TINY, check_one_step, gpt


@pytest.mark.parametrize("layout,algorithm", [
    ((1, 2, 1), "ring"), ((1, 2, 1), "ulysses"), ((2, 1, 2), "ring")],
    ids=lambda v: "pp%d-dp%d-tp%d-cp2" % v if isinstance(v, tuple) else v)
def test_one_step_equals_single_process(layout, algorithm):
    check_one_step(layout, Schedule1F1B,
                   TINY + ["--cp-algorithm", algorithm], cp=2)


def test_region_shards_tokens_targets_and_positions():
    """Inside gpt.cp_region each CP rank holds its two chunks of the
    tokens, the targets and the position ids (so the step above is not
    each rank computing the whole sequence)."""
    from dtorch.distributed.device_mesh import init_device_mesh

    def body(r, n):
        args = gpt.parse(TINY + ["--cp", "2"])
        mesh = init_device_mesh("cpu", (1, 1, 2, 1),
                                mesh_dim_names=("pp", "dp", "cp", "tp"))
        model = gpt.GPT(10, 1, 2, 8, 8, None)
        x = dtorch.arange(16).reshape(2, 8)
        y = x + 100
        with gpt.cp_region(args, mesh, model, x, y):
            inside = (x.numpy().copy(), y.numpy().copy(),
                      model.embed.pos_ids.numpy().copy())
        return inside + (model.embed.pos_ids.numpy(),)
    (x0, y0, p0, after), (x1, y1, p1, _) = dist.spawn_threads(body, 2)
    assert p0.tolist() == [0, 1, 6, 7] and p1.tolist() == [2, 3, 4, 5]
    assert x0.tolist() == [[0, 1, 6, 7], [8, 9, 14, 15]]
    assert (y1 == x1 + 100).all() and x1[0].tolist() == [2, 3, 4, 5]
    assert after.tolist() == list(range(8))       # restored


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
