"""``dtorch.nn.functional``: PyTorch's functional API, one module per family
in ``dtorch/nn/_functional/`` (as PyTorch's documentation groups them),
every name re-exported here.

Heavy ops call the fused ops of ``dtorch/ops`` (conv,
pooling, softmax, nll, norms, embedding, dropout, GELU), and so do the
activations and losses whose gradient a composition would get wrong at a
kink or under a mask (their own backward, PyTorch's formula); the rest is a
few lines of Tensor code. Argument names, defaults and error texts are
PyTorch's.
"""
from ._functional._common import (  # noqa: F401 (used as F._pair ...)
    _ntuple, _pair, _legacy_reduction)
from ._functional.linear import (  # noqa: F401
    linear, bilinear)
from ._functional.conv import (  # noqa: F401
    conv2d, conv1d, conv_transpose2d, conv_transpose1d, unfold, fold,
    conv3d)
from ._functional.pooling import (  # noqa: F401
    max_pool2d, max_pool1d, avg_pool2d, avg_pool1d, adaptive_avg_pool2d,
    adaptive_avg_pool1d, adaptive_max_pool2d, adaptive_max_pool1d,
    lp_pool2d, lp_pool1d, max_pool3d, avg_pool3d)
from ._functional.activation import (  # noqa: F401
    relu, relu6, hardtanh, leaky_relu, elu, gelu, silu, mish, sigmoid,
    tanh, softplus, logsigmoid, softmax, log_softmax, softmin, hardswish,
    hardsigmoid, glu, prelu, rrelu, selu, celu, threshold, softsign,
    tanhshrink, hardshrink, softshrink, gumbel_softmax, silu_, relu_, elu_,
    leaky_relu_, hardtanh_, threshold_)
from ._functional.dropout import (  # noqa: F401
    dropout, dropout1d, dropout2d, dropout3d, alpha_dropout,
    feature_alpha_dropout)
from ._functional.sparse import (  # noqa: F401
    embedding, one_hot, embedding_bag)
from ._functional.normalization import (  # noqa: F401
    layer_norm, batch_norm, normalize, group_norm, instance_norm,
    local_response_norm)
from ._functional.distance import (  # noqa: F401
    cosine_similarity, pairwise_distance, pdist)
from ._functional.loss import (  # noqa: F401
    mse_loss, l1_loss, smooth_l1_loss, huber_loss, nll_loss, cross_entropy,
    binary_cross_entropy, binary_cross_entropy_with_logits, kl_div,
    margin_ranking_loss, hinge_embedding_loss, soft_margin_loss,
    cosine_embedding_loss, triplet_margin_loss,
    triplet_margin_with_distance_loss, poisson_nll_loss, gaussian_nll_loss,
    multilabel_soft_margin_loss, multi_margin_loss, multilabel_margin_loss,
    ctc_loss)
from ._functional.padding import (  # noqa: F401
    pad)
from ._functional.vision import (  # noqa: F401
    interpolate, upsample, upsample_nearest, upsample_bilinear,
    pixel_shuffle, pixel_unshuffle, channel_shuffle, affine_grid,
    grid_sample)
from ._functional.attention import (  # noqa: F401
    scaled_dot_product_attention, multi_head_attention_forward)
