"""``dtorch.nn.utils.prune``: magnitude, random and structured pruning.

PyTorch's parametrisation (torch.nn.utils.prune): pruning ``module.weight``
moves the parameter to ``weight_orig``, adds a buffer ``weight_mask`` (1 =
kept, 0 = pruned, the parameter's dtype) and registers the method itself as
a forward pre-hook that sets the plain attribute ``module.weight = weight_orig
* weight_mask`` before each forward. Gradients reach ``weight_orig`` through
that product, so pruned entries get zero gradient. ``state_dict`` therefore
holds ``weight_orig`` and ``weight_mask``; ``remove`` makes the pruning
permanent (``weight`` a parameter again, both extras gone).

Pruning the same tensor again combines the masks as PyTorch's
``PruningContainer``: a fractional ``amount`` applies to what is still
unpruned (entries for unstructured methods, channels for structured ones).
"""
import numbers

from ...autograd.grad_mode import no_grad
from ...ops.base import dim_error
from ..parameter import Parameter

__all__ = ["BasePruningMethod", "PruningContainer", "Identity",
           "RandomUnstructured", "L1Unstructured", "RandomStructured",
           "LnStructured", "CustomFromMask", "identity",
           "random_unstructured", "l1_unstructured", "random_structured",
           "ln_structured", "global_unstructured", "custom_from_mask",
           "remove", "is_pruned"]


def _dtorch():
    import dtorch      # the package (nn sits above it at run time)
    return dtorch


def _validate_amount(amount):
    if not isinstance(amount, numbers.Real) or isinstance(amount, bool) \
            or (isinstance(amount, numbers.Integral) and amount < 0) or \
            (not isinstance(amount, numbers.Integral)
             and (float(amount) > 1.0 or float(amount) < 0.0)):
        raise ValueError(
            f"amount={amount} should either be a float in the range [0, 1] "
            f"or a non-negative integer")


def _validate_against(amount, size):
    if isinstance(amount, numbers.Integral) and amount > size:
        raise ValueError(
            f"amount={amount} should be smaller than the number of "
            f"parameters to prune={size}")


def _n_to_prune(amount, size):
    if isinstance(amount, numbers.Integral):
        return int(amount)
    return round(float(amount) * size)     # PyTorch rounds half to even too


