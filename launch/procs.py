"""Process plumbing shared by the runners: spawn in a new session, watch
without reaping, stop a whole process group, forward the launcher's
signals.  POSIX only (the runners target Linux clusters)."""

import ctypes
import os
import signal
import subprocess
import threading
import time

_PR_SET_PDEATHSIG = 1
try:
    _libc = ctypes.CDLL(None, use_errno=True)
except OSError:  # not glibc-like: no parent-death signal, still works
    _libc = None


def signal_name(signum):
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def describe_status(status):
    """'exited with code 3' / 'was killed by SIGKILL (signal 9)'."""
    kind, value = status
    if kind == "exit":
        return f"exited with code {value}"
    return f"was killed by {signal_name(value)} (signal {value})"


def exit_code(status):
    """Shell convention: the code itself, or 128 + the signal number."""
    kind, value = status
    return min(255, value if kind == "exit" else 128 + value)


def _child_setup(parent_pid):
    def setup():
        # If the launcher itself is SIGKILLed it cannot stop its ranks;
        # the kernel then sends SIGTERM to each rank for us.
        if _libc is not None:
            _libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent_pid:  # the launcher died before prctl
            os._exit(1)
    return setup


def spawn(cmd, env, cwd=None, capture=True):
    """Start `cmd` as the leader of a new session and process group, so
    that killpg(pid) reaches everything it starts (e.g. DataLoader
    workers) and a Ctrl-C in the terminal reaches only the launcher, which
    then forwards it."""
    pipe = subprocess.PIPE if capture else None
    return subprocess.Popen(
        cmd, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
        stdout=pipe, stderr=pipe, start_new_session=True,
        preexec_fn=_child_setup(os.getpid()))


def peek(pid):
    """Exit status of child `pid` without reaping it, or None if it runs.

    Not reaping keeps the pid (and so its process-group id) reserved: a
    later killpg() can never hit an unrelated process that reused it."""
    try:
        info = os.waitid(os.P_PID, pid,
                         os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return ("exit", 0)   # already reaped elsewhere
    if info is None or info.si_pid == 0:
        return None
    if info.si_code == os.CLD_EXITED:
        return ("exit", info.si_status)
    return ("signal", info.si_status)


def group_alive(pgids):
    """Process groups among `pgids` that still hold a live process.

    Reads /proc: a zombie (state Z) counts as gone, since PID 1 on some
    machines reaps orphans only after a second or two."""
    wanted, alive = set(pgids), set()
    try:
        names = os.listdir("/proc")
    except OSError:
        return set(wanted)  # no /proc: assume alive, rely on SIGKILL
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()
        state, pgrp = fields[0], int(fields[2])
        if pgrp in wanted and state not in (b"Z", b"X"):
            alive.add(pgrp)
    return alive


def killpg(pgid, signum):
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def stop_groups(pgids, signum=signal.SIGTERM, grace=5.0):
    """Send `signum` to every group, wait up to `grace` seconds for them
    to empty, then SIGKILL what is left and wait for that too.  Returns
    the set of groups that had to be killed."""
    pgids = list(pgids)
    for pgid in pgids:
        killpg(pgid, signum)
    deadline = time.monotonic() + grace
    left = group_alive(pgids)
    while left and time.monotonic() < deadline:
        time.sleep(0.02)
        left = group_alive(left)
    killed = set(left)
    for pgid in left:
        killpg(pgid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while left and time.monotonic() < deadline:
        time.sleep(0.02)
        left = group_alive(left)
    return killed


class SignalTrap:
    """Catch SIGINT/SIGTERM/SIGHUP while a job runs; the runner polls
    `.signum` and forwards it.  A second signal while stopping means
    'hurry': `.urgent` turns True and the grace period is skipped."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self):
        self.signum = None
        self.urgent = False
        self._old = {}

    def _handler(self, signum, frame):
        if self.signum is not None:
            self.urgent = True
        self.signum = signum

    def __enter__(self):
        # Handlers can only be installed from the main thread; elsewhere
        # (e.g. a test calling the runner in a thread) we do without.
        if threading.current_thread() is threading.main_thread():
            for s in self.SIGNALS:
                self._old[s] = signal.signal(s, self._handler)
        return self

    def __exit__(self, *exc):
        for s, old in self._old.items():
            signal.signal(s, old)
        self._old.clear()
        return False
