"""slurm/*.sbatch and the slurm/mpi runners against a REAL single-node
SLURM (munged + slurmctld + slurmd) started by slurm/local-cluster.sh.

The session fixture starts the cluster (installing Debian's packages when
they are missing) and stops it at the end, unless SLURM_CONF already
points at a running one.  Without root or apt-get the tests are skipped,
except under CI=true, where that is an error.  Jobs are waited for by
polling (sbatch --wait polls too slowly) and cancelled on timeout."""
import contextlib
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from launch import env as renv
from launch_scripts.harness import (ROOT, UNDER_MPI, assert_gone,
                                    clean_env, reported_pids, script)

if UNDER_MPI:
    pytest.skip("launcher tests start their own jobs; they run in the "
                "single-process phase, not inside an MPI rank",
                allow_module_level=True)

CLUSTER = os.path.join(ROOT, "slurm", "local-cluster.sh")
# The fixture may have to install SLURM first (~20 s on a fresh machine);
# jobs share 2 loaded cores with other test sessions.
pytestmark = pytest.mark.timeout(300)
# Deadlines catch a hung job, not a slow one: the margin of a loaded
# 2-core machine (a job that "fails at once" took 12 s and more there).
SLOW = 90
SLURM_BINARIES = ("slurmctld", "slurmd", "sinfo", "srun", "sbatch",
                  "munged", "munge")


def _in_ci():
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _missing(path=None):
    return [b for b in SLURM_BINARIES if not shutil.which(b, path=path)]


def _can_start(environ=None, path=None):
    e = os.environ if environ is None else environ
    if os.geteuid() != 0:
        return "needs root"
    if not _missing(path):
        return None
    if e.get("SLURM_LOCAL_NO_INSTALL") == "1":
        return ("SLURM is not installed and SLURM_LOCAL_NO_INSTALL=1 "
                "forbids installing it")
    if not shutil.which("apt-get", path=path):
        return "SLURM is not installed and apt-get is not available"
    return None


def install_notice(environ=None, path=None):
    """What the fixture prints before local-cluster.sh apt-installs SLURM
    (None when nothing is missing)."""
    missing = _missing(path)
    if not missing:
        return None
    return ("tests/launch/test_slurm.py: SLURM is not installed (no "
            f"{', '.join(missing)}): slurm/local-cluster.sh now installs "
            "slurmctld, slurmd, slurm-client, munge and libpmix with "
            "apt-get (~25 Debian packages with their dependencies, 10-20 "
            "s); SLURM_LOCAL_NO_INSTALL=1 skips the SLURM tests instead")


def tell_terminal(config, text):
    """Print a line on the terminal now, past pytest's output capture
    (a fixture's print would only show if a test failed)."""
    plugins = config.pluginmanager
    reporter = plugins.get_plugin("terminalreporter")
    capture = plugins.get_plugin("capturemanager")
    if reporter is None:
        print(text, file=sys.__stderr__, flush=True)
    elif capture is None:
        reporter.write_line(text, yellow=True)
    else:
        with capture.global_and_fixture_disabled():
            reporter.write_line(text, yellow=True)


def cluster_dir_of(env):
    """The cluster's DIR: SLURM_LOCAL_DIR, else local-cluster.sh's own per
    user and clone (so two users or CI checkouts on a host never meet)."""
    return env.get("SLURM_LOCAL_DIR") or subprocess.run(
        ["bash", CLUSTER, "dir"], env=env, capture_output=True, text=True,
        check=True, timeout=30).stdout.strip()


