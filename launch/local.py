"""The local runner: K rank processes on this node.

A job is `nnodes * K` ranks; this launcher owns ranks
`node_rank * K ... node_rank * K + K - 1`.  Launchers on other nodes (or
other terminals: multi-node on loopback) started with the same
--master-addr/--master-port and DTORCH_RDZV_TOKEN join the same job.

Each rank's stdout/stderr is read line by line, prefixed with
`[rank R] `, written to the console (optionally rank 0 only) and to
`LOG_DIR/rankR.log`.  When a rank fails, the others are stopped
(SIGTERM, SIGKILL after the grace period), the failure is reported with
the rank's exit code or signal and the tail of its output, and the job
restarts if restarts are left.
"""

import collections
import contextlib
import os
import signal
import sys
import threading
import time

from launch import env as renv
from launch import procs
from launch.errorfile import VAR as ERROR_FILE_VAR, ErrorFiles

TAIL_LINES = 20
POLL_S = 0.02


def _say(msg):
    print(f"dtorch-launch: {msg}", file=sys.stderr, flush=True)


def _stopping(others):
    """'; stopping the other 2 ranks' for a failure report."""
    if others == 0:
        return ""
    if others == 1:
        return "; stopping the other running rank"
    return f"; stopping the other {others} running ranks"


class _Console:
    """Serialises prefixed lines from the reader threads."""

    def __init__(self, out=None, err=None):
        self.lock = threading.Lock()
        self.out = out or sys.stdout
        self.err = err or sys.stderr

    def write(self, stream, text):
        with self.lock:
            stream.write(text)
            stream.flush()


class _Rank:
    """One rank's process, output readers, log file and output tail."""

    def __init__(self, rank, local_rank, proc, log_path, console, echo):
        self.rank, self.local_rank = rank, local_rank
        self.proc, self.pid = proc, proc.pid
        self.status = None
        self.failed_at = None
        self.tail = collections.deque(maxlen=TAIL_LINES)
        self.log_path = log_path
        self._log = open(log_path, "a", encoding="utf-8") \
            if log_path else None
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._pump, daemon=True,
                             args=(proc.stdout, console, console.out, echo)),
            threading.Thread(target=self._pump, daemon=True,
                             args=(proc.stderr, console, console.err, echo)),
        ]
        for t in self._threads:
            t.start()

    def _pump(self, pipe, console, stream, echo):
        for raw in iter(pipe.readline, b""):
            line = raw.decode("utf-8", "replace")
            if not line.endswith("\n"):
                line += "\n"
            with self._lock:
                self.tail.append(line)
                if self._log:
                    self._log.write(line)
                    self._log.flush()
            if echo:
                # the rank now: an elastic job renumbers its ranks
                console.write(stream, f"[rank {self.rank}] " + line)
        pipe.close()

    def finish(self, timeout=2.0):
        """Reap the process, drain its output, close the log."""
        self.proc.wait()
        end = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, end - time.monotonic()))
        with self._lock:
            if self._log:
                self._log.close()
                self._log = None


PEER_FAILURE = "RankFailureError"


def _caused_by_peer(r):
    """True when the rank's last words are a collective that failed
    because a peer went away (RankFailureError), not a failure of its
    own."""
    with r._lock:
        lines = [ln for ln in r.tail if ln.strip()]
    return bool(lines) and PEER_FAILURE in lines[-1]


def first_cause(failed, drain_s=0.5):
    """`failed` (ranks seen failing in the same poll) with the ones whose
    failure was their own first: when rank 3 exits and rank 2's collective
    fails because of it within one poll, rank 3 is the one to name. The
    exited ranks' output is drained first (its readers may lag behind the
    exit), for at most `drain_s` seconds in all."""
    end = time.monotonic() + drain_s
    for r in failed:
        for t in r._threads:
            t.join(max(0.0, end - time.monotonic()))
    return sorted(failed, key=_caused_by_peer)   # stable: poll order kept


