"""The DataLoader's iterator over worker processes (``num_workers > 0``):
one socket per worker, ``prefetch_factor`` batches in flight per worker,
results read in sampler order (see the dataloader module)."""
import itertools
import multiprocessing
import select
import socket
import sys
import time

from . import _worker
from ._iter import _BaseIter, _batch_len, _keeps_workers, _plain, \
    _worker_resumes
from ._worker import ExceptionWrapper

# how long shutdown waits for a worker to exit before terminating it: an
# idle worker exits at once; a busy one is working on a batch nobody wants
_JOIN_TIMEOUT = 1.0


class _MultiProcessIter(_BaseIter):
    # until the workers exist (a failed __init__ still meets __del__)
    _shutdown = True
    _workers = ()
    _socks = ()
    _outbox = ()

    def __init__(self, loader, resume=None):
        super().__init__(loader, resume)
        self._persistent = loader.persistent_workers
        self._prefetch_factor = loader.prefetch_factor
        self._timeout = loader.timeout
        ctx = loader.multiprocessing_context
        if ctx is None:
            # fork: the dataset is inherited, not pickled (dtorch tensors
            # are not picklable). Forking after CUDA is initialised is safe
            # as long as the workers leave CUDA alone: _worker makes sure
            # they do, with a clear error otherwise (PyTorch's rule)
            methods = multiprocessing.get_all_start_methods()
            ctx = "fork" if "fork" in methods else None
        if ctx is None or isinstance(ctx, str):
            ctx = multiprocessing.get_context(ctx)
        n = self._num_workers
        resumes = _worker_resumes(loader.dataset, resume, n, self._keep)
        self._workers = []
        self._shutdown = False
        pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
                 for _ in range(n)]
        self._outbox = [bytearray() for _ in range(n)]
        self._socks = [p[0] for p in pairs]
        make_fetcher = loader._make_fetcher()
        try:
            for i in range(n):
                others = [s for j, p in enumerate(pairs) for s in p
                          if s is not pairs[i][1]]
                w = ctx.Process(
                    target=_worker.worker_loop,
                    args=(make_fetcher, loader.dataset, pairs[i][1], others,
                          loader.worker_init_fn, self._base_seed, i, n,
                          resumes[i]),
                    daemon=True)
                w.start()
                self._workers.append(w)
        finally:
            for p in pairs:
                p[1].close()
            if len(self._workers) < n:
                self._shutdown_workers()
        self._reset(loader, first_iter=True, resume=resume,
                    resumes=resumes)

    def _reset(self, loader, first_iter=False, resume=None, resumes=None):
        if not first_iter:
            self._finished = False
            self._start_pass(resume)
            resumes = _worker_resumes(loader.dataset, resume,
                                      self._num_workers,
                                      _keeps_workers(loader, resume))
        n = self._num_workers
        self._send_idx = 0
        self._rcvd_idx = 0
        self._task_info = {}
        self._tasks_outstanding = 0
        self._workers_status = [True] * n
        if first_iter or not hasattr(self, "_snaps"):
            self._snaps = [None] * n
        else:
            # a new pass: keep each worker's RNG, forget its old position
            self._snaps = [s and {"rng": s["rng"], "fetcher": None}
                           for s in self._snaps]
        for i, r in enumerate(resumes):
            if r is not None and r.get("rng") is not None:
                self._snaps[i] = {"rng": r["rng"], "fetcher": r["fetcher"]}
            elif r is not None and r.get("fetcher") is not None:
                old = self._snaps[i]
                self._snaps[i] = {"rng": old and old["rng"],
                                  "fetcher": r["fetcher"]}
        start = 0
        if resume is not None and not resume.get("_iterator_finished"):
            start = (int(resume.get("_last_yielded_worker_id", -1)) + 1) % n
            done = resume.get("_workers_done") or []
            if len(done) == n:
                self._workers_status = [not bool(d) for d in done]
            self._last_worker = int(resume.get("_last_yielded_worker_id",
                                               -1))
        else:
            self._last_worker = -1
        self._worker_cycle = itertools.cycle(
            list(range(start, n)) + list(range(start)))
        if not first_iter:
            # new pass with persistent workers: each acknowledges the
            # resume after any results still queued from the last pass
            epoch = getattr(self._dataset, "epoch", None) if hasattr(
                self._dataset, "set_epoch") else None
            for i in range(n):
                self._post(i, _worker._ResumeIteration(resumes[i], epoch))
            for i in range(n):
                while True:
                    msg, fds = self._recv_from(i)
                    for fd in fds:
                        _sock_close_fd(fd)
                    if isinstance(msg[0], _worker._ResumeIteration):
                        break
                    if msg[2] is not None and (
                            resumes[i] is None or resumes[i]["rng"] is None):
                        # a batch of the abandoned pass: the worker's RNG
                        # moved on with it
                        self._snaps[i] = {"rng": msg[2][0], "fetcher": None}
        for _ in range(self._prefetch_factor * n):
            self._try_put_index()

    def _try_put_index(self):
        if self._shutdown:
            return
        for _ in range(self._num_workers):
            w = next(self._worker_cycle)
            if self._workers_status[w]:
                break
        else:
            return      # every worker has run out (IterableDataset)
        try:
            index = self._next_index()
        except StopIteration:
            return
        self._post(w, (self._send_idx, index))
        self._task_info[self._send_idx] = (w, _batch_len(index))
        self._tasks_outstanding += 1
        self._send_idx += 1

    def _worker_died(self, w):
        proc = self._workers[w]
        proc.join(_JOIN_TIMEOUT)
        pid, code = proc.pid, proc.exitcode
        self._shutdown_workers()
        raise RuntimeError(f"DataLoader worker (pid(s) {pid}) exited "
                           f"unexpectedly (exit code(s) {code})") from None

    # The main process never blocks sending to a worker: a worker blocked
    # sending its batch is not reading, so a blocking send of a large
    # index list could wait on it forever. Messages wait in an outbox,
    # written as the sockets take them while waiting for results.
    def _post(self, w, msg):
        self._outbox[w] += _worker.frame(msg)
        self._flush(w)

    def _flush(self, w):
        box = self._outbox[w]
        sock = self._socks[w]
        # non-blocking mode: with a timeout set, a send that would block
        # waits for it, then raises TimeoutError mid-message
        sock.settimeout(0.0)
        while box:
            try:
                sent = sock.send(box)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:        # the worker has gone: _recv_from says
                box.clear()
                return
            del box[:sent]

    def _wait_readable(self, w, limit):
        """Flush outboxes until worker ``w`` has something to read; False
        after ``limit`` seconds."""
        sock = self._socks[w]
        deadline = time.monotonic() + limit
        while True:
            pending = [i for i, b in enumerate(self._outbox) if b]
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            readable, writable, _ = select.select(
                [sock], [self._socks[i] for i in pending], [], left)
            for i in pending:
                if self._socks[i] in writable:
                    self._flush(i)
            if readable:
                return True

    def _recv_from(self, w):
        """The next message from worker ``w`` (its results come in the
        order of its tasks)."""
        sock = self._socks[w]
        limit = self._timeout if self._timeout > 0 else \
            _worker.STATUS_CHECK_INTERVAL
        while True:
            try:
                if not self._wait_readable(w, limit):
                    raise socket.timeout
                sock.settimeout(limit)
                return _worker.recv(sock)
            except socket.timeout:
                if self._timeout > 0:
                    self._shutdown_workers()
                    raise RuntimeError(
                        f"DataLoader timed out after {self._timeout} "
                        "seconds") from None
                if not self._workers[w].is_alive():
                    self._worker_died(w)
            except (_worker.ChannelClosed, ConnectionResetError):
                self._worker_died(w)

    def __next__(self):
        if self._shutdown:
            raise StopIteration
        while True:
            # skip tasks of workers whose IterableDataset has ended
            while self._rcvd_idx < self._send_idx:
                w, _ = self._task_info[self._rcvd_idx]
                if self._workers_status[w]:
                    break
                del self._task_info[self._rcvd_idx]
                self._tasks_outstanding -= 1
                self._rcvd_idx += 1
            else:
                self._finish()
                if not self._persistent:
                    self._shutdown_workers()
                raise StopIteration
            w, size = self._task_info.pop(self._rcvd_idx)
            self._rcvd_idx += 1
            self._tasks_outstanding -= 1
            (idx, data, state), fds = self._recv_from(w)
            assert idx == self._rcvd_idx - 1, (idx, self._rcvd_idx)
            if isinstance(data, _worker._IterableDatasetStopIteration):
                self._workers_status[w] = False
                self._try_put_index()
                continue
            return self._process(w, size, data, state, fds)

    def _process(self, w, size, data, state, fds):
        try:
            batch = _worker.from_payload(data, fds)
        finally:
            self._try_put_index()
        if isinstance(batch, ExceptionWrapper):
            if not self._persistent:
                self._shutdown_workers()
            batch.reraise()
        if state is not None:
            self._snaps[w] = {"rng": state[0], "fetcher": state[1]}
        self._last_worker = w
        self._num_yielded += 1
        self._samples_in_pass += size
        return self._pin_batch(batch)

    def _snapshots(self):
        out = []
        for s in self._snaps:
            if s is None:
                out.append(None)
                continue
            rng = s["rng"]
            if rng is not None and not isinstance(rng, dict):
                rng = _worker.rng_to_plain(rng)
            out.append({"rng": _plain(rng), "fetcher": _plain(s["fetcher"])})
        return out

    def _done_flags(self):
        return [not s for s in self._workers_status]

    def _shutdown_workers(self):
        """Stop and join every worker; terminate one that does not exit.
        Safe to call more than once."""
        if self._shutdown:
            return
        self._shutdown = True
        for sock in self._socks:
            if not self._outbox[self._socks.index(sock)]:
                try:        # a polite stop; closing the socket suffices
                    sock.send(_worker.frame(None), socket.MSG_DONTWAIT)
                except OSError:
                    pass
            # a worker waiting on the socket sees its end close, one
            # blocked sending a batch gets EPIPE; undelivered batches'
            # shared memory is freed with the socket
            sock.close()
        for w in self._workers:
            w.join(_JOIN_TIMEOUT)
            if w.is_alive():
                w.terminate()
                w.join()

    def __del__(self):
        if sys.is_finalizing():
            return
        if not self._shutdown:
            self._leave_state()
        self._shutdown_workers()


def _sock_close_fd(fd):
    import os
    os.close(fd)
