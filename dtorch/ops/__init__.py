"""dtorch's differentiable ops, forward and backward side by side, one module
per family:

    base         Op, unbroadcast, promote, keep_grad: what every op shares
    arith        + - * / **, maximum/minimum, fmod, lerp, where, clamp
    elementwise  exp/log/sqrt/trig/tanh/sigmoid/relu, special functions
    reduce       sum, prod, amax/amin, norm, max(dim), median
    movement     reshape/permute/expand, cat/stack, pad, copy/cast/to
    index        x[key], x[key] = v, embedding
    matmul       matmul, linear
    einsum       einsum
    selection    tril, sort/topk, gather/scatter, index_*, scans (cum*)
    window       sliding-window views (im2col / col2im) for conv and pool
    conv         conv2d, conv_transpose2d
    pool         max_pool2d, avg_pool2d
    activation   softmax, log_softmax, gelu, the piecewise activations
    norm         layer_norm, batch_norm, dropout
    loss         nll, cross-entropy, the per-element losses
    ctc          CTC loss
    rnn          whole RNN / LSTM / GRU layers
    attention    scaled_dot_product_attention
    recompute    create_graph=True backward by recomputation (rnn layers)

This package is their index: ``dtorch.ops.<Op>`` names every op, which is
how Tensor methods and ``nn.functional`` reach them. Importing it changes
nothing process-wide (the malloc tuning is ``dtorch._malloc``).
"""
from .base import Op, unbroadcast, promote, keep_grad, _device_error, \
    ZeroLink, Binary, Pointwise
from .arith import Add, Sub, Mul, Div, Pow, Maximum, Minimum, Lerp, Mod, \
    Where, Clamp, Hardtanh, ClampT, Step, int_division
from .elementwise import Neg, Exp, Log, Sqrt, StdSqrt, Rsqrt, Abs, \
    Reciprocal, Expm1, Log1p, Sin, Cos, Tanh, Sigmoid, Relu, Asin, Acos, \
    Atan, Sinh, Cosh, Asinh, Acosh, Atanh, Exp2, Erf, Erfc, Erfinv, Frac, \
    Sinc, Logit, Atan2, Hypot, Xlogy, Lgamma, Digamma, NanToNum, Unary
from .reduce import Sum, Prod, Amax, Norm, MaxDim, MedianAll
from .movement import Reshape, Permute, Expand, Cat, stack, Pad, Copy, \
    Cast, ToDevice
from .index import Index, IndexView, SetIndex, Embedding, AddAt, index_add0, \
    _is_basic
from .matmul import MatMul, Linear
from .einsum import Einsum
from .selection import Tril, Select, Gather, Scatter, IndexSelect, \
    IndexAdd, Scan, Cumsum, Cumprod, LogCumSumExp
from .window import _pad2d, _windows
from .conv import Conv2d, ConvTranspose2d, Conv2dWeightGrad
from .pool import MaxPool2d, AvgPool2d, AvgPool2dGrad
from .activation import AlongDim, Softmax, LogSoftmax, Gelu, LeakyRelu, \
    Elu, Hardswish, Hardsigmoid, Shrink, Threshold, PRelu, Softplus, Silu, \
    Mish, LogSigmoid
from .norm import LayerNorm, BatchNorm, ChannelAffine, Dropout
from .loss import NllLoss, CrossEntropy, SoftMargin, MultiMargin, \
    BinaryCrossEntropy, BinaryCrossEntropyWithLogits, SmoothL1, Huber
from .ctc import CTCLoss
from .rnn import Recurrent, RNNLayer, LSTMLayer, GRULayer
from .recompute import Reconnect, Pin
from .attention import ScaledDotProductAttention
from . import _tnp      # noqa: F401  the tensor namespace of backward bodies
