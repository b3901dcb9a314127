"""Padding layers (``nn.ZeroPad2d``, ``ConstantPad1d/2d/3d``,
``ReflectionPad1d/2d``, ``ReplicationPad1d/2d/3d``, ``CircularPad*``) over
``F.pad``; the padding tuple is PyTorch's (left, right, top, bottom, ...)."""
from .module import Module
from .. import functional as F


def _expand(padding, n):
    if isinstance(padding, int):
        return (padding,) * (2 * n)
    padding = tuple(padding)
    if len(padding) != 2 * n:
        raise ValueError(f"padding must be an int or a {2 * n}-tuple, got "
                         f"{padding}")
    return padding


class _PadNd(Module):
    _n = 1
    _mode = "constant"

    def __init__(self, padding, value=0.0):
        super().__init__()
        self.padding = _expand(padding, self._n)
        self.value = value

    def forward(self, input):
        if self._mode == "constant":
            return F.pad(input, self.padding, "constant", self.value)
        return F.pad(input, self.padding, self._mode)

    def extra_repr(self):
        if self._mode == "constant":
            return f"padding={self.padding}, value={self.value}"
        return f"{self.padding}"


def _make(name, n, mode, doc):
    if mode == "constant":
        def __init__(self, padding, value):
            _PadNd.__init__(self, padding, value)
    else:
        def __init__(self, padding):
            _PadNd.__init__(self, padding)
    return type(name, (_PadNd,), {"_n": n, "_mode": mode, "__doc__": doc,
                                  "__init__": __init__})


ConstantPad1d = _make("ConstantPad1d", 1, "constant", "Pad with a value.")
ConstantPad2d = _make("ConstantPad2d", 2, "constant", "Pad with a value.")
ConstantPad3d = _make("ConstantPad3d", 3, "constant", "Pad with a value.")
ReflectionPad1d = _make("ReflectionPad1d", 1, "reflect", "Mirror padding.")
ReflectionPad2d = _make("ReflectionPad2d", 2, "reflect", "Mirror padding.")
ReflectionPad3d = _make("ReflectionPad3d", 3, "reflect", "Mirror padding.")
ReplicationPad1d = _make("ReplicationPad1d", 1, "replicate",
                         "Edge padding.")
ReplicationPad2d = _make("ReplicationPad2d", 2, "replicate",
                         "Edge padding.")
ReplicationPad3d = _make("ReplicationPad3d", 3, "replicate",
                         "Edge padding.")
CircularPad1d = _make("CircularPad1d", 1, "circular", "Wrap-around padding.")
CircularPad2d = _make("CircularPad2d", 2, "circular", "Wrap-around padding.")
CircularPad3d = _make("CircularPad3d", 3, "circular", "Wrap-around padding.")


class ZeroPad1d(ConstantPad1d):
    def __init__(self, padding):
        super().__init__(padding, 0.0)


class ZeroPad2d(ConstantPad2d):
    def __init__(self, padding):
        super().__init__(padding, 0.0)


class ZeroPad3d(ConstantPad3d):
    def __init__(self, padding):
        super().__init__(padding, 0.0)
