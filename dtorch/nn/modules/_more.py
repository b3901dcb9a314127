"""Activations, losses, pooling and dropout layers added for issue 14 (each
over its ``nn.functional`` counterpart), and every layer that is one
functional call (``_simple``: ELU, Softmax, PixelShuffle, ...). The classes
are re-exported from the PyTorch module paths (``nn.modules.activation``,
``.pixelshuffle``, ``.pooling``, ``.loss``, ...)."""
import inspect

from .module import Module
from .loss import _Loss, _WeightedLoss
from ..parameter import Parameter
from .. import functional as F
from ..._creation import empty


# ============================================================ activations ==

class PReLU(Module):
    """max(0, x) + weight * min(0, x); one weight, or one per channel."""

    def __init__(self, num_parameters=1, init=0.25, device=None, dtype=None):
        super().__init__()
        self.num_parameters = num_parameters
        self.init = init
        self.weight = Parameter(empty(num_parameters, device=device,
                                      dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self):
        self.weight.data.fill_(self.init)

    def forward(self, input):
        return F.prelu(input, self.weight)

    def extra_repr(self):
        return f"num_parameters={self.num_parameters}"


_REQUIRED = inspect.Parameter.empty     # a _simple argument with no default


def _simple(name, fn_name, params=(), doc=""):
    """A parameter-free module that is one call of F.<fn_name> with its
    constructor's arguments ``params`` ((name, default) pairs, in
    PyTorch's order; default _REQUIRED for none), ``inplace`` too, and
    ``training`` where F takes it, as RReLU's random slopes need. Its
    extra_repr shows them all but ``inplace``."""
    names = [p for p, _ in params]
    sig = inspect.Signature(
        [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        + [inspect.Parameter(p, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                             default=v) for p, v in params])

    def __init__(self, *args, **kwargs):
        # bind as a real signature would: a misspelt or extra argument is a
        # TypeError, not an attribute nobody reads
        try:
            bound = sig.bind(self, *args, **kwargs)
        except TypeError as e:
            raise TypeError(f"{name}.__init__(): {e}") from None
        bound.apply_defaults()
        Module.__init__(self)
        for k in names:
            setattr(self, k, bound.arguments[k])
    __init__.__signature__ = sig
    takes_training = "training" in inspect.signature(
        getattr(F, fn_name)).parameters

    def forward(self, input):
        kw = {p: getattr(self, p) for p in names}
        if takes_training:
            kw["training"] = self.training
        return getattr(F, fn_name)(input, **kw)

    def extra_repr(self):
        return ", ".join(f"{p}={getattr(self, p)}" for p, _ in params
                         if p != "inplace")

    return type(name, (Module,), {"__init__": __init__, "forward": forward,
                                  "extra_repr": extra_repr, "__doc__": doc})


Hardswish = _simple("Hardswish", "hardswish", (("inplace", False),))
Hardsigmoid = _simple("Hardsigmoid", "hardsigmoid", (("inplace", False),))
SELU = _simple("SELU", "selu", (("inplace", False),))
CELU = _simple("CELU", "celu", (("alpha", 1.0), ("inplace", False)))
Softsign = _simple("Softsign", "softsign")
Tanhshrink = _simple("Tanhshrink", "tanhshrink")
Hardshrink = _simple("Hardshrink", "hardshrink", (("lambd", 0.5),))
Softshrink = _simple("Softshrink", "softshrink", (("lambd", 0.5),))
GLU = _simple("GLU", "glu", (("dim", -1),))
RReLU = _simple("RReLU", "rrelu", (("lower", 1.0 / 8), ("upper", 1.0 / 3),
                                   ("inplace", False)))
ELU = _simple("ELU", "elu", (("alpha", 1.0), ("inplace", False)))
Hardtanh = _simple("Hardtanh", "hardtanh", (("min_val", -1.0),
                                             ("max_val", 1.0),
                                             ("inplace", False)))
Threshold = _simple("Threshold", "threshold", (("threshold", _REQUIRED),
                                                ("value", _REQUIRED),
                                                ("inplace", False)))
Softplus = _simple("Softplus", "softplus", (("beta", 1.0),
                                             ("threshold", 20.0)))
Softmax = _simple("Softmax", "softmax", (("dim", None),))
LogSoftmax = _simple("LogSoftmax", "log_softmax", (("dim", None),))
Softmin = _simple("Softmin", "softmin", (("dim", None),))
ChannelShuffle = _simple("ChannelShuffle", "channel_shuffle",
                         (("groups", _REQUIRED),))
PixelShuffle = _simple("PixelShuffle", "pixel_shuffle",
                       (("upscale_factor", _REQUIRED),))
PixelUnshuffle = _simple("PixelUnshuffle", "pixel_unshuffle",
                         (("downscale_factor", _REQUIRED),))
AdaptiveAvgPool1d = _simple("AdaptiveAvgPool1d", "adaptive_avg_pool1d",
                            (("output_size", _REQUIRED),))
AdaptiveAvgPool2d = _simple("AdaptiveAvgPool2d", "adaptive_avg_pool2d",
                            (("output_size", _REQUIRED),))


class AlphaDropout(Module):
    def __init__(self, p=0.5, inplace=False):
        super().__init__()
        self.p, self.inplace = p, inplace

    def forward(self, input):
        return F.alpha_dropout(input, self.p, self.training, self.inplace)


class FeatureAlphaDropout(AlphaDropout):
    def forward(self, input):
        return F.feature_alpha_dropout(input, self.p, self.training,
                                       self.inplace)


# ================================================================ pooling ==

class AdaptiveMaxPool2d(Module):
    def __init__(self, output_size, return_indices=False):
        super().__init__()
        self.output_size, self.return_indices = output_size, return_indices

    def forward(self, input):
        return F.adaptive_max_pool2d(input, self.output_size,
                                     self.return_indices)


class AdaptiveMaxPool1d(AdaptiveMaxPool2d):
    def forward(self, input):
        return F.adaptive_max_pool1d(input, self.output_size,
                                     self.return_indices)


class LPPool2d(Module):
    def __init__(self, norm_type, kernel_size, stride=None, ceil_mode=False):
        super().__init__()
        self.norm_type, self.kernel_size = norm_type, kernel_size
        self.stride, self.ceil_mode = stride, ceil_mode

    def forward(self, input):
        return F.lp_pool2d(input, self.norm_type, self.kernel_size,
                           self.stride, self.ceil_mode)


class LPPool1d(LPPool2d):
    def forward(self, input):
        return F.lp_pool1d(input, self.norm_type, self.kernel_size,
                           self.stride, self.ceil_mode)


class LocalResponseNorm(Module):
    def __init__(self, size, alpha=1e-4, beta=0.75, k=1.0):
        super().__init__()
        self.size, self.alpha, self.beta, self.k = size, alpha, beta, k

    def forward(self, input):
        return F.local_response_norm(input, self.size, self.alpha, self.beta,
                                     self.k)


# ================================================================= losses ==

class MarginRankingLoss(_Loss):
    def __init__(self, margin=0.0, size_average=None, reduce=None,
                 reduction="mean"):
        super().__init__(size_average, reduce, reduction)
        self.margin = margin

    def forward(self, input1, input2, target):
        return F.margin_ranking_loss(input1, input2, target, self.margin,
                                     reduction=self.reduction)


class HingeEmbeddingLoss(_Loss):
    def __init__(self, margin=1.0, size_average=None, reduce=None,
                 reduction="mean"):
        super().__init__(size_average, reduce, reduction)
        self.margin = margin

    def forward(self, input, target):
        return F.hinge_embedding_loss(input, target, self.margin,
                                      reduction=self.reduction)


class SoftMarginLoss(_Loss):
    def forward(self, input, target):
        return F.soft_margin_loss(input, target, reduction=self.reduction)


class CosineEmbeddingLoss(_Loss):
    def __init__(self, margin=0.0, size_average=None, reduce=None,
                 reduction="mean"):
        super().__init__(size_average, reduce, reduction)
        self.margin = margin

    def forward(self, input1, input2, target):
        return F.cosine_embedding_loss(input1, input2, target, self.margin,
                                       reduction=self.reduction)


class TripletMarginLoss(_Loss):
    def __init__(self, margin=1.0, p=2.0, eps=1e-6, swap=False,
                 size_average=None, reduce=None, reduction="mean"):
        super().__init__(size_average, reduce, reduction)
        self.margin, self.p, self.eps, self.swap = margin, p, eps, swap

    def forward(self, anchor, positive, negative):
        return F.triplet_margin_loss(anchor, positive, negative, self.margin,
                                     self.p, self.eps, self.swap,
                                     reduction=self.reduction)


class TripletMarginWithDistanceLoss(_Loss):
    def __init__(self, *, distance_function=None, margin=1.0, swap=False,
                 reduction="mean"):
        super().__init__(reduction=reduction)
        self.distance_function = distance_function
        self.margin, self.swap = margin, swap

    def forward(self, anchor, positive, negative):
        return F.triplet_margin_with_distance_loss(
            anchor, positive, negative,
            distance_function=self.distance_function, margin=self.margin,
            swap=self.swap, reduction=self.reduction)


class PoissonNLLLoss(_Loss):
    def __init__(self, log_input=True, full=False, size_average=None,
                 eps=1e-8, reduce=None, reduction="mean"):
        super().__init__(size_average, reduce, reduction)
        self.log_input, self.full, self.eps = log_input, full, eps

    def forward(self, log_input, target):
        return F.poisson_nll_loss(log_input, target, self.log_input,
                                  self.full, eps=self.eps,
                                  reduction=self.reduction)


class GaussianNLLLoss(_Loss):
    def __init__(self, *, full=False, eps=1e-6, reduction="mean"):
        super().__init__(reduction=reduction)
        self.full, self.eps = full, eps

    def forward(self, input, target, var):
        return F.gaussian_nll_loss(input, target, var, self.full, self.eps,
                                   self.reduction)


class MultiLabelSoftMarginLoss(_WeightedLoss):
    def forward(self, input, target):
        return F.multilabel_soft_margin_loss(input, target, self.weight,
                                             reduction=self.reduction)


class MultiMarginLoss(_WeightedLoss):
    def __init__(self, p=1, margin=1.0, weight=None, size_average=None,
                 reduce=None, reduction="mean"):
        super().__init__(weight, size_average, reduce, reduction)
        self.p, self.margin = p, margin

    def forward(self, input, target):
        return F.multi_margin_loss(input, target, self.p, self.margin,
                                   self.weight, reduction=self.reduction)


class EmbeddingBag(Module):
    """Sums, means or maxima of bags of embeddings (``weight``: N(0, 1)
    rows; a ``padding_idx`` row is zero and skipped)."""

    def __init__(self, num_embeddings, embedding_dim, max_norm=None,
                 norm_type=2.0, scale_grad_by_freq=False, mode="mean",
                 sparse=False, _weight=None, include_last_offset=False,
                 padding_idx=None, device=None, dtype=None):
        super().__init__()
        # sparse=True: F.embedding_bag warns that the gradient is dense,
        # as Embedding's does
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.max_norm, self.norm_type = max_norm, norm_type
        self.scale_grad_by_freq = scale_grad_by_freq
        self.mode = mode
        self.sparse = sparse
        self.include_last_offset = include_last_offset
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise AssertionError("padding_idx must be within "
                                     "num_embeddings")
            padding_idx %= num_embeddings
        self.padding_idx = padding_idx
        if _weight is None:
            self.weight = Parameter(empty((num_embeddings, embedding_dim),
                                          device=device, dtype=dtype))
            self.reset_parameters()
        else:
            self.weight = Parameter(_weight)

    def reset_parameters(self):
        self.weight.data.normal_()
        if self.padding_idx is not None:
            self.weight.data[self.padding_idx] = 0.0

    def forward(self, input, offsets=None, per_sample_weights=None):
        return F.embedding_bag(input, self.weight, offsets, self.max_norm,
                               self.norm_type, self.scale_grad_by_freq,
                               self.mode, self.sparse, per_sample_weights,
                               self.include_last_offset, self.padding_idx)

    def extra_repr(self):
        return (f"{self.num_embeddings}, {self.embedding_dim}, "
                f"mode='{self.mode}'")


class CTCLoss(_Loss):
    def __init__(self, blank=0, reduction="mean", zero_infinity=False):
        super().__init__(reduction=reduction)
        self.blank = blank
        self.zero_infinity = zero_infinity

    def forward(self, log_probs, targets, input_lengths, target_lengths):
        return F.ctc_loss(log_probs, targets, input_lengths, target_lengths,
                          self.blank, self.reduction, self.zero_infinity)
