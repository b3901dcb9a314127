"""``detect_anomaly`` / ``set_detect_anomaly``: while enabled, backward
checks each node's gradients and raises, naming the node, when one holds a
NaN (as PyTorch does). dtorch records no forward traceback."""
from .._backend import get_array_module

_state = [False]


def is_anomaly_enabled():
    return _state[0]


def check_grads(node, grads):
    """Called by the engine after a node's backward while enabled."""
    for i, g in enumerate(grads):
        if g is None or getattr(g, "dtype", None) is None or \
                g.dtype.kind != "f":
            continue
        if bool(get_array_module(g).isnan(g).any()):
            raise RuntimeError(f"Function '{node.name()}' returned nan "
                               f"values in its {i}th output.")


class detect_anomaly:
    """Context manager (and decorator) enabling anomaly detection."""

    def __init__(self, check_nan=True):
        self.check_nan = check_nan
        self.prev = None

    def __enter__(self):
        self.prev = _state[0]
        _state[0] = bool(self.check_nan)
        return self

    def __exit__(self, *exc):
        _state[0] = self.prev
        return False

    def __call__(self, fn):
        def wrapped(*args, **kwargs):
            with detect_anomaly(self.check_nan):
                return fn(*args, **kwargs)
        return wrapped


class set_detect_anomaly:
    """``set_detect_anomaly(True)`` turns detection on (for good, or for a
    ``with`` block)."""

    def __init__(self, mode, check_nan=True):
        self.prev = _state[0]
        _state[0] = bool(mode) and bool(check_nan)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        _state[0] = self.prev
        return False
