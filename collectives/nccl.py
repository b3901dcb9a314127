"""`nccl` backend: cupy.cuda.nccl communicators for CuPy arrays.

Bootstrapped as chainermn's init_nccl_comm does: rank 0 creates the unique
id, which travels through the rendezvous store (tcp) or an MPI bcast; the
communicator is created after the device is set. Ops are enqueued on the
current CuPy stream; async ops record an event, and waits poll it against
the deadline (a timed-out communicator is aborted: NCCL cannot cancel).

Importing this module never imports CuPy: the group does, when made.
"""
import time

from .arrays import divide_avg, is_cupy, ReduceOp
from .errors import _Expired
from .group import ProcessGroup

_NCCL_DTYPES = {'b': 0, 'B': 1, 'i': 2, 'I': 3, 'l': 4, 'q': 4, 'L': 5,
                'Q': 5, 'e': 6, 'f': 7, 'd': 8}
_NCCL_OPS = {ReduceOp.SUM: 0, ReduceOp.PRODUCT: 1, ReduceOp.MAX: 2,
             ReduceOp.MIN: 3, ReduceOp.AVG: 0}


def import_cupy():
    try:
        import cupy
        from cupy.cuda import nccl
    except ImportError as e:
        raise ImportError(
            "the 'nccl' collectives backend needs CuPy with NCCL: in the "
            "dtorch clone, pip install -e '.[cuda12]' (or '.[cuda13]')") from e
    return cupy, nccl


def is_available():
    try:
        cupy, nccl = import_cupy()
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def _on_host(arr):
    if isinstance(arr, (list, tuple)):
        return bool(arr) and _on_host(arr[0])
    return arr is not None and not is_cupy(arr)


def _host_via_bootstrap(start):
    """NCCL moves device memory only: a collective on host (NumPy) arrays -
    a CPU model on a GPU host, DDP's join flags, metrics, object transport -
    runs on the bootstrap (CPU) group of the same ranks instead."""
    name = start.__name__

    def run(self, *args):
        if _on_host(args[0]):
            if self._bootstrap is None:
                raise TypeError(
                    f"the NCCL group {self.name!r} moves CuPy arrays only, "
                    f"got a host array ({type(args[0]).__name__}) and has "
                    f"no bootstrap group for host data")
            return getattr(self._bootstrap, name)(*args)
        return start(self, *args)
    run.__name__ = name
    return run



