"""``dtorch.futures``: ``torch.futures.Future``, the result of an
asynchronous operation (DDP communication hooks return one).

``then(callback)`` chains: the callback receives the completed future and
its return value completes the future ``then`` returned, as in PyTorch::

    fut = dist.all_reduce(t, async_op=True).get_future()
    fut.then(lambda f: f.value()[0].div_(world_size)).wait()
"""
import threading

__all__ = ["Future", "collect_all", "wait_all"]


class Future:
    """A value that will be there: ``set_result`` (or ``set_exception``)
    completes it once; ``wait()`` blocks until then and returns the value
    (or raises the exception)."""

    def __init__(self, *, devices=None):
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._value = self._exc = None
        self._callbacks = []

    def done(self):
        return self._done.is_set()

    def set_result(self, result):
        self._complete(result, None)

    def set_exception(self, result):
        if not isinstance(result, BaseException):
            raise TypeError(f"set_exception expects an exception, got "
                            f"{type(result).__name__}")
        self._complete(None, result)

    def _complete(self, value, exc):
        with self._lock:
            if self._done.is_set():
                raise RuntimeError("this Future is already completed")
            self._value, self._exc = value, exc
            self._done.set()
            callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            cb(self)

    def wait(self):
        self._done.wait()
        if self._exc is not None:
            raise self._exc
        return self._value

    def value(self):
        """The result of a completed future (raises if it failed)."""
        if not self.done():
            raise RuntimeError("Future.value() called before the future "
                               "completed; use wait()")
        return self.wait()

    def add_done_callback(self, callback):
        """Run ``callback(self)`` when complete (now if already done)."""
        with self._lock:
            if not self._done.is_set():
                self._callbacks.append(callback)
                return
        callback(self)

    def then(self, callback):
        """A new future completed with ``callback(self)`` once this one is
        done (or with the exception the callback raised)."""
        nxt = Future()

        def run(fut):
            try:
                nxt.set_result(callback(fut))
            except BaseException as e:
                nxt.set_exception(e)
        self.add_done_callback(run)
        return nxt


def collect_all(futures):
    """A future completed with the list of ``futures`` once all are."""
    futures = list(futures)
    out = Future()
    left = [len(futures)]
    lock = threading.Lock()
    if not futures:
        out.set_result([])

    def one(_):
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            out.set_result(futures)
    for f in futures:
        f.add_done_callback(one)
    return out


def wait_all(futures):
    """The values of ``futures``, waiting for each."""
    return [f.wait() for f in futures]
