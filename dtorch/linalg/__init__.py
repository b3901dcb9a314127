"""``dtorch.linalg``: PyTorch's ``torch.linalg`` on NumPy/CuPy.

The factorisations and solvers are the primitives of ``_lapack`` (one graph
node each, backward written once with tensor ops, so it also serves
``create_graph=True``); norms, products, powers, ``matrix_exp``, ``lstsq``
and the rest are compositions of those and of the Tensor API. Real
float32/float64 inputs, batched over leading dims; errors and named-tuple
results as PyTorch's. Complex dtypes do not exist in dtorch, so ``eig`` and
``eigvals`` raise.

Example::

    A = dtorch.randn(4, 3, 3, dtype=dtorch.float64, requires_grad=True)
    L, Q = dtorch.linalg.eigh(A @ A.mT)
    X = dtorch.linalg.solve(A, dtorch.ones(4, 3, dtype=dtorch.float64))
"""
import math

import numpy as np

from .. import return_types as R
from ..autograd.function import autocast_op
from ..ops import Cat
from ._lapack import (
    LinAlgError, Inv, Solve, SolveTriangular, Cholesky, QR, Eigh, SVD, Pinv,
    Slogdet, Det, check_float, check_matrix, raise_info, solve_shapes,
    eye_like, _SINGULAR, _NOT_PD)

__all__ = [
    "LinAlgError", "vector_norm", "matrix_norm", "norm", "inv", "inv_ex",
    "solve", "solve_ex", "solve_triangular", "det", "slogdet", "cholesky",
    "cholesky_ex", "qr", "svd", "svdvals", "eigh", "eigvalsh", "eig",
    "eigvals", "lstsq", "pinv", "matrix_exp", "matrix_power",
    "matrix_rank", "cond", "cross", "vecdot", "multi_dot", "matmul",
    "diagonal", "vander", "tensorinv", "tensorsolve",
]


# PyTorch's CPU autocast runs these in float32 (its fp32 list: a bfloat16
# input is cast, not refused); elsewhere they run on what they are given
_fp32_on_cpu = autocast_op({"cpu": "fp32"})


# =============================================================== norms ==

def vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):
    """The ``ord``-norm of x over ``dim`` (all elements when None)."""
    if dtype is not None:
        x = x.to(dtype)
    check_float(x, "linalg.vector_norm", low=True)
    ord = float(ord)
    if x.numel() == 0 and ord < 0 or (x.numel() == 0 and ord == math.inf):
        raise RuntimeError(
            f"linalg.vector_norm cannot compute the {_ord_name(ord)} norm on "
            f"an empty tensor because the operation does not have an "
            f"identity")
    return x.norm(ord, dim, keepdim)


def _ord_name(o):
    return {math.inf: "inf", -math.inf: "-inf"}.get(o, f"{o:g}")


def matrix_norm(A, ord="fro", dim=(-2, -1), keepdim=False, *, dtype=None):
    """Frobenius, nuclear, 2 / -2 (largest / smallest singular value),
    1 / -1 and inf / -inf (max / min column / row sums of |A|)."""
    if dtype is not None:
        A = A.to(dtype)
    check_float(A, "linalg.matrix_norm", low=ord == "fro")
    if A.ndim < 2:
        raise RuntimeError("linalg.matrix_norm: The input tensor A must "
                           "have at least 2 dimensions.")
    d0, d1 = (d % A.ndim for d in dim)
    if d0 == d1:
        raise RuntimeError(f"linalg.matrix_norm: dims must be different. Got "
                           f"({dim[0]}, {dim[1]})")
    if ord == "fro":
        return A.norm(2.0, (d0, d1), keepdim)
    if ord in ("nuc", 2, -2):
        S = svdvals(A.movedim((d0, d1), (-2, -1)))
        out = S.sum(-1) if ord == "nuc" else (
            S.amax(-1) if ord == 2 else S.amin(-1))
        if keepdim:
            for d in sorted((d0, d1)):
                out = out.unsqueeze(d)
        return out
    if ord not in (1, -1, math.inf, -math.inf):
        raise RuntimeError(f"linalg.matrix_norm: Order {ord} not supported.")
    # 1: max over columns of the column sums; inf: over rows
    sum_d, ext_d = (d0, d1) if ord in (1, -1) else (d1, d0)
    s = A.abs().sum(sum_d, keepdim=True)
    out = s.amax(ext_d, keepdim=True) if ord > 0 else \
        s.amin(ext_d, keepdim=True)
    return out if keepdim else out.squeeze((d0, d1))