class JobResult:
    """How one attempt ended: ok, a rank failed, or the launcher was
    signalled."""

    def __init__(self, failed=(), signum=None, teardown_s=None):
        self.failed = list(failed)   # _Rank objects, first failure first
        self.signum = signum
        self.teardown_s = teardown_s

    @property
    def ok(self):
        return not self.failed and self.signum is None

    def exit_code(self):
        if self.signum is not None:
            return 128 + self.signum
        if self.failed:
            return procs.exit_code(self.failed[0].status) or 1
        return 0


class LocalRunner:
    """Run `cmd` as `nproc` ranks on this node; see module docstring."""

    def __init__(self, cmd, nproc=1, nnodes=1, node_rank=0,
                 master_addr=renv.DEFAULT_ADDR, master_port=None,
                 backend=None, log_dir=None, only_rank0=False,
                 grace=5.0, max_restarts=0, token=None, base_env=None,
                 console=None):
        if nproc < 1 or nnodes < 1:
            raise ValueError("--nproc-per-node and --nnodes must be >= 1")
        if not 0 <= node_rank < nnodes:
            raise ValueError(
                f"--node-rank {node_rank} is not in [0, {nnodes})")
        base_env = dict(os.environ if base_env is None else base_env)
        token = token or base_env.get("DTORCH_RDZV_TOKEN")
        if nnodes > 1 and master_port is None:
            raise ValueError(
                "--nnodes > 1 needs the same --master-port on every node")
        if nnodes > 1 and not token:
            raise ValueError(
                "--nnodes > 1 needs a secret shared by every node: run "
                "export DTORCH_RDZV_TOKEN=$(python -c 'import secrets; "
                "print(secrets.token_hex(16))') and pass the same value "
                "to the launcher on each node")
        self.cmd = list(cmd)
        self.nproc, self.nnodes, self.node_rank = nproc, nnodes, node_rank
        self.master_addr, self.master_port = master_addr, master_port
        self.backend, self.log_dir = backend, log_dir
        self.only_rank0, self.grace = only_rank0, grace
        self.max_restarts = max_restarts
        self.token = token
        self.base_env = base_env
        self.base_env.setdefault("PYTHONUNBUFFERED", "1")
        self.console = console or _Console()
        self.ranks = []
        self._reaper = None
        self._errors = None     # launch.errorfile.ErrorFiles, at 1st spawn
        if log_dir:
            os.makedirs(log_dir, exist_ok=True)

    # ------------------------------------------------------------------
    def run(self):
        """Run the job, restarting up to max_restarts times; returns the
        launcher's exit code."""
        with procs.SignalTrap() as trap, \
                procs.Reaper(self.grace) as self._reaper, \
                self._error_files():
            for attempt in range(self.max_restarts + 1):
                t0 = time.monotonic()
                result = self._attempt(attempt, trap)
                if result.ok:
                    return 0
                if result.signum is not None:
                    return result.exit_code()
                if attempt < self.max_restarts:
                    _say(f"restarting the job ({attempt + 1} of "
                         f"{self.max_restarts} restarts) after "
                         f"{time.monotonic() - t0:.1f} s")
                    continue
                if self.max_restarts:
                    _say(f"giving up after {self.max_restarts} restarts")
                return result.exit_code()
        return 1

    def _port_and_token(self, attempt):
        # A new rendezvous per attempt, so no rank can join a stale one.
        # Nodes cannot talk before the store exists, so with an explicit
        # port or shared secret the new values are derived, not drawn.
        if self.master_port is None:
            port = renv.free_port(self.master_addr)
        else:
            port = int(self.master_port) + attempt
        if self.token:
            token = renv.derive_token(self.token, attempt)
        else:
            token = renv.new_token()
        return port, token

    def _start(self, attempt):
        port, token = self._port_and_token(attempt)
        world = self.nnodes * self.nproc
        cores = renv.cpu_count()
        self.ranks = []
        for local in range(self.nproc):
            rank = self.node_rank * self.nproc + local
            env = renv.rank_env(
                rank, world, local, self.nproc, self.master_addr, port,
                token=token, restart_count=attempt, backend=self.backend,
                cores=cores, base=self.base_env)
            self._spawn(rank, local, env, f"restart {attempt}")

    @contextlib.contextmanager
    def _error_files(self):
        try:
            yield
        finally:
            if self._errors is not None:
                self._errors.close()

    def _spawn(self, rank, local, env, what):
        """Start one rank with `env`; `what` goes into its log header."""
        if self._errors is None:
            self._errors = ErrorFiles(self.log_dir)
        env[ERROR_FILE_VAR] = self._errors.path(
            rank, int(env.get("DTORCH_RESTART_COUNT") or 0))
        log_path = (os.path.join(self.log_dir, f"rank{rank}.log")
                    if self.log_dir else None)
        if log_path:
            with open(log_path, "a", encoding="utf-8") as f:
                f.write(f"=== dtorch-launch: rank {rank}, {what}, "
                        f"{time.ctime()} ===\n")
        proc = procs.spawn(self.cmd, env)
        if self._reaper is not None:
            self._reaper.watch(proc.pid)
        echo = not self.only_rank0 or rank == 0
        r = _Rank(rank, local, proc, log_path, self.console, echo)
        self.ranks.append(r)
        return r

    def _attempt(self, attempt, trap):
        try:
            self._start(attempt)
        except BaseException:
            self._stop(0.0)
            raise
        failed = []
        while True:
            if trap.signum is not None:
                return self._on_signal(trap)
            now = time.monotonic()
            running = 0
            for r in self.ranks:
                if r.status is None:
                    r.status = procs.peek(r.pid)
                    if r.status is not None and r.status != ("exit", 0):
                        r.failed_at = now
                        failed.append(r)
                if r.status is None:
                    running += 1
            if failed:
                return self._on_failure(self._own_cause(failed))
            if running == 0:
                self._stop(self.grace)  # leftovers of finished ranks
                return JobResult()
            time.sleep(POLL_S)

    def _own_cause(self, failed, wait_s=0.5):
        """`failed` in first_cause's order; while every rank seen failing
        blames a peer, the peer may be one of ours still exiting (its
        sockets close before its exit code is seen): poll the others for up
        to `wait_s` seconds more."""
        failed = first_cause(failed)
        end = time.monotonic() + wait_s
        while _caused_by_peer(failed[0]) and time.monotonic() < end:
            time.sleep(POLL_S)
            now, new = time.monotonic(), []
            for r in self.ranks:
                if r.status is None:
                    r.status = procs.peek(r.pid)
                    if r.status is not None and r.status != ("exit", 0):
                        r.failed_at = now
                        new.append(r)
            if new:
                failed = first_cause(failed + new)
        return failed

    def _stop(self, grace, signum=None, hurry=None):
        pgids = [r.pid for r in self.ranks]
        procs.stop_groups(pgids, signum or signal.SIGTERM, grace,
                          hurry)
        for r in self.ranks:
            if self._reaper is not None:
                self._reaper.forget(r.pid)  # its id is free once reaped
            r.finish()

    def _on_failure(self, failed):
        first = failed[0]
        others = sum(1 for r in self.ranks if r.status is None)
        _say(f"rank {first.rank} (local rank {first.local_rank}, pid "
             f"{first.pid}) {procs.describe_status(first.status)}"
             f"{_stopping(others)}")
        self._stop(self.grace)
        teardown = time.monotonic() - first.failed_at
        for r in failed[1:]:
            _say(f"rank {r.rank} also {procs.describe_status(r.status)}")
        _say(f"all ranks stopped {teardown:.2f} s after the failure")
        where = f" (full log: {first.log_path})" if first.log_path else ""
        lines = list(first.tail)
        if lines:
            _say(f"last {len(lines)} lines of rank {first.rank}{where}:")
            sys.stderr.write("".join(f"    | {ln}" for ln in lines))
            sys.stderr.flush()
        else:
            _say(f"rank {first.rank} printed nothing{where}")
        self._errors.report(first.rank, _say, sys.stderr, lines)
        return JobResult(failed=failed, teardown_s=teardown)

    def _on_signal(self, trap):
        signum = trap.signum
        n = len(self.ranks)
        _say(f"got {procs.signal_name(signum)}; passing it to "
             + ("the rank" if n == 1 else f"the {n} ranks"))
        # a second Ctrl-C skips the rest of the grace period
        self._stop(self.grace, signum, hurry=lambda: trap.urgent)
        return JobResult(signum=signum)
