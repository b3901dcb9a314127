"""dtorch-launch --elastic MIN:MAX: the survivors of a lost rank go on.

    dtorch-launch --elastic 2:4 --nproc-per-node 3 train.py
    dtorch-launch --join --master-port P --nproc-per-node 1 train.py

The node-0 launcher starts a store *agent* (``python -m
collectives.elastic_store host``; this package imports neither dtorch nor
collectives, it only talks to the agent's stdin/stdout) that serves the
job's rendezvous store, so no rank hosts it and any rank may die. A rank
that exits with an error or a signal is reported, named, to the store
(``dead``) and the other ranks are left running: they agree on the new
membership there (``dtorch.distributed.elastic``), and the agent tells this
launcher each decided round, which it prints (lost rank, new world size).
The job ends when every rank has ended; its exit code is that of the ranks
of the last membership (0 when they finished).

``--join`` starts ranks that join a running job (same --master-addr,
--master-port and DTORCH_RDZV_TOKEN) at its next step boundary; without
DTORCH_RDZV_TOKEN, a local join reads the token that the job's launcher
left (mode 0600) in ``$TMPDIR/dtorch-elastic-PORT.token``. More ranks than
MAX are refused before any starts.
"""

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from launch import env as renv
from launch import procs
from launch.local import POLL_S, JobResult, LocalRunner, _say


def token_file(port):
    return os.path.join(tempfile.gettempdir(), f"dtorch-elastic-{port}.token")


class Agent:
    """The store agent process and its line protocol (module docstring).
    ``on_round(decision)`` gets each decided round (host mode)."""

    def __init__(self, mode, host, port, token, world=0, lo=1, hi=1,
                 on_round=None):
        cmd = [sys.executable, "-m", "collectives.elastic_store", mode,
               host, str(port)]
        if mode == "host":
            cmd += [str(world), str(lo), str(hi)]
        env = dict(os.environ, DTORCH_RDZV_TOKEN=token,
                   PYTHONPATH=procs._launch_root())
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env=env, start_new_session=True)
        self.on_round = on_round
        self.answers = queue.Queue()
        self._lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()
        first = self._answer("ready", 90.0)
        self.port = int(first.split()[1])

    def _read(self):
        for line in self.proc.stdout:
            head, _, rest = line.rstrip("\n").partition(" ")
            if head == "round":
                if self.on_round is not None:
                    self.on_round(json.loads(rest))
            else:
                self.answers.put((head, rest))
        self.answers.put(("eof", ""))

    def _answer(self, want, timeout=30.0):
        try:
            head, rest = self.answers.get(timeout=timeout)
        except queue.Empty:
            raise RuntimeError(f"the elastic store agent did not answer "
                               f"{want!r} within {timeout:.0f} s") from None
        if head == "error" or head == "eof":
            raise RuntimeError(f"the elastic store agent failed: "
                               f"{rest or 'it exited'}")
        return f"{head} {rest}"

    def ask(self, line):
        with self._lock:
            self._send(line)
            return self._answer(line.split()[0])

    def _send(self, line):
        try:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass

    def dead(self, uid, why):
        with self._lock:
            self._send(f"dead {uid} {why}")

    def close(self, hurry=False):
        """End the agent. The host's serves the store until the ranks of
        other launchers (joiners, other nodes) have left it, unless
        `hurry` (the launcher was signalled)."""
        try:
            self.proc.stdin.close()
        except (BrokenPipeError, ValueError):
            pass
        try:
            self.proc.wait(timeout=0 if hurry else 2)
            return
        except subprocess.TimeoutExpired:
            pass
        if not hurry:
            _say("this launcher's ranks are done; serving the store until "
                 "the other launchers' ranks leave it")
            try:
                self.proc.wait()
                return
            except KeyboardInterrupt:
                pass
        self.proc.kill()
        self.proc.wait()


def _status(proc):
    code = proc.returncode
    return ("signal", -code) if code < 0 else ("exit", code)