def norm(A, ord=None, dim=None, keepdim=False, *, dtype=None):
    """``vector_norm`` over one dim (or all when ord is None), else
    ``matrix_norm`` over two."""
    if isinstance(dim, int):
        dim = (dim,)
    if dim is None:
        if ord is None:
            return vector_norm(A, 2, None, keepdim, dtype=dtype)
        if A.ndim not in (1, 2):
            raise RuntimeError(
                f"linalg.norm: If dim is not specified but ord is, the "
                f"input must be 1D or 2D. Got {A.ndim}D.")
        dim = tuple(range(A.ndim))
    if len(dim) == 1:
        return vector_norm(A, 2 if ord is None else ord, dim, keepdim,
                           dtype=dtype)
    if len(dim) == 2:
        return matrix_norm(A, "fro" if ord is None else ord, dim, keepdim,
                           dtype=dtype)
    raise RuntimeError(f"linalg.norm: If dim is specified, it must be of "
                       f"length 1 or 2. Got {list(dim)}")


# ====================================================== inverse, solve ==

@_fp32_on_cpu
def inv_ex(A, *, check_errors=False):
    """(inverse, info): info is getrf's (0, or the 1-based index of the
    first zero pivot), the inverse NaN where info != 0."""
    check_matrix(A, "linalg.inv_ex")
    out, info = Inv.apply(A)
    if check_errors:
        raise_info(info, "linalg.inv_ex", _SINGULAR)
    return R.linalg_inv_ex(out, info)


@_fp32_on_cpu
def inv(A):
    check_matrix(A, "linalg.inv")
    out, info = Inv.apply(A)
    raise_info(info, "linalg.inv", _SINGULAR)
    return out


def _as_matrix_rhs(A, B):
    """PyTorch's rule: B is a batch of vectors when it is 1-D, or has one
    dim less than A with A's batch shape."""
    return B.ndim == 1 or (B.ndim == A.ndim - 1
                           and tuple(B.shape) == tuple(A.shape[:-1]))


@_fp32_on_cpu
def solve(A, B, *, left=True):
    """X with A X = B (``left=False``: X A = B)."""
    check_matrix(A, "linalg.solve")
    check_float(B, "linalg.solve")
    if not left:
        return solve(A.mT, B.mT).mT
    vec = _as_matrix_rhs(A, B)
    Bm = B.unsqueeze(-1) if vec else B
    solve_shapes(A, Bm, "linalg.solve")
    X = Solve.apply(A, Bm)
    return X.squeeze(-1) if vec else X


def solve_ex(A, B, *, left=True, check_errors=False):
    """(result, info); a singular A raises (dtorch computes no partial
    solution)."""
    X = solve(A, B, left=left)
    batch = X.shape[:-1] if _as_matrix_rhs(A, B) else X.shape[:-2]
    return R.linalg_solve_ex(X, _zeros(A, batch, np.int32))


def _zeros(like, shape, dt):
    return like._make(like._xp().zeros(tuple(shape), dt), False, None)


def solve_triangular(A, B, *, upper, left=True, unitriangular=False):
    """X with A X = B for triangular A (only its ``upper`` or lower
    triangle is read)."""
    name = "linalg.solve_triangular"
    check_matrix(A, name)
    check_float(B, name)
    if B.ndim < 2:
        raise RuntimeError(f"{name}: The input tensor B must have at least "
                           f"2 dimensions.")
    if not left:
        return SolveTriangular.apply(A.mT, B.mT, not upper,
                                     unitriangular).mT
    solve_shapes(A, B, name)
    return SolveTriangular.apply(A, B, bool(upper), bool(unitriangular))


