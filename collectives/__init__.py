"""collectives: process groups over NumPy/CuPy arrays (no dtorch import).

Backends: threads (N ranks in one process, for tests), mpi (mpi4py), tcp
(sockets + a rendezvous store), nccl (cupy.cuda.nccl). MPI, CuPy and NCCL
are imported only when their backend is used.

    import collectives
    g = collectives.init()              # from the launcher's environment
    g.all_reduce(x, op='avg')           # in place, every rank
    w = g.broadcast(y, src=0, async_op=True); w.wait()

    collectives.spawn_threads(lambda g: ..., world_size=4)  # in one process
"""
from __future__ import annotations
from . import blas_threads
from .arrays import get_array_module, ReduceOp
from .errors import (CollectiveError, CollectiveMismatchError,
                     CollectiveTimeoutError, RankFailureError)
from .group import DEFAULT_TIMEOUT, ProcessGroup, Timeout, Work
from .env import (RankInfo, discover, env_choice, env_flag, env_number,
                  env_str)
from .fusion import FlatLayout, bucketize, pack, unpack
from .store import RendezvousAuthError, RendezvousError, TCPStore
from .threads import ThreadGroup, single_group, spawn_threads

BACKENDS = ('threads', 'mpi', 'tcp', 'nccl')


def init(backend: str | None = None, rank: int | None = None,
         world_size: int | None = None, timeout: Timeout = None,
         master_addr: str | None = None, master_port: int | None = None,
         token: str | None = None,
         bootstrap: ProcessGroup | None = None) -> ProcessGroup:
    """The world ProcessGroup of this process.

    Unset arguments come from the environment (`discover()`). backend None
    picks mpi under an MPI launcher, tcp otherwise, and a one-rank group
    when the world has one rank. 'nccl' needs CuPy and a bootstrap: an
    MPI group under MPI, else a tcp group made here. timeout: seconds or
    timedelta for every collective (default DTORCH_COLLECTIVE_TIMEOUT or
    600 s).
    """
    info = discover()
    rank = info.rank if rank is None else int(rank)
    world_size = info.world_size if world_size is None else int(world_size)
    if world_size > 1:      # no launcher split the cores (a bare mpiexec)
        blas_threads.fit(info.local_world_size)
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"unknown collectives backend {backend!r}; "
                         f"expected one of {BACKENDS}")
    if backend is None:
        if info.under_mpi:
            backend = 'mpi'
        elif world_size == 1:
            backend = 'threads'
        else:
            backend = 'tcp'
    if backend == 'threads':
        if world_size != 1:
            raise ValueError(
                f"the threads backend cannot join a {world_size}-process "
                f"world: use spawn_threads(fn, {world_size}) in one process")
        return single_group(timeout)
    if backend == 'mpi':
        from .mpi import world_group
        return world_group(timeout)
    addr = master_addr or info.master_addr
    port = int(master_port or info.master_port)
    token = token or info.token
    if backend == 'tcp':
        from .tcp import tcp_group
        return tcp_group(rank, world_size, addr, port, token, timeout)
    from .nccl import nccl_group
    if bootstrap is None:
        bootstrap = init('mpi' if info.under_mpi else 'tcp', rank,
                         world_size, timeout, addr, port, token)
    return nccl_group(bootstrap, timeout)


__all__ = [
    'init', 'discover', 'RankInfo', 'spawn_threads', 'single_group',
    'ProcessGroup', 'ThreadGroup', 'Work', 'ReduceOp', 'TCPStore',
    'CollectiveError', 'CollectiveTimeoutError', 'CollectiveMismatchError',
    'RankFailureError', 'RendezvousError', 'RendezvousAuthError',
    'FlatLayout', 'pack', 'unpack', 'bucketize', 'get_array_module',
    'DEFAULT_TIMEOUT', 'BACKENDS', 'env_flag', 'env_number', 'env_choice',
    'env_str',
]
