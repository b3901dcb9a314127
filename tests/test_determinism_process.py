"""Deterministic DDP in real processes (issue 26): the owners' training run
on 2 and 3 tcp processes (127.0.0.1) gives the bits of 1 thread rank.

This file is also the ranks' script (``python test_determinism_process.py
OUT``). Only pids started here are killed."""
import os
import socket
import subprocess
import sys

import pytest

if __name__ != "__main__" and ("OMPI_COMM_WORLD_SIZE" in os.environ
                               or "PMI_SIZE" in os.environ):
    pytest.skip("single-process tests; not run under mpiexec",
                allow_module_level=True)

pytestmark = pytest.mark.timeout(180)
HERE = os.path.abspath(__file__)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_tcp(world, tmp_path):
    port, token = _free_port(), os.urandom(8).hex()
    procs = []
    for r in range(world):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world),
                   LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(world),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   DTORCH_RDZV_TOKEN=token, DTORCH_COLLECTIVE_TIMEOUT="60")
        procs.append(subprocess.Popen(
            [sys.executable, HERE, str(tmp_path / f"h{world}.{r}")],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True))
    try:
        for r, p in enumerate(procs):
            out, err = p.communicate(timeout=150)
            assert p.returncode == 0, f"rank {r}:\n{err[-3000:]}"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return {open(tmp_path / f"h{world}.{r}").read() for r in range(world)}


def test_tcp_processes_give_the_thread_ranks_bits(tmp_path):
    import dtorch.distributed as dist
    from test_determinism_ddp import train_mlp
    one = set(dist.spawn_threads(train_mlp, 1))
    assert _run_tcp(2, tmp_path) == one
    assert _run_tcp(3, tmp_path) == one


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(HERE))
    import dtorch.distributed as dist
    from test_determinism_ddp import train_mlp
    dist.init_process_group("tcp")
    h = train_mlp(dist.get_rank(), dist.get_world_size())
    with open(sys.argv[1], "w") as f:
        f.write(h)
