"""Pictures: the main job's metrics file and --plot, and the benchmarks'
shared plot helper (PNG when matplotlib is there, JSON still without)."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
EX = os.path.join(ROOT, "examples")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _run(args, cwd):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    p = subprocess.run([sys.executable] + args, cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=240)
    assert p.returncode in (0, 3), p.stdout + p.stderr
    return p


def test_digits_metrics_file_resume_and_plot(tmp_path):
    pytest.importorskip("sklearn")
    pytest.importorskip("matplotlib")
    ck = str(tmp_path / "run" / "d.safetensors")
    digits = os.path.join(EX, "digits.py")
    # stopped at the start of epoch 3 (0-based 2): two epochs recorded
    p = _run([digits, "--epochs", "4", "--quiet", "--checkpoint", ck,
              "--fail-at-epoch", "2"], tmp_path)
    assert p.returncode == 3
    mfile = tmp_path / "run" / "d.metrics.jsonl"
    recs = [json.loads(line) for line in mfile.read_text().splitlines()]
    assert [r["epoch"] for r in recs] == [1, 2]
    # a crash after writing epoch 3's line but before its checkpoint
    with open(mfile, "a") as f:
        f.write(json.dumps({"epoch": 3, "train_loss": 9.9}) + "\n")
        f.write('{"epoch": 4, "trai')                # cut mid-line
    _run([digits, "--epochs", "4", "--quiet", "--checkpoint", ck,
          "--resume", "--plot"], tmp_path)
    recs = [json.loads(line) for line in mfile.read_text().splitlines()]
    assert [r["epoch"] for r in recs] == [1, 2, 3, 4]   # each epoch once
    assert recs[2]["train_loss"] != 9.9
    for r in recs:
        assert set(r) == {"epoch", "train_loss", "test_loss", "test_acc",
                          "lr", "time_s"}
        assert 0 <= r["test_acc"] <= 1 and r["train_loss"] > 0
    assert recs[-1]["test_loss"] < recs[0]["test_loss"]
    png = tmp_path / "run" / "d.metrics.png"
    assert png.read_bytes()[:8] == PNG_MAGIC
    # a fresh run starts a new file; --plot PATH puts the picture there
    other = tmp_path / "pic.png"
    _run([digits, "--epochs", "1", "--quiet", "--checkpoint", ck,
          "--plot", str(other)], tmp_path)
    assert len(mfile.read_text().splitlines()) == 1
    assert other.read_bytes()[:8] == PNG_MAGIC


def test_open_metrics_keeps_only_epochs_up_to_the_start(tmp_path):
    sys.path.insert(0, EX)
    try:
        from digits_common import open_metrics, read_metrics, metrics_path
    finally:
        sys.path.remove(EX)
    assert metrics_path("runs/x.safetensors") == "runs/x.metrics.jsonl"
    assert metrics_path("runs/ckdir/") == "runs/ckdir.metrics.jsonl"
    path = str(tmp_path / "m.jsonl")
    with open(path, "w") as f:
        for e in (1, 2, 3):
            f.write(json.dumps({"epoch": e}) + "\n")
    open_metrics(path, 2).close()
    assert [r["epoch"] for r in read_metrics(path)] == [1, 2]
    open_metrics(path, 0).close()
    assert read_metrics(path) == []
    # resuming with no file yet: an empty one
    p2 = str(tmp_path / "new" / "m.jsonl")
    open_metrics(p2, 5).close()
    assert read_metrics(p2) == []


def test_benchmark_plot_helper(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        import _plot
    finally:
        sys.path.pop(0)
    assert _plot.png_path("results/x.json") == "results/x.png"
    p = _plot.plot(str(tmp_path / "a.png"), {"dtorch": ([1, 2, 4], [1, 2,
                                                                    3])},
                   "ranks", "speed-up", "t", logx=True, hline=1.0)
    assert open(p, "rb").read(8) == PNG_MAGIC
    b = _plot.bars(str(tmp_path / "sub" / "b.png"), ["a", "b"],
                   {"x": [1.0, 2.0], "y": [0.5, 1.5]}, "ratio", "t")
    assert open(b, "rb").read(8) == PNG_MAGIC
    # without matplotlib: no file, no error
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert _plot.plot(str(tmp_path / "c.png"), {}, "x", "y", "t") is None
    assert not (tmp_path / "c.png").exists()
