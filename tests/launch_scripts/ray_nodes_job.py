"""Driver for tests/launch/test_ray_nodes.py, run inside node0 of a two-node Ray
cluster (RAY_ADDRESS set): waits until both Ray nodes are up, then runs
`dtorch-launch --runner ray` twice, with --nnodes 3 (more nodes than the
cluster has: must fail at once) and with --nnodes 2 of two_nodes_job.py.

usage: ray_nodes_job.py RESULTS.json LOG_DIR
Results go into RESULTS.json (rewritten after every step), not onto
stdout, where Ray's log lines interleave."""
import contextlib
import io
import json
import os
import sys
import time

import ray

from launch import cli

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS_PATH, LOGS = sys.argv[1], sys.argv[2]
results = {}


def report(name, value):
    results[name] = value
    with open(RESULTS_PATH + ".tmp", "w") as f:
        json.dump(results, f)
    os.replace(RESULTS_PATH + ".tmp", RESULTS_PATH)


def launch(argv):
    """cli.main(argv): (exit code, its stderr)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            cli.main(argv)
            code = 0
        except SystemExit as e:
            code = e.code
    return code, err.getvalue()


t = time.monotonic()
ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=True)
# the worker node joins on its own schedule
deadline = time.monotonic() + 240
while sum(1 for n in ray.nodes() if n.get("Alive")) < 2:
    if time.monotonic() > deadline:
        report("nodes", [n.get("NodeManagerAddress") for n in ray.nodes()])
        sys.exit("the Ray worker node never joined")
    time.sleep(0.2)
report("cluster_secs", time.monotonic() - t)

t = time.monotonic()
code, err = launch(["--runner", "ray", "--nnodes", "3", "--nproc-per-node",
                    "1", os.path.join(HERE, "two_nodes_job.py"), "check"])
report("too_many", {"code": str(code), "stderr": err,
                    "secs": time.monotonic() - t})

t = time.monotonic()
code, _ = launch(["--runner", "ray", "--nnodes", "2", "--nproc-per-node", "1",
                  "--backend", "tcp", "--log-dir", LOGS,
                  os.path.join(HERE, "two_nodes_job.py"), "check"])
report("job", {"code": code, "secs": time.monotonic() - t})
ray.shutdown()
