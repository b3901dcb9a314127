"""Ray runner scenarios against a local 2-CPU Ray (run by
tests/launch/test_launch_ray.py in its own session, so that Ray's daemons are the
test's to clean up).

usage: ray_job.py RESULTS.json
Each case's result goes into RESULTS.json (rewritten after every case),
never onto stdout: Ray's own log lines interleave with the driver's
output, even within a line."""
import json
import os
import shutil
import sys
import tempfile
import time

import ray

from launch import cli
from launch.ray import RankFailedError, run

HERE = os.path.dirname(os.path.abspath(__file__))


def env_of_rank(x):
    keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
            "MASTER_ADDR", "MASTER_PORT", "DTORCH_RDZV_TOKEN",
            "DTORCH_RESTART_COUNT", "DTORCH_BACKEND", "OMP_NUM_THREADS")
    return {k: os.environ.get(k) for k in keys}, x * 10


def crash_rank1():
    if os.environ["RANK"] == "1":
        raise ValueError("rank 1 is broken")
    time.sleep(60)


RESULTS_PATH = sys.argv[1]
results = {}


def report(name, value):
    results[name] = value
    tmp = RESULTS_PATH + ".tmp"
    with open(tmp, "w") as f:          # write-then-rename: never torn
        json.dump(results, f)
    os.replace(tmp, RESULTS_PATH)


ray.init(num_cpus=2, include_dashboard=False, log_to_driver=True)
t = time.monotonic()
report("fn", run(env_of_rank, 2, args=(4,), backend="tcp"))
report("fn_secs", time.monotonic() - t)

# Ray forwards actor output to the driver asynchronously (lines can be
# lost at shutdown): check the per-rank log files instead.
logs = tempfile.mkdtemp(prefix="dtorch-ray-")
for name, target in (("fn_fail", crash_rank1),
                     ("script_fail", [os.path.join(HERE, "fail.py"), "0",
                                      "exit", "3"])):
    t = time.monotonic()
    try:
        run(target, 2)
        report(name, "no error")
    except RankFailedError as err:
        report(name, {"rank": err.rank, "msg": str(err),
                      "secs": time.monotonic() - t})

# a script, through dtorch-launch --runner ray (ray is initialised)
t = time.monotonic()
try:
    cli.main(["--runner", "ray", "--nproc-per-node", "2", "--log-dir",
              logs, os.path.join(HERE, "rendezvous.py")])
except SystemExit as e:
    report("cli_rc", e.code)
report("cli_secs", time.monotonic() - t)
for rank in (0, 1):
    with open(os.path.join(logs, f"rank{rank}.log")) as f:
        report(f"cli_log{rank}", f.read())
ray.shutdown()
shutil.rmtree(logs, ignore_errors=True)
sys.stdout.flush()
