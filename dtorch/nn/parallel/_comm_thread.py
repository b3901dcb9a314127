"""The communication thread of DDP: runs a rank's bucket reductions in
order while the main thread goes on with backward."""
import queue
import threading

from ... import _backend as B
from ... import _rank_local


class _CommThread:
    """One thread that runs a rank's bucket reductions in order, so that
    communication proceeds while the main thread computes.

    For a CUDA bucket the thread works on the bucket's device (the current
    device is per thread, and a new thread starts on device 0) and on its
    own stream, which first waits for an event recorded on the submitting
    thread's stream (the gradients are computed there); ``result`` makes the
    caller's stream wait for the reduction's event in turn."""

    def __init__(self, name):
        self._q = queue.Queue()
        self._streams = {}     # device index -> this thread's CUDA stream
        # a thread rank's helper works with that rank's RNG, dtype, flags
        self._t = threading.Thread(target=self._run, name=name, daemon=True,
                                   args=(_rank_local.current(),))
        self._t.start()

    def _run(self, values):
        if values is None:
            return self._loop()
        with _rank_local.rank_scope(values):
            return self._loop()

    def _loop(self):
        while True:
            item = self._q.get()
            if item is None:
                return
            fn, fut, dev, ready = item
            try:
                if ready is None:
                    fut.set_result(fn())
                else:
                    fut.set_result(self._on_device(fn, fut, dev, ready))
            except BaseException as e:   # re-raised in the main thread
                fut.set_exception(e)

    def _on_device(self, fn, fut, dev, ready):
        cp = B.check_cuda_available()
        with cp.cuda.Device(dev.index):
            s = self._streams.get(dev.index)
            if s is None:
                s = self._streams[dev.index] = cp.cuda.Stream(
                    non_blocking=True)
            s.wait_event(ready)
            with s:
                out = fn()
            fut.dtorch_done = (dev.index, s.record())
        return out

    def submit(self, fn, device=None):
        from concurrent.futures import Future
        fut = Future()
        ready = None
        if device is not None and device.type == "cuda":
            cp = B.check_cuda_available()
            with cp.cuda.Device(device.index):
                ready = cp.cuda.Event(disable_timing=True)
                ready.record(cp.cuda.get_current_stream())
        self._q.put((fn, fut, device, ready))
        return fut

    def result(self, fut):
        out = fut.result()
        done = getattr(fut, "dtorch_done", None)
        if done is not None:
            index, ev = done
            with B.check_cuda_available().cuda.Device(index):
                B._cupy.cuda.get_current_stream().wait_event(ev)
        return out

    def close(self):
        self._q.put(None)
