"""`sbatch -N 2` on a REAL two-node SLURM on this machine:
`slurm/local-cluster.sh start --nodes 2` runs slurmctld and munged on the
host and one slurmd in each of two namespace nodes (slurm/netns-nodes.sh:
own network on a link-local bridge, hostname, /dev/shm and PID space).
The DDP example runs through slurm/train.sbatch, its ranks started by
`srun --mpi=pmix` and talking Open MPI across the link.

Skipped with the reason without root, namespace tools or SLURM (an error
under CI=true, as in tests/launch/test_slurm.py).  The cluster lives in its own
DIR, port and namespaces, beside test_slurm.py's single-node one, and is
stopped at the end (namespaces included)."""
import re
import subprocess
import sys
import time

import pytest

from launch_scripts.harness import UNDER_MPI, clean_env, script

if UNDER_MPI:
    pytest.skip("launcher tests start their own jobs; they run in the "
                "single-process phase, not inside an MPI rank",
                allow_module_level=True)

import netns_nodes  # noqa: E402
from test_slurm import (CLUSTER, _can_start, _in_ci, _secs,  # noqa: E402
                        cluster_dir_of, install_notice, sbatch,
                        shared_cluster,
                        tell_terminal, wait_job)

pytestmark = pytest.mark.timeout(400)
# Deadlines catch a hung job, not a slow one: a job of a few seconds took
# 30-40 s on the 2-core machine while other test sessions ran.
SLOW = 180


@pytest.fixture(scope="module")
def cluster(pytestconfig):
    """Environment (SLURM_CONF, SLURM_LOCAL_NETNS_PREFIX, ...) of the
    running two-node cluster."""
    why = netns_nodes.skip_reason() or _can_start()
    if why:
        if _in_ci():
            pytest.fail(f"CI=true but a two-node SLURM cannot start: {why}")
        pytest.skip(f"two-node SLURM cluster: {why} (CI=true makes this "
                    "an error)")
    env = clean_env(PYTHON=sys.executable, SLURM_LOCAL_CPUS="2")
    for var in ("SLURM_CONF", "SLURM_LOCAL_DIR", "SLURM_LOCAL_NETNS_PREFIX",
                "SLURM_LOCAL_WARMUP", "SLURM_LOCAL_CTLD_PORT",
                "SLURM_LOCAL_SLURMD_PORT"):
        env.pop(var, None)
    # next to the single-node cluster's DIR (per user and clone); its
    # ports follow from it, so both clusters may be up in one session
    DIR = cluster_dir_of(env) + "-nodes"
    notice = install_notice()
    if notice:
        tell_terminal(pytestconfig, notice)
    t0 = time.monotonic()
    with shared_cluster(DIR, env, ["bash", CLUSTER, "start", DIR, "--nodes",
                                   "2"], ["bash", CLUSTER, "stop", DIR],
                        timeout=240) as out:
        env["_START_SECS"] = f"{time.monotonic() - t0:.1f}"
        for name, value in re.findall(r"^export (\w+)=(.*)$", out, re.M):
            env[name] = value.strip("'")
        yield env


