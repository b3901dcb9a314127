"""Gradient-recording modes: no_grad, enable_grad, set_grad_enabled,
inference_mode. Thread-local, as in PyTorch, so ranks that run as threads
(the single-process test mode of collectives) do not disturb each other."""
import functools
import threading


class _State(threading.local):
    enabled = True


_state = _State()


def is_grad_enabled():
    return _state.enabled


class _Mode:
    """Base of the grad-mode context managers; also usable as decorators."""
    _target = True

    def __enter__(self):
        self._prev = _state.enabled
        _state.enabled = self._target

    def __exit__(self, *exc):
        _state.enabled = self._prev
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with self.__class__():
                return fn(*args, **kwargs)
        return wrapper


class no_grad(_Mode):
    """Context manager / decorator that disables gradient recording.

    Example::

        with dtorch.no_grad():
            y = model(x)      # y.requires_grad is False
    """
    _target = False


class enable_grad(_Mode):
    """Context manager / decorator that enables gradient recording."""
    _target = True


class inference_mode(_Mode):
    """Like no_grad (dtorch has no separate inference tensors)."""

    def __init__(self, mode=True):
        self._target = not mode

    def __call__(self, fn):
        mode = not self._target

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with inference_mode(mode):
                return fn(*args, **kwargs)
        return wrapper


class set_grad_enabled(_Mode):
    """Set gradient recording on or off; works as a function or a context
    manager: ``dtorch.set_grad_enabled(False)`` or ``with set_grad_enabled(mode):``."""

    def __init__(self, mode):
        self._prev = _state.enabled
        self._target = bool(mode)
        _state.enabled = self._target

    def __enter__(self):
        pass

    def __exit__(self, *exc):
        _state.enabled = self._prev
        return False
