"""PyTorch keyword arguments that dtorch accepts but does not act on.

Scripts written for PyTorch pass them (``static_graph=True``,
``pg_options=...``); refusing them would break those scripts, ignoring them
silently would hide that they do nothing. ``ignored_argument`` warns once
per (callable, argument) and process, naming both."""
import threading
import warnings

_warned = set()
_lock = threading.Lock()


def ignored_argument(owner, name, value, why="", stacklevel=3):
    """Warn (once) that ``owner``'s argument ``name`` has no effect."""
    key = (owner, name)
    with _lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(f"{owner}: argument {name}={value!r} has no effect in "
                  f"dtorch{'; ' + why if why else ''}", UserWarning,
                  stacklevel=stacklevel)
