"""Deterministic DDP in real processes (issue 26): the owners' training run
on 2 and 3 tcp processes (127.0.0.1), and a dcp save by 2 processes resumed
by 3, give the bits of 1 thread rank.

This file is also the ranks' script (``dtorch-launch --nproc-per-node N
test_determinism_process.py OUT [save|resume CKPT]``: rank r writes OUT.r)."""
import os
import sys

import pytest

if __name__ != "__main__" and ("OMPI_COMM_WORLD_SIZE" in os.environ
                               or "PMI_SIZE" in os.environ):
    pytest.skip("single-process tests; not run under mpiexec",
                allow_module_level=True)

_TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# tests/ (the shared helpers) and the checkout above it: run as a script
# under an editable install, a rank would otherwise import tests/collectives
# and tests/launch (namespace directories) as the packages of those names
sys.path[:0] = [_TESTS, os.path.dirname(_TESTS)]
from launch_scripts.harness import launch  # noqa: E402

pytestmark = pytest.mark.timeout(180)
HERE = os.path.abspath(__file__)


def _run_tcp(world, tmp_path, *mode):
    """The ranks' digests of one dtorch-launch job of ``world`` tcp
    processes."""
    out = str(tmp_path / f"h{world}{mode[:1]}")
    rc, _, err, _ = launch(["--nproc-per-node", str(world), "--backend",
                            "tcp", HERE, out, *mode], timeout=150)
    assert rc == 0, err[-3000:]
    return {open(f"{out}.{r}").read() for r in range(world)}


def test_tcp_processes_give_the_thread_ranks_bits(tmp_path):
    import dtorch.distributed as dist
    from test_determinism_ddp import train_mlp
    one = set(dist.spawn_threads(train_mlp, 1))
    assert _run_tcp(2, tmp_path) == one
    assert _run_tcp(3, tmp_path) == one


def test_save_on_2_processes_resume_on_3(tmp_path):
    import dtorch.distributed as dist
    from test_determinism_ddp import train_mlp
    one = set(dist.spawn_threads(train_mlp, 1))
    ck = str(tmp_path / "ck")
    _run_tcp(2, tmp_path, "save", ck)
    assert _run_tcp(3, tmp_path, "resume", ck) == one


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(HERE))
    import dtorch.distributed as dist
    from test_determinism_ddp import train_mlp
    dist.init_process_group("tcp")
    mode = dict(zip(sys.argv[2::2], sys.argv[3::2]))
    save = (mode["save"], 5) if "save" in mode else None
    h = train_mlp(dist.get_rank(), dist.get_world_size(), save=save,
                  resume=mode.get("resume"))
    with open(f"{sys.argv[1]}.{dist.get_rank()}", "w") as f:
        f.write(str(h))
