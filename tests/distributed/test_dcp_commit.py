"""dcp.save over an existing checkpoint name, killed (SIGKILL, in a
forked child) after each step of its commit: a complete checkpoint is
always found under the name (or its .old) by load and latest_checkpoint,
the next save recovers and leaves no .old or temporary directory behind;
and the pattern of examples/ddp_digits.py (one directory saved every
epoch) resumes after such a kill instead of starting fresh."""
import os
import signal
import sys

import pytest

import dtorch
import dtorch.distributed.checkpoint as dcp
from dtorch.distributed.checkpoint import _files

if "OMPI_COMM_WORLD_SIZE" in os.environ or "PMI_SIZE" in os.environ:
    pytest.skip("single-process tests; not run under mpiexec",
                allow_module_level=True)
if not hasattr(os, "fork"):
    pytest.skip("needs os.fork", allow_module_level=True)


def _state(v):
    # the entries examples/ddp_digits.py's plan_start looks for, too
    return {"t": dtorch.full((3,), float(v)), "epoch": v, "test_acc": 0.5,
            "rng": dcp.RNGState()}


def _save_killed_at(step, path, v):
    """dcp.save of value v in a child SIGKILLed right after ``step``."""
    pid = os.fork()
    if pid == 0:                                     # the child
        try:
            def hook(s):
                if s == step:
                    os.kill(os.getpid(), signal.SIGKILL)
            _files._commit_hook = hook
            dcp.save(_state(v), checkpoint_id=path)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status), f"the save was not killed at {step}"


def _loaded(path):
    st = _state(-1)
    dcp.load(st, checkpoint_id=path)
    assert st["t"].tolist() == [float(st["epoch"])] * 3
    return st["epoch"]


@pytest.mark.parametrize("step", _files.COMMIT_STEPS)
def test_kill_at_each_commit_step_keeps_a_checkpoint(tmp_path, step):
    path = str(tmp_path / "step_7")
    dcp.save(_state(1), checkpoint_id=path)
    _save_killed_at(step, path, 2)
    # the new one once it has its name, the previous one before
    renamed = _files.COMMIT_STEPS.index(step) >= \
        _files.COMMIT_STEPS.index("renamed")
    assert _loaded(path) == (2 if renamed else 1)
    assert dcp.latest_checkpoint(path) is not None
    assert dcp.FileSystemReader(path).read_metadata() is not None
    # and so does a folder of checkpoints
    assert _loaded(str(tmp_path)) == (2 if renamed else 1)
    # the next save recovers: no .old, no dead save's temporary left
    dcp.save(_state(3), checkpoint_id=path)
    assert os.listdir(tmp_path) == ["step_7"]
    assert _loaded(path) == 3


def test_kill_between_renames_of_the_next_save_too(tmp_path):
    """Killed between the renames twice in a row: the .old of the first
    kill is still the checkpoint; the second save must not lose it."""
    path = str(tmp_path / "ckpt")
    dcp.save(_state(1), checkpoint_id=path)
    _save_killed_at("moved-aside", path, 2)
    assert not os.path.exists(path)            # the name is empty...
    assert _loaded(path) == 1                  # ...the .old is found
    _save_killed_at("stale-old-removed", path, 2)
    _save_killed_at("moved-aside", path, 2)
    assert _loaded(path) == 1
    dcp.save(_state(4), checkpoint_id=path)
    assert os.listdir(tmp_path) == ["ckpt"] and _loaded(path) == 4


def test_an_earlier_versions_old_is_recovered_or_removed(tmp_path):
    """Saves before this fix moved the replaced checkpoint to a per-save
    .old and never removed it; a dead pid's one is taken over as the
    checkpoint's .old when the name is missing, else removed."""
    import subprocess
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()                                          # a pid that is gone
    tag = _files._host_tag()
    for name, v in (("a", 1), ("b", 2)):
        dcp.save(_state(v), checkpoint_id=tmp_path / name)
        os.rename(tmp_path / name,
                  tmp_path / f".{name}.dcp-{tag}-{p.pid}-0badf00d.old")
    dcp.save(_state(5), checkpoint_id=tmp_path / "b")   # b exists again
    assert sorted(os.listdir(tmp_path)) == [".a.old", "b"]
    assert _loaded(str(tmp_path / "a")) == 1 and _loaded(
        str(tmp_path / "b")) == 5


def test_ddp_digits_pattern_resumes_after_a_kill(tmp_path, monkeypatch):
    """examples/ddp_digits.py saves to one directory every epoch and, on
    a restart, resumes from what its plan_start/dcp_summary find there.
    A kill inside epoch 3's save must resume at epoch 3, not start fresh
    (the issue: 3 epochs lost)."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..",
                                    "examples"))
    try:
        from digits_common import dcp_summary, plan_start
    finally:
        sys.path.pop(0)
    ck = str(tmp_path / "ckpt")
    for epoch in (1, 2):
        dcp.save(_state(epoch), checkpoint_id=ck)
    _save_killed_at("moved-aside", ck, 3)
    monkeypatch.setenv("DTORCH_RESTART_COUNT", "1")     # the requeue
    found = dcp.latest_checkpoint(ck) or ck            # as ddp_digits.py
    got, finished, message = plan_start(found, 5, False, read=dcp_summary)
    assert got is not None and not finished, message
    assert "resuming" in message and "epoch 3" in message
    assert _loaded(found) == 2
    for epoch in (3, 4, 5):
        dcp.save(_state(epoch), checkpoint_id=ck)
    assert os.listdir(tmp_path) == ["ckpt"] and _loaded(ck) == 5