class NCCLGroup(ProcessGroup):
    """NCCL communicator over `size` ranks. uid_exchange(uid_or_None) ->
    uid shares rank 0's unique id (store or MPI bcast)."""
    backend = 'nccl'

    def __init__(self, rank, size, uid_exchange, name='world',
                 timeout=None, ranks=None, bootstrap=None):
        super().__init__(rank, size, name, ranks, timeout)
        cupy, nccl = import_cupy()
        self._cp, self._nccl = cupy, nccl
        uid = nccl.get_unique_id() if rank == 0 else None
        uid = uid_exchange(uid)
        self.comm = nccl.NcclCommunicator(size, uid, rank)
        # a CPU group of the same ranks for objects and the debug check
        self._bootstrap = bootstrap

    def _stream(self):
        return self._cp.cuda.get_current_stream()

    def _fin(self, then=None):
        ev = self._cp.cuda.Event(disable_timing=True)
        ev.record(self._stream())

        def fin(deadline):
            while not ev.done:
                if time.monotonic() > deadline:
                    self.comm.abort()
                    raise _Expired(None)
                time.sleep(0.0001)
            if then is not None:
                then()
        fin.test = lambda: ev.done
        return fin

    def _dt(self, arr):
        try:
            return _NCCL_DTYPES[arr.dtype.char]
        except KeyError:
            raise TypeError(
                f"NCCL cannot move {arr.dtype} arrays (dtorch's NCCL dtypes: "
                f"int8, uint8, int32, uint32, int64, uint64, float16, "
                f"float32, float64; CuPy has no bfloat16); cast to a "
                f"supported dtype first") from None

    @_host_via_bootstrap
    def _start_all_reduce(self, arr, op, deadline):
        self.comm.allReduce(arr.data.ptr, arr.data.ptr, arr.size,
                            self._dt(arr), _NCCL_OPS[op], self._stream().ptr)
        return self._fin((lambda: divide_avg(arr, self.size))
                         if op is ReduceOp.AVG else None)

    @_host_via_bootstrap
    def _start_reduce(self, arr, dst, op, deadline):
        self.comm.reduce(arr.data.ptr, arr.data.ptr, arr.size, self._dt(arr),
                         _NCCL_OPS[op], dst, self._stream().ptr)
        return self._fin((lambda: divide_avg(arr, self.size))
                         if op is ReduceOp.AVG and self.rank == dst
                         else None)

    @_host_via_bootstrap
    def _start_broadcast(self, arr, src, deadline):
        self.comm.bcast(arr.data.ptr, arr.size, self._dt(arr), src,
                        self._stream().ptr)
        return self._fin()

    @_host_via_bootstrap
    def _start_all_gather(self, out, inp, deadline):
        cp = self._cp
        full = out if not isinstance(out, (list, tuple)) else cp.empty(
            (self.size,) + inp.shape, inp.dtype)
        self.comm.allGather(inp.data.ptr, full.data.ptr, inp.size,
                            self._dt(inp), self._stream().ptr)
        if full is not out:
            for r in range(self.size):
                out[r][...] = full[r]
        return self._fin()

    @_host_via_bootstrap
    def _start_reduce_scatter(self, out, inp, op, deadline):
        cp = self._cp
        full = inp if not isinstance(inp, (list, tuple)) else cp.stack(inp)
        self.comm.reduceScatter(full.data.ptr, out.data.ptr, out.size,
                                self._dt(out), _NCCL_OPS[op],
                                self._stream().ptr)
        return self._fin((lambda: divide_avg(out, self.size))
                         if op is ReduceOp.AVG else None)

    @_host_via_bootstrap
    def _start_send(self, arr, dst, tag, deadline):
        self.comm.send(arr.data.ptr, arr.size, self._dt(arr), dst,
                       self._stream().ptr)
        return self._fin()

    @_host_via_bootstrap
    def _start_recv(self, arr, src, tag, deadline):
        self.comm.recv(arr.data.ptr, arr.size, self._dt(arr), src,
                       self._stream().ptr)
        return self._fin()

    def _start_barrier(self, deadline):
        return self._start_all_reduce(self._cp.zeros(1, 'i'),
                                      ReduceOp.SUM, deadline)

    def _gather_objects(self, obj, deadline, what):
        if self._bootstrap is not None:
            return self._bootstrap.all_gather_object(obj)
        return ProcessGroup._gather_objects(self, obj, deadline, what)

    def _new_group(self, sub, global_ranks, me, name, timeout):
        # ids travel over the bootstrap group, which all members share
        boot = self._bootstrap
        if boot is None:
            raise NotImplementedError(
                "NCCL sub-groups need a bootstrap (CPU) group")
        bsub = boot.new_group(global_ranks, name=name + '/boot')
        if me is None:
            return None
        return NCCLGroup(me, len(sub),
                         lambda uid: bsub.broadcast_object(uid, 0), name,
                         timeout, global_ranks, bsub)

    def destroy(self):
        try:
            self.comm.destroy()
        except Exception:
            pass
        ProcessGroup.destroy(self)


def nccl_group(bootstrap, timeout=None):
    """An NCCL group over the same ranks as `bootstrap` (an MPI or TCP
    group), whose broadcast_object carries the unique id."""
    return NCCLGroup(bootstrap.rank, bootstrap.size,
                     lambda uid: bootstrap.broadcast_object(uid, 0),
                     bootstrap.name, timeout or bootstrap.timeout,
                     bootstrap.ranks, bootstrap)