class BasePruningMethod:
    """A pruning method is a forward pre-hook: ``__call__`` recomputes the
    pruned tensor from ``name + '_orig'`` and ``name + '_mask'``."""
    PRUNING_TYPE = None      # "unstructured" | "structured" | "global"
    _tensor_name = None

    def __call__(self, module, inputs):
        setattr(module, self._tensor_name, self.apply_mask(module))

    def compute_mask(self, t, default_mask):
        raise NotImplementedError

    def apply_mask(self, module):
        assert self._tensor_name is not None, \
            f"Module {module} has to be pruned"
        orig = getattr(module, self._tensor_name + "_orig")
        mask = getattr(module, self._tensor_name + "_mask")
        return orig * mask.to(dtype=orig.dtype)

    @classmethod
    def apply(cls, module, name, *args, importance_scores=None, **kwargs):
        """Prune ``module.<name>`` in place; returns the method (the hook)."""
        old = None
        hooks = [k for k, (h, _) in module._forward_pre_hooks.items()
                 if isinstance(h, BasePruningMethod)
                 and h._tensor_name == name]
        if len(hooks) > 1:
            raise RuntimeError(
                f"More than one forward pre-hook prunes parameter {name} "
                f"of {type(module).__name__}")
        if hooks:
            old = module._forward_pre_hooks.pop(hooks[0])[0]
        method = cls(*args, **kwargs)
        method._tensor_name = name
        if old is not None:
            if isinstance(old, PruningContainer):
                old.add_pruning_method(method)
                method = old
            else:
                container = PruningContainer(old)
                container.add_pruning_method(method)
                method = container
        orig = getattr(module, name + "_orig", None) if old is not None \
            else getattr(module, name)
        if orig is None:
            raise AttributeError(
                f"Parameter '{name}' of module {type(module).__name__} has "
                f"to be pruned (no {name}_orig found)")
        if importance_scores is not None and \
                tuple(importance_scores.shape) != tuple(orig.shape):
            raise ValueError(
                f"importance_scores should have the same shape as "
                f"parameter {name} of {type(module).__name__}: got "
                f"{list(importance_scores.shape)}, expected "
                f"{list(orig.shape)}")
        scores = importance_scores if importance_scores is not None else orig
        with no_grad():
            if old is None:
                default = _dtorch().ones_like(orig)
            else:
                default = getattr(module, name + "_mask").detach().clone()
            mask = method.compute_mask(scores.detach(), default_mask=default)
            if old is None:
                # weight -> weight_orig (the same Parameter object), plus
                # the mask buffer
                module.register_parameter(name + "_orig", orig)
                del module._parameters[name]
                module.register_buffer(name + "_mask", mask)
            else:
                getattr(module, name + "_mask").copy_(mask)
        setattr(module, name, method.apply_mask(module))
        module.register_forward_pre_hook(method)
        return method

    def prune(self, t, default_mask=None, importance_scores=None):
        """The pruned version of ``t`` (no module involved)."""
        scores = importance_scores if importance_scores is not None else t
        if default_mask is None:
            default_mask = _dtorch().ones_like(t)
        with no_grad():
            mask = self.compute_mask(scores, default_mask=default_mask)
        return t * mask

    def remove(self, module):
        """Make the pruning permanent: ``name`` becomes a Parameter holding
        ``orig * mask``; ``name_orig`` and ``name_mask`` go."""
        assert self._tensor_name is not None, \
            f"Module {module} has to be pruned before pruning can be removed"
        weight = self.apply_mask(module)
        if hasattr(module, self._tensor_name):
            delattr(module, self._tensor_name)
        orig = module._parameters[self._tensor_name + "_orig"]
        with no_grad():
            orig.copy_(weight.detach())
        del module._parameters[self._tensor_name + "_orig"]
        del module._buffers[self._tensor_name + "_mask"]
        setattr(module, self._tensor_name, orig)


class PruningContainer(BasePruningMethod):
    """The methods applied in turn to one tensor; each new mask only
    touches what the previous ones kept."""

    def __init__(self, *args):
        self._pruning_methods = ()
        if len(args) == 1 and not isinstance(args[0], BasePruningMethod):
            args = tuple(args[0])
        for m in args:
            self.add_pruning_method(m)

    def add_pruning_method(self, method):
        if not isinstance(method, BasePruningMethod) and method is not None:
            raise TypeError(f"{type(method)} is not a BasePruningMethod "
                            f"subclass")
        if method is not None and self._tensor_name is not None and \
                self._tensor_name != method._tensor_name:
            raise ValueError(
                f"Can only add pruning methods acting on the parameter named "
                f"'{self._tensor_name}' to PruningContainer {self}. Found "
                f"'{method._tensor_name}'")
        self._pruning_methods += (method,)
        self._tensor_name = method._tensor_name

    def __len__(self):
        return len(self._pruning_methods)

    def __iter__(self):
        return iter(self._pruning_methods)

    def __getitem__(self, idx):
        return self._pruning_methods[idx]

    def compute_mask(self, t, default_mask):
        method = self._pruning_methods[-1]
        kind = method.PRUNING_TYPE
        mask = default_mask.clone()
        if kind == "unstructured":
            keep = default_mask == 1
            part = method.compute_mask(t[keep], default_mask[keep])
            mask[keep] = part.to(dtype=mask.dtype)
        elif kind == "structured":
            dim = method.dim if method.dim >= 0 else method.dim + t.dim()
            others = tuple(d for d in range(t.dim()) if d != dim)
            alive = (default_mask.sum(dim=others) != 0) if others \
                else default_mask != 0
            idx = alive.nonzero().view(-1)
            sub_t = t.index_select(dim, idx)
            sub_m = default_mask.index_select(dim, idx)
            part = method.compute_mask(sub_t, sub_m)
            mask.index_copy_(dim, idx, part.to(dtype=mask.dtype))
        elif kind == "global":
            mask = method.compute_mask(t, default_mask)
        else:
            raise ValueError(f"Unrecognized PRUNING_TYPE {kind}")
        return mask


