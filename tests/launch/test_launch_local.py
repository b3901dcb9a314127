"""dtorch-launch, local runner: environment contract, output, multi-node
on loopback, failure handling, signals, restarts.  Every test runs the
real launcher as a subprocess and checks the process table afterwards."""
import json
import os
import re
import signal
import time

import pytest

from launch import env as renv
from launch_scripts.harness import (UNDER_MPI, assert_gone, clean_env,
                                    finish, kill_session, launch,
                                    reported_pids, script, start)

if UNDER_MPI:
    pytest.skip("launcher tests start their own jobs; they run in the "
                "single-process phase, not inside an MPI rank",
                allow_module_level=True)

pytestmark = pytest.mark.timeout(180)

# Deadlines carry the margin of a loaded 2-core machine (CI runs up to
# several test sessions at once): they catch a hang or a missed stop, not
# a slow start.  SLOW is what a job that "fails at once" may take.
SLOW = 60


def env_lines(out):
    return {int(d["RANK"]): d for d in
            (json.loads(m) for m in re.findall(r"ENV (\{.*\})", out))}


@pytest.mark.parametrize("nproc", [2, 3])
def test_rank_environment(nproc):
    rc, out, err, _ = launch(["--nproc-per-node", str(nproc), "--backend",
                              "tcp", script("print_env.py")])
    assert rc == 0, err
    envs = env_lines(out)
    assert sorted(envs) == list(range(nproc))
    threads = str(renv.thread_budget(renv.cpu_count(), nproc))
    ports = {e["MASTER_PORT"] for e in envs.values()}
    tokens = {e["DTORCH_RDZV_TOKEN"] for e in envs.values()}
    assert len(ports) == 1 and len(tokens) == 1
    assert re.fullmatch(r"[0-9a-f]{32}", tokens.pop())
    for rank, e in envs.items():
        assert e["WORLD_SIZE"] == str(nproc)
        assert e["LOCAL_RANK"] == str(rank)
        assert e["LOCAL_WORLD_SIZE"] == str(nproc)
        assert e["MASTER_ADDR"] == "127.0.0.1"
        assert e["DTORCH_RESTART_COUNT"] == "0"
        assert e["DTORCH_BACKEND"] == "tcp"
        for var in renv.THREAD_VARS:
            assert e[var] == threads
    # every line of a rank carries its prefix
    for line in out.splitlines():
        assert re.match(r"\[rank \d\] ENV ", line), line


def test_user_thread_setting_wins_and_tokens_differ_per_job():
    env = clean_env(OMP_NUM_THREADS=7)
    first = env_lines(launch(["--nproc-per-node", "2",
                              script("print_env.py")], env=env)[1])
    second = env_lines(launch(["--nproc-per-node", "2",
                               script("print_env.py")], env=env)[1])
    assert first[0]["OMP_NUM_THREADS"] == "7"
    assert first[1]["OPENBLAS_NUM_THREADS"] != "7"
    assert first[0]["DTORCH_RDZV_TOKEN"] != second[0]["DTORCH_RDZV_TOKEN"]


def test_only_rank0_output_and_log_dir(tmp_path):
    rc, out, err, _ = launch(["--nproc-per-node", "3", "--only-rank0-output",
                              "--log-dir", str(tmp_path),
                              script("rendezvous.py")])
    assert rc == 0, err
    assert "[rank 0] JOINED 0 1 2" in out
    assert "[rank 1]" not in out and "[rank 2]" not in out
    for rank in (1, 2):
        log = (tmp_path / f"rank{rank}.log").read_text()
        assert f"rank {rank} joined" in log


def test_module_target(tmp_path):
    # -m: the target is a module (found through the working directory)
    (tmp_path / "hello_mod.py").write_text(
        "import os; print('MOD', os.environ['RANK'])\n")
    env = clean_env(PYTHONPATH=str(tmp_path))
    rc, out, err, _ = launch(["--nproc-per-node", "2", "-m", "hello_mod"],
                             env=env)
    assert rc == 0, err
    assert "[rank 0] MOD 0" in out and "[rank 1] MOD 1" in out


