"""The namespaces scripts probe at their top (issue 14): accelerator,
backends, multiprocessing (spawn), utils.tensorboard, utils.checkpoint,
and the nn.modules.* import paths."""
import os
import sys

import numpy as np
import pytest

import dtorch


def test_accelerator_answers_like_a_cpu_build():
    has_gpu = dtorch.cuda.is_available()
    assert dtorch.accelerator.is_available() is has_gpu
    assert dtorch.accelerator.device_count() == dtorch.cuda.device_count()
    acc = dtorch.accelerator.current_accelerator()
    if has_gpu:
        assert acc.type == "cuda"
    else:
        assert acc is None
        with pytest.raises(RuntimeError, match="none is available"):
            dtorch.accelerator.current_device_index()
    # the idiom of current scripts
    device = dtorch.accelerator.current_accelerator().type \
        if dtorch.accelerator.is_available() else "cpu"
    assert dtorch.zeros(1, device=device).device.type == device


def test_backends_flags_set_and_read_back():
    b = dtorch.backends
    old = (b.cudnn.benchmark, b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32)
    try:
        b.cudnn.benchmark = True
        b.cudnn.deterministic = True
        b.cuda.matmul.allow_tf32 = True
        b.cudnn.allow_tf32 = False
        assert b.cudnn.benchmark and b.cuda.matmul.allow_tf32
        assert not b.cudnn.allow_tf32
        with b.cudnn.flags(enabled=False, benchmark=False):
            assert b.cudnn.enabled is False and b.cudnn.benchmark is False
        assert b.cudnn.benchmark is True and b.cudnn.enabled is True
    finally:
        b.cudnn.benchmark, b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32 = old
        b.cudnn.deterministic = False
    assert b.mps.is_available() is False and b.mps.is_built() is False
    assert b.cudnn.is_available() is False
    # the script idiom picks cpu
    dev = "mps" if b.mps.is_available() else "cpu"
    assert dev == "cpu"
    with b.cuda.sdp_kernel(enable_flash=False):
        assert not b.cuda.flash_sdp_enabled()
    assert b.cuda.flash_sdp_enabled()


def test_settings_round_trip():
    dtorch.use_deterministic_algorithms(True)
    assert dtorch.are_deterministic_algorithms_enabled()
    dtorch.use_deterministic_algorithms(False)
    assert not dtorch.are_deterministic_algorithms_enabled()
    dtorch.set_float32_matmul_precision("high")
    assert dtorch.get_float32_matmul_precision() == "high"
    dtorch.set_float32_matmul_precision("highest")
    with pytest.raises(RuntimeError, match="positive"):
        dtorch.set_num_threads(0)
    assert dtorch.get_num_threads() >= 1


# spawn targets must be importable by the child ('spawn' start method)
def _child_ok(i, path):
    with open(os.path.join(path, f"r{i}"), "w") as f:
        f.write(str(i * i))


def _child_fail(i, path):
    if i == 1:
        raise ValueError("boom in child 1")


def _child_exit(i):
    os._exit(3 if i == 0 else 0)


def _spawn_env():
    # children must import this test module (and the shared helpers) and
    # dtorch from this checkout
    here = os.path.dirname(os.path.abspath(__file__))
    tests = os.path.dirname(here)
    return [p for p in (here, tests, os.path.dirname(tests))
            if p not in sys.path]


def test_multiprocessing_reexports_and_spawn(tmp_path, monkeypatch):
    import multiprocessing
    mp = dtorch.multiprocessing
    assert mp.Process is multiprocessing.Process
    assert mp.Queue == multiprocessing.Queue
    assert mp.get_context is multiprocessing.get_context
    assert mp.cpu_count() == multiprocessing.cpu_count()
    extra = _spawn_env()
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        extra + [os.environ.get("PYTHONPATH", "")]))
    mp.spawn(_child_ok, args=(str(tmp_path),), nprocs=2)
    assert sorted(os.listdir(tmp_path)) == ["r0", "r1"]
    assert (tmp_path / "r1").read_text() == "1"
    with pytest.raises(mp.ProcessRaisedException, match="boom in child 1"):
        mp.spawn(_child_fail, args=(str(tmp_path),), nprocs=2)
    with pytest.raises(mp.ProcessExitedException, match="exit code 3") as e:
        mp.spawn(_child_exit, nprocs=2)
    assert e.value.exit_code == 3 and e.value.error_index == 0
    ctx = mp.spawn(_child_ok, args=(str(tmp_path),), nprocs=1, join=False)
    assert len(ctx.pids()) == 1
    while not ctx.join():
        pass