class Identity(BasePruningMethod):
    PRUNING_TYPE = "unstructured"

    def compute_mask(self, t, default_mask):
        return default_mask

    @classmethod
    def apply(cls, module, name):
        return super().apply(module, name)


class _Unstructured(BasePruningMethod):
    PRUNING_TYPE = "unstructured"

    def __init__(self, amount):
        _validate_amount(amount)
        self.amount = amount

    def _scores(self, t):
        raise NotImplementedError

    def compute_mask(self, t, default_mask):
        n = t.numel()
        _validate_against(self.amount, n)
        k = _n_to_prune(self.amount, n)
        mask = default_mask.clone()
        if k:
            idx = _dtorch().topk(self._scores(t).reshape(-1), k,
                                 largest=False).indices
            mask.view(-1)[idx] = 0
        return mask


class RandomUnstructured(_Unstructured):
    """Prune ``amount`` entries chosen uniformly at random."""

    def _scores(self, t):
        return _dtorch().rand_like(t.float())

    @classmethod
    def apply(cls, module, name, amount):
        return super().apply(module, name, amount=amount)


class L1Unstructured(_Unstructured):
    """Prune the ``amount`` entries of smallest absolute value."""

    def _scores(self, t):
        return t.abs()

    @classmethod
    def apply(cls, module, name, amount, importance_scores=None):
        return super().apply(module, name, amount=amount,
                             importance_scores=importance_scores)


class _Structured(BasePruningMethod):
    PRUNING_TYPE = "structured"

    def __init__(self, amount, dim=-1):
        _validate_amount(amount)
        self.amount = amount
        self.dim = dim

    def _channel_scores(self, t, dim):
        raise NotImplementedError

    def compute_mask(self, t, default_mask):
        if t.dim() < 1:
            raise ValueError("Structured pruning can only be applied to "
                             "multidimensional tensors. Found tensor of "
                             "shape () with 0 dims")
        dim = self.dim if self.dim >= 0 else self.dim + t.dim()
        if not 0 <= dim < t.dim():
            raise dim_error(self.dim, t.dim())
        size = t.shape[dim]
        _validate_against(self.amount, size)
        k = _n_to_prune(self.amount, size)
        keep = size - k
        dt = _dtorch()
        chan = dt.zeros(size, dtype=default_mask.dtype,
                        device=default_mask.device)
        if keep:
            idx = dt.topk(self._channel_scores(t, dim), keep,
                          largest=True).indices
            chan[idx] = 1
        shape = [1] * t.dim()
        shape[dim] = size
        return default_mask * chan.view(shape)


class RandomStructured(_Structured):
    """Prune ``amount`` whole channels along ``dim``, chosen at random."""

    def _channel_scores(self, t, dim):
        return _dtorch().rand(t.shape[dim], device=t.device)

    @classmethod
    def apply(cls, module, name, amount, dim=-1):
        return super().apply(module, name, amount=amount, dim=dim)


class LnStructured(_Structured):
    """Prune the ``amount`` channels along ``dim`` of smallest L``n`` norm."""

    def __init__(self, amount, n, dim=-1):
        super().__init__(amount, dim)
        self.n = n

    def _channel_scores(self, t, dim):
        others = tuple(d for d in range(t.dim()) if d != dim)
        if not others:
            return t.abs()
        x = t.float() if not t.is_floating_point() else t
        return x.norm(p=self.n, dim=others)

    @classmethod
    def apply(cls, module, name, amount, n, dim, importance_scores=None):
        return super().apply(module, name, amount=amount, n=n, dim=dim,
                             importance_scores=importance_scores)


