"""The example programs run end to end: the main job (digits.py) trains,
checkpoints and resumes; ddp_digits.py trains under mpiexec -n 2."""
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest

from helpers import mpi_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
EX = os.path.join(ROOT, "examples")

pytestmark = pytest.mark.skipif(
    "OMPI_COMM_WORLD_SIZE" in os.environ,
    reason="examples start their own jobs; run in the single-process phase")


def run(cmd, timeout=240, raw=False, **kw):
    """stdout of a command that must succeed; raw: (stdout, stderr) as
    bytes (text mode would turn a progress bar's \r into \n)."""
    env = mpi_env()
    p = subprocess.run(cmd, capture_output=True, text=not raw,
                       timeout=timeout, env=env, cwd=ROOT, **kw)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return (p.stdout, p.stderr) if raw else p.stdout


def assert_plain(*outputs):
    """No progress bar or terminal escape codes: what a log file gets."""
    for raw in outputs:
        assert b"\r" not in raw and b"\x1b" not in raw, raw[-500:]
        assert b"it/s" not in raw, raw[-500:]


def accuracy(out):
    return float(re.findall(r"final test accuracy ([\d.]+)%", out)[-1])


def _copy(path, tmp_path):
    """A copy of a checkpoint (file or directory) that a test may change."""
    dst = str(tmp_path / os.path.basename(path))
    (shutil.copytree if os.path.isdir(path) else shutil.copy)(path, dst)
    return dst


# Each example run is a fresh interpreter that imports dtorch and
# scikit-learn (most of its ~2 s of CPU): the uninterrupted runs that
# several tests compare with are made once per module.
@pytest.fixture(scope="module")
def digits_3_epochs(tmp_path_factory):
    """(stdout, checkpoint) of ``digits.py --epochs 3``."""
    ck = str(tmp_path_factory.mktemp("digits3") / "whole.st")
    return run([sys.executable, os.path.join(EX, "digits.py"), "--epochs",
                "3", "--quiet", "--checkpoint", ck]), ck


@pytest.fixture(scope="module")
def ddp_digits_2_epochs(tmp_path_factory):
    """(stdout, checkpoint) of ``dtorch-launch --nproc-per-node 2
    ddp_digits.py --epochs 2``."""
    ck = str(tmp_path_factory.mktemp("ddp2") / "whole.st")
    return _launch(["--nproc-per-node", "2", os.path.join(
        EX, "ddp_digits.py"), "--epochs", "2", "--quiet", "--checkpoint",
        ck]), ck


def test_digits_main_job_trains_checkpoints_and_resumes(tmp_path,
                                                        digits_3_epochs):
    out, whole = digits_3_epochs
    assert accuracy(out) > 85.0
    assert os.path.getsize(whole) > 10_000
    ck = _copy(whole, tmp_path)
    out = run([sys.executable, os.path.join(EX, "digits.py"), "--epochs",
               "4", "--quiet", "--checkpoint", ck, "--resume"])
    assert "resuming from" in out and "at epoch 4" in out
    assert out.count("test loss") == 1       # only the remaining epoch
    assert accuracy(out) > 85.0


def test_ddp_digits_under_mpiexec(tmp_path):
    mpiexec = shutil.which("mpiexec", path=os.path.dirname(sys.executable))
    if mpiexec is None:
        pytest.fail("mpiexec not found next to the interpreter: install "
                    "with pip install -e '.[dev]'")
    ck = str(tmp_path / "ddp.safetensors")
    # no --quiet: output redirected to a file must still be plain
    out, err = run([mpiexec, "-n", "2", sys.executable, "-m", "mpi4py",
                    os.path.join(EX, "ddp_digits.py"), "--epochs", "2",
                    "--checkpoint", ck], raw=True)
    assert_plain(out, err)
    out = out.decode()
    assert "on 2 ranks" in out and accuracy(out) > 80.0
    assert os.path.exists(ck)


def _launch(args, timeout=240):
    return run([sys.executable, "-m", "launch"] + list(args),
               timeout=timeout)


