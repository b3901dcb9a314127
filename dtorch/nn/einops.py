"""einops' layers as dtorch modules (``einops.layers.torch`` for dtorch):
``Rearrange``, ``Reduce`` and ``EinMix`` (einsum with managed weights),
built from einops' own mixins. Importing this module imports einops::

    from dtorch.nn.einops import Rearrange, EinMix
    patches = nn.Sequential(
        Rearrange("b c (h p1) (w p2) -> b (h w) (p1 p2 c)", p1=4, p2=4),
        nn.Linear(48, 64))
"""
from einops.layers import RearrangeMixin, ReduceMixin
from einops.layers._einmix import _EinmixMixin

from .._creation import zeros
from ..functional import einsum
from .modules.module import Module
from .parameter import Parameter

__all__ = ["Rearrange", "Reduce", "EinMix"]


class Rearrange(RearrangeMixin, Module):
    def forward(self, input):
        return self._apply_recipe(input)


class Reduce(ReduceMixin, Module):
    def forward(self, input):
        return self._apply_recipe(input)


class EinMix(_EinmixMixin, Module):
    def _create_parameters(self, weight_shape, weight_bound, bias_shape,
                           bias_bound):
        self.weight = Parameter(zeros(weight_shape).uniform_(
            -weight_bound, weight_bound))
        self.bias = None if bias_shape is None else Parameter(
            zeros(bias_shape).uniform_(-bias_bound, bias_bound))

    def _create_rearrange_layers(self, pre_reshape_pattern,
                                 pre_reshape_lengths, post_reshape_pattern,
                                 post_reshape_lengths):
        self.pre_rearrange = None if pre_reshape_pattern is None else \
            Rearrange(pre_reshape_pattern, **pre_reshape_lengths)
        self.post_rearrange = None if post_reshape_pattern is None else \
            Rearrange(post_reshape_pattern, **post_reshape_lengths)

    def forward(self, input):
        if self.pre_rearrange is not None:
            input = self.pre_rearrange(input)
        out = einsum(self.einsum_pattern, input, self.weight)
        if self.bias is not None:
            out = out + self.bias
        if self.post_rearrange is not None:
            out = self.post_rearrange(out)
        return out
