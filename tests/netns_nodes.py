"""Several "nodes" on this machine for tests, built on slurm/netns-nodes.sh
(network, UTS, mount and PID namespaces per node; see the script's header).

    from netns_nodes import two_nodes          # module-scoped fixture

    def test_x(two_nodes):
        out = two_nodes.run("node1", ["hostname"]).stdout   # 'node1\\n'
        p = two_nodes.popen("node0", [sys.executable, "job.py"])
        two_nodes.addr["node0"]                             # 169.254.S.1

or `with start_nodes(3, rate="1gbit") as nodes: ...` for other shapes.

Each test session uses its own random prefix, so parallel sessions do not
collide; the nodes are stopped when the fixture ends, also after a failing
test, and (as a backstop) at interpreter exit.  A session that was
SIGKILLed leaves its nodes behind: the next start stops test prefixes whose
owner process is gone.  Tests skip with the reason when not root or when a
tool the script needs is missing; with both, a failure to start fails."""
import atexit
import functools
import os
import re
import secrets
import shutil
import signal
import subprocess
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "slurm", "netns-nodes.sh")
STATE_ROOT = "/run/dtorch-netns"
TOOLS = ("ip", "tc", "unshare", "nsenter", "setpriv", "bash")
# test prefixes: "dt" + 6 hex digits (netns-nodes.sh allows 10 characters)
_TEST_PREFIX = re.compile(r"^dt[0-9a-f]{6}$")


