"""The LAPACK calls of ``dtorch.linalg``, one graph node each.

Each primitive is an ``autograd.Function`` over tensors: ``forward`` runs
``xp.linalg`` (NumPy, or CuPy on a CUDA tensor: the same names) on the
arrays, and its one ``backward`` is written with differentiable tensor ops
(matmul, the other primitives here), so the same body gives first-order
gradients and, under ``create_graph=True``, records a graph for the second
order. The formulas are PyTorch's (FunctionsManual.cpp), for real dtypes.
Everything else in ``dtorch.linalg`` composes these and the Tensor API.
"""
import numpy as np

from .. import _backend as B
from ..autograd.function import Function

_TORCH_NAMES = {
    "int64": "Long", "int32": "Int", "int16": "Short", "int8": "Char",
    "uint8": "Byte", "bool": "Bool", "float16": "Half",
    "bfloat16": "BFloat16", "float32": "Float", "float64": "Double"}


class LinAlgError(RuntimeError):
    """A matrix the operation cannot handle (singular, not positive
    definite): ``torch.linalg.LinAlgError``, a RuntimeError."""


def check_float(A, name, low=False):
    """PyTorch's dtype errors of the linalg functions: float32/float64
    (and float16/bfloat16 where ``low``)."""
    dt = A._data.dtype
    is_low = dt.itemsize == 2 and (dt.kind == "f" or dt == B.bfloat16.np)
    if dt.kind == "f" and dt.itemsize >= 4 or (low and is_low):
        return
    got = _TORCH_NAMES.get(str(dt), str(dt))
    if is_low:
        raise RuntimeError(f"{name}: Low precision dtypes not supported. "
                           f"Got {got}")
    raise RuntimeError(f"{name}: Expected a floating point or complex "
                       f"tensor as input. Got {got}")


def check_matrix(A, name, square=True, arg="A", low=False):
    check_float(A, name, low)
    if A.ndim < 2:
        raise RuntimeError(f"{name}: The input tensor {arg} must have at "
                           f"least 2 dimensions.")
    if square and A.shape[-1] != A.shape[-2]:
        raise RuntimeError(
            f"{name}: {arg} must be batches of square matrices, but they "
            f"are {A.shape[-2]} by {A.shape[-1]} matrices")


def _wrap(like, a):
    return like._make(a, False, None)


def _host(a):
    return a if isinstance(a, np.ndarray) else a.get()


# ------------------------------------------------------- failure reports --
# LAPACK's ``info`` per batch element, computed on the host only when a
# call failed (NumPy raises) or gave non-finite values (CuPy does not
# raise): the error path, where its cost does not matter.

def _lu_info(a):
    """getrf's info: the 1-based column of the first zero pivot of the LU
    factorisation with partial pivoting, 0 if there is none."""
    a = a.copy()
    n = a.shape[-1]
    info = 0
    for j in range(n):
        p = j + int(np.argmax(abs(a[j:, j])))
        if a[p, j] == 0:
            info = info or j + 1
            continue
        a[[j, p]] = a[[p, j]]
        a[j + 1:, j] /= a[j, j]
        a[j + 1:, j + 1:] -= np.outer(a[j + 1:, j], a[j, j + 1:])
    return info


def _chol_info(a):
    """potrf's info: the order of the first leading minor that is not
    positive definite, 0 if there is none."""
    for k in range(1, a.shape[-1] + 1):
        try:
            np.linalg.cholesky(a[:k, :k])
        except np.linalg.LinAlgError:
            return k
    return 0


def infos(a, per_matrix):
    """``per_matrix`` over the batch of arrays ``a``: int32, batch shape."""
    h = _host(a)
    flat = h.reshape((-1,) + h.shape[-2:])
    out = np.array([per_matrix(m) for m in flat], np.int32)
    return out.reshape(h.shape[:-2])


def raise_info(info, name, text):
    """Raise LinAlgError(``text`` formatted with the info value) for the
    first failed element of ``info`` (an int tensor, batch shape)."""
    info = _host(info._data)
    bad = np.flatnonzero(info.reshape(-1))
    if not bad.size:
        return
    i = int(bad[0])
    pre = f"(Batch element {i}): " if info.ndim else ""
    raise LinAlgError(f"{name}: {pre}{text.format(int(info.reshape(-1)[i]))}")