# ======================================================== determinants ==

def det(A):
    check_matrix(A, "linalg.det")
    return Det.apply(A)


def slogdet(A):
    """(sign, logabsdet) of det(A)."""
    check_matrix(A, "linalg.slogdet")
    return R.linalg_slogdet(*Slogdet.apply(A))


def logdet(A):
    """log det(A): NaN for a negative determinant, -inf for zero
    (``torch.logdet``)."""
    check_matrix(A, "logdet")
    sign, la = Slogdet.apply(A)
    return la.masked_fill(sign < 0, math.nan)


# ====================================================== factorisations ==

@_fp32_on_cpu
def cholesky_ex(A, *, upper=False, check_errors=False):
    """(L, info): info is potrf's (0, or the order of the first leading
    minor that is not positive definite), L NaN where info != 0."""
    check_matrix(A, "linalg.cholesky")
    L, info = Cholesky.apply(A)
    if check_errors:
        raise_info(info, "linalg.cholesky_ex", _NOT_PD)
    return R.linalg_cholesky_ex(L.mT if upper else L, info)


@_fp32_on_cpu
def cholesky(A, *, upper=False):
    """L with A = L L^T (``upper``: U with A = U^T U)."""
    check_matrix(A, "linalg.cholesky")
    L, info = Cholesky.apply(A)
    raise_info(info, "linalg.cholesky", _NOT_PD)
    return L.mT if upper else L


@_fp32_on_cpu
def qr(A, mode="reduced"):
    """(Q, R) with A = Q R; mode 'reduced', 'complete' or 'r' (Q empty)."""
    if mode not in ("reduced", "complete", "r"):
        raise RuntimeError(
            f"qr received unrecognized mode '{mode}' but expected one of "
            f"'reduced' (default), 'r', or 'complete'")
    check_matrix(A, "linalg.qr", square=False)
    return R.linalg_qr(*QR.apply(A, mode))


def _check_driver(A, driver):
    if driver is not None and not A.is_cuda:
        raise RuntimeError(
            "torch.linalg.svd: keyword argument `driver=` is only supported "
            "on CUDA inputs with cuSOLVER backend.")


@_fp32_on_cpu
def svd(A, full_matrices=True, *, driver=None):
    """(U, S, Vh) with A = U diag(S) Vh, S descending."""
    check_matrix(A, "linalg.svd", square=False)
    _check_driver(A, driver)
    return R.linalg_svd(*SVD.apply(A, bool(full_matrices)))


@_fp32_on_cpu
def svdvals(A, *, driver=None):
    check_matrix(A, "linalg.svdvals", square=False)
    _check_driver(A, driver)
    return SVD.apply(A, False)[1]


def _check_uplo(UPLO):
    if UPLO not in ("L", "U"):
        raise RuntimeError(f"Expected UPLO argument to be 'L' or 'U', but "
                           f"got {UPLO}")


@_fp32_on_cpu
def eigh(A, UPLO="L"):
    """(eigenvalues ascending, eigenvectors) of symmetric A, read from its
    ``UPLO`` triangle."""
    _check_uplo(UPLO)
    check_matrix(A, "linalg.eigh")
    return R.linalg_eigh(*Eigh.apply(A, UPLO))


@_fp32_on_cpu
def eigvalsh(A, UPLO="L"):
    _check_uplo(UPLO)
    check_matrix(A, "linalg.eigvalsh")
    return Eigh.apply(A, UPLO)[0]


def eig(A):
    raise NotImplementedError(
        "linalg.eig returns complex tensors, and dtorch has no complex "
        "dtypes; for a symmetric matrix use linalg.eigh")


def eigvals(A):
    raise NotImplementedError(
        "linalg.eigvals returns complex tensors, and dtorch has no complex "
        "dtypes; for a symmetric matrix use linalg.eigvalsh")


