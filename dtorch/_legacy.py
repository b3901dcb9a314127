"""PyTorch's legacy typed tensor classes (``torch.FloatTensor``,
``torch.LongTensor``, ...): ``FloatTensor([1, 2])`` and
``LongTensor(2, 3)`` construct, ``isinstance(t, torch.FloatTensor)`` checks
a CPU tensor's dtype, and ``t.type(torch.LongTensor)`` converts."""
from ._creation import tensor, zeros
from ._tensor_methods.convert import _LEGACY_DTYPES
from .tensor import Tensor

__all__ = ["FloatTensor", "DoubleTensor", "HalfTensor", "BFloat16Tensor",
           "LongTensor", "IntTensor", "ShortTensor", "ByteTensor",
           "CharTensor", "BoolTensor"]


class _LegacyMeta(type):
    def __instancecheck__(cls, obj):
        return isinstance(obj, Tensor) and obj.dtype is cls._legacy_dtype \
            and obj.device.type == "cpu"

    def __repr__(cls):
        return f"<class 'torch.{cls.__name__}'>"


def _make(name, dt):
    def __new__(cls, *args, device=None):
        if len(args) == 1 and not isinstance(args[0], int):
            return tensor(args[0], dtype=dt, device=device)
        return zeros(*args, dtype=dt, device=device)
    return _LegacyMeta(name, (), {"__new__": __new__, "_legacy_dtype": dt,
                                  "dtype": dt})


BY_NAME = {n: _make(n, dt) for n, dt in _LEGACY_DTYPES.items()}
globals().update(BY_NAME)
