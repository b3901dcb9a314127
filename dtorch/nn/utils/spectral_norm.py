"""``nn.utils.spectral_norm`` / ``remove_spectral_norm`` (PyTorch's hook
API): ``weight = weight_orig / sigma``, sigma the largest singular value of
``weight_orig`` (as a matrix with ``dim`` first) estimated by power
iteration; in training mode each forward runs ``n_power_iterations`` steps
and updates the buffers ``weight_u`` and ``weight_v`` in place."""
from ..parameter import Parameter
from ...autograd.grad_mode import no_grad
from .weight_norm import _remove_hook

__all__ = ["spectral_norm", "remove_spectral_norm", "SpectralNorm"]


def _normalize(t, eps):
    return t / t.norm().clamp(min=eps)


class SpectralNorm:
    def __init__(self, name="weight", n_power_iterations=1, dim=0,
                 eps=1e-12):
        if n_power_iterations <= 0:
            raise ValueError(f"Expected n_power_iterations to be positive, "
                             f"but got n_power_iterations="
                             f"{n_power_iterations}")
        self.name = name
        self.dim = dim
        self.n_power_iterations = n_power_iterations
        self.eps = eps

    def reshape_weight_to_matrix(self, weight):
        w = weight
        if self.dim != 0:
            order = [self.dim] + [d for d in range(w.ndim) if d != self.dim]
            w = w.permute(*order)
        return w.reshape(w.shape[0], -1)

    def compute_weight(self, module, do_power_iteration):
        weight = getattr(module, self.name + "_orig")
        u = getattr(module, self.name + "_u")
        v = getattr(module, self.name + "_v")
        mat = self.reshape_weight_to_matrix(weight)
        if do_power_iteration:
            with no_grad():
                m = mat.detach()
                for _ in range(self.n_power_iterations):
                    v.copy_(_normalize(m.t() @ u, self.eps))
                    u.copy_(_normalize(m @ v, self.eps))
                # later in-place updates must not touch the saved copies
                u = u.clone()
                v = v.clone()
        sigma = u.dot(mat @ v)
        return weight / sigma

    def remove(self, module):
        with no_grad():
            weight = self.compute_weight(module, do_power_iteration=False)
        delattr(module, self.name)
        delattr(module, self.name + "_u")
        delattr(module, self.name + "_v")
        delattr(module, self.name + "_orig")
        module.register_parameter(self.name, Parameter(weight.detach()))

    def __call__(self, module, inputs):
        setattr(module, self.name,
                self.compute_weight(module, module.training))

    @staticmethod
    def apply(module, name, n_power_iterations, dim, eps):
        for hook in module._forward_pre_hooks.values():
            if isinstance(hook[0], SpectralNorm) and hook[0].name == name:
                raise RuntimeError(f"Cannot register two spectral_norm hooks "
                                   f"on the same parameter {name}")
        fn = SpectralNorm(name, n_power_iterations, dim, eps)
        weight = module._parameters[name]
        with no_grad():
            mat = fn.reshape_weight_to_matrix(weight)
            h, w = mat.shape
            u = _normalize(weight.new_empty(h).normal_(0, 1), fn.eps)
            v = _normalize(weight.new_empty(w).normal_(0, 1), fn.eps)
        del module._parameters[name]
        module.register_parameter(name + "_orig", weight)
        setattr(module, name, weight.detach())
        module.register_buffer(name + "_u", u)
        module.register_buffer(name + "_v", v)
        module.register_forward_pre_hook(fn)
        return fn


def spectral_norm(module, name="weight", n_power_iterations=1, eps=1e-12,
                  dim=None):
    if dim is None:
        # ConvTranspose weights are (in, out, ...): normalise over dim 1
        dim = 1 if type(module).__name__.startswith("ConvTranspose") else 0
    SpectralNorm.apply(module, name, n_power_iterations, dim, eps)
    return module


def remove_spectral_norm(module, name="weight"):
    return _remove_hook(module, SpectralNorm, name, "spectral_norm")