def _close_store(launcher, trap):
    """A launcher's end: its store agent closed (at once after a signal)
    and the rendezvous token file it wrote removed."""
    if launcher.agent is not None:
        launcher.agent.close(hurry=trap.signum is not None)
    if launcher._token_path:
        try:
            os.remove(launcher._token_path)
        except OSError:
            pass


class ElasticRunner(LocalRunner):
    """LocalRunner whose ranks outlive each other's deaths (module
    docstring). ``elastic``: (MIN, MAX); ``join``: start joiners."""

    def __init__(self, cmd, elastic=(1, 1), join=False, node_agent=False,
                 **kw):
        lo, hi = elastic
        nproc = kw.get("nproc", 1)
        world = kw.get("nnodes", 1) * nproc
        if not join and not lo <= world <= hi:
            raise ValueError(
                f"--elastic {lo}:{hi}: the job starts with {world} ranks "
                f"(--nnodes x --nproc-per-node), outside MIN:MAX")
        port = kw.get("master_port")
        if join and port is None:
            raise ValueError("--join needs the --master-port (and "
                             "--master-addr) of the job to join")
        base = dict(os.environ if kw.get("base_env") is None
                    else kw["base_env"])
        if join and not (kw.get("token") or base.get("DTORCH_RDZV_TOKEN")):
            try:
                with open(token_file(port)) as f:
                    kw["token"] = f.read().strip()
            except OSError:
                raise ValueError(
                    f"--join: DTORCH_RDZV_TOKEN is not set and no local "
                    f"job left {token_file(port)}: set the job's secret "
                    f"token") from None
        super().__init__(cmd, **kw)
        self.lo, self.hi, self.join = lo, hi, join
        # a node's launcher under --runner slurm: the store is hosted by
        # the launcher that started this step (node 0 included), which
        # prints the rounds
        self.node_agent = node_agent
        self.world0 = world
        self.agent = None
        self.uids = {}            # uid -> _Rank
        self.last = None          # the last decided round
        self._token_path = None

    def run(self):
        with procs.SignalTrap() as trap, \
                procs.Reaper(self.grace) as self._reaper, \
                self._error_files():
            try:
                return self._run(trap)
            finally:
                _close_store(self, trap)

    # ------------------------------------------------------------------
    def _on_round(self, dec):
        self.last = dec
        for uid, r in list(self.uids.items()):   # the console's [rank N]
            if uid in dec["members"]:
                r.rank = dec["members"].index(uid)
        if not self.node_agent:
            _say(dec["text"])

    def _open_agent(self):
        token = self.token or renv.new_token()
        self.token = token
        host = self.node_rank == 0 and not self.join and \
            not self.node_agent
        if host:
            port = self.master_port
            if port is None:
                port = renv.free_port(self.master_addr)
            self.agent = Agent("host", self.master_addr, port, token,
                               self.world0, self.lo, self.hi,
                               on_round=self._on_round)
            self.master_port = self.agent.port
            if not os.environ.get("DTORCH_RDZV_TOKEN") and \
                    self.nnodes == 1:
                self._token_path = token_file(self.master_port)
                fd = os.open(self._token_path,
                             os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "w") as f:
                    f.write(token)
            _say(f"elastic job ({self.lo} to {self.hi} ranks) with its "
                 f"store on {self.master_addr}:{self.master_port}; add "
                 f"ranks with: dtorch-launch --join --master-port "
                 f"{self.master_port} --nproc-per-node K "
                 f"{' '.join(self.cmd[1:])}")
        else:
            self.agent = Agent("client", self.master_addr,
                               self.master_port, token,
                               on_round=self._on_round)
        if self.join:
            self.lo, self.hi = map(int, self.agent.ask("minmax").split()[1:])
            total = int(self.agent.ask(f"seats {self.nproc}").split()[1])
            if total > self.hi:
                self.agent.ask(f"seats {-self.nproc}")
                raise ValueError(
                    f"--join refused: the job has {total - self.nproc} "
                    f"rank(s); {self.nproc} more would exceed its maximum "
                    f"{self.hi} (--elastic {self.lo}:{self.hi})")
            return [int(self.agent.ask("uid").split()[1])
                    for _ in range(self.nproc)]
        return [self.node_rank * self.nproc + k for k in range(self.nproc)]

    def _run(self, trap):
        uids = self._open_agent()
        cores = renv.cpu_count()
        for local, uid in enumerate(uids):
            env = renv.rank_env(
                uid, self.world0, local, self.nproc, self.master_addr,
                self.master_port, token=self.token, backend=self.backend,
                cores=cores, base=self.base_env)
            env.update({"DTORCH_ELASTIC": f"{self.lo}:{self.hi}",
                        "DTORCH_ELASTIC_UID": str(uid),
                        "DTORCH_STORE_HOSTED": "1"})
            if self.join:
                env["DTORCH_ELASTIC_JOIN"] = "1"
            what = "joining" if self.join else "elastic"
            self.uids[uid] = self._spawn(uid, local, env, what)
        agent_said = False
        while True:
            if trap.signum is not None:
                return self._on_signal(trap)
            if not agent_said and self.agent.proc.poll() is not None:
                agent_said = True
                _say(f"the elastic store agent (pid {self.agent.proc.pid}) "
                     f"{procs.describe_status(_status(self.agent.proc))}: "
                     f"without the job's store the ranks cannot re-form "
                     f"and stop at their next use of it")
            now = time.monotonic()
            running = 0
            for uid, r in self.uids.items():
                if r.status is None:
                    r.status = procs.peek(r.pid)
                    if r.status is not None and r.status != ("exit", 0):
                        r.failed_at = now
                        self._lost(uid, r)
                if r.status is None:
                    running += 1
            if running == 0:
                self._stop(self.grace)
                return self._exit_code()
            time.sleep(POLL_S)

    def _lost(self, uid, r):
        why = procs.describe_status(r.status)
        self.agent.dead(uid, why)
        where = ""
        if self.last is not None and uid in self.last["members"]:
            where = f"rank {self.last['members'].index(uid)}, "
        elif self.last is None and not self.join:
            where = f"rank {uid}, "
        _say(f"{where}member {uid} (pid {r.pid}) {why}; elastic: the "
             f"other ranks go on without it")
        self._errors.report(uid, _say, sys.stderr)

    def _exit_code(self):
        final = self.last["members"] if self.last else list(self.uids)
        mine = [r for u, r in self.uids.items() if u in final]
        bad = [r for r in (mine or list(self.uids.values()))
               if r.status != ("exit", 0)]
        if bad:
            return procs.exit_code(bad[0].status) or 1
        return 0

    def _on_signal(self, trap):
        res = super()._on_signal(trap)
        return res.exit_code() if isinstance(res, JobResult) else res


