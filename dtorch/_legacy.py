"""PyTorch's legacy typed tensor classes (``torch.FloatTensor``,
``torch.LongTensor``, ...): ``FloatTensor([1, 2])`` and
``LongTensor(2, 3)`` construct, ``isinstance(t, torch.FloatTensor)`` checks
a CPU tensor's dtype, and ``t.type(torch.LongTensor)`` converts."""
from . import _backend as B

__all__ = ["FloatTensor", "DoubleTensor", "HalfTensor", "BFloat16Tensor",
           "LongTensor", "IntTensor", "ShortTensor", "ByteTensor",
           "CharTensor", "BoolTensor"]


class _LegacyMeta(type):
    def __instancecheck__(cls, obj):
        from .tensor import Tensor
        return isinstance(obj, Tensor) and obj.dtype is cls._legacy_dtype \
            and obj.device.type == "cpu"

    def __repr__(cls):
        return f"<class 'torch.{cls.__name__}'>"


def _make(name, dt):
    def __new__(cls, *args, device=None):
        from ._creation import tensor, zeros
        if len(args) == 1 and not isinstance(args[0], int):
            return tensor(args[0], dtype=dt, device=device)
        return zeros(*args, dtype=dt, device=device)
    return _LegacyMeta(name, (), {"__new__": __new__, "_legacy_dtype": dt,
                                  "dtype": dt})


FloatTensor = _make("FloatTensor", B.float32)
DoubleTensor = _make("DoubleTensor", B.float64)
HalfTensor = _make("HalfTensor", B.float16)
BFloat16Tensor = _make("BFloat16Tensor", B.bfloat16)
LongTensor = _make("LongTensor", B.int64)
IntTensor = _make("IntTensor", B.int32)
ShortTensor = _make("ShortTensor", B.int16)
ByteTensor = _make("ByteTensor", B.uint8)
CharTensor = _make("CharTensor", B.int8)
BoolTensor = _make("BoolTensor", B.bool_)

BY_NAME = {n: globals()[n] for n in __all__}
