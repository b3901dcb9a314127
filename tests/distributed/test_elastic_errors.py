"""dtorch.distributed.elastic.multiprocessing.errors: torchrun scripts'
``@record`` writes an escaping exception to TORCHELASTIC_ERROR_FILE as
PyTorch's JSON and raises it again; ChildFailedError/ProcessFailure.
PyTorch (when installed) is the oracle for the file's layout."""
import json
import os
import signal
import subprocess
import sys

import pytest

from dtorch.distributed.elastic.multiprocessing import errors
from dtorch.distributed.elastic.multiprocessing.errors import (
    ChildFailedError, ProcessFailure, record)


def _boom():
    raise ValueError("boom 42")


def _written(rec, fn, path, monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
    with pytest.raises(ValueError, match="boom 42") as info:
        rec(fn)()
    with open(path) as f:
        return json.load(f), info.value


def test_record_writes_pytorchs_json_and_reraises(tmp_path, monkeypatch):
    data, exc = _written(record, _boom, tmp_path / "e.json", monkeypatch)
    msg = data["message"]
    assert msg["message"] == "ValueError: boom 42"
    assert "_boom" in msg["extraInfo"]["py_callstack"]
    assert "ValueError: boom 42" in msg["extraInfo"]["py_callstack"]
    assert abs(int(msg["extraInfo"]["timestamp"])
               - int(os.path.getmtime(tmp_path / "e.json"))) <= 2
    assert isinstance(exc, ValueError)
    torch_errors = pytest.importorskip(
        "torch.distributed.elastic.multiprocessing.errors")
    theirs, _ = _written(torch_errors.record, _boom, tmp_path / "t.json",
                         monkeypatch)
    assert set(theirs) == set(data)
    assert set(theirs["message"]) == set(msg)
    assert set(theirs["message"]["extraInfo"]) == set(msg["extraInfo"])
    assert theirs["message"]["message"] == msg["message"]


def test_record_passes_results_and_exits_through(tmp_path, monkeypatch):
    path = tmp_path / "e.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))

    @record
    def main(a, b=1):
        """doc"""
        return a + b
    assert main(2, b=3) == 5 and main.__name__ == "main"
    assert main.__doc__ == "doc"
    assert record(lambda: sys.exit(0))() is None
    with pytest.raises(SystemExit) as info:
        record(lambda: sys.exit(3))()
    assert info.value.code == 3
    assert not path.exists()        # neither a result nor an exit is an error


def test_no_error_file_set_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(KeyError):
        record(lambda: {}["x"])()
    assert os.listdir(tmp_path) == []


def test_child_failure_is_copied_into_the_parents_file(tmp_path,
                                                       monkeypatch):
    child = tmp_path / "child.json"
    _written(record, _boom, child, monkeypatch)
    f0 = ProcessFailure(local_rank=0, pid=11, exitcode=1,
                        error_file=str(child))
    f1 = ProcessFailure(local_rank=1, pid=12, exitcode=-signal.SIGKILL,
                        error_file=str(tmp_path / "none.json"))
    assert f0.message["message"] == "ValueError: boom 42"
    assert f1.error_file == "<N/A>" and f1.signal_name() == "SIGKILL"
    assert f1.message == "Signal 9 (SIGKILL) received by PID 12"
    f1.timestamp = f0.timestamp + 10          # rank 0 failed first
    err = ChildFailedError("train.py", {0: f0, 1: f1})
    assert err.get_first_failure() == (0, f0)
    assert "root cause: rank 0" in str(err) and "boom 42" in str(err)
    assert "SIGKILL" in str(err)
    parent = tmp_path / "parent.json"
    parent.write_text("stale")
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(parent))

    def launcher_main():
        raise err
    with pytest.raises(ChildFailedError):
        record(launcher_main)()
    data = json.loads(parent.read_text())
    assert data["message"]["message"] == "ValueError: boom 42"
    assert data["message"]["errorCode"] == 1
    with pytest.raises(ValueError, match="at least one failure"):
        ChildFailedError("x", {})


def test_a_script_under_record_leaves_its_error(tmp_path):
    """The way torchrun scripts use it: ``import dtorch as torch``,
    ``from dtorch.distributed.elastic.multiprocessing.errors import
    record``, an exception in main, a non-zero exit and the file."""
    script = tmp_path / "train.py"
    script.write_text(
        "from dtorch.distributed.elastic.multiprocessing.errors import "
        "record\n@record\ndef main():\n    raise RuntimeError('rank died')"
        "\nif __name__ == '__main__':\n    main()\n")
    path = tmp_path / "err.json"
    env = dict(os.environ, TORCHELASTIC_ERROR_FILE=str(path))
    r = subprocess.run([sys.executable, str(script)], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "RuntimeError: rank died" in r.stderr
    data = json.loads(path.read_text())
    assert data["message"]["message"] == "RuntimeError: rank died"
    assert errors.ProcessFailure(0, 1, 1, str(path)).message == \
        data["message"]
