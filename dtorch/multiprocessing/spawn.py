"""``spawn(fn, args, nprocs)``: PyTorch's process launcher semantics.

Each child runs ``fn(i, *args)``; an exception in a child is sent to the
parent as its formatted traceback, the other children are terminated, and
``join`` raises ``ProcessRaisedException`` naming the process. A child that
dies without raising (a signal, ``os._exit``) gives
``ProcessExitedException`` with its exit code."""
import multiprocessing
import multiprocessing.connection
import signal
import sys
import time
import traceback


class ProcessException(Exception):
    def __init__(self, msg, error_index, pid):
        super().__init__(msg)
        self.msg = msg
        self.error_index = error_index
        self.pid = pid

    def __reduce__(self):
        return type(self), (self.msg, self.error_index, self.pid)


class ProcessRaisedException(ProcessException):
    """A child raised an exception; ``msg`` holds its traceback."""


class ProcessExitedException(ProcessException):
    """A child exited with a non-zero code or was killed by a signal."""

    def __init__(self, msg, error_index, error_pid, exit_code,
                 signal_name=None):
        super().__init__(msg, error_index, error_pid)
        self.exit_code = exit_code
        self.signal_name = signal_name

    def __reduce__(self):
        return type(self), (self.msg, self.error_index, self.pid,
                            self.exit_code, self.signal_name)


def _wrap(fn, i, args, error_queue):
    try:
        fn(i, *args)
    except KeyboardInterrupt:
        pass
    except Exception:
        error_queue.put(traceback.format_exc())
        sys.exit(1)


class ProcessContext:
    def __init__(self, processes, error_queues):
        self.processes = processes
        self.error_queues = error_queues
        self.sentinels = {p.sentinel: i for i, p in enumerate(processes)}

    def pids(self):
        return [p.pid for p in self.processes]

    def join(self, timeout=None):
        """True when every process has finished; raises if one failed
        (after terminating the others). With a timeout, False if some are
        still running when it passes."""
        if not self.sentinels:
            return True
        ready = multiprocessing.connection.wait(list(self.sentinels),
                                                timeout=timeout)
        error_index = None
        for s in ready:
            i = self.sentinels.pop(s)
            p = self.processes[i]
            p.join()
            if p.exitcode != 0:
                error_index = i
                break
        if error_index is None:
            return not self.sentinels
        # a failure: stop the rest, then report it
        for p in self.processes:
            if p.is_alive():
                p.terminate()
        deadline = time.monotonic() + 30
        for p in self.processes:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join()
        p = self.processes[error_index]
        q = self.error_queues[error_index]
        if not q.empty():
            tb = q.get()
            raise ProcessRaisedException(
                f"\n\n-- Process {error_index} terminated with the "
                f"following error:\n{tb}", error_index, p.pid)
        code = p.exitcode
        if code < 0:
            name = signal.Signals(-code).name
            raise ProcessExitedException(
                f"process {error_index} terminated with signal {name}",
                error_index, p.pid, code, name)
        raise ProcessExitedException(
            f"process {error_index} terminated with exit code {code}",
            error_index, p.pid, code)


class SpawnContext(ProcessContext):
    pass


def start_processes(fn, args=(), nprocs=1, join=True, daemon=False,
                    start_method="spawn"):
    ctx = multiprocessing.get_context(start_method)
    procs, queues = [], []
    for i in range(nprocs):
        q = ctx.SimpleQueue()
        p = ctx.Process(target=_wrap, args=(fn, i, args, q), daemon=daemon)
        p.start()
        procs.append(p)
        queues.append(q)
    pc = ProcessContext(procs, queues)
    if not join:
        return pc
    while not pc.join():
        pass
    return None


def spawn(fn, args=(), nprocs=1, join=True, daemon=False,
          start_method="spawn"):
    """Run ``fn(i, *args)`` for i in range(nprocs) in new processes (the
    'spawn' start method: fn must be importable, as in PyTorch)."""
    return start_processes(fn, args, nprocs, join, daemon, start_method)