def skip_reason():
    """Why namespace nodes cannot be made here, or None."""
    if os.name != "posix" or not hasattr(os, "geteuid"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "netns nodes need root (namespaces, veth links, tc)"
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return f"netns nodes need {', '.join(missing)} (not installed)"
    return None


def _script(*args, timeout=60, check=True):
    proc = subprocess.run(["bash", SCRIPT] + list(args), capture_output=True,
                          text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise RuntimeError(f"netns-nodes.sh {' '.join(args)} failed "
                           f"({proc.returncode}):\n{proc.stderr}")
    return proc


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stop_orphans():
    """Stop test prefixes left by sessions that died without teardown."""
    try:
        names = os.listdir(STATE_ROOT)
    except OSError:
        return
    for name in names:
        if not _TEST_PREFIX.match(name):
            continue
        try:
            with open(os.path.join(STATE_ROOT, name, "owner")) as f:
                owner = int(f.read().strip())
        except (OSError, ValueError):
            continue   # being started right now, or not ours
        if not _pid_alive(owner):
            _script("stop", "--prefix", name, check=False)


class Nodes:
    """Handle on started nodes: names, addresses, run/popen inside one."""

    def __init__(self, prefix, lines, rate):
        self.prefix, self.rate = prefix, rate
        self.names, self.addr, self.netns, self.holder = [], {}, {}, {}
        for line in lines:
            name, addr, netns, pid = line.split("\t")
            self.names.append(name)
            self.addr[name] = addr
            self.netns[name] = netns
            self.holder[name] = int(pid)   # the node's PID 1, host pid
        self._stopped = False

    def __len__(self):
        return len(self.names)

    def command(self, node, cmd):
        """The argv that runs `cmd` (a list, or a string for bash -c) in
        `node` through the script's exec."""
        if isinstance(cmd, str):
            cmd = ["bash", "-c", cmd]
        return ["bash", SCRIPT, "exec", "--prefix", self.prefix, node] \
            + list(cmd)

    def run(self, node, cmd, timeout=60, check=False, **kw):
        """subprocess.run inside `node` (text output captured unless
        stdout/stderr are given); raises on timeout like subprocess.run."""
        kw.setdefault("capture_output", "stdout" not in kw)
        kw.setdefault("text", True)
        proc = subprocess.run(self.command(node, cmd), timeout=timeout, **kw)
        if check and proc.returncode != 0:
            raise AssertionError(
                f"{cmd!r} on {node} exited with {proc.returncode}\n"
                f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
        return proc

    def popen(self, node, cmd, **kw):
        """subprocess.Popen inside `node`, in a session of its own.  Its pid
        is nsenter's; the command is nsenter's child and dies with it
        (SIGKILL), so proc.kill() kills the command; inner_pid(proc) is the
        command's own pid for other signals."""
        kw.setdefault("start_new_session", True)
        return subprocess.Popen(self.command(node, cmd), **kw)

    @staticmethod
    def inner_pid(proc, timeout=30):
        """The host pid of the command a popen() started (nsenter's
        child), waiting for nsenter to have forked it."""
        deadline = time.monotonic() + timeout
        path = f"/proc/{proc.pid}/task/{proc.pid}/children"
        while True:
            try:
                with open(path) as f:
                    kids = f.read().split()
            except OSError:
                kids = []
            # the script execs nsenter: wait until the exec happened
            try:
                with open(f"/proc/{proc.pid}/comm") as f:
                    comm = f.read().strip()
            except OSError:
                comm = ""
            if kids and comm == "nsenter":
                return int(kids[0])
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"no command running under pid {proc.pid} "
                    f"(exit status {proc.returncode})")
            time.sleep(0.02)

    def counters(self, node, dev="eth0"):
        """{'rx_bytes', 'tx_bytes', 'rx_packets', 'tx_packets'} of `dev` in
        `node`, read from the node's own sysfs."""
        keys = ("rx_bytes", "tx_bytes", "rx_packets", "tx_packets")
        out = self.run(node, ["cat"] + [
            f"/sys/class/net/{dev}/statistics/{k}" for k in keys],
            check=True).stdout.split()
        return dict(zip(keys, map(int, out)))

    def set_rate(self, rate):
        """Reshape every link to `rate` ('1gbit'...) or unshape (None)."""
        _script("rate", rate or "none", "--prefix", self.prefix)
        self.rate = rate

    def stop(self):
        if not self._stopped:
            self._stopped = True
            _script("stop", "--prefix", self.prefix, check=False)


def new_prefix():
    return "dt" + secrets.token_hex(3)


class start_nodes:
    """Context manager: start `n` nodes (rate: tc rate such as '1gbit', or
    None for unshaped), stop them on exit whatever happened."""

    def __init__(self, n=2, rate=None, prefix=None, host_link=False):
        self.n, self.rate, self.host_link = n, rate, host_link
        self.prefix = prefix or new_prefix()
        self.nodes = None

    def __enter__(self):
        reason = skip_reason()
        if reason:
            pytest.skip(reason)
        _stop_orphans()
        args = ["start", str(self.n), "--prefix", self.prefix]
        if self.rate:
            args += ["--rate", self.rate]
        if self.host_link:
            args.append("--host-link")
        self._atexit = functools.partial(_script, "stop", "--prefix",
                                         self.prefix, check=False)
        atexit.register(self._atexit)
        try:
            proc = _script(*args)
            with open(os.path.join(STATE_ROOT, self.prefix, "owner"),
                      "w") as f:
                f.write(str(os.getpid()))
        except BaseException:
            _script("stop", "--prefix", self.prefix, check=False)
            raise
        self.nodes = Nodes(self.prefix, proc.stdout.splitlines(), self.rate)
        return self.nodes

    def __exit__(self, *exc):
        if self.nodes is not None:
            self.nodes.stop()
        else:
            _script("stop", "--prefix", self.prefix, check=False)
        atexit.unregister(self._atexit)
        return False


@pytest.fixture(scope="module")
def two_nodes():
    """Two unshaped nodes, node0 and node1, for one test module."""
    with start_nodes(2) as nodes:
        yield nodes


def kill_tree(proc):
    """SIGKILL a popen()ed command (a test's cleanup): nsenter's process
    group, which holds the command too unless it made a session of its
    own; such a command still dies with nsenter (its parent-death
    signal)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
