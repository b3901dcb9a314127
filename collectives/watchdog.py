"""The per-process watchdog thread that ticks registered groups."""
import sys
import threading
import time
import weakref


class _Watchdog:
    """One daemon thread per process that calls `_watchdog_tick()` on the
    groups registered with it (answering status queries, enforcing
    timeouts of blocking MPI calls). It wakes every `interval` seconds."""

    def __init__(self):
        self.groups = weakref.WeakSet()
        self.lock = threading.Lock()
        self.thread = None
        self.interval = 0.05
        self.tick_lock = threading.Lock()
        self.stopped = False

    def register(self, group):
        with self.lock:
            self.groups.add(group)
            if self.thread is None:
                self.thread = threading.Thread(
                    target=self._loop, name='dtorch-collectives-watchdog',
                    daemon=True)
                self.thread.start()

    def unregister(self, group):
        with self.lock:
            self.groups.discard(group)

    def stop(self):
        """Stop ticking (before MPI_Finalize: no MPI calls after it)."""
        with self.tick_lock:
            self.stopped = True

    def _loop(self):
        while not self.stopped:
            time.sleep(self.interval)
            with self.lock:
                groups = list(self.groups)
            with self.tick_lock:
                if self.stopped:
                    return
                for g in groups:
                    try:
                        g._watchdog_tick()
                    except Exception as e:  # never let the watchdog die
                        print(f"dtorch collectives watchdog: {g!r}: "
                              f"{e!r}", file=sys.stderr)


watchdog = _Watchdog()