def _try(fn, a, per_matrix):
    """``fn(a)`` and the info array: on failure (NumPy's LinAlgError, or a
    non-finite result from CuPy) the failed elements are found on the host
    and their results are NaN; the others are computed one by one."""
    xp = B.get_array_module(a)
    try:
        out = fn(a)
        if xp is np or bool(xp.isfinite(out).all()):
            return out, np.zeros(a.shape[:-2], np.int32)
    except np.linalg.LinAlgError:
        out = None
    info = infos(a, per_matrix)
    if out is None:
        out = xp.full(a.shape, np.nan, a.dtype)
        flat_a = a.reshape((-1,) + a.shape[-2:])
        flat_o = out.reshape((-1,) + a.shape[-2:])
        for i, bad in enumerate(info.reshape(-1)):
            if not bad:
                flat_o[i] = fn(flat_a[i])
    return out, info


_SINGULAR = ("The diagonal element {} is zero, the inversion could not be "
             "completed because the input matrix is singular.")
_NOT_PD = ("The factorization could not be completed because the input is "
           "not positive-definite (the leading minor of order {} is not "
           "positive-definite).")


def eye_like(A, n):
    xp = A._xp()
    return _wrap(A, xp.eye(n, dtype=A._data.dtype))


# ------------------------------------------------------------ primitives --

class _WithInfo(Function):
    """xp.linalg.<_lapack>(A) and LAPACK's info (``_info`` per matrix),
    both as tensors; the result is saved for backward."""
    @classmethod
    def forward(cls, ctx, A):
        xp = A._xp()
        out, info = _try(getattr(xp.linalg, cls._lapack), A._data,
                         cls._info)
        out = _wrap(A, out)
        ctx.save_for_backward(out)
        return out, _wrap(A, xp.asarray(info))


class Inv(_WithInfo):
    """A^-1 and getrf's info; gA = -A^-T g A^-T."""
    _lapack, _info = "inv", staticmethod(_lu_info)

    @staticmethod
    def backward(ctx, g, _info):
        inv, = ctx.saved_tensors
        t = inv.mT
        return -(t @ g @ t)


def solve_shapes(A, Bm, name):
    if A.shape[-1] != Bm.shape[-2]:
        raise RuntimeError(
            f"{name}: Incompatible shapes of A and B for the equation AX = B "
            f"({A.shape[-2]}x{A.shape[-1]} and {Bm.shape[-2]}x"
            f"{Bm.shape[-1]})")


class Solve(Function):
    """X = A^-1 B for matrices B (batches broadcast); gB = A^-T g,
    gA = -gB X^T, summed back to the inputs' batch shapes."""
    @staticmethod
    def forward(ctx, A, Bm):
        xp = A._xp()
        batch = np.broadcast_shapes(A.shape[:-2], Bm.shape[:-2])
        a = xp.broadcast_to(A._data, batch + A.shape[-2:])
        b = xp.broadcast_to(Bm._data, batch + Bm.shape[-2:])
        try:
            out = xp.linalg.solve(a, b)
            ok = xp is np or bool(xp.isfinite(out).all())
        except np.linalg.LinAlgError:
            ok = False
        if not ok:
            raise LinAlgError("torch.linalg.solve: The solver failed "
                              "because the input matrix is singular.")
        X = _wrap(A, out)
        ctx.save_for_backward(A, X)
        ctx.shapes = A.shape, Bm.shape
        return X

    @staticmethod
    def backward(ctx, g):
        A, X = ctx.saved_tensors
        sa, sb = ctx.shapes
        gB = Solve.apply(A.mT, g)
        gA = -(gB @ X.mT) if ctx.needs_input_grad[0] else None
        return (None if gA is None else gA.sum_to_size(*sa),
                gB.sum_to_size(*sb))


