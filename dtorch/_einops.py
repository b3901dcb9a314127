"""The einops backend for dtorch tensors (``framework_name = 'dtorch'``):
einops' rearrange / reduce / repeat / einsum / pack / unpack run on dtorch
ops, so they are differentiable and run on either device. Imported only
after einops itself (``dtorch._einops_hook``); the layers are in
``dtorch.nn.einops``."""
from einops._backends import AbstractBackend

from ._creation import arange, cat, from_numpy, stack
from .functional import einsum
from .tensor import Tensor


class DtorchBackend(AbstractBackend):
    framework_name = "dtorch"

    def is_appropriate_type(self, tensor):
        return isinstance(tensor, Tensor)

    def from_numpy(self, x):
        t = from_numpy(x)
        if t.dtype.is_floating_point:
            t.requires_grad_(True)
        return t

    def to_numpy(self, x):
        return x.detach().cpu().numpy()

    def arange(self, start, stop):
        return arange(start, stop)

    def reduce(self, x, operation, axes):
        axes = tuple(axes)
        if operation in ("min", "max"):
            return (x.amin if operation == "min" else x.amax)(dim=axes)
        if operation in ("sum", "mean"):
            return getattr(x, operation)(dim=axes)
        if operation in ("prod", "any", "all"):
            # one dim at a time, the highest first
            for d in sorted(axes, reverse=True):
                x = getattr(x, operation)(dim=d)
            return x
        raise NotImplementedError(f"Unknown reduction {operation}")

    def transpose(self, x, axes):
        return x.permute(tuple(axes))

    def stack_on_zeroth_dimension(self, tensors):
        return stack(list(tensors))

    def add_axis(self, x, new_position):
        return x.unsqueeze(new_position)

    def add_axes(self, x, n_axes, pos2len):
        # new axes as broadcast views (expand), not copies (tile)
        sizes = [-1] * n_axes
        for pos, n in pos2len.items():
            x = x.unsqueeze(pos)
            sizes[pos] = n
        return x.expand(*sizes)

    def tile(self, x, repeats):
        return x.repeat(*repeats)

    def concat(self, tensors, axis):
        return cat(list(tensors), dim=axis)

    def is_float_type(self, x):
        return x.dtype.is_floating_point

    def layers(self):
        from .nn import einops
        return einops

    def einsum(self, pattern, *x):
        return einsum(pattern, *x)
