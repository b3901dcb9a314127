"""dtorch: PyTorch's API on NumPy (CPU) and CuPy (GPU), built for
distributed training. ``import dtorch as torch`` runs the covered subset of
PyTorch scripts."""
from . import _backend
import os as _os
if _os.environ.get("DTORCH_MALLOC_TUNING", "1") != "0":
    from ._malloc import tune_malloc as _tune_malloc
    _tune_malloc()      # the one process-wide setting dtorch makes
from ._backend import (dtype, device, get_default_dtype, set_default_dtype,
                       promote_types, bool_ as bool, uint8, int8, int16,
                       int32, int64, float16, bfloat16, float32, float64)
from .tensor import Tensor, Size
from .autograd import (no_grad, enable_grad, set_grad_enabled,
                       inference_mode, is_grad_enabled)
from ._creation import (tensor, as_tensor, from_numpy, zeros, ones, empty,
                        full, zeros_like, ones_like, empty_like, full_like,
                        randn, rand, randint, randperm, randn_like,
                        rand_like, randint_like, normal, arange, linspace,
                        logspace, eye, cat, concat, concatenate, stack, where,
                        nonzero)
from .random import (manual_seed, seed, initial_seed, get_rng_state,
                     set_rng_state, Generator, default_generator)
from . import autograd, cuda, ops, return_types

half, float, double = float16, float32, float64
long, int, short = int64, int32, int16
uint8 = uint8

# dtorch.add(x, y), dtorch.exp(x), ...: the Tensor methods as functions
_METHODS = (
    "add sub subtract mul multiply div divide true_divide pow matmul mm bmm "
    "dot neg negative exp log log1p log2 log10 expm1 sqrt rsqrt square abs "
    "absolute reciprocal sin cos tan tanh sigmoid relu clamp clip clamp_min "
    "clamp_max maximum minimum lerp addcmul addcdiv sign floor ceil round "
    "trunc isnan isinf isfinite nan_to_num eq ne lt le gt ge equal allclose "
    "isclose logical_not logical_and logical_or sum mean var std prod cumsum "
    "amax amin argmax argmin all any count_nonzero norm logsumexp softmax "
    "log_softmax reshape flatten unflatten permute transpose swapaxes t "
    "unsqueeze squeeze broadcast_to narrow split chunk unbind flip roll "
    "masked_fill numel clone detach"
).split()


def _make_function(name):
    def fn(input, *args, **kwargs):
        return getattr(input, name)(*args, **kwargs)
    fn.__name__ = name
    fn.__doc__ = f"``dtorch.{name}(input, ...)`` is ``input.{name}(...)``."
    return fn


for _n in _METHODS:
    globals()[_n] = _make_function(_n)


def max(input, *args, **kwargs):
    return input.max(*args, **kwargs)


def min(input, *args, **kwargs):
    return input.min(*args, **kwargs)


def is_tensor(obj):
    return isinstance(obj, Tensor)


def is_floating_point(t):
    return t.is_floating_point()


def numel(t):
    return t.numel()


from ._tensor_methods import (  # noqa: E402
    tril, triu, sort, argsort, msort, topk, kthvalue, median, quantile,
    nanquantile, gather, take_along_dim, take, scatter, scatter_add,
    scatter_reduce, index_select, index_add, index_copy, index_fill,
    index_put, masked_select, masked_scatter, cumprod, cummax, cummin,
    logcumsumexp, diff, diagonal, diag, diag_embed, trace, outer, movedim,
    repeat_interleave, erf, erfc, erfinv, asin, acos, atan, sinh, cosh,
    asinh, acosh, atanh, exp2, frac, sinc, logit, atan2, hypot, xlogy,
    remainder, fmod, floor_divide, float_power, logical_xor, bitwise_and,
    bitwise_or, bitwise_xor, bitwise_not, signbit, heaviside, copysign,
    nansum, nanmean, mv, addmm, baddbmm, addbmm, addmv, tile, unique,
    unique_consecutive, multinomial, bernoulli, lgamma, digamma, mode)
from ._tensor_methods import (  # noqa: E402
    inverse, det, logdet, slogdet, cholesky, cholesky_solve,
    cholesky_inverse, qr, svd, pinverse, matrix_power, matrix_exp)
from . import linalg  # noqa: E402
from . import sparse  # noqa: E402
from .sparse import sparse_coo_tensor, spmm  # noqa: E402
from ._tensor_methods import fmax, fmin, sgn  # noqa: E402
from .tensor import numpy_aliases as _numpy_aliases  # noqa: E402
cat = concat = concatenate = _numpy_aliases(cat)     # axis= for dim=
stack = _numpy_aliases(stack)
for _n in ("cumprod nansum nanmean median mode sort argsort logcumsumexp "
           "cummax cummin").split():
    globals()[_n] = _numpy_aliases(globals()[_n])
from .functional import *  # noqa: F401,F403,E402
from ._settings import *  # noqa: F401,F403,E402
from ._legacy import *  # noqa: F401,F403,E402
arctan2, arcsin, arccos, arctan, moveaxis = atan2, asin, acos, atan, movedim

__version__ = "0.1.0"

from .serialization import save, load
from . import optim, utils
from . import accelerator, backends, multiprocessing, distributions  # noqa
from .utils import checkpoint as _ckpt  # noqa: E402,F401
from . import nn  # noqa: E402
from . import amp, cpu  # noqa: E402
from ._compile import compile  # noqa: E402  (dtorch/_compile)
from . import compiler  # noqa: E402
from .amp import autocast, is_autocast_enabled, get_autocast_dtype  # noqa
from .cuda import amp as _cuda_amp  # noqa: E402,F401  (dtorch.cuda.amp)
from ._einops_hook import install as _einops_install  # noqa: E402
_einops_install()   # einops finds dtorch tensors (dtorch/_einops_hook.py)


def __getattr__(name):
    # torch.distributed is reachable as an attribute after `import torch`;
    # here it loads on first use, so that single-process programs import
    # no distribution code (collectives, process groups)
    if name in ("distributed", "onnx", "ao", "quantization", "profiler"):
        import importlib
        return importlib.import_module("." + name, __name__)
    if name in ("qint8", "quint8", "qint32"):
        import importlib
        return getattr(importlib.import_module(
            ".ao.quantization._dtypes", __name__), name)
    raise AttributeError(f"module 'dtorch' has no attribute {name!r}")
