"""The layer classes of ``dtorch.nn``."""
from .module import Module
from .linear import Identity, Linear, Bilinear, LazyLinear
from .conv import (Conv1d, Conv2d, Conv3d, ConvTranspose1d,
                   ConvTranspose2d)
from .pooling import (MaxPool1d, MaxPool2d, AvgPool1d, AvgPool2d,
                      AdaptiveAvgPool1d, AdaptiveAvgPool2d, MaxPool3d,
                      AvgPool3d)
from .activation import (ReLU, ReLU6, LeakyReLU, ELU, Hardtanh, GELU, SiLU,
                         Mish, Sigmoid, Tanh, Softplus, LogSigmoid, Softmax,
                         LogSoftmax, Softmin, MultiheadAttention)
from .dropout import Dropout, Dropout1d, Dropout2d, Dropout3d
from .flatten import Flatten, Unflatten
from .sparse import Embedding
from .normalization import (LayerNorm, BatchNorm1d, BatchNorm2d,
                            BatchNorm3d, GroupNorm)
from .instancenorm import InstanceNorm1d, InstanceNorm2d, InstanceNorm3d
from .padding import (ZeroPad1d, ZeroPad2d, ZeroPad3d, ConstantPad1d,
                      ConstantPad2d, ConstantPad3d, ReflectionPad1d,
                      ReflectionPad2d, ReflectionPad3d, ReplicationPad1d,
                      ReplicationPad2d, ReplicationPad3d, CircularPad1d,
                      CircularPad2d, CircularPad3d)
from .pixelshuffle import PixelShuffle, PixelUnshuffle
from .upsampling import Upsample, UpsamplingNearest2d, UpsamplingBilinear2d
from .distance import CosineSimilarity, PairwiseDistance
from .fold import Fold, Unfold
from ._more import (PReLU, Hardswish, Hardsigmoid, SELU, CELU, Softsign,
                    Tanhshrink, Hardshrink, Softshrink, GLU, RReLU,
                    Threshold, AlphaDropout, FeatureAlphaDropout,
                    ChannelShuffle, AdaptiveMaxPool1d, AdaptiveMaxPool2d,
                    LPPool1d, LPPool2d, LocalResponseNorm, MarginRankingLoss,
                    HingeEmbeddingLoss, SoftMarginLoss, CosineEmbeddingLoss,
                    TripletMarginLoss, TripletMarginWithDistanceLoss,
                    PoissonNLLLoss, GaussianNLLLoss, MultiLabelSoftMarginLoss,
                    MultiMarginLoss, EmbeddingBag, CTCLoss)
from .transformer import (Transformer, TransformerEncoder,
                          TransformerDecoder, TransformerEncoderLayer,
                          TransformerDecoderLayer)
from .container import (Sequential, ModuleList, ModuleDict, ParameterList,
                        ParameterDict)
from .rnn import RNNBase, RNN, LSTM, GRU, RNNCell, LSTMCell, GRUCell
from .loss import (MSELoss, L1Loss, SmoothL1Loss, HuberLoss, NLLLoss,
                   CrossEntropyLoss, BCELoss, BCEWithLogitsLoss, KLDivLoss)
