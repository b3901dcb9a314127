"""dtorch-launch across two "hosts": one launcher per netns node (own
network, hostname, /dev/shm and PID namespace; slurm/netns-nodes.sh), tcp
backend, ranks meeting only over the veth link.  Needs root and ip/tc/
unshare/nsenter (skips with the reason otherwise; CI has them)."""
import os
import random
import re
import secrets
import signal
import subprocess
import sys
import threading
import time

import pytest

from launch_scripts.harness import ROOT, UNDER_MPI, clean_env, script
from netns_nodes import STATE_ROOT, kill_tree, start_nodes

if UNDER_MPI:
    pytest.skip("starts its own jobs; runs in the single-process phase",
                allow_module_level=True)

pytestmark = pytest.mark.timeout(300)

# Deadlines catch hangs on a loaded 2-core machine, not slowness.
JOB_S = 180


@pytest.fixture(scope="module")
def two_nodes():
    """node0 and node1, unshaped, shared by this module's tests (each
    test leaves no process in them)."""
    with start_nodes(2) as nodes:
        yield nodes


class _Reader:
    """Collects a process's stdout/stderr lines in threads."""

    def __init__(self, proc):
        self.proc, self.out, self.err = proc, [], []
        self._threads = [threading.Thread(target=self._pump, daemon=True,
                                          args=(s, acc)) for s, acc in
                         ((proc.stdout, self.out), (proc.stderr, self.err))]
        for t in self._threads:
            t.start()

    def _pump(self, stream, acc):
        for line in iter(stream.readline, ""):
            acc.append(line)
        stream.close()

    def join(self, timeout=10):
        for t in self._threads:
            t.join(timeout)
        return "".join(self.out), "".join(self.err)


