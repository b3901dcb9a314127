"""Helpers for the launcher tests: start `dtorch-launch` in its own
session, read its output, and check the process table for the pids the
ranks reported.  Tests only ever signal processes they started."""
import os
import re
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
SCRIPTS = os.path.join(ROOT, "tests", "launch_scripts")
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def script(name):
    return os.path.join(SCRIPTS, name)


# Launcher tests start their own MPI/SLURM jobs: run inside an MPI rank
# (the mpiexec phase of tests/run.sh) they would nest jobs and double the
# load, so the test modules skip themselves there.
UNDER_MPI = any(v in os.environ for v in ("OMPI_COMM_WORLD_RANK",
                                          "PMIX_RANK", "PMI_RANK"))
_FOREIGN = ("OMPI_", "PMIX_", "PRTE_", "PMI_", "SLURM_")
_KEEP = ("SLURM_CONF", "SLURM_LOCAL_")


def clean_env(**extra):
    """The test's environment without the variables that the runner under
    test is supposed to set, and without those of an enclosing MPI job or
    SLURM allocation (the child would join or detect it)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(_FOREIGN) or k.startswith(_KEEP)}
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                "MASTER_ADDR", "MASTER_PORT", "DTORCH_RDZV_TOKEN",
                "DTORCH_RESTART_COUNT", "DTORCH_BACKEND") + THREAD_VARS:
        env.pop(var, None)
    env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
    env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    env.update({k: str(v) for k, v in extra.items()})
    return env


def start(args, env=None, **kw):
    """Start `python -m launch ARGS` in a new session (so a hung test can
    kill exactly its own tree)."""
    return subprocess.Popen(
        [sys.executable, "-m", "launch"] + list(args), cwd=ROOT,
        env=env or clean_env(), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True, **kw)


def finish(proc, timeout):
    """Wait for a launcher; on timeout kill its session and fail."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_session(proc.pid)
        out, err = proc.communicate()
        raise AssertionError(
            f"launcher still running after {timeout} s\nstdout:\n{out}\n"
            f"stderr:\n{err}")
    return out, err


def launch(args, timeout=120, env=None):
    """Run the launcher to the end: (returncode, stdout, stderr, secs).
    The timeout only stops a hang: a loaded 2-core machine is slow."""
    t0 = time.monotonic()
    proc = start(args, env)
    out, err = finish(proc, timeout)
    return proc.returncode, out, err, time.monotonic() - t0


def kill_session(sid):
    """SIGKILL every process of session `sid` (one this test started)."""
    for pid in session_members(sid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _stat(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return data[data.rfind(b")") + 2:].split()


def alive(pid):
    """Exists and is not a zombie (orphans are reaped lazily here)."""
    st = _stat(pid)
    return st is not None and st[0] not in (b"Z", b"X")


def session_members(sid):
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _stat(name)
            if st and int(st[3]) == sid and st[0] not in (b"Z", b"X"):
                out.append(int(name))
    return out


def reported_pids(text):
    """{kind: {rank: pid}} from the `PID r p` / `CHILD r p` lines."""
    found = {"PID": {}, "CHILD": {}}
    for kind, rank, pid in re.findall(r"\b(PID|CHILD) (\d+) (\d+)", text):
        found[kind][int(rank)] = int(pid)
    return found


def assert_gone(pids, within=3.0):
    """Every pid is gone (or a zombie) within `within` seconds."""
    deadline = time.monotonic() + within
    left = [p for p in pids if alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [p for p in left if alive(p)]
    assert not left, f"processes left behind: {left}"