# ================================================ pseudo-inverse, rank ==

def _tolerances(A, atol, rtol, name):
    """PyTorch's defaults: rtol = eps * max(m, n) unless an atol > 0 is
    given without rtol."""
    def num(t):
        return None if t is None else float(t)
    atol, rtol = num(atol), num(rtol)
    if rtol is None:
        rtol = 0.0 if atol is not None and atol > 0 else \
            float(np.finfo(A._data.dtype).eps) * max(A.shape[-2:])
    return atol or 0.0, rtol


def pinv(A, *, atol=None, rtol=None, hermitian=False):
    """The Moore-Penrose pseudo-inverse: singular values at or below
    max(atol, rtol * largest) count as zero."""
    check_matrix(A, "linalg.pinv", square=False)
    atol, rtol = _tolerances(A, atol, rtol, "linalg.pinv")
    return Pinv.apply(A, atol, rtol, bool(hermitian))


@_fp32_on_cpu
def matrix_rank(A, tol=None, hermitian=False, *, atol=None, rtol=None):
    """How many singular values exceed max(atol, rtol * largest)
    (int64)."""
    check_matrix(A, "linalg.matrix_rank", square=False)
    if tol is not None:
        atol, rtol = tol, 0.0
    atol, rtol = _tolerances(A, atol, rtol, "linalg.matrix_rank")
    if hermitian:
        S = Eigh.apply(A, "L")[0].abs()
    else:
        S = SVD.apply(A, False)[1]
    S = S.detach()
    if S.shape[-1] == 0:
        return S.sum(-1).long()
    smax = S.amax(-1, keepdim=True)
    tol_t = (smax * rtol).clamp_min(atol)
    return (S > tol_t).sum(-1)


@_fp32_on_cpu
def lstsq(A, B, rcond=None, *, driver=None):
    """(solution, residuals, rank, singular_values) of min ||A X - B||,
    as PyTorch's drivers report them: 'gelsy' (the CPU default) gives the
    rank, 'gelsd'/'gelss' also the singular values, and every driver but
    'gelsy' the residuals when m > n and A has full rank; 'gels' (the CUDA
    default) gives neither. The solution is pinv(A) B (the minimum-norm
    solution), differentiable in A and B."""
    check_matrix(A, "linalg.lstsq", square=False)
    check_float(B, "linalg.lstsq")
    if driver is None:
        driver = "gels" if A.is_cuda else "gelsy"
    if driver not in ("gels", "gelsy", "gelsd", "gelss"):
        raise RuntimeError(
            f"torch.linalg.lstsq: parameter `driver` should be one of "
            f"(gels, gelsy, gelsd, gelss)")
    vec = B.ndim == A.ndim - 1
    Bm = B.unsqueeze(-1) if vec else B
    if A.shape[-2] != Bm.shape[-2]:
        raise RuntimeError(
            f"torch.linalg.lstsq: input.size(-2) should match other.size(-2)"
            f" (got {A.shape[-2]} and {Bm.shape[-2]})")
    m, n = A.shape[-2:]
    if rcond is None:
        rcond = float(np.finfo(A._data.dtype).eps) * max(m, n)
    X = Pinv.apply(A, 0.0, float(rcond), False) @ Bm
    empty = A.new_zeros((0,))
    rank = matrix_rank(A, rtol=rcond) if driver != "gels" else \
        _zeros(A, (0,), np.int64)
    # PyTorch's singular values here carry no gradient
    sv = svdvals(A).detach() if driver in ("gelsd", "gelss") else empty
    res = empty
    if driver != "gelsy" and m > n and bool(
            (matrix_rank(A, rtol=rcond) == n).all()):
        res = ((A @ X - Bm) ** 2).sum(-2)
    return R.linalg_lstsq(X.squeeze(-1) if vec else X, res, rank, sv)