class SolveTriangular(Function):
    """X = A^-1 B with A upper or lower triangular (unit diagonal if
    ``unit``), left side; the other triangle of A is never read."""
    @staticmethod
    def forward(ctx, A, Bm, upper, unit):
        xp = A._xp()
        batch = np.broadcast_shapes(A.shape[:-2], Bm.shape[:-2])
        n = A.shape[-1]
        a = xp.triu(A._data) if upper else xp.tril(A._data)
        if unit:
            eye = xp.eye(n, dtype=a.dtype)
            a = a * (1 - eye) + eye
        a = xp.broadcast_to(a, batch + (n, n))
        b = xp.broadcast_to(Bm._data, batch + Bm.shape[-2:])
        try:
            out = xp.linalg.solve(a, b)
        except np.linalg.LinAlgError:
            # a zero on the diagonal: LAPACK's trtrs divides by it
            with np.errstate(divide="ignore", invalid="ignore"):
                out = xp.full(batch + Bm.shape[-2:], np.inf, a.dtype) * b
        X = _wrap(A, out)
        ctx.save_for_backward(A, X)
        ctx.args = upper, unit, A.shape, Bm.shape
        return X

    @staticmethod
    def backward(ctx, g):
        A, X = ctx.saved_tensors
        upper, unit, sa, sb = ctx.args
        gB = SolveTriangular.apply(A.mT, g, not upper, unit)
        gA = None
        if ctx.needs_input_grad[0]:
            gA = -(gB @ X.mT)
            k = 1 if unit else 0
            gA = (gA.triu(k) if upper else gA.tril(-k)).sum_to_size(*sa)
        return gA, gB.sum_to_size(*sb), None, None


class Cholesky(_WithInfo):
    """The lower factor L of A = L L^T and potrf's info. PyTorch's
    cholesky_backward: gA = L^-T phi(L^T gL) L^-1, symmetrised, where phi
    keeps the lower triangle and halves the diagonal."""
    _lapack, _info = "cholesky", staticmethod(_chol_info)

    @staticmethod
    def backward(ctx, gL, _info):
        L, = ctx.saved_tensors
        P = L.mT @ gL.tril()
        P = P.tril() - 0.5 * P.diagonal(0, -2, -1).diag_embed()
        U = L.mT
        Y = SolveTriangular.apply(U, P, True, False)      # L^-T P
        gA = SolveTriangular.apply(U, Y.mT, True, False).mT
        return 0.5 * (gA + gA.mT)


class QR(Function):
    """Q, R of A (mode 'reduced' or 'complete'; 'r' gives an empty Q).
    Backward (m >= n, and m < n through the square leading block):
    gA = (gQ + Q copyltu(M)) R^-T with M = gR R^T - Q^T gQ."""
    @staticmethod
    def forward(ctx, A, mode):
        xp = A._xp()
        a = A._data
        if mode == "r":
            r = xp.linalg.qr(a, mode="r")
            q = xp.zeros((0,), a.dtype)
        else:
            q, r = xp.linalg.qr(a, mode=mode)
        Q, R = _wrap(A, q), _wrap(A, r)
        # Q and R only, as torch (A itself may change in place afterwards)
        ctx.save_for_backward(Q, R)
        ctx.mode, ctx.mn = mode, tuple(a.shape[-2:])
        return Q, R

    @staticmethod
    def backward(ctx, gQ, gR):
        Q, R = ctx.saved_tensors
        m, n = ctx.mn
        if ctx.mode == "r":
            raise RuntimeError(
                "The derivative of linalg.qr depends on Q, which is not "
                "computed when mode='r'. Please use linalg.qr(A, "
                "mode='reduced') if you are going to differentiate through "
                "linalg.qr.")
        if ctx.mode == "complete" and m > n:
            raise RuntimeError(
                "The QR decomposition is not differentiable when "
                "mode='complete' and nrows > ncols.")
        if m >= n:
            return _qr_square_backward(Q, R, gQ, gR), None
        # A = [X | Y], R = [U | V]: X = Q U is square, Y = Q V
        U, V = R.narrow(-1, 0, m), R.narrow(-1, m, n - m)
        gU, gV = gR.narrow(-1, 0, m), gR.narrow(-1, m, n - m)
        Y = Q @ V                       # A's last n - m columns
        gX = _qr_square_backward(Q, U, gQ + Y @ gV.mT, gU)
        return _cat_last(gX, Q @ gV), None