def _model_of(path):
    """The "model" entry of a checkpoint: a dtorch.save file, or a
    distributed checkpoint directory (ddp_digits), made one file first."""
    import dtorch
    if os.path.isdir(path):
        from dtorch.distributed.checkpoint.format_utils import (
            dcp_to_torch_save)
        dcp_to_torch_save(path, path + ".whole")
        path += ".whole"
    return dtorch.load(path)["model"]


def _same_parameters(a, b):
    import numpy as np
    sa, sb = _model_of(a), _model_of(b)
    assert sorted(sa) == sorted(sb)
    return all(np.array_equal(sa[k].numpy(), sb[k].numpy()) for k in sa)


def test_digits_resume_is_bitwise(tmp_path, digits_3_epochs):
    # a run interrupted after epoch 1 and resumed ends with bitwise the
    # parameters of the uninterrupted run (dropout's RNG stream included)
    digits = os.path.join(EX, "digits.py")
    whole, cut = digits_3_epochs[1], str(tmp_path / "cut.st")
    p = subprocess.run([sys.executable, digits, "--epochs", "3", "--quiet",
                        "--checkpoint", cut, "--fail-at-epoch", "1"],
                       capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert p.returncode == 3, p.stderr
    out = run([sys.executable, digits, "--epochs", "3", "--quiet",
               "--checkpoint", cut, "--resume"])
    assert "resuming from" in out and out.count("test loss") == 2
    assert _same_parameters(whole, cut)


def test_ddp_digits_restart_is_bitwise(tmp_path, ddp_digits_2_epochs):
    # dtorch-launch --max-restarts: rank 1 dies at the start of epoch 1;
    # the restarted job resumes and ends where the uninterrupted one does
    ddp = os.path.join(EX, "ddp_digits.py")
    whole, cut = ddp_digits_2_epochs[1], str(tmp_path / "cut.st")
    out = _launch(["--nproc-per-node", "2", "--max-restarts", "1", ddp,
                   "--epochs", "2", "--quiet", "--checkpoint", cut,
                   "--fail-at-epoch", "1"])
    assert "failing on purpose" in out and "resuming from" in out, out
    assert _same_parameters(whole, cut)


def test_running_an_example_twice_trains_twice(tmp_path):
    # README's run lines share a checkpoint path: the second run must
    # train again (not resume a finished run and report 0.00%)
    ck = str(tmp_path / "digits.st")
    cmd = [sys.executable, os.path.join(EX, "digits.py"), "--epochs", "1",
           "--checkpoint", ck]
    # the first run without --quiet, its output to a pipe (a SLURM .out, a
    # redirected log): no tqdm bars, no escape codes
    out, err = run(cmd, raw=True)
    assert_plain(out, err)
    assert b"epoch  1" in out
    first = accuracy(out.decode())
    cmd.append("--quiet")
    again = run(cmd)
    assert "starting fresh" in again and "finished run" in again
    assert again.count("test loss") == 1 and accuracy(again) == first
    report = run(cmd + ["--resume"])        # a finished run: reported
    assert "test loss" not in report and "from the checkpoint" in report
    assert accuracy(report) == first


def test_ddp_digits_under_launcher_twice_trains_twice(tmp_path,
                                                      ddp_digits_2_epochs):
    out, whole = ddp_digits_2_epochs
    ck = _copy(whole, tmp_path)
    args = ["--nproc-per-node", "2", os.path.join(EX, "ddp_digits.py"),
            "--epochs", "2", "--quiet", "--checkpoint", ck]
    again = _launch(args)
    assert "starting fresh" in again and again.count("  test acc ") == 2
    assert accuracy(again) == accuracy(out) > 50.0


@pytest.mark.parametrize("name", ["digits.py", "ddp_digits.py",
                                  "tp_digits.py"])
def test_example_help_shows_defaults(name):
    out = " ".join(run([sys.executable, os.path.join(EX, name),
                        "--help"]).split())    # unwrap argparse's lines
    assert "(default: runs/" in out and "(default: 0.002)" in out, out


def test_checkpoint_of_an_older_example_is_not_resumed(tmp_path):
    # no RNG state: it cannot continue exactly, so --resume refuses with
    # the reason and a plain run replaces it
    import dtorch
    ck = str(tmp_path / "old.st")
    dtorch.save({"model": {"w": dtorch.zeros(2)}, "epoch": 3}, ck)
    cmd = [sys.executable, os.path.join(EX, "digits.py"), "--epochs", "1",
           "--quiet", "--checkpoint", ck]
    p = subprocess.run(cmd + ["--resume"], capture_output=True, text=True,
                       timeout=240, cwd=ROOT)
    assert p.returncode == 1
    assert f"--resume: {ck} lacks rng, test_acc" in p.stderr, p.stderr
    out = run(cmd)
    assert "older example's checkpoint" in out and accuracy(out) > 50.0


def _children_by_rank(pid):
    """{RANK: pid} of the rank processes a launcher started."""
    ranks = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if int(stat[stat.rfind(b")") + 2:].split()[1]) != pid:
            continue
        for kv in env:
            if kv.startswith(b"RANK="):
                ranks[int(kv[5:])] = int(name)
    return ranks


def _signal_one_rank(args, env, rank, sig, nranks):
    """Start ``dtorch-launch ARGS``; once rank 0 printed its first epoch,
    send ``sig`` to rank ``rank``'s process: (code, stdout, stderr) of the
    launcher (its session killed if it is still running at the end)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "launch"] + args, cwd=ROOT, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    try:
        seen = ""
        while "epoch  1 " not in seen:
            line = proc.stdout.readline()
            assert line, seen + proc.stderr.read()
            seen += line
        ranks = _children_by_rank(proc.pid)
        assert sorted(ranks) == list(range(nranks)), ranks
        os.kill(ranks[rank], sig)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, seen + out, err


def test_ddp_digits_sigusr1_to_one_rank_checkpoints_all(tmp_path):
    # SLURM's warning reaches the ranks at different steps (here: only
    # rank 1 gets it); they must agree on the step, save and exit 0, not
    # leave rank 0 alone in a collective
    ck = str(tmp_path / "usr1.st")
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               DTORCH_COLLECTIVE_TIMEOUT="60")
    code, out, err = _signal_one_rank(
        ["--nproc-per-node", "2", os.path.join(EX, "ddp_digits.py"),
         "--epochs", "100", "--quiet", "--checkpoint", ck], env, 1,
        signal.SIGUSR1, 2)
    assert code == 0, out + err
    assert "SIGUSR1: checkpointed" in out
    resumed = _launch(["--nproc-per-node", "2",
                       os.path.join(EX, "ddp_digits.py"), "--epochs", "3",
                       "--quiet", "--checkpoint", ck, "--resume"])
    assert "resuming from" in resumed and "samples of epoch" in resumed


def test_elastic_gpt_survives_a_sigkill_and_refuses_tp(tmp_path):
    # examples/elastic_gpt.py under dtorch-launch --elastic, rank 1
    # SIGKILLed in epoch 2: a transformer with tied embedding/head weights
    # through the state transfer and the DDP re-wrap (tests/launch/
    # test_elastic.py's schedules use an MLP)
    ex = os.path.join(EX, "elastic_gpt.py")
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               PYTHONPATH=ROOT)
    code, out, err = _signal_one_rank(
        ["--elastic", "2:3", "--nproc-per-node", "3", ex, "--epochs", "2",
         "--windows", "120", "--batch-size", "12", "--n-layer", "1",
         "--n-head", "2", "--d-model", "16", "--block-size", "16", "--lr",
         "1e-2"], env, 1, signal.SIGKILL, 3)
    assert code == 0, out + err
    assert "lost rank 1" in err and "new world size 2 (was 3)" in err, err
    loss, uniform = map(float, re.findall(
        r"final val loss ([\d.]+) \(uniform: ([\d.]+)\) on 2 ranks", out)[0])
    assert loss < uniform - 0.3, out
    p = subprocess.run([sys.executable, ex, "--tp", "2"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "--tp is not supported" in p.stderr \
        and "plain data parallelism" in p.stderr, p.stderr
