"""Process plumbing shared by the runners: spawn in a new session, watch
without reaping, stop a whole process group, forward the launcher's
signals.  POSIX only (the runners target Linux clusters)."""

import ctypes
import os
import signal
import subprocess
import sys
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


def members(sessions):
    """Live processes in the sessions (or process groups) `sessions`,
    as {pid: session}.

    Each rank leads its own session, and a session cannot be left except
    by setsid(): processes that moved to another process group (mpiexec's
    ranks, a shell's jobs) are still found, even after their parent died.
    Reads /proc; a zombie (state Z) counts as gone, since PID 1 on some
    machines reaps orphans only after a second or two."""
    wanted, found = set(sessions), {}
    try:
        names = os.listdir("/proc")
    except OSError:  # no /proc: report the leaders, rely on SIGKILL
        return {s: s for s in wanted}
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()
        state, pgrp, sid = fields[0], int(fields[2]), int(fields[3])
        if state in (b"Z", b"X"):
            continue
        if sid in wanted or pgrp in wanted:
            found[int(name)] = sid if sid in wanted else pgrp
    return found


def _signal_all(sessions, signum):
    for sid in sessions:
        killpg(sid, signum)
    for pid in members(sessions):
        try:
            os.kill(pid, signum)
        except (ProcessLookupError, PermissionError):
            pass


def killpg(pgid, signum):
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def stop_groups(sessions, signum=signal.SIGTERM, grace=5.0, hurry=None):
    """Send `signum` to every process of the sessions started by spawn(),
    wait up to `grace` seconds for them to end (less once `hurry()` turns
    true), then SIGKILL what is left and wait for that too.  Returns the
    pids that had to be killed.

    The session leaders must not be reaped yet (see peek), so their ids
    cannot have been reused."""
    sessions = list(sessions)
    if not members(sessions):
        return set()
    _signal_all(sessions, signum)
    deadline = time.monotonic() + grace
    left = members(sessions)
    while left and time.monotonic() < deadline:
        if hurry is not None and hurry():
            break
        time.sleep(0.02)
        left = members(sessions)
    killed = set(left)
    if left:
        _signal_all(sessions, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while left and time.monotonic() < deadline:
        time.sleep(0.02)
        left = members(sessions)
    return killed


class Reaper:
    """The launcher's insurance against its own sudden death: a
    `python -m launch.reaper` process in a session of its own that stops
    the ranks' sessions (SIGTERM, SIGKILL after `grace`) once the launcher
    is gone, even if it was SIGKILLed.  Use as a context manager around a
    job; `watch(pid)` after each spawn(), `forget(pid)` before the rank is
    reaped."""

    def __init__(self, grace=5.0):
        self.grace = grace
        self._proc = None

    def __enter__(self):
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "launch.reaper", str(self.grace)],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                start_new_session=True, text=True,
                env=dict(os.environ, PYTHONPATH=_launch_root()))
        except OSError:  # no reaper: the ranks still get PDEATHSIG
            self._proc = None
        return self

    def _send(self, line):
        if self._proc is None:
            return
        try:
            self._proc.stdin.write(line + "\n")
            self._proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            self._proc = None    # the reaper died: carry on without it

    def watch(self, sid):
        self._send(f"+{sid}")

    def forget(self, sid):
        self._send(f"-{sid}")

    def __exit__(self, *exc):
        if self._proc is not None:
            try:
                self._proc.stdin.close()  # EOF: "the launcher is done"
            except (BrokenPipeError, ValueError):
                pass
            try:
                self._proc.wait(timeout=self.grace + 10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
        return False


def _launch_root():
    """The directory holding the `launch` package, so the reaper imports
    this very copy whatever the working directory."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    old = os.environ.get("PYTHONPATH")
    return here + (os.pathsep + old if old else "")


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