def _qr_square_backward(Q, R, gQ, gR):
    M = gR @ R.mT - Q.mT @ gQ
    S = M.triu() + M.triu(1).mT
    X = gQ + Q @ S
    # X R^-T, as (R^-1 X^T)^T
    return SolveTriangular.apply(R, X.mT, True, False).mT


def _cat_last(a, b):
    from ..ops import Cat
    return Cat.apply(a, b, dim=-1)


def _eye_off(L):
    """L_j - L_i as a matrix (i, j) with ones on the diagonal."""
    E = L.unsqueeze(-2) - L.unsqueeze(-1)
    n = L.shape[-1]
    eye = eye_like(L, n)
    return E + eye


class Eigh(Function):
    """Eigenvalues (ascending) and eigenvectors of a symmetric matrix, from
    the ``uplo`` triangle. PyTorch's backward: gA = V (diag(gL) +
    skew(V^T gV) / E) V^T, E_ij = L_j - L_i."""
    @staticmethod
    def forward(ctx, A, uplo):
        xp = A._xp()
        w, v = xp.linalg.eigh(A._data, UPLO=uplo)
        L, V = _wrap(A, w), _wrap(A, v)
        ctx.save_for_backward(L, V)
        return L, V

    @staticmethod
    def backward(ctx, gL, gV):
        L, V = ctx.saved_tensors
        VhgV = V.mT @ gV
        VhgV = 0.5 * (VhgV - VhgV.mT)
        inner = VhgV / _eye_off(L)
        inner = inner - inner.diagonal(0, -2, -1).diag_embed() \
            + gL.diag_embed()
        return V @ inner @ V.mT, None


class SVD(Function):
    """U, S, Vh of A (full_matrices as NumPy's). PyTorch's svd_backward
    on the leading k = min(m, n) singular vectors."""
    @staticmethod
    def forward(ctx, A, full_matrices):
        xp = A._xp()
        a = A._data
        if a.size == 0:
            m, n = a.shape[-2:]
            k = min(m, n)
            ku, kv = (m, n) if full_matrices else (k, k)
            eye = xp.eye
            bt = a.shape[:-2]
            u = xp.broadcast_to(eye(m, ku, dtype=a.dtype), bt + (m, ku))
            v = xp.broadcast_to(eye(kv, n, dtype=a.dtype), bt + (kv, n))
            u, v = u.copy(), v.copy()
            s = xp.zeros(bt + (k,), a.dtype)
        else:
            u, s, v = xp.linalg.svd(a, full_matrices=full_matrices)
        U, S, Vh = _wrap(A, u), _wrap(A, s), _wrap(A, v)
        ctx.save_for_backward(U, S, Vh)
        ctx.shape = A.shape
        return U, S, Vh

    @staticmethod
    def backward(ctx, gU, gS, gVh):
        U, S, Vh = ctx.saved_tensors
        m, n = ctx.shape[-2:]
        k = min(m, n)
        U, gU = U.narrow(-1, 0, k), gU.narrow(-1, 0, k)
        Vh, gVh = Vh.narrow(-2, 0, k), gVh.narrow(-2, 0, k)
        V, gV = Vh.mT, gVh.mT
        S2 = S * S
        E = _eye_off(S2)
        UhgU = U.mT @ gU
        VhgV = V.mT @ gV
        ret = ((UhgU - UhgU.mT) * S.unsqueeze(-2)
               + S.unsqueeze(-1) * (VhgV - VhgV.mT)) / E
        ret = ret - ret.diagonal(0, -2, -1).diag_embed() + gS.diag_embed()
        if m > n:
            gUSinv = gU / S.unsqueeze(-2)
            gA = U @ ret + gUSinv - U @ (U.mT @ gUSinv)
            return gA @ Vh, None
        if m < n:
            SinvgVh = gVh / S.unsqueeze(-1)
            gA = ret @ Vh + SinvgVh - (SinvgVh @ V) @ Vh
            return U @ gA, None
        return U @ ret @ Vh, None


