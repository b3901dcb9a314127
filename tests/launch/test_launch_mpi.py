"""dtorch-launch --runner mpi outside SLURM: mpiexec + python -m mpi4py +
launch.rank.  Skipped when mpi4py or mpiexec is missing."""
import os
import shutil
import sys

import pytest

from launch_scripts.harness import (UNDER_MPI, assert_gone, clean_env,
                                    launch, reported_pids, script)

if UNDER_MPI:
    pytest.skip("launcher tests start their own jobs; they run in the "
                "single-process phase, not inside an MPI rank",
                allow_module_level=True)

pytest.importorskip("mpi4py", reason="mpi4py is not installed")
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")
if not os.access(MPIEXEC, os.X_OK) and not shutil.which("mpiexec"):
    pytest.skip("mpiexec not found", allow_module_level=True)

pytestmark = pytest.mark.timeout(180)
SLOW = 60   # a loaded 2-core machine: catches a hang, not a slow start


def test_mpi_runner_allreduce_and_env():
    rc, out, err, _ = launch(["--runner", "mpi", "--nproc-per-node", "2",
                              script("mpi_allreduce.py"), "a", "b"])
    assert rc == 0, err
    assert out.count("size=2 sum=3") == 2, out
    for rank in (0, 1):
        assert f"rank={rank} size=2 sum=3 RANK={rank} WORLD_SIZE=2 " \
               f"MASTER_ADDR=127.0.0.1 args=a b" in out


def test_mpi_runner_failure_ends_job():
    rc, out, err, secs = launch(["--runner", "mpi", "--nproc-per-node", "2",
                                 script("fail.py"), "1", "exit", "3",
                                 "--child"])
    pids = reported_pids(out)
    assert len(pids["PID"]) == 2 and len(pids["CHILD"]) == 2, out
    assert_gone(list(pids["PID"].values()) + list(pids["CHILD"].values()),
                within=5)
    assert rc == 3, err
    assert "mpiexec exited with code 3" in err
    assert "names the failing rank" in err
    assert secs < SLOW


def test_mpi_runner_handles_root_itself():
    # Open MPI refuses root unless OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM) are
    # set; the launcher sets them when it runs as root (as a user, the
    # job runs either way)
    env = clean_env()
    env.pop("OMPI_ALLOW_RUN_AS_ROOT")
    env.pop("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM")
    rc, out, err, _ = launch(["--runner", "mpi", "--nproc-per-node", "2",
                              script("mpi_allreduce.py")], env=env)
    assert rc == 0, err
    assert out.count("size=2 sum=3") == 2, out


def test_mpiexec_failing_before_any_rank_is_not_blamed_on_a_rank(
        tmp_path):
    # a hostfile that does not exist: mpiexec gives up before starting a
    # rank, and the launcher must say so instead of pointing at a rank
    env = clean_env(PRTE_MCA_prte_default_hostfile=str(tmp_path / "none"),
                    OMPI_MCA_orte_default_hostfile=str(tmp_path / "none"))
    rc, out, err, _ = launch(["--runner", "mpi", "--nproc-per-node", "2",
                              script("mpi_allreduce.py")], env=env)
    assert rc != 0
    assert "ALLREDUCE" not in out
    assert "before any rank started" in err, err
    assert "mpiexec itself failed" in err
    assert "names the failing rank" not in err


def test_no_colour_codes_in_redirected_output(tmp_path):
    # mpiexec gives every rank a pseudo-terminal for stdout even when the
    # job's output goes to a file, so tools in the ranks (pytest here)
    # colour their output; the launcher's own output is not a terminal
    # here, so the ranks must be asked for plain text
    (tmp_path / "test_plain.py").write_text("def test_ok():\n    pass\n")
    rc, out, err, _ = launch(["--runner", "mpi", "--nproc-per-node", "2",
                              "-m", "pytest", "-p", "no:cacheprovider",
                              str(tmp_path / "test_plain.py")])
    assert rc == 0, err
    assert out.count("1 passed") == 2, out
    assert "\x1b" not in out + err, repr(out)
