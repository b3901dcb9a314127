"""dtorch-launch --runner slurm --elastic / --join on a REAL SLURM (the
single-node cluster of slurm/local-cluster.sh that tests/launch/
test_slurm.py's fixture starts; root, else skipped with the reason).

The job's launcher runs in the batch step, hosts the store and starts one
job step per node (a local elastic launcher of that node's ranks). The
schedule: 3 ranks -> one SIGKILLed -> 2 -> a joiner as a new sbatch job
(`--runner slurm --join`) and one as a new step of the job's own
allocation (`srun --jobid J --overlap dtorch-launch --join`) -> 4 -> the
sbatch joiner's node step SIGKILLed by `scancel --signal=KILL J.0` -> 3
survivors, which keep their pids, train every sample once per epoch, and
the job COMPLETES. Then slurm/README.md's elastic lines as written.
"""
import os
import re
import secrets
import subprocess
import sys
import time

import pytest

from launch_scripts.harness import ROOT, UNDER_MPI, assert_gone

if UNDER_MPI:
    pytest.skip("launcher tests start their own jobs; they run in the "
                "single-process phase, not inside an MPI rank",
                allow_module_level=True)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_elastic import (_check_exactly_once, _events,  # noqa: E402
                          _one_start_per_member)
from test_slurm import (SLOW, job_info, node_name, sbatch,  # noqa: E402,F401
                        slurm_env, wait_job)
# the two-node cluster (namespace nodes) of test_slurm_nodes.py
from test_slurm_nodes import cluster  # noqa: E402,F401

pytestmark = pytest.mark.timeout(400)
SCRIPT = os.path.join(ROOT, "tests", "launch", "elastic_train.py")
DONE = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL",
        "OUT_OF_MEMORY")


class Jobs:
    """The jobs a test submitted: cancelled if still there at the end,
    and waited for until none of their steps is left (no slurmstepd
    outlives the test)."""

    def __init__(self, env):
        self.env, self.ids = env, []

    def submit(self, args, **extra):
        job = sbatch(self.env, args, **extra)
        self.ids.append(job)
        return job

    def close(self):
        for job in self.ids:
            if job_info(self.env, job).get("JobState") not in DONE:
                subprocess.run(["scancel", job], env=self.env, timeout=30)
        end = time.monotonic() + SLOW
        while time.monotonic() < end and self.steps():
            time.sleep(0.2)
        assert not self.steps(), self.steps()

    def steps(self):
        out = subprocess.run(["squeue", "-h", "-s", "-o", "%i"],
                             env=self.env, capture_output=True, text=True,
                             timeout=30).stdout.split()
        return [s for s in out if s.split(".")[0] in self.ids]


@pytest.fixture
def jobs(slurm_env):
    j = Jobs(slurm_env)
    yield j
    j.close()


def _wait_text(path, text, job, env, timeout=SLOW):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if path.exists() and text in path.read_text():
            return
        if job_info(env, job).get("JobState") in DONE:
            break
        time.sleep(0.1)
    raise AssertionError(f"no {text!r} in {path}:\n"
                         + (path.read_text() if path.exists() else ""))


def _wait_done(log, step, n, timeout=SLOW):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if log.exists() and sum(e["event"] == "done" and e["step"] == step
                                for e in _events(log)) >= n:
            return
        time.sleep(0.1)
    raise AssertionError(f"fewer than {n} ranks did step {step}")


def test_slurm_elastic_shrink_two_joiners_and_a_lost_step(slurm_env, jobs,
                                                          tmp_path):
    env = dict(slurm_env, PYTHONPATH=ROOT, PYTHONUNBUFFERED="1",
               DTORCH_RDZV_TOKEN=secrets.token_hex(16),
               DTORCH_ELASTIC_FORM_TIMEOUT="6")
    log, flag = tmp_path / "steps.jsonl", tmp_path / "go"
    port = str(20000 + secrets.randbelow(20000))
    node = node_name(slurm_env)
    script = [SCRIPT, "--samples", "96", "--epochs", "2", "--log", str(log),
              "--kill", "1:1", "--hold", f"3:join2,6:{flag}"]
    launch = [sys.executable, "-m", "launch"]
    main = jobs.submit(["-n1", f"--output={tmp_path}/main-%j.out", "--wrap",
                        " ".join(launch + [
                            "--runner", "slurm", "--elastic", "2:5",
                            "--nproc-per-node", "3", "--master-port",
                            port] + script)], **env)
    out = tmp_path / f"main-{main}.out"
    _wait_text(out, "elastic round 1:", main, env)
    joiner = jobs.submit(["-n1", f"--output={tmp_path}/join-%j.out",
                          "--wrap", " ".join(launch + [
                              "--runner", "slurm", "--join", "--master-addr",
                              node, "--master-port", port,
                              "--nproc-per-node", "1"] + script)], **env)
    # the second joiner: a new step of the job's own allocation
    step = subprocess.Popen(
        ["srun", f"--jobid={main}", "--overlap", "-N1", "-n1"] + launch + [
            "--join", "--master-addr", node, "--master-port", port,
            "--nproc-per-node", "1"] + script,
        env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)
    try:
        _wait_text(out, "elastic round 2:", main, env)
        _wait_done(log, 5, 4)          # all 4 at the hold of step 6
        # the sbatch joiner's node step (step 0 of its job), as if its
        # node were lost: its launcher and rank die without a word
        subprocess.run(["scancel", "--signal=KILL", f"{joiner}.0"],
                       env=env, check=True, timeout=30)
        _wait_text(out, "elastic round 3:", main, env)
        flag.write_text("go")
        info = wait_job(env, main, timeout=2 * SLOW)
        step_out, _ = step.communicate(timeout=SLOW)
    finally:
        if step.poll() is None:
            step.kill()
            step.wait()
    text = out.read_text()
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", \
        text
    assert step.returncode == 0, step_out
    jinfo = wait_job(env, joiner)
    assert jinfo["JobState"] != "COMPLETED", jinfo
    assert "one job step per node" in text, text
    assert ("elastic round 1: lost rank 1 (member 1: was killed by SIGKILL"
            in text and "new world size 2 (was 3)" in text), text
    assert re.search(r"elastic round 2: 2 joined \(member\(s\) 3, 4\); "
                     r"new world size 4 \(was 2\)", text), text
    lost = re.search(r"elastic round 3: lost rank \d \(member (\d): its "
                     r"connection to the store closed", text)
    assert lost and "new world size 3 (was 4)" in text, text
    ev = _events(log)
    pids = _one_start_per_member(ev)
    assert sorted(pids) == [0, 1, 2, 3, 4]
    gone = int(lost.group(1))
    ends = sorted(e["uid"] for e in ev if e["event"] == "end")
    assert ends == sorted({0, 2, 3, 4} - {gone}), (ends, gone)
    _check_exactly_once(ev, 96, 2)
    assert_gone(list(pids.values()), within=10)