def test_two_launchers_form_one_job():
    # multi-node on loopback: node 0 and node 1, 2 ranks each
    port = renv.free_port()
    env = clean_env(DTORCH_RDZV_TOKEN=renv.new_token())
    common = ["--nnodes", "2", "--nproc-per-node", "2",
              "--master-port", str(port)]
    node0 = start(common + ["--node-rank", "0", script("rendezvous.py")],
                  env)
    node1 = start(common + ["--node-rank", "1", script("rendezvous.py")],
                  env)
    out0, err0 = finish(node0, SLOW)
    out1, err1 = finish(node1, SLOW)
    assert node0.returncode == 0 and node1.returncode == 0, err0 + err1
    assert "[rank 0] JOINED 0 1 2 3" in out0
    assert "[rank 2] rank 2 joined" in out1
    assert "[rank 3] rank 3 joined" in out1


def test_multi_node_needs_port_and_secret():
    rc, _, err, _ = launch(["--nnodes", "2", script("print_env.py")])
    assert rc != 0 and "--master-port" in err
    rc, _, err, _ = launch(["--nnodes", "2", "--master-port", "29999",
                            script("print_env.py")])
    assert rc != 0 and "DTORCH_RDZV_TOKEN" in err


def _check_failure(args, rank, how, code, extra=()):
    t0 = time.monotonic()
    rc, out, err, secs = launch(["--nproc-per-node", "3"] + list(extra)
                                + [script("fail.py")] + args + ["--child"])
    pids = reported_pids(out)
    assert len(pids["PID"]) == 3 and len(pids["CHILD"]) == 3, out
    # the launcher returns only once its ranks are gone (zombies count as
    # gone: an orphan's reaping by PID 1 can lag)
    assert_gone(list(pids["PID"].values()) + list(pids["CHILD"].values()),
                within=5)
    assert rc == code, err
    assert f"rank {rank} (local rank {rank}" in err and how in err, err
    # the tail of the failed rank's output
    assert f"    | rank {rank} fails now" in err
    # fails 0.5 s after start; the rest is teardown
    assert secs < SLOW, f"launcher took {secs:.1f} s"
    return err, time.monotonic() - t0


def test_rank_exit_code_stops_job():
    _check_failure(["1", "exit", "3"], 1, "exited with code 3", 3)


def test_rank_sigkill_stops_job():
    _check_failure(["2", "kill", "SIGKILL"], 2,
                   "was killed by SIGKILL (signal 9)", 128 + 9)


def test_rank_ignoring_sigterm_is_killed_after_grace():
    err, secs = _check_failure(["0", "exit", "4", "--ignore-term"], 0,
                               "exited with code 4",
                               4, extra=["--grace-period", "1"])
    assert 1.0 < secs < SLOW


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_to_launcher_reaches_every_rank(sig):
    proc = start(["--nproc-per-node", "2", script("fail.py"), "0", "none",
                  "--child"])
    seen = ""
    try:
        seen = wait_for_ranks(proc, 2)
        t0 = time.monotonic()
        os.kill(proc.pid, sig)
        out, err = finish(proc, SLOW)
    finally:
        kill_session(proc.pid)  # no-op unless the test failed
    secs = time.monotonic() - t0
    pids = reported_pids(seen + out)
    assert_gone(list(pids["PID"].values()) + list(pids["CHILD"].values()),
                within=5)
    assert proc.returncode == 128 + sig, err
    assert signal.Signals(sig).name in err
    assert "passing it to the 2 ranks" in err
    assert secs < SLOW


def test_restart_resumes_from_checkpoint(tmp_path):
    rc, out, err, secs = launch(["--nproc-per-node", "2", "--max-restarts",
                                 "1", script("resume.py"), str(tmp_path),
                                 "10", "4"])
    assert rc == 0, err
    assert "rank 1 (local rank 1" in err and "exited with code 7" in err
    assert "restarting the job (1 of 1 restarts)" in err
    results = {int(r): (int(t), int(s), int(n)) for r, t, s, n in
               re.findall(r"RESULT (\d) (\d+) (\d+) (\d+)", out)}
    # totals as if nothing had failed: sum (step + 1) * (rank + 1)
    assert results[0][0] == 55 and results[1][0] == 110
    assert results[1][1] == 4          # rank 1 resumed at its crash step
    assert results[0][2] == results[1][2] == 1
    starts = re.findall(r"restart (\d) starts at step \d+ port (\d+) "
                        r"token (\w+)", out)
    by_restart = {n: (p, t) for n, p, t in starts}
    assert by_restart["0"] != by_restart["1"]   # new port and token
    assert by_restart["0"][0] != by_restart["1"][0]
    assert by_restart["0"][1] != by_restart["1"][1]


