"""`dtorch-launch --runner ray --nnodes 2` on a two-node Ray cluster: the
head (`ray start --head`) in one namespace node, the worker (`ray start
--address`) in the other (slurm/netns-nodes.sh via tests/netns_nodes.py),
2 CPUs each, so only --nnodes can spread the ranks.  The ranks run
two_nodes_job.py (tcp backend across the link: collectives and DDP steps
checked, hostnames printed).

One driver run does it all (Ray takes 10-20 s to start on a loaded 2-core
machine).  Every Ray process lives in the nodes' PID namespaces: `ray start
--block` gets SIGTERM (it stops what it started), then stopping the nodes
kills whatever is left.  Skipped with the reason without Ray, root or the
namespace tools (the latter two an error under CI=true)."""
import importlib.util
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from launch_scripts.harness import ROOT, UNDER_MPI, clean_env, script

if UNDER_MPI:
    pytest.skip("launcher tests start their own jobs; they run in the "
                "single-process phase, not inside an MPI rank",
                allow_module_level=True)
if importlib.util.find_spec("ray") is None:
    pytest.skip("ray is not installed; pip install -e '.[ray]' to run "
                "the Ray runner tests", allow_module_level=True)

import netns_nodes  # noqa: E402

pytestmark = pytest.mark.timeout(400)
PORT = 6379   # the head's GCS, inside node0's own network namespace


def _ray():
    """The `ray` command of this interpreter's installation."""
    mine = os.path.join(os.path.dirname(sys.executable), "ray")
    found = mine if os.access(mine, os.X_OK) else shutil.which("ray")
    if not found:
        pytest.skip("the ray package is importable but its `ray` command "
                    "is not on PATH")
    return found


def _stop(nodes, proc):
    """SIGTERM `ray start --block` (it then stops its daemons), wait, and
    kill what is left of the command."""
    try:
        pid = nodes.inner_pid(proc, timeout=1)
        os.kill(pid, signal.SIGTERM)
    except (RuntimeError, ProcessLookupError):
        pass
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        netns_nodes.kill_tree(proc)
        proc.wait()


@pytest.fixture(scope="module")
def ray_nodes():
    why = netns_nodes.skip_reason()
    if why:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI=true but netns nodes cannot start: {why}")
        pytest.skip(f"two-node Ray cluster: {why}")
    ray_cmd = _ray()
    # Ray's socket paths must stay short (108 bytes): not under tmp_path
    work = tempfile.mkdtemp(prefix="dtr-")
    t0 = time.monotonic()
    daemons = []
    with netns_nodes.start_nodes(2) as nodes:
        # a fresh token for this cluster only (not ~/.ray/auth_token)
        env = clean_env(RAY_DISABLE_USAGE_STATS=1, RAY_AUTH_MODE="token",
                        RAY_AUTH_TOKEN=secrets.token_hex(32),
                        RAY_COLOR_PREFIX=0)
        env.pop("RAY_ADDRESS", None)
        head = nodes.addr["node0"]
        common = ["--block", "--num-cpus=2", "--disable-usage-stats",
                  "--object-store-memory=100000000"]
        try:
            for node, extra in (
                    ("node0", ["--head", f"--port={PORT}",
                               "--include-dashboard=false"]),
                    ("node1", [f"--address={head}:{PORT}"])):
                log = open(os.path.join(work, f"{node}.out"), "w")
                daemons.append(nodes.popen(
                    node, [ray_cmd, "start", *extra, *common,
                           f"--node-ip-address={nodes.addr[node]}",
                           f"--temp-dir={work}/{node}"],
                    env=env, cwd=ROOT, stdin=subprocess.DEVNULL,
                    stdout=log, stderr=subprocess.STDOUT))
                log.close()
            results = os.path.join(work, "results.json")
            driver = nodes.popen(
                "node0", [sys.executable, script("ray_nodes_job.py"),
                          results, os.path.join(work, "logs")],
                env=dict(env, RAY_ADDRESS=f"{head}:{PORT}"), cwd=ROOT,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            try:
                out, _ = driver.communicate(timeout=330)
            except subprocess.TimeoutExpired:
                netns_nodes.kill_tree(driver)
                out, _ = driver.communicate()
            found = {}
            if os.path.exists(results):
                with open(results) as f:
                    found = json.load(f)
            for rank in (0, 1):
                path = os.path.join(work, "logs", f"rank{rank}.log")
                if os.path.exists(path):
                    with open(path) as f:
                        found[f"log{rank}"] = f.read()
            for node in ("node0", "node1"):
                with open(os.path.join(work, f"{node}.out")) as f:
                    found[f"ray_{node}"] = f.read()[-2000:]
            found["_out"] = out[-4000:]
            found["_secs"] = time.monotonic() - t0
        finally:
            for proc in reversed(daemons):
                _stop(nodes, proc)
    shutil.rmtree(work, ignore_errors=True)
    yield found


def _context(found):
    return "\n".join(f"--- {k}:\n{found.get(k)}" for k in (
        "_out", "ray_node0", "ray_node1"))


def test_ranks_on_both_nodes(ray_nodes):
    job = ray_nodes.get("job")
    assert job and job["code"] == 0, (job, _context(ray_nodes))
    log0, log1 = ray_nodes["log0"], ray_nodes["log1"]
    # each rank on its own node (which one is Ray's choice), and both
    # agree on who runs where
    lines = [re.search(r"^HOST (\d) (\S+) (\S+) (\S+)$", log, re.M)
             for log in (log0, log1)]
    assert all(lines), (log0, log1)
    views = [m.groups() for m in lines]
    hosts = views[0][2:]
    assert sorted(hosts) == ["node0", "node1"], views
    assert views == [("0", hosts[0]) + hosts, ("1", hosts[1]) + hosts], views
    # collectives and DDP steps across the link checked by the job itself
    assert "OK 0" in log0 and "OK 1" in log1, (log0, log1)
    print(f"Ray cluster up {ray_nodes['cluster_secs']:.1f} s after the "
          f"driver started; job {job['secs']:.1f} s; fixture "
          f"{ray_nodes['_secs']:.1f} s")


def test_more_nodes_than_the_cluster_has_fails_at_once(ray_nodes):
    got = ray_nodes.get("too_many")
    assert got, _context(ray_nodes)
    assert got["code"] == ("dtorch-launch: nnodes=3 but the Ray cluster "
                           "has 2 node(s) alive"), got
    assert got["secs"] < 30, got
