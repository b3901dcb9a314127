"""``nn.utils.parametrize``: a tensor of a module computed from
``module.parametrizations.<name>.original`` (or ``original0``, ``original1``
... when ``right_inverse`` returns several) through a chain of modules, on
every access, with PyTorch's state_dict keys. The module's class is swapped
for a subclass that holds one property per parametrized tensor, as in
PyTorch."""
from ..modules.container import ModuleDict, ModuleList
from ..parameter import Parameter
from ...autograd.grad_mode import no_grad

__all__ = ["register_parametrization", "remove_parametrizations",
           "is_parametrized", "ParametrizationList", "cached"]


class ParametrizationList(ModuleList):
    def __init__(self, modules, original, unsafe=False):
        super().__init__(modules)
        self.unsafe = unsafe
        new = original
        with no_grad():
            for m in reversed(list(self)):
                if hasattr(m, "right_inverse"):
                    new = m.right_inverse(new)
        self.is_tensor = not isinstance(new, (tuple, list))
        self.ntensors = 1 if self.is_tensor else len(new)
        if self.is_tensor:
            # keep the original Parameter object (optimizers may hold it)
            if new is not original:
                with no_grad():
                    original.data = new.detach()
            self.register_parameter("original", original)
        else:
            for i, t in enumerate(new):
                p = Parameter(t.detach().clone(),
                              requires_grad=original.requires_grad)
                self.register_parameter(f"original{i}", p)

    def right_inverse(self, value):
        with no_grad():
            for m in reversed(list(self)):
                if hasattr(m, "right_inverse"):
                    value = m.right_inverse(value)
            if self.is_tensor:
                self.original.copy_(value)
            else:
                for i, t in enumerate(value):
                    getattr(self, f"original{i}").copy_(t)

    def forward(self):
        mods = list(self)
        if self.is_tensor:
            x = mods[0](self.original)
        else:
            x = mods[0](*(getattr(self, f"original{i}")
                          for i in range(self.ntensors)))
        for m in mods[1:]:
            x = m(x)
        return x


def is_parametrized(module, tensor_name=None):
    p = module.__dict__.get("_modules", {}).get("parametrizations")
    if p is None or not isinstance(p, ModuleDict):
        return False
    return True if tensor_name is None else tensor_name in p


def _inject_class(module):
    cls = module.__class__
    new = type(f"Parametrized{cls.__name__}", (cls,), {})
    module.__class__ = new


def _inject_property(module, name):
    def get(self):
        return self.parametrizations[name]()

    def set_(self, value):
        self.parametrizations[name].right_inverse(value)
    setattr(module.__class__, name, property(get, set_))


def register_parametrization(module, tensor_name, parametrization, *,
                             unsafe=False):
    if is_parametrized(module, tensor_name):
        module.parametrizations[tensor_name].append(parametrization)
        return module
    if tensor_name in module._buffers:
        original = module._buffers.pop(tensor_name)
    elif tensor_name in module._parameters:
        original = module._parameters.pop(tensor_name)
    else:
        raise ValueError(f"Module '{module}' does not have a parameter, a "
                         f"buffer, or a parametrized element with name "
                         f"'{tensor_name}'")
    if not is_parametrized(module):
        _inject_class(module)
        module.parametrizations = ModuleDict()
    module.parametrizations[tensor_name] = ParametrizationList(
        [parametrization], original, unsafe)
    _inject_property(module, tensor_name)
    return module


def remove_parametrizations(module, tensor_name, leave_parametrized=True):
    if not is_parametrized(module, tensor_name):
        raise ValueError(f"Module {module} does not have a parametrization "
                         f"on {tensor_name}")
    plist = module.parametrizations[tensor_name]
    with no_grad():
        value = plist() if leave_parametrized else plist.original
    delattr(module.__class__, tensor_name)
    del module.parametrizations[tensor_name]
    module.register_parameter(tensor_name, Parameter(value.detach()))
    if not len(module.parametrizations):
        del module._modules["parametrizations"]
        module.__class__ = module.__class__.__bases__[0]
    return module


class cached:
    """Context manager; dtorch recomputes parametrized tensors on each
    access (the result is the same)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

