"""``nn.utils.weight_norm`` / ``remove_weight_norm`` (PyTorch's hook API):
``weight`` becomes ``weight_g * weight_v / ||weight_v||`` (norm over all
dims but ``dim``), recomputed before every forward; ``weight_g`` and
``weight_v`` are the parameters (and the state_dict keys)."""
from ..parameter import Parameter

__all__ = ["weight_norm", "remove_weight_norm", "WeightNorm"]


def _norm_except_dim(v, dim):
    if dim is None or dim == -1 and v.ndim == 0:
        return v.norm()
    dim = dim % v.ndim
    axes = tuple(i for i in range(v.ndim) if i != dim)
    return (v * v).sum(axes, keepdim=True).sqrt() if axes else v.abs()


class WeightNorm:
    def __init__(self, name, dim):
        self.name = name
        self.dim = -1 if dim is None else dim

    def compute_weight(self, module):
        g = getattr(module, self.name + "_g")
        v = getattr(module, self.name + "_v")
        return v * (g / _norm_except_dim(v, None if self.dim == -1
                                         else self.dim))

    @staticmethod
    def apply(module, name, dim):
        for hook in module._forward_pre_hooks.values():
            if isinstance(hook[0], WeightNorm) and hook[0].name == name:
                raise RuntimeError(f"Cannot register two weight_norm hooks "
                                   f"on the same parameter {name}")
        fn = WeightNorm(name, dim)
        weight = getattr(module, name)
        del module._parameters[name]
        g = _norm_except_dim(weight.detach(), None if fn.dim == -1
                             else fn.dim)
        module.register_parameter(name + "_g", Parameter(g.clone()))
        module.register_parameter(name + "_v",
                                  Parameter(weight.detach().clone()))
        setattr(module, name, fn.compute_weight(module))
        module.register_forward_pre_hook(fn)
        return fn

    def remove(self, module):
        weight = self.compute_weight(module)
        delattr(module, self.name)
        del module._parameters[self.name + "_g"]
        del module._parameters[self.name + "_v"]
        module.register_parameter(self.name, Parameter(weight.detach()))

    def __call__(self, module, inputs):
        setattr(module, self.name, self.compute_weight(module))


def weight_norm(module, name="weight", dim=0):
    WeightNorm.apply(module, name, dim)
    return module


def _remove_hook(module, kind, name, what):
    """Undo the ``kind`` reparametrisation of ``name`` (weight_norm's and
    spectral_norm's remove_*): restore the plain parameter, drop the hook."""
    for k, hook in list(module._forward_pre_hooks.items()):
        if isinstance(hook[0], kind) and hook[0].name == name:
            hook[0].remove(module)
            del module._forward_pre_hooks[k]
            return module
    raise ValueError(f"{what} of '{name}' not found in {module}")


def remove_weight_norm(module, name="weight"):
    return _remove_hook(module, WeightNorm, name, "weight_norm")