def _launchers(nodes, k, mode, first=0, args=(), launcher=(), **env):
    """Start dtorch-launch on node0 (node rank 0) and node1, node `first`
    first; returns [(proc, reader)] for node0 and node1."""
    port = random.randrange(20000, 40000)
    env = clean_env(DTORCH_RDZV_TOKEN=secrets.token_hex(16),
                    PYTHONUNBUFFERED=1, **env)
    procs = [None, None]
    for r in (first, 1 - first):
        node = f"node{r}"
        cmd = [sys.executable, "-m", "launch", "--nnodes", "2",
               "--node-rank", str(r), "--master-addr", "node0",
               "--master-port", str(port), "--nproc-per-node", str(k),
               "--backend", "tcp", "--grace-period", "3", *launcher,
               script("two_nodes_job.py"), mode] + list(args)
        p = nodes.popen(node, cmd, cwd=ROOT, env=env, text=True,
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        procs[r] = (p, _Reader(p))
        if r == first:
            time.sleep(1.0)   # the other node joins a job already waiting
    return procs


def _wait_all(procs, timeout):
    deadline = time.monotonic() + timeout
    try:
        for p, _ in procs:
            p.wait(max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        for p, _ in procs:
            kill_tree(p)
        outs = [r.join() for _, r in procs]
        raise AssertionError(f"launchers still running after {timeout} s: "
                             f"{outs}")
    return [r.join() for _, r in procs]


def _node_processes(nodes, node):
    """Processes in `node` other than its PID 1 holder and this ps."""
    out = nodes.run(node, ["ps", "-e", "-o", "pid=,args="],
                    check=True).stdout
    return [ln for ln in out.splitlines()
            if ln.split()[0] != "1" and "ps -e" not in ln
            and not ln.split(None, 1)[1].startswith("sleep 3600")]


def test_nodes_are_separate_hosts(two_nodes):
    n = two_nodes
    assert n.run("node0", "hostname", check=True).stdout.strip() == "node0"
    assert n.run("node1", "hostname", check=True).stdout.strip() == "node1"
    # /dev/shm is private per node and persists between exec calls
    name = f"/dev/shm/dtorch-two-nodes-{secrets.token_hex(4)}"
    n.run("node0", ["touch", name], check=True)
    try:
        assert n.run("node0", ["test", "-e", name]).returncode == 0
        assert n.run("node1", ["test", "-e", name]).returncode != 0
        assert not os.path.exists(name)
    finally:
        n.run("node0", ["rm", "-f", name])
    # the nodes reach each other by name over eth0, on 169.254/16 only
    addrs = n.run("node1", "ip -4 -o addr show", check=True).stdout
    assert re.findall(r"inet (\S+)/", addrs) == ["127.0.0.1", n.addr["node1"]]
    assert n.addr["node0"].startswith("169.254.")
    got = n.run("node1", "getent hosts node0", check=True).stdout.split()[0]
    assert got == n.addr["node0"]
    # each node has its own process table: node1 cannot see node0's pids
    p = n.popen("node0", ["sleep", "60"])
    try:
        inner = n.inner_pid(p)
        assert inner != p.pid
        seen = n.run("node1", ["ps", "-e", "-o", "args="]).stdout
        assert "sleep 60" not in seen
        seen0 = n.run("node0", ["ps", "-e", "-o", "args="]).stdout
        assert "sleep 60" in seen0
    finally:
        p.kill()
        p.wait(10)
    # killing the pid we started killed the command inside the node
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{inner}") and time.monotonic() < deadline:
        with open(f"/proc/{inner}/stat") as f:
            if f.read().split(") ")[1].split()[0] in ("Z", "X"):
                break
        time.sleep(0.05)
    assert "sleep 60" not in n.run("node0", ["ps", "-e", "-o",
                                             "args="]).stdout


def _qdisc(netns, dev):
    return subprocess.run(["tc", "-n", netns, "qdisc", "show", "dev", dev],
                          capture_output=True, text=True, check=True).stdout


def test_script_shapes_reaches_and_cleans_up():
    """Three shaped nodes: every link (node side and switch side) has the
    tbf rate, the rate can be changed live, the nodes reach each other by
    name, and stop leaves no namespace, state or holder behind."""
    with start_nodes(3, rate="100mbit") as n:
        prefix, holders = n.prefix, list(n.holder.values())
        sw = f"{prefix}-sw"
        for i, node in enumerate(n.names):
            assert "tbf" in _qdisc(n.netns[node], "eth0")
            assert "rate 100Mbit" in _qdisc(n.netns[node], "eth0")
            assert "rate 100Mbit" in _qdisc(sw, f"p{i}")
        n.set_rate("2gbit")
        assert "rate 2Gbit" in _qdisc(n.netns["node2"], "eth0")
        assert "rate 2Gbit" in _qdisc(sw, "p2")
        n.set_rate(None)
        assert "tbf" not in _qdisc(n.netns["node2"], "eth0")
        srv = n.popen("node0", [sys.executable, "-c", (
            "import socket; s = socket.create_server(('node0', 7001)); "
            "print('up', flush=True); c, a = s.accept(); "
            "print(c.recv(64).decode().strip(), a[0], flush=True)")],
            stdout=subprocess.PIPE, text=True)
        try:
            assert srv.stdout.readline() == "up\n"
            n.run("node2", "echo hello >/dev/tcp/node0/7001", check=True)
            assert srv.stdout.readline().split() == ["hello",
                                                     n.addr["node2"]]
            assert srv.wait(30) == 0
        finally:
            kill_tree(srv)
    names = subprocess.run(["ip", "netns", "list"], capture_output=True,
                           text=True, check=True).stdout
    assert prefix not in names
    assert not os.path.exists(os.path.join(STATE_ROOT, prefix))
    for pid in holders:
        assert not os.path.exists(f"/proc/{pid}/cmdline") or \
            b"dtorch-netns" not in open(f"/proc/{pid}/cmdline", "rb").read()


@pytest.mark.parametrize("hierarchical", [None, "0"], ids=["auto", "flat"])
def test_launch_two_nodes_tcp(two_nodes, hierarchical):
    """2 nodes x 2 ranks: hostnames, all_reduce/broadcast, 3 DDP steps;
    the cross-node bytes went over eth0.  node1's launcher starts first:
    it waits for the master node's store.  Run with the all-reduce chosen
    from the hosts (auto) and with the flat ring."""
    n, k = two_nodes, 2
    env = {} if hierarchical is None else \
        {"DTORCH_HIERARCHICAL": hierarchical}
    before = {node: n.counters(node) for node in n.names}
    t0 = time.monotonic()
    (o0, e0), (o1, e1) = _wait_all(
        _launchers(n, k, "check", first=1, **env), JOB_S)
    took = time.monotonic() - t0
    out = o0 + o1
    assert sorted(map(int, re.findall(r"\bOK (\d+)", out))) == \
        [0, 1, 2, 3], f"node0:\n{o0}{e0}\nnode1:\n{o1}{e1}"
    hosts = {int(r): (h, rest.split()) for r, h, rest in
             re.findall(r"\bHOST (\d+) (\S+) ([^\n]*)", out)}
    for rank in range(2 * k):
        assert hosts[rank][0] == f"node{rank // k}"
        assert hosts[rank][1] == ["node0"] * k + ["node1"] * k
    # every rank line came through the launcher of its own node
    assert set(re.findall(r"\[rank (\d)\]", o0)) == {"0", "1"}
    assert set(re.findall(r"\[rank (\d)\]", o1)) == {"2", "3"}
    after = {node: n.counters(node) for node in n.names}
    # the 1 MiB all-reduce alone moves >= 1 MiB each way across the link
    # (ring or hierarchical); nothing else leaves a node but over eth0
    for node in n.names:
        for key in ("tx_bytes", "rx_bytes"):
            moved = after[node][key] - before[node][key]
            assert moved >= 1 << 20, (node, key, moved)
    print(f"two nodes x {k} ranks: {took:.1f} s; eth0 node0 tx "
          f"{after['node0']['tx_bytes'] - before['node0']['tx_bytes']} B")
    for node in n.names:
        assert _node_processes(n, node) == []


@pytest.mark.parametrize("victim", ["node1", "node0"])
def test_dead_node_stops_the_other(two_nodes, victim):
    """SIGKILL one node's launcher (by the pid started in that node): its
    ranks die with it, the other node's ranks fail their next all-reduce
    and that launcher stops its job with an error naming the lost rank."""
    n, k = two_nodes, 2
    procs = _launchers(n, k, "loop")
    try:
        deadline = time.monotonic() + JOB_S
        while len(re.findall(r"\bREADY \d+", "".join(
                procs[0][1].out + procs[1][1].out))) < 2 * k:
            assert time.monotonic() < deadline, "ranks never got ready"
            assert all(p.poll() is None for p, _ in procs), \
                [r.join() for _, r in procs]
            time.sleep(0.05)
        dead = int(victim[-1])
        other = 1 - dead
        os.kill(n.inner_pid(procs[dead][0]), signal.SIGKILL)
        t0 = time.monotonic()
        procs[other][0].wait(JOB_S)
        took = time.monotonic() - t0
    finally:
        for p, _ in procs:
            if p.poll() is None:
                kill_tree(p)
    (out, err) = procs[other][1].join()
    procs[dead][0].wait(30)
    assert procs[other][0].returncode != 0, out + err
    lost = range(dead * k, dead * k + k)
    # the survivors' ranks name a rank of the dead node
    named = set(map(int, re.findall(r"\brank (\d+)\b", err)))
    assert named & set(lost), err
    # ... and the host it was on: a rank number alone does not say which
    # of many nodes to look at
    assert f"host {n.addr[victim]}" in err, err
    print(f"{victim} killed: node{other}'s launcher exited "
          f"{procs[other][0].returncode} after {took:.1f} s")
    for node in n.names:
        left = []
        end = time.monotonic() + 20
        while time.monotonic() < end:
            left = _node_processes(n, node)
            if not left:
                break
            time.sleep(0.1)
        assert left == [], (node, left)


@pytest.mark.parametrize("hierarchical", [None, "0"], ids=["auto", "flat"])
def test_vanished_node_times_out(two_nodes, hierarchical):
    """A node that vanishes without closing its connections (link down,
    then its launcher killed: a power cut): node0's ranks give up after
    DTORCH_COLLECTIVE_TIMEOUT, naming ranks of node1 as those that never
    arrived (a live rank of node0 must never be blamed)."""
    n, k = two_nodes, 2
    env = {} if hierarchical is None else \
        {"DTORCH_HIERARCHICAL": hierarchical}
    procs = _launchers(n, k, "loop", DTORCH_COLLECTIVE_TIMEOUT=3, **env)
    link = ["ip", "-n", n.netns["node1"], "link", "set", "eth0"]
    try:
        deadline = time.monotonic() + JOB_S
        while len(re.findall(r"\bREADY \d+", "".join(
                procs[0][1].out + procs[1][1].out))) < 2 * k:
            assert time.monotonic() < deadline, "ranks never got ready"
            assert all(p.poll() is None for p, _ in procs), \
                [r.join() for _, r in procs]
            time.sleep(0.05)
        subprocess.run(link + ["down"], check=True)
        os.kill(n.inner_pid(procs[1][0]), signal.SIGKILL)
        t0 = time.monotonic()
        procs[0][0].wait(JOB_S)
        took = time.monotonic() - t0
    finally:
        for p, _ in procs:
            if p.poll() is None:
                kill_tree(p)
        subprocess.run(link + ["up"], check=True)
    out, err = procs[0][1].join()
    assert procs[0][0].returncode != 0, out + err
    assert "timed out after 3.0 s" in err, err
    blamed = re.findall(r"ranks that did not arrive: \[([\d, ]+)\]", err)
    assert blamed, err
    for ranks in blamed:
        assert set(map(int, ranks.split(","))) <= {2, 3}, err
    print(f"node1 vanished: node0's launcher exited after {took:.1f} s")
    procs[1][0].wait(30)
    for node in n.names:
        end = time.monotonic() + 20
        while _node_processes(n, node) and time.monotonic() < end:
            time.sleep(0.1)
        assert _node_processes(n, node) == []


def test_skip_reason_names_what_is_missing(monkeypatch):
    """Where nodes cannot be made the tests skip saying why (CI is root
    and has the tools, so there they run)."""
    import netns_nodes
    monkeypatch.setattr(netns_nodes.os, "geteuid", lambda: 1000)
    assert "root" in netns_nodes.skip_reason()
    monkeypatch.setattr(netns_nodes.os, "geteuid", lambda: 0)
    real = netns_nodes.shutil.which
    monkeypatch.setattr(netns_nodes.shutil, "which",
                        lambda t: None if t in ("tc", "nsenter") else real(t))
    assert netns_nodes.skip_reason() == \
        "netns nodes need tc, nsenter (not installed)"


def test_first_connection_to_a_dead_rank_fails_at_once(two_nodes, tmp_path):
    """A rank whose first p2p connection (lazy: send/recv, the cross-host
    all-reduce) goes to a rank that has died since it published its
    address gets 'connection refused': that is a failure naming the rank,
    not a listener still starting up to wait for until the timeout."""
    n = two_nodes
    go = tmp_path / "go"        # /tmp is shared by the nodes
    procs = _launchers(n, 1, "send_to_dead", args=[str(go)],
                       DTORCH_COLLECTIVE_TIMEOUT=60)
    try:
        deadline = time.monotonic() + JOB_S
        while len(re.findall(r"\bREADY \d+", "".join(
                procs[0][1].out + procs[1][1].out))) < 2:
            assert time.monotonic() < deadline, "ranks never got ready"
            assert all(p.poll() is None for p, _ in procs), \
                [r.join() for _, r in procs]
            time.sleep(0.05)
        procs[1][0].kill()      # node1's launcher and, with it, rank 1
        procs[1][0].wait(30)
        end = time.monotonic() + 30
        while _node_processes(n, "node1") and time.monotonic() < end:
            time.sleep(0.05)
        assert _node_processes(n, "node1") == []
        go.write_text("go")
        procs[0][0].wait(JOB_S)
    finally:
        for p, _ in procs:
            if p.poll() is None:
                kill_tree(p)
    out, err = procs[0][1].join()
    assert procs[0][0].returncode != 0 and "SENT" not in out, out + err
    assert "RankFailureError: connection with rank 1 (global 1, host " \
        f"{n.addr['node1']}) of group 'world' could not be opened" in err, \
        err


def test_failed_start_leaves_nothing():
    """A start that fails half-way (node0's /dev/shm cannot be mounted)
    says why and undoes the namespaces and links it had made."""
    import netns_nodes
    if netns_nodes.skip_reason():
        pytest.skip(netns_nodes.skip_reason())
    prefix = netns_nodes.new_prefix()
    try:
        proc = netns_nodes._script("start", "2", "--prefix", prefix,
                                   "--rate", "1gbit", "--shm-size", "bogus",
                                   check=False)
        assert proc.returncode == 1
        assert "node0 did not start" in proc.stderr, proc.stderr
        names = subprocess.run(["ip", "netns", "list"], capture_output=True,
                               text=True, check=True).stdout
        assert prefix not in names
        assert not os.path.exists(os.path.join(STATE_ROOT, prefix))
    finally:
        netns_nodes._script("stop", "--prefix", prefix, check=False)


def test_restart_after_a_rank_fails_on_one_node(two_nodes):
    """Rank 3 (node1) fails in the first attempt: node1's launcher restarts
    its ranks, node0's ranks lose their peer and node0's launcher restarts
    too; both meet again on the derived port and token and finish."""
    n = two_nodes
    procs = _launchers(n, 2, "fail_once", launcher=["--max-restarts", "1"])
    (o0, e0), (o1, e1) = _wait_all(procs, JOB_S)
    assert [p.returncode for p, _ in procs] == [0, 0], \
        f"node0:\n{o0}{e0}\nnode1:\n{o1}{e1}"
    assert sorted(map(int, re.findall(r"\bOK (\d+)", o0 + o1))) == \
        [0, 1, 2, 3]
    assert "rank 3 (local rank 1, pid" in e1 and "exited with code 3" in e1
    for err in (e0, e1):
        assert "restarting the job (1 of 1 restarts)" in err, err