def test_restarts_exhausted(tmp_path):
    rc, out, err, _ = launch(["--nproc-per-node", "2", "--max-restarts",
                              "1", "--log-dir", str(tmp_path),
                              script("fail.py"), "0", "exit", "5"])
    assert rc == 5
    assert "giving up after 1 restarts" in err
    assert out.count("[rank 0] rank 0 fails now") == 2
    log = (tmp_path / "rank0.log").read_text()
    assert "restart 0" in log and "restart 1" in log


def wait_for_ranks(proc, n, timeout=SLOW):
    """The launcher's stdout up to the n-th `is up` line of fail.py."""
    seen = ""
    deadline = time.monotonic() + timeout
    while seen.count("is up") < n and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen += line
    assert seen.count("is up") == n, seen
    return seen


def test_sigkilled_launcher_leaves_no_rank_behind():
    # ranks that ignore SIGTERM (their parent-death signal) and children
    # of ranks must still go when the launcher is SIGKILLed
    proc = start(["--nproc-per-node", "2", "--grace-period", "1",
                  script("fail.py"), "-1", "none", "--child",
                  "--ignore-term"])
    pids = []
    try:
        seen = wait_for_ranks(proc, 2)
        found = reported_pids(seen)
        pids = list(found["PID"].values()) + list(found["CHILD"].values())
        assert len(pids) == 4, seen
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=SLOW)
        # grace 1 s, then SIGKILL: the rest is the margin of a busy host
        assert_gone(pids, within=SLOW)
    finally:
        for pid in pids:     # only if the test failed: the ranks it made
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        kill_session(proc.pid)


@pytest.mark.parametrize("nproc,says", [
    (1, "rank 0 (local rank 0, pid {pid}) exited with code 3\n"),
    (2, "exited with code 3; stopping the other running rank\n"),
    (3, "exited with code 3; stopping the other 2 running ranks\n")])
def test_failure_report_counts_the_other_ranks(nproc, says):
    rc, out, err, _ = launch(["--nproc-per-node", str(nproc),
                              script("fail.py"), "0", "exit", "3"])
    assert rc == 3, err
    pid = reported_pids(out)["PID"][0]
    assert says.format(pid=pid) in err, err
    assert "(s)" not in err and "other 0" not in err


@pytest.mark.parametrize("args,says", [
    (["--nproc-per-node", "0"], "--nproc-per-node must be >= 1 (got 0)"),
    (["--nproc-per-node", "-2"], "--nproc-per-node must be >= 1 (got -2)"),
    (["--nnodes", "0"], "--nnodes must be >= 1 (got 0)"),
    (["--max-restarts", "-1"], "--max-restarts must be >= 0 (got -1)")])
def test_bad_counts_are_rejected(args, says):
    rc, out, err, _ = launch(args + [script("print_env.py")])
    assert rc == 2 and says in err, err
    assert "ENV" not in out        # no rank ran


def test_no_arguments_prints_usage_and_an_example():
    rc, out, err, _ = launch([])
    assert rc == 2
    assert err.startswith("usage: dtorch-launch")
    assert "no training script given" in err
    assert "required: script, args" not in err
    assert "example: dtorch-launch --nproc-per-node 2 " in err


@pytest.mark.parametrize("runner", ["local", "mpi", "ray", "slurm"],
                         ids=["local", "mpiexec", "ray", "srun"])
def test_missing_script_is_one_line_before_any_rank(tmp_path, runner):
    missing = str(tmp_path / "no_such_train.py")
    rc, out, err, _ = launch(["--runner", runner, "--nproc-per-node", "2",
                              missing, "--epochs", "1"])
    assert rc == 1 and out == ""
    assert err.splitlines() == [
        f"dtorch-launch: training script {missing!r} does not exist "
        f"(looked in {os.getcwd()})"], err
    rc, out, err, _ = launch(["--runner", runner, str(tmp_path)])
    assert rc == 1 and err.count("\n") == 1 and "is a directory" in err


def test_help_describes_every_option():
    from launch.cli import build_parser
    undocumented = [a.option_strings or a.dest
                    for a in build_parser()._actions if not a.help]
    assert undocumented == []
    rc, out, err, _ = launch(["--help"])
    assert rc == 0
    assert re.search(r"--runner \{local,mpi,ray,slurm\}\s+how the ranks "
                     r"start", out), out