@_fp32_on_cpu
def cond(A, p=None):
    """The condition number in norm p (None or 2: by singular values)."""
    check_matrix(A, "linalg.cond", square=p not in (None, 2, -2))
    if p in (None, 2, -2):
        S = svdvals(A)
        big, small = S.amax(-1), S.amin(-1)
        return big / small if p != -2 else small / big
    return matrix_norm(A, p) * matrix_norm(inv(A), p)


# ================================================ tensor inverse, solve ==

def _prod(shape):
    return int(np.prod(shape, dtype=np.int64))


def tensorinv(A, ind=2):
    """The inverse of A seen as a matrix of its first ``ind`` dims by the
    rest, shaped A.shape[ind:] + A.shape[:ind]."""
    if ind <= 0:
        raise RuntimeError(f"Expected a strictly positive integer for "
                           f"'ind', but got {ind}")
    rows, cols = tuple(A.shape[:ind]), tuple(A.shape[ind:])
    if _prod(rows) != _prod(cols):
        raise RuntimeError(
            f"Expected self to satisfy the requirement prod(self.shape[ind:])"
            f" == prod(self.shape[:ind]), but got {_prod(cols)} != "
            f"{_prod(rows)}")
    return inv(A.reshape(_prod(rows), _prod(cols))).reshape(cols + rows)


def tensorsolve(A, B, dims=None):
    """X with tensordot(A, X, X.ndim) = B (``dims``: A's dims to move to
    the end first)."""
    if dims is not None:
        dims = [d % A.ndim for d in dims]
        A = A.movedim(dims, list(range(A.ndim - len(dims), A.ndim)))
    rest = tuple(A.shape[B.ndim:])
    n = B.numel()
    if _prod(rest) != n:        # PyTorch's text (it compares with B)
        raise RuntimeError(
            f"Expected self to satisfy the requirement "
            f"prod(self.shape[other.ndim:]) == prod(self.shape[:other.ndim])"
            f", but got {_prod(rest)} != {n}")
    X = solve(A.reshape(n, _prod(rest)), B.reshape(-1))
    return X.reshape(rest)


# =========================================== powers and the exponential ==

def matrix_power(A, n):
    """A^n by repeated squaring; A^0 is the identity, A^-n = inv(A)^n."""
    if A.ndim < 2 or A.shape[-1] != A.shape[-2]:
        raise RuntimeError(
            f"linalg.matrix_power: A must be batches of square matrices, "
            f"but they are {' by '.join(map(str, A.shape[-2:]))} matrices")
    if n < 0:
        A, n = inv(A), -n
    if n == 0:
        eye = A._xp().eye(A.shape[-1], dtype=A._data.dtype)
        return A._make(A._xp().broadcast_to(eye, A.shape).copy(), False,
                       None)
    out, base = None, A
    while n:
        if n & 1:
            out = base if out is None else out @ base
        n >>= 1
        if n:
            base = base @ base
    return out


@autocast_op({"cpu": "none", "cuda": "none"})   # torch's is one kernel
def matrix_exp(A):
    """exp(A) by scaling and squaring: A / 2^s has a 1-norm at most 1/4,
    where the Taylor series of degree 12 (Horner's form) is exact to
    ~2e-18 relative; then s squarings. All matmuls, so the gradient (and
    the second one) is that of the same composition."""
    check_matrix(A, "linalg.matrix_exp", low=True)   # as torch
    n = A.shape[-1]
    if A.numel() == 0:
        return A.clone()
    nrm = float(A.detach().abs().sum(-2).amax().item())
    s = 0
    if math.isfinite(nrm) and nrm > 0.25:
        s = int(math.ceil(math.log2(nrm / 0.25)))
    X = A / float(2 ** s) if s else A
    eye = eye_like(A, n)
    E = eye
    for k in range(12, 0, -1):
        E = eye + (X @ E) / float(k)
    for _ in range(s):
        E = E @ E
    return E


# ============================================================ products ==

