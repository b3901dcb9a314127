"""Who am I? Rank discovery from the launcher's environment.

Precedence: dtorch-launch's variables (RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, DTORCH_RDZV_TOKEN), then Open MPI
/ PMI / PMIx under mpiexec, then SLURM under srun (master = first host of
SLURM_NODELIST). Nothing set: a world of one.
"""
from __future__ import annotations
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

DEFAULT_PORT = 29500


@dataclass
class RankInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    master_addr: str = '127.0.0.1'
    master_port: int = DEFAULT_PORT
    token: str = None
    launcher: str = 'none'     # 'env' | 'mpi' | 'slurm' | 'none'
    under_mpi: bool = False


def _int(env, *names):
    for n in names:
        v = env.get(n)
        if v not in (None, ''):
            try:
                return int(v)
            except ValueError:
                raise ValueError(f"environment variable {n}={v!r} is not "
                                 f"an integer") from None
    return None


def under_mpi(env=None):
    """True when started by an MPI launcher (mpiexec, or srun --mpi)."""
    env = os.environ if env is None else env
    return any(k in env for k in ('OMPI_COMM_WORLD_SIZE', 'PMI_SIZE',
                                  'PMIX_RANK', 'MPI_LOCALNRANKS'))


def first_host(nodelist):
    """First host of a SLURM nodelist: 'gpu[03-05,9],cpu1' -> 'gpu03'."""
    m = re.match(r'([^,\[]+)(\[([^\]]+)\])?', nodelist.strip())
    if not m:
        raise ValueError(f"cannot parse SLURM_NODELIST {nodelist!r}")
    prefix, rng = m.group(1), m.group(3)
    if not rng:
        return prefix
    return prefix + rng.split(',')[0].split('-')[0]


def discover(env: Mapping[str, str] | None = None) -> RankInfo:
    """RankInfo from the environment (see the module docstring)."""
    env = os.environ if env is None else env
    info = RankInfo()
    info.token = env.get('DTORCH_RDZV_TOKEN') or None
    info.under_mpi = under_mpi(env)
    if 'SLURM_PROCID' in env and 'SLURM_NTASKS' in env:
        info.launcher = 'slurm'
        info.rank = _int(env, 'SLURM_PROCID')
        info.world_size = _int(env, 'SLURM_NTASKS')
        info.local_rank = _int(env, 'SLURM_LOCALID') or 0
        per_node = env.get('SLURM_TASKS_PER_NODE', '').split('(')[0]
        info.local_world_size = int(per_node) if per_node.isdigit() else 1
        if env.get('SLURM_NODELIST'):
            info.master_addr = first_host(env['SLURM_NODELIST'])
    mpi_rank = _int(env, 'OMPI_COMM_WORLD_RANK', 'PMI_RANK', 'PMIX_RANK')
    mpi_size = _int(env, 'OMPI_COMM_WORLD_SIZE', 'PMI_SIZE')
    if mpi_rank is not None and mpi_size is not None:
        info.launcher = 'mpi'
        info.rank, info.world_size = mpi_rank, mpi_size
        info.local_rank = _int(env, 'OMPI_COMM_WORLD_LOCAL_RANK',
                               'MPI_LOCALRANKID') or 0
        info.local_world_size = _int(env, 'OMPI_COMM_WORLD_LOCAL_SIZE',
                                     'MPI_LOCALNRANKS') or 1
    if 'RANK' in env and 'WORLD_SIZE' in env:
        info.launcher = 'env'
        info.rank = _int(env, 'RANK')
        info.world_size = _int(env, 'WORLD_SIZE')
        info.local_rank = _int(env, 'LOCAL_RANK') or 0
        info.local_world_size = _int(env, 'LOCAL_WORLD_SIZE') or 1
    info.master_addr = env.get('MASTER_ADDR') or info.master_addr
    info.master_port = _int(env, 'MASTER_PORT') or info.master_port
    if not 0 <= info.rank < info.world_size:
        raise ValueError(f"rank {info.rank} is out of range for world size "
                         f"{info.world_size} (from {info.launcher} "
                         f"environment)")
    return info


# ---------------------------------------------------------------- switches
# Every DTORCH_* switch is read through these helpers (README's table
# lists them all): one spelling of true/false, empty means unset, and a
# value that cannot be understood is an error naming the variable instead
# of a silent default.

_TRUE = ('1', 'yes', 'true', 'on')
_FALSE = ('0', 'no', 'false', 'off')


def _raw(name, env):
    v = (os.environ if env is None else env).get(name)
    return None if v is None or v.strip() == '' else v.strip()


def env_str(name: str, default: str | None,
            env: Mapping[str, str] | None = None) -> str | None:
    """A free-form value (a name the caller checks); unset or empty gives
    `default`."""
    v = _raw(name, env)
    return default if v is None else v


def env_flag(name: str, default: bool | None,
             env: Mapping[str, str] | None = None) -> bool | None:
    """A yes/no switch: 1/yes/true/on or 0/no/false/off (any case); unset
    or empty gives `default` (which may be None: "not set")."""
    v = _raw(name, env)
    if v is None:
        return default
    if v.lower() in _TRUE:
        return True
    if v.lower() in _FALSE:
        return False
    raise ValueError(f"environment variable {name}={v!r}: expected one of "
                     f"{'/'.join(_TRUE)} or {'/'.join(_FALSE)}")


def env_number(name: str, default: float | None, kind: type = float,
               env: Mapping[str, str] | None = None) -> Any:
    """A positive number (`kind`: float or int); unset or empty gives
    `default`."""
    v = _raw(name, env)
    if v is None:
        return default
    try:
        x = kind(v)
    except ValueError:
        x = 0
    if not x > 0:
        raise ValueError(f"{name}={v!r} must be a positive number")
    return x


def env_choice(name: str, default: str | None, choices: Sequence[str],
               env: Mapping[str, str] | None = None) -> str | None:
    """One of `choices` (compared case-insensitively, returned as spelled
    in `choices`); unset or empty gives `default`."""
    v = _raw(name, env)
    if v is None:
        return default
    for c in choices:
        if v.lower() == c.lower():
            return c
    raise ValueError(f"environment variable {name}={v!r}: expected one of "
                     f"{', '.join(choices)}")


# ------------------------------------------------------------- hierarchy

def hierarchical(env: Mapping[str, str] | None = None) -> bool:
    """DTORCH_HIERARCHICAL: a group whose ranks span several hosts, some
    with more than one rank, all-reduces in two levels (inside each host
    through shared memory, then among one rank per host); 0 keeps the flat
    ring. Default on (`collectives.hier`)."""
    return env_flag('DTORCH_HIERARCHICAL', True, env)


def host_override(env: Mapping[str, str] | None = None) -> str | None:
    """DTORCH_HOST_ID, for tests: the host identity this rank reports at
    group set-up instead of hostname + boot id, so that one machine can
    play several hosts (`collectives.hier.host_key`)."""
    return env_str('DTORCH_HOST_ID', None, env)
