"""Tensor methods by family, below dtorch/tensor.py: each module holds one
family's mixin class, which Tensor inherits (the rule is in tensor.py's
docstring). They import only ops, autograd and the backend, and know Tensor
through autograd's TensorBase protocol, so dtorch/tensor.py imports them
without a circle. This package re-exports the functions that are also
``dtorch.<name>``."""
from .selection import (  # noqa: F401
    tril, triu, tril_, triu_, sort, argsort, msort, topk, kthvalue, median,
    quantile, nanquantile, gather, take_along_dim, take, scatter,
    scatter_add, scatter_, scatter_add_, scatter_reduce, index_select,
    index_add, index_copy, index_fill, index_add_, index_copy_,
    index_fill_, index_put, index_put_, masked_select, masked_scatter,
    unique, unique_consecutive, nonzero, mode, put_)
from .reduce import (  # noqa: F401
    cumprod, cummax, cummin, logcumsumexp, diff)
from .shape import (  # noqa: F401
    diagonal, diag, diag_embed, movedim, repeat_interleave, unfold,
    sum_to_size, H, tile, squeeze_, unsqueeze_, t_, transpose_, is_complex,
    is_pinned, storage_offset, resize_)
from .linalg import (  # noqa: F401
    trace, outer, mv, addmm, baddbmm, addbmm, addmv)
from .linalg import (  # noqa: F401
    inverse, det, logdet, slogdet, cholesky, cholesky_solve,
    cholesky_inverse, qr, svd, pinverse, matrix_power, matrix_exp, cross)
from .maths import (  # noqa: F401
    erf, erfc, erfinv, asin, acos, atan, sinh, cosh, asinh, acosh, atanh,
    exp2, frac, sinc, logit, atan2, arctan2, hypot, xlogy, remainder, fmod,
    floor_divide, float_power, logical_xor, bitwise_and, bitwise_or,
    bitwise_xor, bitwise_not, signbit, heaviside, copysign, nansum,
    nanmean, lgamma, digamma, fmax, fmin, sgn)
from .sampling import (  # noqa: F401
    multinomial, bernoulli, exponential_, geometric_, log_normal_, cauchy_)