@pytest.fixture(scope="session")
def slurm_env(pytestconfig):
    """Environment (SLURM_CONF & co.) of a running local cluster."""
    env = clean_env(PYTHON=sys.executable)
    if env.get("SLURM_CONF") and subprocess.run(
            ["bash", CLUSTER, "status"], env=env, capture_output=True,
            timeout=30).returncode == 0:
        yield env            # started by the caller (e.g. .ci/run)
        return
    why = _can_start()
    if why:
        if _in_ci():
            pytest.fail(f"CI=true but a local SLURM cannot start: {why}")
        pytest.skip(f"local SLURM cluster: {why} (CI=true makes this an "
                    "error)")
    # 4 CPUs declared on a 2-core machine: room for the 4-task DP x TP
    # job (SlurmdParameters=config_overrides allows it)
    env.setdefault("SLURM_LOCAL_CPUS", str(max(4, os.cpu_count() or 1)))
    cluster_dir = cluster_dir_of(env)
    notice = install_notice()
    if notice:
        tell_terminal(pytestconfig, notice)
    start = ["bash", CLUSTER, "start", cluster_dir]
    stop = ["bash", CLUSTER, "stop", cluster_dir]
    with shared_cluster(cluster_dir, env, start, stop, timeout=240) as out:
        for name, value in re.findall(r"^export (\w+)=(.*)$", out, re.M):
            env[name] = value
        yield env


