"""The rank environment contract, as pure functions.

Every runner gives every rank the same variables:

    RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE  who am I, how many
    MASTER_ADDR, MASTER_PORT          where rank 0 serves the store
    DTORCH_RDZV_TOKEN                 per-job secret for that store
    DTORCH_RESTART_COUNT              0, 1, ... after restarts
    DTORCH_BACKEND                    auto | mpi | tcp | nccl
    OMP/OPENBLAS/MKL_NUM_THREADS      a fair share of the cores

Nothing here starts a process or imports the training stack, so the
functions can be used (and tested) anywhere.  `detect()` rebuilds the
contract from what mpiexec (Open MPI) or srun (SLURM) put in a rank's
environment; `launch.rank` applies it before exec'ing the real command.
"""

import hashlib
import os
import re
import secrets
import shutil
import socket
import subprocess

THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
CONTRACT_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                 "MASTER_ADDR", "MASTER_PORT", "DTORCH_RDZV_TOKEN",
                 "DTORCH_RESTART_COUNT")
DEFAULT_ADDR = "127.0.0.1"
# Set by the mpi/slurm runners: a directory where each rank's launch.rank
# leaves a file as it starts, so that a failure of mpiexec/srun itself is
# not blamed on a rank.
STARTED_VAR = "DTORCH_LAUNCH_STARTED_DIR"


def cpu_count():
    """CPUs this process may run on (affinity mask, not the whole host)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def is_terminal(stream):
    """Whether `stream` is a terminal (False for files, pipes, closed or
    replaced streams)."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def no_color(env, stream):
    """Ask the ranks for plain output (NO_COLOR=1, the convention pytest,
    Python 3.13+ and most tools follow) when the launcher's output is not
    a terminal.  mpiexec gives each rank a pseudo-terminal for stdout even
    when its own output goes to a file, so the ranks cannot tell by
    themselves.  A value the user set wins."""
    if not is_terminal(stream):
        env.setdefault("NO_COLOR", "1")
    return env