class CustomFromMask(BasePruningMethod):
    PRUNING_TYPE = "global"

    def __init__(self, mask):
        self.mask = mask

    def compute_mask(self, t, default_mask):
        if tuple(default_mask.shape) != tuple(self.mask.shape):
            raise ValueError(
                f"mask of shape {list(self.mask.shape)} does not match the "
                f"parameter's shape {list(default_mask.shape)}")
        return default_mask * self.mask.to(dtype=default_mask.dtype,
                                           device=default_mask.device)

    @classmethod
    def apply(cls, module, name, mask):
        return super().apply(module, name, mask=mask)


def identity(module, name):
    """Apply the parametrisation with an all-ones mask."""
    Identity.apply(module, name)
    return module


def random_unstructured(module, name, amount):
    RandomUnstructured.apply(module, name, amount)
    return module


def l1_unstructured(module, name, amount, importance_scores=None):
    L1Unstructured.apply(module, name, amount=amount,
                         importance_scores=importance_scores)
    return module


def random_structured(module, name, amount, dim):
    RandomStructured.apply(module, name, amount, dim)
    return module


def ln_structured(module, name, amount, n, dim, importance_scores=None):
    LnStructured.apply(module, name, amount, n, dim,
                       importance_scores=importance_scores)
    return module


def custom_from_mask(module, name, mask):
    CustomFromMask.apply(module, name, mask)
    return module


def global_unstructured(parameters, pruning_method, importance_scores=None,
                        **kwargs):
    """Prune the union of ``parameters`` ((module, name) pairs) at once:
    e.g. the 20% smallest weights of the whole model, not of each layer."""
    if not hasattr(parameters, "__iter__") or isinstance(parameters, str):
        raise TypeError("global_unstructured(): parameters is not an "
                        "Iterable")
    parameters = list(parameters)
    if not parameters:
        raise ValueError("global_unstructured(): parameters is empty")
    importance_scores = importance_scores or {}
    if not isinstance(importance_scores, dict):
        raise TypeError("global_unstructured(): importance_scores must be "
                        "of type dict")
    if getattr(pruning_method, "PRUNING_TYPE", None) != "unstructured":
        raise TypeError(
            'Only "unstructured" PRUNING_TYPE supported for the '
            f"`pruning_method`. Found method {pruning_method} of type "
            f"{getattr(pruning_method, 'PRUNING_TYPE', None)}")
    dt = _dtorch()
    with no_grad():
        scores = dt.cat([importance_scores.get((m, n), getattr(m, n))
                         .detach().reshape(-1) for m, n in parameters])
        default = dt.cat([
            getattr(m, n + "_mask", dt.ones_like(getattr(m, n))).detach()
            .reshape(-1).to(dtype=scores.dtype) for m, n in parameters])
        method = pruning_method(**kwargs)
        method._tensor_name = "temp"
        container = PruningContainer(method)
        mask = container.compute_mask(scores, default)
    start = 0
    for m, n in parameters:
        p = getattr(m, n)
        part = mask[start:start + p.numel()].view(p.shape)
        start += p.numel()
        custom_from_mask(m, n, part)


def remove(module, name):
    """Make the pruning of ``module.<name>`` permanent."""
    for k, (hook, _) in list(module._forward_pre_hooks.items()):
        if isinstance(hook, BasePruningMethod) and hook._tensor_name == name:
            hook.remove(module)
            del module._forward_pre_hooks[k]
            return module
    raise ValueError(
        f"Parameter '{name}' of module {module} has to be pruned before "
        f"pruning can be removed")


def is_pruned(module):
    """True when any submodule of ``module`` carries a pruning hook."""
    for _, sub in module.named_modules():
        for hook, _ in sub._forward_pre_hooks.values():
            if isinstance(hook, BasePruningMethod):
                return True
    return False
