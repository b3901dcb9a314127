"""launch.env: the environment contract as pure functions (no process is
started here)."""
import pytest

from launch import env as renv


def test_parse_nodelist():
    assert renv.parse_nodelist("vm") == ["vm"]
    assert renv.parse_nodelist("node[01-04],other") == [
        "node01", "node02", "node03", "node04", "other"]
    assert renv.parse_nodelist("a[1,3-4]b,c[8-10]") == [
        "a1b", "a3b", "a4b", "c8", "c9", "c10"]
    assert renv.parse_nodelist("r[1-2]n[1-2]") == [
        "r1n1", "r1n2", "r2n1", "r2n2"]
    with pytest.raises(ValueError, match="unbalanced"):
        renv.parse_nodelist("node[1-2")


def test_first_host_without_scontrol():
    assert renv.first_host("gpu[07-09],cpu1", use_scontrol=False) == "gpu07"


def test_thread_budget():
    assert renv.thread_budget(16, 4) == 4
    assert renv.thread_budget(2, 3) == 1
    assert renv.thread_budget(2, 0) == 2


def test_derived_tokens_and_ports():
    assert renv.derive_token("abc", 0) == "abc"
    assert renv.derive_token("abc", 1) == renv.derive_token("abc", 1)
    assert renv.derive_token("abc", 1) != renv.derive_token("abc", 2)
    assert renv.new_token() != renv.new_token()
    p = renv.port_from_job_id("1234")
    assert 20000 <= p < 60000
    assert renv.port_from_job_id("1234", 1) != p
    assert renv.port_from_job_id("1235") != p


def test_rank_env_keeps_user_threads():
    env = renv.rank_env(3, 8, 1, 4, "10.0.0.1", 29500, token="t",
                        restart_count=2, backend="tcp", cores=8,
                        base={"OMP_NUM_THREADS": "5", "X": "y"})
    assert env["RANK"] == "3" and env["WORLD_SIZE"] == "8"
    assert env["LOCAL_RANK"] == "1" and env["LOCAL_WORLD_SIZE"] == "4"
    assert env["MASTER_ADDR"] == "10.0.0.1" and env["MASTER_PORT"] == "29500"
    assert env["DTORCH_RDZV_TOKEN"] == "t"
    assert env["DTORCH_RESTART_COUNT"] == "2"
    assert env["DTORCH_BACKEND"] == "tcp"
    assert env["OMP_NUM_THREADS"] == "5"          # the user's value
    assert env["OPENBLAS_NUM_THREADS"] == "2"     # 8 cores / 4 ranks
    assert env["X"] == "y"


SLURM = {
    "SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1", "SLURM_TASKS_PER_NODE": "4(x2)",
    "SLURM_NODELIST": "node[03-04]", "SLURM_JOB_ID": "4242",
    "SLURM_STEP_ID": "0", "SLURM_CPUS_ON_NODE": "16",
}


def test_detect_slurm():
    got = renv.detect(SLURM, use_scontrol=False)
    assert got["RANK"] == "5" and got["WORLD_SIZE"] == "8"
    assert got["LOCAL_RANK"] == "1" and got["LOCAL_WORLD_SIZE"] == "4"
    assert got["MASTER_ADDR"] == "node03"
    assert got["MASTER_PORT"] == str(renv.port_from_job_id(4242, 0))
    assert got["OMP_NUM_THREADS"] == "4"           # 16 CPUs / 4 tasks
    assert got["DTORCH_RESTART_COUNT"] == "0"


def test_detect_slurm_cpus_per_task_and_requeue():
    e = dict(SLURM, SLURM_CPUS_PER_TASK="3", SLURM_RESTART_COUNT="2")
    got = renv.detect(e, use_scontrol=False)
    assert got["MKL_NUM_THREADS"] == "3"
    assert got["DTORCH_RESTART_COUNT"] == "2"


def test_detect_explicit_values_win():
    e = dict(SLURM, MASTER_ADDR="10.1.1.1", MASTER_PORT="1234",
             DTORCH_RDZV_TOKEN="secret")
    got = renv.detect(e, use_scontrol=False)
    assert got["MASTER_ADDR"] == "10.1.1.1" and got["MASTER_PORT"] == "1234"
    assert got["DTORCH_RDZV_TOKEN"] == "secret"


def test_detect_open_mpi_inside_allocation():
    # mpiexec inside sbatch: the batch step's SLURM_PROCID=0 is inherited
    # by every rank; Open MPI's own numbering must win.
    e = dict(SLURM, SLURM_PROCID="0", OMPI_COMM_WORLD_RANK="3",
             OMPI_COMM_WORLD_SIZE="4", OMPI_COMM_WORLD_LOCAL_RANK="1",
             OMPI_COMM_WORLD_LOCAL_SIZE="2")
    got = renv.detect(e, use_scontrol=False)
    assert (got["RANK"], got["WORLD_SIZE"]) == ("3", "4")
    assert (got["LOCAL_RANK"], got["LOCAL_WORLD_SIZE"]) == ("1", "2")
    assert got["MASTER_ADDR"] == "node03"


def test_detect_without_rank_fails_clearly():
    with pytest.raises(ValueError, match="SLURM_PROCID"):
        renv.detect({"PATH": "/bin"})


def test_launch_does_not_import_training_stack():
    # layer rule: launch/ starts processes, it never imports dtorch
    import subprocess
    import sys
    code = ("import sys, launch.cli, launch.local, launch.external, "
            "launch.rank, launch.ray; "
            "bad = [m for m in sys.modules if m.split('.')[0] in "
            "('dtorch', 'collectives', 'ray')]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                         text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr
