"""``Parameter``: a Tensor that a Module registers as a learnable weight."""
from ..tensor import Tensor
from ..autograd.grad_mode import no_grad


class Parameter(Tensor):
    """A tensor that is a module parameter: assigning one to a Module
    attribute registers it in ``_parameters``. It shares memory (and the
    version counter) with the tensor it was made from.

    Example::

        w = nn.Parameter(dtorch.zeros(3, 4))
    """

    def __new__(cls, data=None, requires_grad=True):
        if data is None:
            from .._creation import empty
            data = empty(0)
        t = object.__new__(cls)
        t._init(data._data, False)
        t._vc = data._vc
        if requires_grad:
            t.requires_grad_(True)
        return t

    def __init__(self, data=None, requires_grad=True):
        pass

    def __repr__(self):
        return "Parameter containing:\n" + super().__repr__()

    def __deepcopy__(self, memo):
        if id(self) in memo:
            return memo[id(self)]
        with no_grad():
            res = Parameter(self.clone(), self.requires_grad)
        memo[id(self)] = res
        return res


class Buffer(Tensor):
    """``nn.Buffer(tensor, persistent=True)``: assigning one to a Module
    attribute registers it as a buffer."""

    def __new__(cls, data=None, *, persistent=True):
        if data is None:
            from .._creation import empty
            data = empty(0)
        t = object.__new__(cls)
        t._init(data._data, False)
        t._vc = data._vc
        t.persistent = persistent
        return t

    def __init__(self, data=None, *, persistent=True):
        pass


class UninitializedParameter(Parameter):
    pass
