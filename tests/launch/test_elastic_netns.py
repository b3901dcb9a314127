"""The acceptance schedule of issue 27 across namespace nodes
(slurm/netns-nodes.sh; root, else skipped with the reason): 4 ranks on two
nodes -> SIGKILL one -> 3 -> two join -> 5 -> every process of node1
SIGKILLed (its launcher too) -> 3 survivors, which keep their pids, train
each sample once per epoch and exit 0."""
import os
import secrets
import sys
import time

from netns_nodes import skip_reason, start_nodes
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_elastic import (Launcher, _check_exactly_once,  # noqa: E402
                          _events, _one_start_per_member)

SCRIPT = os.path.join(ROOT, "tests", "launch", "elastic_train.py")
pytestmark = pytest.mark.skipif(skip_reason() is not None,
                                reason=str(skip_reason()))


def _on(nodes, node, args, env):
    """A dtorch-launch inside a namespace node."""
    return Launcher(args, env, wrap=lambda cmd: nodes.command(node, cmd))


def test_schedule_across_namespace_nodes(tmp_path):
    log, flag = tmp_path / "steps.jsonl", tmp_path / "go"
    port = 20000 + secrets.randbelow(20000)
    env = dict(os.environ, PYTHONPATH=ROOT, PYTHONUNBUFFERED="1",
               DTORCH_RDZV_TOKEN=secrets.token_hex(16),
               DTORCH_ELASTIC_FORM_TIMEOUT="6")
    script = [SCRIPT, "--samples", "96", "--epochs", "2", "--log", str(log),
              "--kill", "1:1", "--hold", f"3:join2,6:{flag}"]
    common = ["--elastic", "2:5", "--nnodes", "2", "--nproc-per-node", "2",
              "--master-addr", "node0", "--master-port", str(port)]
    with start_nodes(2) as nodes:
        n0 = _on(nodes, "node0", common + ["--node-rank", "0"] + script,
                 env)
        time.sleep(1.0)
        n1 = _on(nodes, "node1", common + ["--node-rank", "1"] + script,
                 env)
        n0.wait_for("elastic round 1:", 90)
        join = _on(nodes, "node0", [
            "--join", "--master-addr", "node0", "--master-port", str(port),
            "--nproc-per-node", "2"] + script, env)
        n0.wait_for("elastic round 2:", 90)
        end = time.monotonic() + 60      # every rank at the hold of step 6
        while time.monotonic() < end and sum(
                e["event"] == "done" and e["step"] == 5
                for e in _events(log)) < 5:
            time.sleep(0.05)
        nodes.run("node1", "kill -9 -1", check=False)   # the whole node
        flag.write_text("go")
        code, err, _ = n0.finish(120)
        jcode, jerr, _ = join.finish(60)
        n1.finish(30)
    assert code == 0 and jcode == 0, err + jerr
    assert "elastic round 1: lost rank 1 (member 1: was killed by SIGKILL" \
        in err and "new world size 3 (was 4)" in err, err
    assert "elastic round 2: 2 joined (member(s) 4, 5); new world size 5" \
        in err, err
    assert "member 2: its connection to the store closed" in err, err
    assert "new world size 3 (was 5)" in err, err
    ev = _events(log)
    _one_start_per_member(ev)
    assert sorted(e["uid"] for e in ev if e["event"] == "end") == [0, 4, 5]
    _check_exactly_once(ev, 96, 2)
