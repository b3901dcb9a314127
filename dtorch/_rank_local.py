"""State that a process has one of, and a thread rank has its own.

``dist.spawn_threads`` runs N ranks as N threads of one process, standing in
for N processes in unit tests. A process has its own RNG state, default
dtype and deterministic flag; if thread ranks shared the interpreter's,
``manual_seed(0)`` in rank 0 would reseed rank 1 mid-draw and a model built
in each rank would differ from run to run. A ``RankLocal`` value is the
process's in ordinary threads and, inside ``rank_scope()`` (entered by each
thread rank), the rank's own, made fresh by the same factory the process
used: a thread rank starts as a newly spawned process does.

State that PyTorch already keeps per thread (grad mode, autocast, the CUDA
current device, the default process group of a thread rank) is thread-local
where it lives; the BLAS thread pool (``set_num_threads``) is one per
interpreter and stays shared.

    seed_state = RankLocal(lambda: [0])
    with rank_scope():
        seed_state.get()[0] = 5     # this thread rank only
"""
import contextlib
import threading

_tls = threading.local()


class RankLocal:
    """One value per process, and one per thread rank (see module doc)."""

    __slots__ = ("_make", "_process")

    def __init__(self, make):
        self._make = make
        self._process = make()

    def get(self):
        own = getattr(_tls, "values", None)
        if own is None:
            return self._process
        v = own.get(self)
        if v is None:
            v = own[self] = self._make()
        return v

    def set(self, value):
        own = getattr(_tls, "values", None)
        if own is None:
            self._process = value
        else:
            own[self] = value


def current():
    """The calling thread's rank values (None outside a thread rank), for
    a helper thread that works for that rank (``rank_scope(current())``)."""
    return getattr(_tls, "values", None)


@contextlib.contextmanager
def rank_scope(values=None):
    """Run the block as a thread rank: RankLocal values are this thread's
    own (``values``: adopt another thread's, e.g. its rank's)."""
    prev = getattr(_tls, "values", None)
    _tls.values = {} if values is None else values
    try:
        yield
    finally:
        _tls.values = prev
