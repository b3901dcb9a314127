"""dtorch-launch gives each rank a TORCHELASTIC_ERROR_FILE of its own, as
torchrun does: ``@record`` writes the exception that ended a rank there
and the launcher names the root cause from it (plain and --elastic jobs);
the files go with the launcher unless --log-dir keeps them."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))

BODY = '''
import json, os, sys, time
from dtorch.distributed.elastic.multiprocessing.errors import record

@record
def main():
    with open(os.environ["FILES_LOG"], "a") as f:
        f.write(json.dumps([os.environ["RANK"],
                            os.environ["TORCHELASTIC_ERROR_FILE"]]) + "\\n")
    if os.environ["RANK"] == "1":
        for _ in range(600):      # rank 0 has said its file first
            if open(os.environ["FILES_LOG"]).read().count("\\n") == 2:
                break
            time.sleep(0.05)
        raise ValueError("boom in rank one, step " + str(6 * 7))

main()
'''


def _launch(tmp_path, args):
    script = tmp_path / "raises.py"
    script.write_text(BODY)
    log = tmp_path / "files.jsonl"
    env = dict(os.environ, PYTHONPATH=ROOT, FILES_LOG=str(log))
    for var in ("TORCHELASTIC_ERROR_FILE", "DTORCH_RDZV_TOKEN",
                "DTORCH_ELASTIC"):
        env.pop(var, None)
    out = subprocess.run([sys.executable, "-m", "launch"] + args
                         + [str(script)], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    files = dict(json.loads(line) for line in log.read_text().split("\n")
                 if line)
    return out.returncode, out.stderr, files


def _check(code, err, files):
    assert code != 0, err
    assert sorted(files) == ["0", "1"] and files["0"] != files["1"], files
    assert ("root cause (from its error file " + files["1"] + "): "
            "ValueError: boom in rank one, step 42") in err, err


def _raise_lines(err):
    return err.count('raise ValueError("boom in rank one, step " + '
                     'str(6 * 7))')


def test_error_file_names_the_root_cause(tmp_path):
    code, err, files = _launch(tmp_path, ["--nproc-per-node", "2"])
    _check(code, err, files)
    assert "rank 1 (local rank 1" in err
    # the rank's last lines (just above) show the traceback: not again
    assert _raise_lines(err.split("root cause")[1]) == 0, err
    assert not os.path.exists(os.path.dirname(files["1"]))  # cleaned up


def test_error_file_under_elastic_and_kept_in_log_dir(tmp_path):
    logs = tmp_path / "logs"
    code, err, files = _launch(tmp_path, [
        "--elastic", "1:2", "--nproc-per-node", "2", "--log-dir",
        str(logs), "--only-rank0-output"])
    _check(code, err, files)
    assert "member 1 (pid" in err and "exited with code 1" in err, err
    # rank 1's output is not on the console: the traceback is the file's
    assert _raise_lines(err) == 1 and "    | Traceback" in err, err
    assert files["1"] == str(logs / "rank1.error.json")
    with open(files["1"]) as f:
        data = json.load(f)
    assert data["message"]["message"] == \
        "ValueError: boom in rank one, step 42"
    assert not os.path.exists(files["0"])   # rank 0 ended well
