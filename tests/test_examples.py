"""The example programs run end to end: the main job (digits.py) trains,
checkpoints and resumes; ddp_digits.py trains under mpiexec -n 2."""
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EX = os.path.join(ROOT, "examples")

pytestmark = pytest.mark.skipif(
    "OMPI_COMM_WORLD_SIZE" in os.environ,
    reason="examples start their own jobs; run in the single-process phase")


def run(cmd, timeout=240, **kw):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                       env=env, cwd=ROOT, **kw)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p.stdout


def accuracy(out):
    return float(re.findall(r"final test accuracy ([\d.]+)%", out)[-1])


def test_digits_main_job_trains_checkpoints_and_resumes(tmp_path):
    ck = str(tmp_path / "digits.safetensors")
    out = run([sys.executable, os.path.join(EX, "digits.py"), "--epochs",
               "3", "--quiet", "--checkpoint", ck])
    assert accuracy(out) > 85.0
    assert os.path.getsize(ck) > 10_000
    out = run([sys.executable, os.path.join(EX, "digits.py"), "--epochs",
               "4", "--quiet", "--checkpoint", ck, "--resume"])
    assert "resumed from" in out and "at epoch 4" in out
    assert out.count("test loss") == 1       # only the remaining epoch
    assert accuracy(out) > 85.0


def test_ddp_digits_under_mpiexec(tmp_path):
    mpiexec = shutil.which("mpiexec", path=os.path.dirname(sys.executable))
    if mpiexec is None:
        pytest.fail("mpiexec not found next to the interpreter: install "
                    "with pip install -e '.[dev]'")
    ck = str(tmp_path / "ddp.safetensors")
    out = run([mpiexec, "-n", "2", sys.executable, "-m", "mpi4py",
               os.path.join(EX, "ddp_digits.py"), "--epochs", "2",
               "--quiet", "--checkpoint", ck])
    assert "on 2 ranks" in out and accuracy(out) > 80.0
    assert os.path.exists(ck)
