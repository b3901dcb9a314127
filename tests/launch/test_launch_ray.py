"""launch.ray against a local Ray with 2 CPUs: a function job, a script
job that rendezvouses, failures naming the rank, `--runner ray`."""
import importlib.util
import json
import subprocess
import sys
import time

import pytest

from launch_scripts.harness import (ROOT, UNDER_MPI, clean_env,
                                    kill_session, script)

if UNDER_MPI:
    pytest.skip("launcher tests start their own jobs; they run in the "
                "single-process phase, not inside an MPI rank",
                allow_module_level=True)

# find_spec, not import: Ray takes seconds to import and every rank of
# the mpiexec test phase collects this module too.  The job itself runs
# in a subprocess, which reports an ImportError in its output.
if importlib.util.find_spec("ray") is None:
    pytest.skip("ray is not installed; pip install -e '.[ray]' to run "
                "the Ray runner tests", allow_module_level=True)


SLOW = 60   # a loaded 2-core machine: catches a hang, not a slow start


@pytest.fixture(scope="module")
def ray_cases(tmp_path_factory):
    results = tmp_path_factory.mktemp("ray") / "results.json"
    env = clean_env(RAY_DISABLE_USAGE_STATS=1)
    proc = subprocess.Popen([sys.executable, script("ray_job.py"),
                             str(results)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    t0 = time.monotonic()
    try:
        out, _ = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        out = ""
    finally:
        # ray.shutdown() stops Ray's daemons; kill whatever of this
        # session is left (only processes this fixture started).
        kill_session(proc.pid)
        proc.wait()
    # results come through a file: Ray's log lines share the stdout
    cases = json.loads(results.read_text()) if results.exists() else {}
    cases["_out"], cases["_secs"] = out, time.monotonic() - t0
    return cases


def test_function_job_environment(ray_cases):
    assert "fn" in ray_cases, ray_cases["_out"][-3000:]
    envs = ray_cases["fn"]
    assert [x for _, x in envs] == [40, 40]
    (e0, _), (e1, _) = envs
    assert (e0["RANK"], e1["RANK"]) == ("0", "1")
    assert e0["WORLD_SIZE"] == e1["WORLD_SIZE"] == "2"
    assert (e0["LOCAL_RANK"], e1["LOCAL_RANK"]) == ("0", "1")
    assert e0["LOCAL_WORLD_SIZE"] == "2"
    assert e0["MASTER_ADDR"] == e1["MASTER_ADDR"]
    assert e0["MASTER_PORT"] == e1["MASTER_PORT"]
    assert e0["DTORCH_RDZV_TOKEN"] == e1["DTORCH_RDZV_TOKEN"]
    assert len(e0["DTORCH_RDZV_TOKEN"]) == 32
    assert e0["DTORCH_BACKEND"] == "tcp"
    assert e0["DTORCH_RESTART_COUNT"] == "0"
    assert e0["OMP_NUM_THREADS"] == "1"


def test_script_job_through_cli(ray_cases):
    # dtorch-launch --runner ray: the script ranks rendezvous through the
    # address/port that Ray's rank-0 actor chose
    assert ray_cases.get("cli_rc") == 0, ray_cases["_out"][-3000:]
    assert "JOINED 0 1" in ray_cases["cli_log0"]
    assert "rank 1 joined" in ray_cases["cli_log1"]


@pytest.mark.parametrize("case,rank,text", [
    ("fn_fail", 1, "raised ValueError: rank 1 is broken"),
    ("script_fail", 0, "exited with code 3"),
])
def test_failure_names_rank(ray_cases, case, rank, text):
    got = ray_cases.get(case)
    assert isinstance(got, dict), ray_cases["_out"][-3000:]
    assert got["rank"] == rank
    assert f"rank {rank} failed" in got["msg"] and text in got["msg"]
    assert got["secs"] < SLOW


def test_forwarded_output_has_no_colour_codes(ray_cases):
    # the driver's stdout is a pipe here (a log file in real use): Ray's
    # "(_Rank pid=...)" prefixes must come without escape codes
    assert "(_Rank pid=" in ray_cases["_out"], ray_cases["_out"][-3000:]
    assert "\x1b[" not in ray_cases["_out"], ray_cases["_out"][-3000:]
