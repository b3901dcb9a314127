"""``Variable``: PyTorch's deprecated wrapper, which now makes a tensor.
``Variable(t, requires_grad=...)`` returns a new tensor over t's data,
detached, with the given flag; ``isinstance(x, Variable)`` holds for every
tensor."""
from . import function as _fn


class _VariableMeta(type):
    def __instancecheck__(cls, other):
        return isinstance(other, _fn.TensorBase)


class Variable(metaclass=_VariableMeta):
    def __new__(cls, data, requires_grad=False, volatile=False):
        if not isinstance(data, _fn.TensorBase):
            raise TypeError(f"Variable data has to be a tensor, but got "
                            f"{type(data).__name__}")
        return data.detach().requires_grad_(requires_grad)