# ---------------------------------------------------------------- SLURM ---

NODE_AGENT_VAR = "DTORCH_ELASTIC_NODE_AGENT"


def _hosts(environ):
    nodelist = environ.get("SLURM_JOB_NODELIST") \
        or environ.get("SLURM_NODELIST")
    return renv.parse_nodelist(nodelist) if nodelist else []


def _slurm_nproc(environ):
    per_node = environ.get("SLURM_NTASKS_PER_NODE", "").split("(")[0]
    if per_node.isdigit():
        return int(per_node)
    tasks = (environ.get("SLURM_TASKS_PER_NODE") or "").split("(")[0]
    return int(tasks) if tasks.isdigit() else 1


class SlurmElastic:
    """``--runner slurm --elastic MIN:MAX`` (and ``--join``) inside a SLURM
    allocation.

    This process hosts the job's store agent (as node 0's launcher does
    locally) and starts one job step per node, ``srun --nodes=1 --ntasks=1
    --nodelist=HOST --overlap --kill-on-bad-exit=0 python -m launch
    --elastic ... --node-rank I``: each step is a local elastic launcher of
    that node's ranks and a client of the store. A step that ends badly
    (``scancel JOB.STEP``, its node lost) takes only its own ranks: the
    store sees their connections close and the other nodes go on; the job
    ends when every step has ended. Separate steps, not one srun of N
    tasks: a step is SLURM's unit of failure, and srun ends a step's other
    tasks when one fails even with --kill-on-bad-exit=0 once its node is
    lost. ``--overlap`` lets the steps (and a joiner's step in the same
    allocation) share the allocation's CPUs.

    With ``join``, the steps are local ``--join`` launchers of a running
    job (MASTER_ADDR/PORT of its store), one per node of this allocation:
    a new sbatch job, or a new step of the job's own allocation."""

    def __init__(self, target, elastic, nproc=None, nnodes=1,
                 master_addr=renv.DEFAULT_ADDR, master_port=None,
                 join=False, grace=5.0, log_dir=None, only_rank0=False,
                 base_env=None):
        env = dict(os.environ if base_env is None else base_env)
        if not env.get("SLURM_JOB_ID"):
            raise ValueError(
                "--runner slurm --elastic runs inside a SLURM allocation "
                "(sbatch or salloc): this launcher hosts the job's store "
                "and starts one job step per node with srun; outside an "
                "allocation each srun would be a separate job")
        hosts = _hosts(env)
        if not hosts:
            raise ValueError("--runner slurm --elastic: SLURM_JOB_NODELIST "
                             "is not set in this allocation")
        if nnodes > 1:
            if nnodes > len(hosts):
                raise ValueError(
                    f"--nnodes {nnodes}: the allocation has "
                    f"{len(hosts)} node(s) ({', '.join(hosts)})")
            hosts = hosts[:nnodes]
        if join and master_port is None:
            raise ValueError("--join needs the --master-addr and "
                             "--master-port of the job to join (its "
                             "launcher prints them)")
        self.target = list(target)
        self.lo, self.hi = elastic
        self.hosts, self.join = hosts, join
        self.nproc = nproc or _slurm_nproc(env)
        world = len(hosts) * self.nproc
        if not join and not self.lo <= world <= self.hi:
            raise ValueError(
                f"--elastic {self.lo}:{self.hi}: the job starts with "
                f"{world} ranks ({len(hosts)} node(s) x "
                f"{self.nproc}), outside MIN:MAX")
        if master_addr == renv.DEFAULT_ADDR and not join:
            # the store is reached from every node: this host's name as
            # SLURM knows it (the batch step runs on the first node)
            master_addr = env.get("SLURMD_NODENAME") or socket.gethostname()
        self.master_addr, self.master_port = master_addr, master_port
        self.grace, self.log_dir = grace, log_dir
        self.only_rank0 = only_rank0
        self.env = env
        self.env.setdefault("PYTHONUNBUFFERED", "1")
        self.token = env.get("DTORCH_RDZV_TOKEN")
        self.agent = None
        self.last = None
        self._token_path = None
        self.steps = []           # [(node, host, Popen)]

    def _on_round(self, dec):
        self.last = dec
        _say(dec["text"])

    def _open_store(self):
        if self.join:
            return
        self.token = self.token or renv.new_token()
        port = self.master_port or renv.free_port(self.master_addr)
        self.agent = Agent("host", self.master_addr, port, self.token,
                           len(self.hosts) * self.nproc, self.lo, self.hi,
                           on_round=self._on_round)
        self.master_port = self.agent.port
        if not os.environ.get("DTORCH_RDZV_TOKEN"):
            self._token_path = token_file(self.master_port)
            fd = os.open(self._token_path,
                         os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(self.token)
        script = " ".join(self.target)
        _say(f"elastic job ({self.lo} to {self.hi} ranks) on "
             f"{len(self.hosts)} node(s) of SLURM job "
             f"{self.env['SLURM_JOB_ID']}, one job step per node, its "
             f"store on {self.master_addr}:{self.master_port}; add ranks "
             f"with: sbatch --wrap 'dtorch-launch --runner slurm --join "
             f"--master-addr {self.master_addr} --master-port "
             f"{self.master_port} --nproc-per-node K {script}' (or as a "
             f"new step of this job: srun --jobid "
             f"{self.env['SLURM_JOB_ID']} --overlap -N1 -n1 dtorch-launch "
             f"--join ...)"
             + ("" if self._token_path is None else
                f"; joiners on other hosts need this job's "
                f"DTORCH_RDZV_TOKEN (export it before sbatch)"))

    def _step_command(self, node, host):
        cmd = ["srun", "--nodes=1", "--ntasks=1", f"--nodelist={host}",
               "--overlap", "--kill-on-bad-exit=0",
               sys.executable, "-m", "launch",
               "--nproc-per-node", str(self.nproc),
               "--master-addr", self.master_addr,
               "--master-port", str(self.master_port),
               "--grace-period", str(self.grace)]
        if self.join:
            cmd += ["--join"]
        else:
            cmd += ["--elastic", f"{self.lo}:{self.hi}",
                    "--nnodes", str(len(self.hosts)),
                    "--node-rank", str(node)]
        if self.log_dir:
            cmd += ["--log-dir", os.path.join(self.log_dir, f"node{node}")]
        if self.only_rank0:
            cmd += ["--only-rank0-output"]
        return cmd + self.target

    def run(self):
        with procs.SignalTrap() as trap, \
                procs.Reaper(self.grace) as reaper:
            try:
                return self._run(trap, reaper)
            finally:
                _close_store(self, trap)

    def _run(self, trap, reaper):
        self._open_store()
        env = dict(self.env, PYTHONPATH=procs._launch_root())
        if self.token:
            env["DTORCH_RDZV_TOKEN"] = self.token
        if not self.join:
            env[NODE_AGENT_VAR] = "1"     # a client of this store
        for node, host in enumerate(self.hosts):
            proc = procs.spawn(self._step_command(node, host), env,
                               capture=False)
            reaper.watch(proc.pid)
            self.steps.append((node, host, proc))
        status = {}
        while len(status) < len(self.steps):
            if trap.signum is not None:
                _say(f"got {procs.signal_name(trap.signum)}; passing "
                     f"it to the {len(self.steps)} job step(s)")
                procs.stop_groups([p.pid for _, _, p in self.steps],
                                  signal.SIGTERM, self.grace,
                                  hurry=lambda: trap.urgent)
                return 128 + trap.signum
            for node, host, proc in self.steps:
                if node in status:
                    continue
                st = procs.peek(proc.pid)
                if st is None:
                    continue
                status[node] = st
                procs.stop_groups([proc.pid], grace=self.grace)
                reaper.forget(proc.pid)
                proc.wait()
                if st != ("exit", 0) and len(status) < len(self.steps):
                    _say(f"node {node} ({host}): its job step (srun pid "
                         f"{proc.pid}) {procs.describe_status(st)}; "
                         f"elastic: the other nodes go on")
            time.sleep(POLL_S)
        return self._exit_code(status)

    def _exit_code(self, status):
        """0 when the steps holding the last membership's ranks ended
        well (a step whose ranks were all dropped earlier does not
        count); a stopped job is 1."""
        if self.join or self.last is None:
            bad = [s for s in status.values() if s != ("exit", 0)]
            return procs.exit_code(bad[0]) or 1 if bad else 0
        if self.last.get("stop"):
            return 1
        final = set(self.last["members"])
        for node, st in sorted(status.items()):
            mine = set(range(node * self.nproc, (node + 1) * self.nproc))
            if mine & final and st != ("exit", 0):
                return procs.exit_code(st) or 1
        return 0