def cross(input, other, *, dim=-1):
    """The cross product of 3-vectors along ``dim`` (broadcasting)."""
    if input.ndim != other.ndim:
        raise RuntimeError("linalg.cross: inputs must have the same number "
                           "of dimensions.")
    nd = input.ndim
    if not -nd <= dim < nd:
        raise IndexError(f"Dimension out of range (expected to be in range "
                         f"of [{-nd}, {nd - 1}], but got {dim})")
    d = dim - nd if dim >= 0 else dim
    na, nb = input.shape[d], other.shape[d]
    if na != 3 or nb != 3:
        raise RuntimeError(f"linalg.cross: inputs dimension {dim} must have "
                           f"length 3. Got {na} and {nb}")
    # c_i = a_{i+1} b_{i+2} - a_{i+2} b_{i+1}, with indices mod 3
    return input.roll(-1, d) * other.roll(-2, d) - \
        input.roll(-2, d) * other.roll(-1, d)


def vecdot(x, y, *, dim=-1):
    """sum(x * y) over ``dim`` (broadcasting)."""
    return (x * y).sum(dim)


def matmul(input, other):
    return input @ other


def multi_dot(tensors):
    """A chain of matrix products in the cheapest order (the classic
    dynamic programme over the chain's shapes); the first and last may be
    vectors."""
    n = len(tensors)
    if n < 2:
        raise RuntimeError(f"multi_dot(): expected at least 2 tensors but "
                           f"got {n}")
    first, last = tensors[0], tensors[-1]
    if first.ndim not in (1, 2):
        raise RuntimeError(f"multi_dot(): the first tensor must be 1D or 2D "
                           f"but got {first.ndim}D")
    if last.ndim not in (1, 2):
        raise RuntimeError(f"multi_dot(): the last tensor must be 1D or 2D "
                           f"but got {last.ndim}D")
    for i, t in enumerate(tensors[1:-1], 1):
        if t.ndim != 2:
            raise RuntimeError(f"multi_dot(): tensor {i} must be 2D but got "
                               f"{t.ndim}D")
    mats = list(tensors)
    if first.ndim == 1:
        mats[0] = first.unsqueeze(0)
    if last.ndim == 1:
        mats[-1] = last.unsqueeze(-1)
    for i in range(n - 1):
        if mats[i].shape[1] != mats[i + 1].shape[0]:
            a, b = mats[i].shape, mats[i + 1].shape
            raise RuntimeError(
                f"multi_dot(): tensors {i} and {i + 1} with shapes "
                f"{list(a)} and {list(b)} cannot be multiplied")
    dims = [mats[0].shape[0]] + [m.shape[1] for m in mats]
    cost = [[0] * n for _ in range(n)]
    split = [[0] * n for _ in range(n)]
    for length in range(1, n):
        for i in range(n - length):
            j = i + length
            cost[i][j] = math.inf
            for k in range(i, j):
                c = cost[i][k] + cost[k + 1][j] + \
                    dims[i] * dims[k + 1] * dims[j + 1]
                if c < cost[i][j]:
                    cost[i][j], split[i][j] = c, k

    def chain(i, j):
        if i == j:
            return mats[i]
        k = split[i][j]
        return chain(i, k) @ chain(k + 1, j)
    out = chain(0, n - 1)
    if first.ndim == 1:
        out = out.squeeze(0)
    if last.ndim == 1:
        out = out.squeeze(-1)
    return out


def diagonal(A, *, offset=0, dim1=-2, dim2=-1):
    return A.diagonal(offset, dim1, dim2)


def vander(x, *, N=None):
    """Columns x^0, x^1, ..., x^(N-1) (increasing powers), as a running
    product so that the gradient at x = 0 is finite."""
    if x.ndim < 1:
        raise RuntimeError("linalg.vander: x must have at least one "
                           "dimension.")
    N = x.shape[-1] if N is None else N
    if N < 1:
        raise RuntimeError("N must be greater than 1.")
    ones = x.new_ones(tuple(x.shape) + (1,))
    if N == 1:
        return ones
    reps = x.unsqueeze(-1).expand(*x.shape, N - 1)
    return Cat.apply(ones, reps, dim=-1).cumprod(-1)