def test_summary_writer_writes_real_event_files(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import \
        EventAccumulator
    from dtorch.utils.tensorboard import SummaryWriter
    with SummaryWriter(log_dir=str(tmp_path)) as w:
        assert w.get_logdir() == str(tmp_path)
        for step in range(4):
            w.add_scalar("loss/train", dtorch.tensor(1.0 / (step + 1)), step)
        w.add_histogram("weights", dtorch.randn(500), 2)
        w.add_image("img", dtorch.rand(3, 6, 5), 1)
        w.add_images("batch", np.random.rand(3, 1, 4, 4), 1)
        w.add_text("notes", "lr=0.1", 0)
        w.add_scalars("acc", {"train": 0.9, "val": 0.8}, 5)
        with pytest.raises(ValueError, match="0D"):
            w.add_scalar("bad", dtorch.zeros(2), 0)
    ea = EventAccumulator(str(tmp_path), size_guidance={"tensors": 0})
    ea.Reload()
    sc = ea.Scalars("loss/train")
    assert [s.step for s in sc] == [0, 1, 2, 3]
    np.testing.assert_allclose([s.value for s in sc], [1, .5, 1 / 3, .25],
                               rtol=1e-6)
    h = ea.Histograms("weights")[0].histogram_value
    assert h.num == 500 and sum(h.bucket) == 500
    im = ea.Images("img")[0]
    assert (im.width, im.height) == (5, 6)
    assert im.encoded_image_string.startswith(b"\x89PNG")
    assert "notes/text_summary" in ea.Tags()["tensors"]
    assert sorted(os.listdir(tmp_path / "acc_val"))[0].startswith(
        "events.out.tfevents")


def test_default_log_dir_is_runs(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    from dtorch.utils.tensorboard import SummaryWriter
    monkeypatch.chdir(tmp_path)
    w = SummaryWriter(comment="_lr0.1")
    w.close()
    (d,) = os.listdir(tmp_path / "runs")
    assert d.endswith("_lr0.1")


def test_checkpoint_gives_the_same_result_and_grads():
    from dtorch.utils.checkpoint import checkpoint
    lin = dtorch.nn.Linear(4, 3)
    x = dtorch.randn(2, 4, requires_grad=True)
    y1 = checkpoint(lin, x, use_reentrant=False)
    y1.sum().backward()
    g1 = x.grad.clone()
    x.grad = None
    lin(x).sum().backward()
    np.testing.assert_array_equal(g1.numpy(), x.grad.numpy())


def test_nn_modules_import_paths():
    from dtorch.nn.modules.linear import NonDynamicallyQuantizableLinear
    from dtorch.nn.modules.batchnorm import _BatchNorm
    from dtorch.nn.modules.transformer import TransformerEncoderLayer
    from dtorch.nn.modules.loss import _Loss
    from dtorch.nn.modules.module import Module
    from dtorch.nn.modules.activation import MultiheadAttention
    assert issubclass(NonDynamicallyQuantizableLinear, dtorch.nn.Linear)
    assert isinstance(MultiheadAttention(4, 2).out_proj,
                      NonDynamicallyQuantizableLinear)
    assert issubclass(dtorch.nn.BatchNorm2d, _BatchNorm)
    assert TransformerEncoderLayer is dtorch.nn.TransformerEncoderLayer
    assert issubclass(dtorch.nn.MSELoss, _Loss) and Module is dtorch.nn.Module