def thread_budget(cores, local_world_size):
    """BLAS/OpenMP threads per rank: the node's cores split evenly."""
    return max(1, int(cores) // max(1, int(local_world_size)))


def new_token():
    """A fresh rendezvous secret (128 bits, hex)."""
    return secrets.token_hex(16)


def derive_token(base, restart_count):
    """The secret for restart `restart_count` of a job whose nodes share
    `base`: every node computes the same value without talking, and each
    restart gets a different one."""
    if restart_count == 0:
        return base
    msg = f"{base}:{restart_count}".encode()
    return hashlib.sha256(msg).hexdigest()[:32]


def free_port(addr=DEFAULT_ADDR):
    """A TCP port that is free on `addr` now (the OS picks it).

    Falls back to loopback when `addr` is not an address of this host.
    There is a window between closing this socket and rank 0 binding the
    port; every launcher that picks ports this way shares it."""
    for host in (addr, DEFAULT_ADDR):
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((host, 0))
                return s.getsockname()[1]
        except OSError:
            continue
    raise OSError(f"cannot bind a port on {addr!r} or {DEFAULT_ADDR}")


def port_from_job_id(job_id, step_id=0, base=20000, span=40000):
    """A port that every task of a SLURM job step agrees on without
    talking: derived from the job id, so two jobs sharing a node differ,
    and from the step id, so a restarted step gets a new one."""
    job = int(job_id)
    step = int(step_id) if str(step_id).isdigit() else 0
    return base + (job * 16 + step % 16) % span


def rank_env(rank, world_size, local_rank, local_world_size,
             master_addr, master_port, token=None, restart_count=0,
             backend=None, cores=None, base=None):
    """The environment of one rank: `base` (default: os.environ) plus the
    contract variables.  Thread counts already set by the user win."""
    env = dict(os.environ if base is None else base)
    env.update({
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(local_world_size),
        "MASTER_ADDR": str(master_addr),
        "MASTER_PORT": str(master_port),
        "DTORCH_RESTART_COUNT": str(restart_count),
    })
    if token is not None:
        env["DTORCH_RDZV_TOKEN"] = token
    if backend is not None:
        env["DTORCH_BACKEND"] = backend
    n = thread_budget(cpu_count() if cores is None else cores,
                      local_world_size)
    for var in THREAD_VARS:
        env.setdefault(var, str(n))
    return env


# ----------------------------------------------------------------- SLURM ---

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def parse_nodelist(nodelist):
    """Expand a SLURM hostlist without calling scontrol.

    'node[01-03,7],gpu5' -> ['node01', 'node02', 'node03', 'node7', 'gpu5'].
    Zero padding follows the lower bound, as SLURM does.  Several bracket
    groups in one name ('r[1-2]n[1-2]') expand as a product."""
    hosts = []
    for item in _split_top(nodelist.strip()):
        if item:
            hosts.extend(_expand(item))
    return hosts


def _split_top(text):
    """Split on commas that are not inside brackets."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in hostlist {text!r}")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth:
        raise ValueError(f"unbalanced '[' in hostlist {text!r}")
    parts.append("".join(cur))
    return parts


def _expand(item):
    start = item.find("[")
    if start < 0:
        return [item]
    end = item.index("]", start)
    prefix, ranges, rest = item[:start], item[start + 1:end], item[end + 1:]
    out = []
    for r in ranges.split(","):
        m = _RANGE.match(r.strip())
        if not m:
            raise ValueError(f"bad range {r!r} in hostlist {item!r}")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        width = len(lo)
        for i in range(int(lo), int(hi) + 1):
            for tail in _expand(rest):
                out.append(f"{prefix}{i:0{width}d}{tail}")
    return out


def first_host(nodelist, use_scontrol=True):
    """First host of a SLURM nodelist: `scontrol show hostnames` when it
    is installed (it knows every hostlist form), else our own parser."""
    if use_scontrol and shutil.which("scontrol"):
        try:
            out = subprocess.run(
                ["scontrol", "show", "hostnames", nodelist],
                capture_output=True, text=True, timeout=10)
            if out.returncode == 0 and out.stdout.split():
                return out.stdout.split()[0]
        except (OSError, subprocess.SubprocessError):
            pass
    hosts = parse_nodelist(nodelist)
    if not hosts:
        raise ValueError(f"empty SLURM nodelist {nodelist!r}")
    return hosts[0]


def slurm_cpus_per_task(environ):
    """CPUs SLURM gave each task, or None when it does not say."""
    if environ.get("SLURM_CPUS_PER_TASK"):
        return int(environ["SLURM_CPUS_PER_TASK"])
    on_node = environ.get("SLURM_CPUS_ON_NODE")
    local = environ.get("SLURM_NTASKS_PER_NODE") or _tasks_on_node(environ)
    if on_node and local:
        return max(1, int(on_node) // int(local))
    return None


def _tasks_on_node(environ):
    """This node's task count from SLURM_TASKS_PER_NODE ('2(x3),1')."""
    spec = environ.get("SLURM_STEP_TASKS_PER_NODE") \
        or environ.get("SLURM_TASKS_PER_NODE")
    node_id = int(environ.get("SLURM_NODEID", "0"))
    if not spec:
        return None
    counts = []
    for part in spec.split(","):
        m = re.match(r"^(\d+)(?:\(x(\d+)\))?$", part.strip())
        if not m:
            return None
        counts.extend([int(m.group(1))] * int(m.group(2) or 1))
    return counts[node_id] if node_id < len(counts) else None


# ---------------------------------------------------------------- detect ---

def detect(environ=None, use_scontrol=True):
    """The contract variables for this rank, rebuilt from its environment.

    Order of trust: variables already in the contract (a launcher set
    them), then Open MPI's OMPI_COMM_WORLD_*, then SLURM's SLURM_PROCID &
    co.  Returns a dict of the contract variables it could determine
    (thread counts included); raises ValueError when it finds no rank."""
    e = dict(os.environ if environ is None else environ)
    out = {}
    if "SLURM_PROCID" in e and "OMPI_COMM_WORLD_RANK" not in e:
        out.update(_from_slurm(e, use_scontrol))
        cpus = slurm_cpus_per_task(e)
    elif "OMPI_COMM_WORLD_RANK" in e:
        out.update({
            "RANK": e["OMPI_COMM_WORLD_RANK"],
            "WORLD_SIZE": e["OMPI_COMM_WORLD_SIZE"],
            "LOCAL_RANK": e.get("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
            "LOCAL_WORLD_SIZE": e.get("OMPI_COMM_WORLD_LOCAL_SIZE", "1"),
        })
        cpus = None
        if "SLURM_JOB_ID" in e:   # mpiexec inside an allocation
            out.update(_slurm_master(e, use_scontrol))
    else:
        cpus = None
    # What a launcher passed explicitly beats what we derived.
    for var in CONTRACT_VARS:
        if e.get(var):
            out[var] = e[var]
    missing = [v for v in ("RANK", "WORLD_SIZE") if v not in out]
    if missing:
        raise ValueError(
            "cannot tell this process's rank: none of RANK, "
            "OMPI_COMM_WORLD_RANK or SLURM_PROCID is set")
    out.setdefault("LOCAL_RANK", "0")
    out.setdefault("LOCAL_WORLD_SIZE", "1")
    out.setdefault("MASTER_ADDR", DEFAULT_ADDR)
    out.setdefault("DTORCH_RESTART_COUNT",
                   e.get("SLURM_RESTART_COUNT", "0"))
    if cpus is None:
        cpus = thread_budget(cpu_count(), out["LOCAL_WORLD_SIZE"])
    for var in THREAD_VARS:
        out[var] = e.get(var) or str(cpus)
    return out


def _from_slurm(e, use_scontrol):
    local_size = e.get("SLURM_NTASKS_PER_NODE") or _tasks_on_node(e) or 1
    out = {
        "RANK": e["SLURM_PROCID"],
        "WORLD_SIZE": e.get("SLURM_NTASKS") or e.get("SLURM_NPROCS", "1"),
        "LOCAL_RANK": e.get("SLURM_LOCALID", "0"),
        "LOCAL_WORLD_SIZE": str(local_size),
    }
    out.update(_slurm_master(e, use_scontrol))
    return out


def _slurm_master(e, use_scontrol):
    out = {}
    # Task 0 of a step runs on the first node of the step's list.
    nodelist = (e.get("SLURM_STEP_NODELIST") or e.get("SLURM_JOB_NODELIST")
                or e.get("SLURM_NODELIST"))
    if nodelist:
        out["MASTER_ADDR"] = first_host(nodelist, use_scontrol)
    if e.get("SLURM_JOB_ID"):
        out["MASTER_PORT"] = str(port_from_job_id(
            e["SLURM_JOB_ID"], e.get("SLURM_STEP_ID", "0")))
    return out