def link_bytes(env):
    """{node: (rx, tx)} bytes of each node's eth0 (its only link)."""
    prefix = env["SLURM_LOCAL_NETNS_PREFIX"]
    out = {}
    for node in env["SLURM_LOCAL_NODES"].split():
        proc = subprocess.run(
            ["bash", netns_nodes.SCRIPT, "exec", "--prefix", prefix, node,
             "cat", "/sys/class/net/eth0/statistics/rx_bytes",
             "/sys/class/net/eth0/statistics/tx_bytes"],
            capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        out[node] = tuple(map(int, proc.stdout.split()))
    return out


def run_ddp(env, tmp_path, name, layout):
    """slurm/train.sbatch of examples/ddp_digits.py (2 epochs), each rank
    first printing `HOST rank hostname`: (job info, output)."""
    job = sbatch(env, [f"--output={tmp_path}/{name}-%j.out"] + layout + [
        "slurm/train.sbatch", "examples/ddp_digits.py", "--epochs", "2",
        "--quiet", "--checkpoint", str(tmp_path / f"{name}-ck")],
        SCRIPT=script("report_host.py"))
    info = wait_job(env, job, timeout=SLOW)
    return info, (tmp_path / f"{name}-{job}.out").read_text()


def final_accuracy(out):
    acc = re.findall(r"final test accuracy ([\d.]+)% on 2 ranks", out)
    assert len(acc) == 1, out
    return float(acc[0])


def test_ddp_example_on_two_nodes_matches_one_node(cluster, tmp_path):
    before = link_bytes(cluster)
    info, out = run_ddp(cluster, tmp_path, "two",
                        ["-N", "2", "--ntasks-per-node=1"])
    after = link_bytes(cluster)
    assert info["JobState"] == "COMPLETED", out
    assert info["NodeList"] == "node[0-1]", info
    assert "2 tasks on node[0-1]" in out
    # each rank on its own node, as its hostname says
    assert sorted(re.findall(r"^HOST (\d) (\S+)$", out, re.M)) == [
        ("0", "node0"), ("1", "node1")], out
    # the gradients crossed the link (node1 has no other way to node0);
    # SLURM's own control traffic is a few KiB
    for node, (rx, tx) in after.items():
        moved = (rx - before[node][0], tx - before[node][1])
        assert min(moved) > 1 << 20, (node, moved)

    ref_info, ref = run_ddp(cluster, tmp_path, "one",
                            ["-N", "1", "--ntasks-per-node=2"])
    assert ref_info["JobState"] == "COMPLETED", ref
    hosts = set(re.findall(r"^HOST \d (\S+)$", ref, re.M))
    assert len(hosts) == 1, ref
    # same seed, same 2 ranks: the same training, wherever the ranks run
    assert final_accuracy(out) == final_accuracy(ref) > 80.0, (out, ref)
    print(f"cluster start {cluster['_START_SECS']} s; job two nodes "
          f"{info['RunTime']}, one node {ref_info['RunTime']}")


def test_job_over_two_nodes_fails_when_a_rank_fails(cluster, tmp_path):
    # rank 1 (on node1) exits 3 while rank 0 (node0) waits: the job fails,
    # ended across nodes by srun --kill-on-bad-exit, not by the timeout
    job = sbatch(cluster, [f"--output={tmp_path}/fail-%j.out", "-N", "2",
                           "--ntasks-per-node=1", "slurm/train.sbatch",
                           "1", "exit", "3"], SCRIPT=script("fail.py"))
    info = wait_job(cluster, job, timeout=SLOW)
    out = (tmp_path / f"fail-{job}.out").read_text()
    assert info["JobState"] == "FAILED", out
    assert "rank 1 fails now (exit 3)" in out, out
    assert info["NodeList"] == "node[0-1]", info
    # rank 0 would sleep 120 s: ending well before means it was ended
    secs = _secs(info["EndTime"]) - _secs(info["StartTime"])
    assert secs < 90, f"job took {secs:.0f} s to fail"


@pytest.mark.parametrize("args,text", [
    (["--nodes", "0"], "--nodes must be an integer in 1..200 (got '0')"),
    (["--nodes", "two"], "--nodes must be an integer in 1..200 (got 'two')"),
    (["--rate", "1gbit"], "--rate shapes the links between namespace nodes: "
                          "it needs --nodes 2 or more"),
    (["--nodes"], "--nodes needs a value"),
])
def test_bad_node_options_are_refused(tmp_path, args, text):
    # refused before anything is installed, made or started
    out = subprocess.run(["bash", CLUSTER, "start", str(tmp_path / "c")]
                         + args, capture_output=True, text=True, timeout=30)
    assert out.returncode == 1 and text in out.stderr, out.stderr
    assert not (tmp_path / "c").exists()