@contextlib.contextmanager
def shared_cluster(cluster_dir, env, start, stop, timeout):
    """Run `start` (a no-op when the cluster already runs), yield its
    stdout, and run `stop` only if no other session still uses the cluster.

    Test sessions on one machine (two xdist workers, two checkouts' CI, a
    second fixture of the same cluster in one process) share it: each holds
    DIR.lock shared while it uses it; start and stop happen under
    DIR.start-lock, and the last one out is the one whose exclusive try on
    DIR.lock succeeds.  (One exclusive lock for start, held against the
    others' shared ones, left a second session waiting for the first one's
    end: CI timed out on it.)"""
    base = cluster_dir.rstrip("/")
    use, mutex = open(base + ".lock", "w"), open(base + ".start-lock", "w")
    try:
        fcntl.flock(mutex, fcntl.LOCK_EX)
        try:
            fcntl.flock(use, fcntl.LOCK_SH)
            out = subprocess.run(start, env=env, capture_output=True,
                                 text=True, timeout=timeout)
        finally:
            fcntl.flock(mutex, fcntl.LOCK_UN)
        if out.returncode != 0:
            pytest.fail(f"{' '.join(start[1:])} failed:\n{out.stderr}")
        yield out.stdout
    finally:
        fcntl.flock(mutex, fcntl.LOCK_EX)
        try:
            fcntl.flock(use, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pass             # another session still uses it
        else:
            subprocess.run(stop, env=env, capture_output=True, timeout=120)
        finally:
            use.close()
            mutex.close()


def node_name(env):
    return env.get("SLURM_LOCAL_NODE") or subprocess.run(
        ["hostname", "-s"], capture_output=True, text=True).stdout.strip()


def sbatch(env, args, **extra):
    run_env = dict(env, **{k: str(v) for k, v in extra.items()})
    out = subprocess.run(["sbatch", "--parsable"] + list(args), cwd=ROOT,
                         env=run_env, capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().split(";")[0]


def job_info(env, job):
    out = subprocess.run(["scontrol", "show", "job", job, "-o"], env=env,
                         capture_output=True, text=True, timeout=30)
    return dict(re.findall(r"(\w+)=(\S+)", out.stdout))


def wait_job(env, job, timeout=SLOW, until=("COMPLETED", "FAILED",
                                          "CANCELLED", "TIMEOUT",
                                          "NODE_FAIL", "OUT_OF_MEMORY")):
    """Poll until the job reaches a state in `until`; scancel on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = job_info(env, job)
        if info.get("JobState") in until:
            return info
        time.sleep(0.1)
    subprocess.run(["scancel", job], env=env, timeout=30)
    raise AssertionError(f"job {job} not done after {timeout} s: "
                         f"{job_info(env, job)}")


def cluster_cpus(env):
    out = subprocess.run(["sinfo", "-h", "-o", "%c"], env=env,
                         capture_output=True, text=True, timeout=30)
    cpus = out.stdout.split()
    return int(cpus[0].rstrip("+")) if cpus else 0


@pytest.fixture(scope="module")
def batch_jobs(slurm_env, tmp_path_factory):
    """Submit the sbatch jobs at once (the two 2-task jobs share the
    4-CPU node; the 4-task one follows): {name: (job id, output path)}."""
    out = tmp_path_factory.mktemp("sbatch")
    jobs = {}

    def submit(name, args, **extra):
        job = sbatch(slurm_env, [f"--output={out}/{name}-%j.out"] + args,
                     **extra)
        jobs[name] = (job, out / f"{name}-{job}.out")

    # README's line as shown: the script's own size (2 tasks, TP 2)
    submit("tp_digits", ["slurm/train_tp.sbatch", "--epochs", "2",
                         "--quiet", "--checkpoint",
                         str(out / "tp_digits.safetensors")])
    submit("train", ["--ntasks=2", "--ntasks-per-node=2",
                     "slurm/train.sbatch", "x", "y"],
           SCRIPT=script("mpi_allreduce.py"))
    submit("fail", ["--ntasks=2", "--ntasks-per-node=2",
                    "slurm/train.sbatch", "1", "exit", "3", "--child"],
           SCRIPT=script("fail.py"))
    if cluster_cpus(slurm_env) >= 4:
        submit("tp", ["--ntasks=4", "--ntasks-per-node=4",
                      "slurm/train_tp.sbatch"],
               SCRIPT=script("mpi_allreduce.py"), TP_SIZE=2)
    yield jobs
    for job, _ in jobs.values():   # only if a test gave up on it
        if job_info(slurm_env, job).get("JobState") in ("PENDING",
                                                         "RUNNING"):
            subprocess.run(["scancel", job], env=slurm_env, timeout=30)


def test_train_sbatch_two_tasks(slurm_env, batch_jobs):
    job, log = batch_jobs["train"]
    info = wait_job(slurm_env, job)
    out = log.read_text()
    assert info["JobState"] == "COMPLETED", out
    assert info["ExitCode"] == "0:0"
    node = node_name(slurm_env)
    for rank in (0, 1):
        assert (f"ALLREDUCE rank={rank} size=2 sum=3 RANK={rank} "
                f"WORLD_SIZE=2 MASTER_ADDR={node} args=x y") in out, out
    assert "srun exited with code 0" in out


def test_train_tp_sbatch_four_tasks(slurm_env, batch_jobs):
    if "tp" not in batch_jobs:
        pytest.skip("the running cluster has fewer than 4 CPUs, the "
                    "DP x TP job needs 4 (start it with SLURM_LOCAL_CPUS=4)")
    job, log = batch_jobs["tp"]
    info = wait_job(slurm_env, job)
    out = log.read_text()
    assert info["JobState"] == "COMPLETED", out
    assert "TP 2 x DP 2" in out
    assert out.count("size=4 sum=10") == 4, out
    assert "args=--tp-size 2" in out


def test_train_tp_sbatch_as_shown_fits_a_two_cpu_cluster(slurm_env,
                                                         batch_jobs):
    # `sbatch slurm/train_tp.sbatch` as README and slurm/README show it,
    # on the local cluster they show it with (CPUs = nproc: 2 on CI)
    job, log = batch_jobs["tp_digits"]
    info = wait_job(slurm_env, job, timeout=2 * SLOW)
    out = log.read_text()
    assert int(info["NumCPUs"]) <= 2, info
    assert info["JobState"] == "COMPLETED", out
    assert "script examples/tp_digits.py, TP 2 x DP 1" in out
    acc = re.findall(r"final test accuracy ([\d.]+)% on 2 ranks "
                     r"\(DP 1 x TP 2\)", out)
    assert acc and float(acc[0]) > 80.0, out
    assert "it/s" not in out and "\r" not in out   # no progress bars


def test_impossible_request_is_refused_at_once(slurm_env):
    # more CPUs than the cluster has: sbatch fails loudly instead of
    # leaving the job PENDING (PartitionConfig) forever
    too_many = cluster_cpus(slurm_env) + 1
    out = subprocess.run(["sbatch", "--parsable", f"--ntasks={too_many}",
                          "--output=/dev/null", "slurm/train.sbatch"],
                         cwd=ROOT, env=slurm_env, capture_output=True,
                         text=True, timeout=SLOW)
    if out.returncode == 0:    # do not leave it queued
        subprocess.run(["scancel", out.stdout.strip().split(";")[0]],
                       env=slurm_env, timeout=30)
    assert out.returncode != 0, out.stdout
    assert "More processors requested than permitted" in out.stderr


def _secs(stamp):
    return time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S"))


def test_sbatch_rank_failure_fails_job(slurm_env, batch_jobs):
    job, log = batch_jobs["fail"]
    info = wait_job(slurm_env, job)
    out = log.read_text()
    assert info["JobState"] == "FAILED", out
    assert info["ExitCode"] != "0:0"
    assert "rank 1 fails now (exit 3)" in out
    pids = reported_pids(out)
    assert len(pids["PID"]) == 2, out
    assert_gone(list(pids["PID"].values()) + list(pids["CHILD"].values()),
                within=10)
    # rank 1 fails ~1 s after the start; the rest is teardown.  The peer
    # ranks sleep 120 s: ending well before that means the job was ended
    # for the failure, not by the ranks finishing.
    secs = _secs(info["EndTime"]) - _secs(info["StartTime"])
    assert secs < SLOW, f"job took {secs:.0f} s to fail"


def test_sbatch_requeue_on_usr1_resumes(slurm_env, tmp_path):
    job = sbatch(slurm_env, ["--ntasks=2", "--ntasks-per-node=2",
                             f"--output={tmp_path}/%j.out",
                             "slurm/train.sbatch", str(tmp_path)],
                 SCRIPT=script("requeue_job.py"))
    log = tmp_path / f"{job}.out"
    deadline = time.monotonic() + SLOW
    while time.monotonic() < deadline:
        if log.exists() and log.read_text().count("waiting for USR1") == 2:
            break
        time.sleep(0.1)
    else:
        subprocess.run(["scancel", job], env=slurm_env, timeout=30)
        pytest.fail(f"job never started: {job_info(slurm_env, job)}")
    # what SLURM does 90 s before the time limit (--signal=B:USR1@90)
    subprocess.run(["scancel", "--signal=USR1", "--batch", job],
                   env=slurm_env, check=True, timeout=30)
    info = wait_job(slurm_env, job, until=("PENDING",) + (
        "COMPLETED", "FAILED", "CANCELLED"))
    assert info["JobState"] == "PENDING" and info["Restarts"] == "1", info
    # a requeued job waits ~2 min before it is eligible: skip that here
    subprocess.run(["scontrol", "update", f"jobid={job}", "StartTime=now"],
                   env=slurm_env, check=True, timeout=30)
    info = wait_job(slurm_env, job)
    out = log.read_text()
    assert info["JobState"] == "COMPLETED", out
    assert "checkpoint and requeue" in out
    assert out.count("USR1, saved step 5") == 2
    assert "RESUMED rank=0 restart=1 step=5 total=10" in out
    assert "RESUMED rank=1 restart=1 step=5 total=10" in out


def _run(env, cmd, timeout=2 * SLOW):
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=timeout)
    return out.returncode, out.stdout, out.stderr


def test_launch_slurm_runner(slurm_env):
    # outside an allocation srun makes one; the ranks derive MASTER_ADDR
    # from SLURM_NODELIST and MASTER_PORT from the job id
    rc, out, err = _run(slurm_env, [
        sys.executable, "-m", "launch", "--runner", "slurm",
        "--nproc-per-node", "2", "--backend", "tcp",
        script("print_env.py")])
    assert rc == 0, err
    envs = {int(d["RANK"]): d for d in
            (json.loads(m) for m in re.findall(r"ENV (\{.*\})", out))}
    assert sorted(envs) == [0, 1], out
    node = node_name(slurm_env)
    e0, e1 = envs[0], envs[1]
    assert e0["MASTER_ADDR"] == e1["MASTER_ADDR"] == node
    assert e0["MASTER_PORT"] == e1["MASTER_PORT"]
    assert 20000 <= int(e0["MASTER_PORT"]) < 60000
    assert e0["DTORCH_RDZV_TOKEN"] == e1["DTORCH_RDZV_TOKEN"]
    assert (e0["LOCAL_RANK"], e1["LOCAL_RANK"]) == ("0", "1")
    assert e0["WORLD_SIZE"] == e0["LOCAL_WORLD_SIZE"] == "2"
    assert e0["DTORCH_BACKEND"] == "tcp"


def test_launch_mpi_runner_inside_allocation(slurm_env):
    # inside salloc the mpi runner uses srun --mpi=pmix, not mpiexec
    rc, out, err = _run(slurm_env, [
        "salloc", "-n", "2", sys.executable, "-m", "launch", "--runner",
        "mpi", "--nproc-per-node", "2", script("mpi_allreduce.py")])
    assert rc == 0, err
    assert out.count("size=2 sum=3") == 2, out + err
    assert renv.first_host(node_name(slurm_env)) in out


# ---- without a cluster: the start script's interface and the opt-out ----

def test_local_cluster_help_exits_0():
    for flag in ("--help", "-h"):
        out = subprocess.run(["bash", CLUSTER, flag], capture_output=True,
                             text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith("usage: slurm/local-cluster.sh start")
        assert "SLURM_LOCAL_NO_INSTALL" in out.stdout
    out = subprocess.run(["bash", CLUSTER, "bogus"], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 1 and "unknown command 'bogus'" in out.stderr
    assert "usage:" in out.stderr


def test_no_install_opt_out(tmp_path):
    # a PATH without SLURM: the fixture would say what it installs, and
    # SLURM_LOCAL_NO_INSTALL=1 makes the tests skip instead
    empty = str(tmp_path)
    notice = install_notice(path=empty)
    assert "apt-get" in notice and "SLURM_LOCAL_NO_INSTALL=1" in notice
    if os.geteuid() == 0:
        why = _can_start({"SLURM_LOCAL_NO_INSTALL": "1"}, path=empty)
        assert "SLURM_LOCAL_NO_INSTALL=1" in why
    # the start script itself refuses to install (and says why)
    if os.geteuid() == 0:
        env = dict(os.environ, SLURM_LOCAL_NO_INSTALL="1",
                   PATH=f"{empty}:/usr/bin:/bin")
        if _missing(env["PATH"]):
            out = subprocess.run(["bash", CLUSTER, "start",
                                  str(tmp_path / "c")], env=env,
                                 capture_output=True, text=True, timeout=30)
            assert out.returncode == 1, out.stderr
            assert "SLURM_LOCAL_NO_INSTALL=1" in out.stderr


def test_job_output_files_are_ignored_by_git():
    # sbatch run from the repository root leaves its output there
    if shutil.which("git") is None or not os.path.isdir(
            os.path.join(ROOT, ".git")):
        pytest.skip("not a git checkout")
    names = ["dtorch-dtorch-ddp-17.out", "dtorch-dtorch-tp-3.out",
             "slurm-42.out"]
    out = subprocess.run(["git", "check-ignore", "--no-index"] + names,
                         cwd=ROOT, capture_output=True, text=True,
                         timeout=30)
    assert sorted(out.stdout.split()) == sorted(names), out.stderr


def test_install_notice_reaches_the_terminal(tmp_path):
    # the fixture's line must show in a passing run (pytest captures a
    # fixture's plain print and shows it only when a test fails)
    paths = [os.path.dirname(os.path.abspath(__file__)),
             os.path.join(ROOT, "tests")]       # test_slurm, its helpers
    (tmp_path / "test_notice.py").write_text(
        "import sys\n"
        f"sys.path[:0] = {paths!r}\n"
        "import pytest\n"
        "from test_slurm import tell_terminal\n"
        "@pytest.fixture(scope='session')\n"
        "def fx(pytestconfig):\n"
        "    tell_terminal(pytestconfig, 'NOTICE installing SLURM')\n"
        "def test_a(fx):\n"
        "    pass\n")
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p",
                          "no:cacheprovider", str(tmp_path)],
                         cwd=tmp_path, capture_output=True, text=True,
                         timeout=120, env=clean_env())
    assert out.returncode == 0, out.stdout + out.stderr
    assert "NOTICE installing SLURM" in out.stdout, out.stdout


def _conf_ports(conf):
    text = open(conf).read()
    return tuple(re.search(rf"^{k}=(\d+)$", text, re.M).group(1)
                 for k in ("SlurmctldPort", "SlurmdPort"))


def test_cluster_per_user_and_clone(slurm_env, tmp_path):
    """Another checkout on this host (a second CI job) gets its own DIR and
    ports: its cluster runs beside the session's, and stopping it leaves
    the session's alone; a port that something else holds is passed over."""
    other = tmp_path / "checkout"
    shutil.copytree(os.path.join(ROOT, "slurm"), other / "slurm")
    script_b = str(other / "slurm" / "local-cluster.sh")
    env = {k: v for k, v in slurm_env.items()
           if not k.startswith(("SLURM_CONF", "SLURM_LOCAL_"))}
    env["SLURM_LOCAL_CPUS"] = "2"
    dir_b = subprocess.run(["bash", script_b, "dir"], env=env, text=True,
                           capture_output=True, timeout=30).stdout.strip()
    uid = os.geteuid()
    assert re.fullmatch(rf"/tmp/dtorch-slurm-{uid}-[0-9a-f]{{8}}", dir_b)
    assert dir_b != cluster_dir_of(clean_env())
    mine = _conf_ports(slurm_env["SLURM_CONF"])

    def start_b():
        out = subprocess.run(["bash", script_b, "start"], env=env, text=True,
                             capture_output=True, timeout=240)
        assert out.returncode == 0, out.stderr
        assert f"export SLURM_CONF={dir_b}/slurm.conf" in out.stdout
        return _conf_ports(f"{dir_b}/slurm.conf")

    import socket
    try:
        ports_b = start_b()
        assert ports_b != mine and not set(ports_b) & set(mine)
        b_env = dict(env, SLURM_CONF=f"{dir_b}/slurm.conf")
        assert subprocess.run(["sinfo", "-h"], env=b_env, capture_output=True,
                              timeout=30).returncode == 0
        subprocess.run(["bash", script_b, "stop"], env=env, timeout=60,
                       capture_output=True, check=True)
        # its derived port now taken by some other program: the next pair
        with socket.socket() as s:
            # (the stopped slurmctld's connections may sit in TIME_WAIT)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", int(ports_b[0])))
            s.listen()
            again = start_b()
        assert again != ports_b
    finally:
        subprocess.run(["bash", script_b, "stop", "--purge"], env=env,
                       capture_output=True, timeout=60)
    assert not os.path.exists(dir_b)
    assert subprocess.run(["bash", CLUSTER, "status"], env=slurm_env,
                          capture_output=True, timeout=30).returncode == 0


def test_start_on_a_terminal_says_to_eval(slurm_env):
    # a start of the running cluster (no-op) with stdout on a terminal:
    # the exports would be lost, so it explains SLURM_CONF and the eval
    import pty
    master, slave = pty.openpty()
    try:
        out = subprocess.run(["bash", CLUSTER, "start",
                              cluster_dir_of(slurm_env)], env=slurm_env,
                             stdout=slave, stderr=subprocess.PIPE, text=True,
                             timeout=120)
    finally:
        os.close(slave)
        os.close(master)
    assert out.returncode == 0, out.stderr
    assert 'eval "$(bash slurm/local-cluster.sh start)"' in out.stderr
    assert "Could not establish a configuration" in out.stderr
    assert "SLURM_CONF is not set" in out.stderr