class Pinv(Function):
    """The pseudo-inverse from the SVD (or eigh when ``hermitian``),
    singular values at or below max(atol, rtol * largest) dropped.
    Backward: PyTorch's pinv_backward."""
    @staticmethod
    def forward(ctx, A, atol, rtol, hermitian):
        xp = A._xp()
        a = A._data
        m, n = a.shape[-2:]
        if a.size == 0:
            out = xp.zeros(a.shape[:-2] + (n, m), a.dtype)
        else:
            if hermitian:
                w, v = xp.linalg.eigh(a)
                s, u, vh = abs(w), v * xp.sign(w)[..., None, :], v.swapaxes(
                    -1, -2)
                # sign(0) = 0 zeroes a dropped column only
            else:
                u, s, vh = xp.linalg.svd(a, full_matrices=False)
            smax = s.max(axis=-1, keepdims=True)
            tol = xp.maximum(atol, rtol * smax)
            keep = s > tol
            with np.errstate(divide="ignore"):
                sinv = xp.where(keep, 1 / xp.where(keep, s, 1), 0)
            out = (vh.swapaxes(-1, -2) * sinv[..., None, :]) @ \
                u.swapaxes(-1, -2)
        P = _wrap(A, out.astype(a.dtype, copy=False))
        ctx.save_for_backward(A, P)
        return P

    @staticmethod
    def backward(ctx, g):
        A, P = ctx.saved_tensors
        m, n = A.shape[-2:]
        Ph, gh = P.mT, g.mT
        if m <= n:
            K = gh @ P
            KPh = K @ Ph
            return (-(P @ K).mT + KPh - (A @ P) @ KPh
                    + (Ph @ P) @ (gh - K @ A)), None, None, None
        K = P @ gh
        PhK = Ph @ K
        return (-(K @ P).mT + (gh - A @ K) @ P @ Ph + PhK
                - (PhK @ P) @ A), None, None, None


class Slogdet(Function):
    """sign and log|det| of A; g_logabsdet A^-T. The sign's derivative is
    zero for real A, but as in PyTorch it is an output of the graph (it
    requires grad), so code that differentiates through it runs."""
    @staticmethod
    def forward(ctx, A):
        xp = A._xp()
        s, la = xp.linalg.slogdet(A._data)
        sign, logabs = _wrap(A, xp.asarray(s)), _wrap(A, xp.asarray(la))
        ctx.save_for_backward(A)
        return sign, logabs

    @staticmethod
    def backward(ctx, _gs, g):
        A, = ctx.saved_tensors
        return g.unsqueeze(-1).unsqueeze(-1) * Inv.apply(A)[0].mT


class Det(Function):
    """det(A). Backward g det A^-T where every matrix is invertible, else
    PyTorch's SVD form of the adjugate: det(U) det(Vh) U diag(prod_{j!=i}
    s_j) Vh, which also holds for singular matrices."""
    @staticmethod
    def forward(ctx, A):
        xp = A._xp()
        a = A._data
        d = xp.linalg.det(a) if a.shape[-1] else xp.ones(a.shape[:-2],
                                                        a.dtype)
        D = _wrap(A, xp.asarray(d, a.dtype))
        ctx.save_for_backward(A, D)
        return D

    @staticmethod
    def backward(ctx, g):
        A, D = ctx.saved_tensors
        g2 = g.unsqueeze(-1).unsqueeze(-1)
        if not bool((D._data == 0).any()):
            return g2 * D.unsqueeze(-1).unsqueeze(-1) * Inv.apply(A)[0].mT
        U, S, Vh = SVD.apply(A, False)
        n = S.shape[-1]
        eye = eye_like(S, n)
        others = (S.unsqueeze(-2) * (1 - eye) + eye).prod(-1)
        c = Det.apply(U) * Det.apply(Vh)
        adjT = (U * others.unsqueeze(-2)) @ Vh
        return g2 * c.unsqueeze(-1).unsqueeze(-1) * adjT