def test_slurm_elastic_refusals(slurm_env, tmp_path):
    """Outside an allocation, and with a rank count outside MIN:MAX, the
    launcher refuses before anything starts, saying why."""
    env = dict(slurm_env, PYTHONPATH=ROOT)
    cmd = [sys.executable, "-m", "launch", "--runner", "slurm", "--elastic",
           "2:4", "--nproc-per-node", "2", SCRIPT]
    out = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True,
                         text=True, timeout=SLOW)
    assert out.returncode != 0
    assert "runs inside a SLURM allocation (sbatch or salloc)" in out.stderr
    out = subprocess.run(["salloc", "-n1"] + cmd[:-2] + ["5", SCRIPT],
                         env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=SLOW)
    assert out.returncode != 0
    assert "the job starts with 5 ranks (1 node(s) x 5), outside MIN:MAX" \
        in out.stderr, out.stderr


def test_slurm_elastic_two_nodes_node_step_lost_then_a_joiner(
        cluster, tmp_path):
    """`sbatch -N 2` on the two-node cluster (namespace nodes): one job
    step per node; node1's step SIGKILLed -> node0's 2 ranks go on, with
    ZeRO-1 (each shard's buddy is on the other node) -> a joiner job on
    node1 -> 3 ranks; the job COMPLETES."""
    env = dict(cluster, PYTHONPATH=ROOT, PYTHONUNBUFFERED="1",
               DTORCH_RDZV_TOKEN=secrets.token_hex(16),
               DTORCH_ELASTIC_FORM_TIMEOUT="6")
    jobs = Jobs(env)
    log, flag = tmp_path / "steps.jsonl", tmp_path / "go"
    port = str(20000 + secrets.randbelow(20000))
    script = [SCRIPT, "--samples", "96", "--epochs", "2", "--log", str(log),
              "--zero", "--hold", f"3:{flag},5:join1"]
    launch = [sys.executable, "-m", "launch"]
    try:
        main = jobs.submit(["-N", "2", "--ntasks-per-node=1",
                            f"--output={tmp_path}/main-%j.out", "--wrap",
                            " ".join(launch + [
                                "--runner", "slurm", "--elastic", "2:5",
                                "--nproc-per-node", "2", "--master-port",
                                port] + script)])
        out = tmp_path / f"main-{main}.out"
        _wait_done(log, 2, 4)
        steps = dict(line.split() for line in subprocess.run(
            ["squeue", "-h", "-s", "-j", main, "-o", "%N %i"], env=env,
            capture_output=True, text=True, timeout=30).stdout.splitlines())
        assert {"node0", "node1"} <= set(steps), steps
        subprocess.run(["scancel", "--signal=KILL", steps["node1"]],
                       env=env, check=True, timeout=30)
        flag.write_text("go")
        _wait_text(out, "elastic round 1:", main, env)
        joiner = jobs.submit(["-N", "1", "--nodelist=node1",
                              f"--output={tmp_path}/join-%j.out", "--wrap",
                              " ".join(launch + [
                                  "--runner", "slurm", "--join",
                                  "--master-addr", "node0", "--master-port",
                                  port, "--nproc-per-node", "1"] + script)])
        _wait_text(out, "elastic round 2:", main, env)
        info = wait_job(env, main, timeout=2 * SLOW)
        jinfo = wait_job(env, joiner, timeout=SLOW)
    finally:
        jobs.close()
    text = out.read_text()
    assert info["JobState"] == "COMPLETED", text
    assert jinfo["JobState"] == "COMPLETED", \
        (tmp_path / f"join-{joiner}.out").read_text()
    assert "on 2 node(s) of SLURM job" in text, text
    assert "node 1 (node1): its job step (srun pid" in text and \
        "elastic: the other nodes go on" in text, text
    assert ("lost rank 2 (member 2: its connection to the store closed"
            in text and "new world size 2 (was 4)" in text), text
    assert "elastic round 2: 1 joined (member(s) 4); new world size 3" \
        in text, text
    ev = _events(log)
    pids = _one_start_per_member(ev)
    assert sorted(pids) == [0, 1, 2, 3, 4]
    assert sorted(e["uid"] for e in ev if e["event"] == "end") == [0, 1, 4]
    _check_exactly_once(ev, 96, 2)
