"""The compiled CPU kernels (numba), imported only by ``dtorch._kernels``
when numba is installed and enabled; never by ``import dtorch``.

Each kernel fuses what the NumPy path does in several passes over memory
(one temporary per ufunc) into one pass, threaded with ``prange`` over
elements or rows. ``fastmath=False``: no FMA contraction or reassociation,
so element-wise arithmetic rounds as NumPy's does. Scalars arrive already
cast to the arrays' dtype (``dtorch._kernels.scalars``), as NumPy 2 casts a
Python float against a float32 array, so float32 stays float32 throughout.

What is exact and what is not (tests/core/test_cpu_kernels.py pins both):
- optimizer updates (+, -, *, /, sqrt, maximum: all correctly rounded, in
  NumPy's order): bit for bit equal to the NumPy path;
- exp / log / erf / tanh come from LLVM/libm instead of NumPy's SIMD loops
  or scipy's cephes (a few ulp apart), and row sums run in one sequential
  float64 accumulator instead of NumPy's pairwise float32 sums: equal to
  float rounding (float32: ~1e-6 relative), NaN/inf where NumPy has them.
``cache=True`` writes the machine code next to this file (__pycache__), so
only the first process on a machine pays the compile time.
"""
import math

import numba
import numpy as np
from llvmlite import ir
from numba import prange
from numba.core import types
from numba.extending import intrinsic, overload

_jit = numba.njit(parallel=True, cache=True, fastmath=False, nogil=True)


# ============================================================ float32 exp ==
# numba's np.exp is a scalar libm call per element: 6x slower than NumPy's
# SIMD exp (12 vs 2 ns per float32 here), which made every exp-heavy kernel
# lose to NumPy on one thread. This exp is plain arithmetic that LLVM
# vectorises: x = n ln2 + r (Cody-Waite, |r| <= ln2/2), e^r by its Taylor
# polynomial to r^7 (truncation < 6e-9 relative), times 2^n built from the
# exponent bits in two halves so that overflow to inf and gradual underflow
# to 0 come out of IEEE multiplication. Within 2 ulp of the exact value
# (tests/core/test_cpu_kernels.py checks it against float64 exp over the
# whole range, inf, -inf and NaN). float64 keeps np.exp.

@intrinsic
def _bits_to_f32(typingctx, i):
    """The float32 whose bits are the low 32 of integer ``i``."""
    if not isinstance(i, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        v = args[0]
        if v.type.width > 32:
            v = builder.trunc(v, ir.IntType(32))
        return builder.bitcast(v, ir.FloatType())
    return types.float32(i), codegen


def vexp(x):
    """e^x; vectorisable for float32 (see above)."""
    return np.exp(x)


@overload(vexp, inline="always")
def _vexp(x):
    if x != types.float32:
        return lambda x: np.exp(x)

    def exp32(x):
        y = x
        if y > np.float32(89.0):
            y = np.float32(89.0)
        if y < np.float32(-104.0):
            y = np.float32(-104.0)
        n = np.floor(y * np.float32(1.44269504) + np.float32(0.5))
        r = y - n * np.float32(0.693359375)
        r = r - n * np.float32(-2.12194440e-4)
        p = np.float32(1.0 / 5040) + r * np.float32(1.0 / 40320)
        p = np.float32(1.0 / 720) + r * p
        p = np.float32(1.0 / 120) + r * p
        p = np.float32(1.0 / 24) + r * p
        p = np.float32(1.0 / 6) + r * p
        p = np.float32(0.5) + r * p
        p = np.float32(1.0) + r * p
        p = np.float32(1.0) + r * p
        k = np.int32(n) if x == x else np.int32(0)
        k1 = k >> 1
        k2 = k - k1
        e = p * _bits_to_f32((k1 + 127) << 23) * _bits_to_f32((k2 + 127) << 23)
        return e if x == x else x
    return exp32


# Element-wise kernels take flat (1-D) views, so one compiled version per
# dtype serves every shape.

# ================================================================ optim ==

@_jit
def adam(x, g, m, v, vmax, c1, b2, c2, bias2_sqrt, eps, step_size, ams):
    """Adam's update of one parameter in place, the NumPy path's order:
    m += (g - m) c1; v = v b2 + (g g) c2; (vmax = max(vmax, v));
    x -= m / (sqrt(v) / bias2_sqrt + eps) * step_size."""
    for i in prange(x.size):
        gi = g[i]
        mi = m[i] + (gi - m[i]) * c1
        m[i] = mi
        vi = v[i] * b2 + (gi * gi) * c2
        v[i] = vi
        if ams:
            w = vmax[i]
            # np.maximum: NaN in either gives NaN
            if w != w or vi != vi:
                w = w + vi
            elif vi > w:
                w = vi
            vmax[i] = w
            vi = w
        x[i] -= mi / (np.sqrt(vi) / bias2_sqrt + eps) * step_size


@_jit
def sgd(x, g, buf, lr, momentum, damp, first, nesterov):
    """SGD in place: buf = g (first) or buf momentum + damp g (damp is
    1 - dampening, 1 means none); x -= lr (g + momentum buf | buf | g)."""
    use_buf = buf.size == x.size
    for i in prange(x.size):
        gi = g[i]
        if use_buf:
            if first:
                b = gi
            elif damp == 1:
                b = buf[i] * momentum + gi
            else:
                b = buf[i] * momentum + damp * gi
            buf[i] = b
            gi = gi + momentum * b if nesterov else b
        x[i] -= lr * gi


# ========================================================= activations ==

@_jit
def gelu_fwd(x, out, cdf, c, half, one):
    """out = x * cdf, cdf = 1/2 (1 + erf(x c)); erf in float64 (as scipy's,
    which computes float32 input in double)."""
    for i in prange(x.size):
        xi = x[i]
        e = x.dtype.type(math.erf(np.float64(xi * c)))
        p = half * (one + e)
        cdf[i] = p
        out[i] = xi * p


@_jit
def gelu_bwd(x, cdf, g, out, half, k):
    """out = g (cdf + x exp(-x x / 2) k), k = 1/sqrt(2 pi)."""
    for i in prange(x.size):
        xi = x[i]
        pdf = vexp(-half * xi * xi) * k
        out[i] = g[i] * (cdf[i] + xi * pdf)


@_jit
def silu_fwd(x, out, one):
    for i in prange(x.size):
        xi = x[i]
        out[i] = xi / (one + vexp(-xi))


@_jit
def silu_bwd(x, g, out, one):
    for i in prange(x.size):
        xi = x[i]
        s = one / (one + vexp(-xi))
        out[i] = g[i] * s * (one + xi * (one - s))


# ====================================================== softmax family ==
# 2-D (rows, C) C-contiguous arrays: the op's axis is the last one. Within
# a row, the exp loop is separate from the sums so that it vectorises (a
# float reduction in the same loop keeps LLVM from it, fastmath off).

@numba.njit(inline="always")
def _row_max(x, r, n):
    """max of row r; NaN if the row has one (NumPy's max). Four running
    maxima: no compare waits on the previous one."""
    m0 = m1 = m2 = m3 = x[r, 0]
    nan = False
    k = n - n % 4
    for j in range(0, k, 4):
        a, b, c, d = x[r, j], x[r, j + 1], x[r, j + 2], x[r, j + 3]
        m0 = a if a > m0 else m0
        m1 = b if b > m1 else m1
        m2 = c if c > m2 else m2
        m3 = d if d > m3 else m3
        nan |= (a != a) | (b != b) | (c != c) | (d != d)
    for j in range(k, n):
        a = x[r, j]
        m0 = a if a > m0 else m0
        nan |= a != a
    m0 = m1 if m1 > m0 else m0
    m2 = m3 if m3 > m2 else m2
    m0 = m2 if m2 > m0 else m0
    return x.dtype.type(np.nan) if nan else m0


@numba.njit(inline="always")
def _row_sum(a, r, n):
    """sum of row r in float64, four independent partial sums (no
    dependency chain through one accumulator)."""
    s0 = s1 = s2 = s3 = 0.0
    m = n - n % 4
    for j in range(0, m, 4):
        s0 += a[r, j]
        s1 += a[r, j + 1]
        s2 += a[r, j + 2]
        s3 += a[r, j + 3]
    for j in range(m, n):
        s0 += a[r, j]
    return (s0 + s1) + (s2 + s3)


@numba.njit(inline="always")
def _row_dot(a, b, r, n):
    s0 = s1 = s2 = s3 = 0.0
    m = n - n % 4
    for j in range(0, m, 4):
        s0 += a[r, j] * b[r, j]
        s1 += a[r, j + 1] * b[r, j + 1]
        s2 += a[r, j + 2] * b[r, j + 2]
        s3 += a[r, j + 3] * b[r, j + 3]
    for j in range(m, n):
        s0 += a[r, j] * b[r, j]
    return (s0 + s1) + (s2 + s3)


@numba.njit(inline="always")
def _row_exp(x, r, n, out):
    """out[r] = exp(x[r] - m), m the row's max: (m, the row's sum in
    out's dtype), softmax's and log_softmax's first two passes."""
    mx = _row_max(x, r, n)
    for j in range(n):
        out[r, j] = vexp(x[r, j] - mx)
    return mx, out.dtype.type(_row_sum(out, r, n))


@_jit
def softmax_fwd(x, out):
    rows, n = x.shape
    for r in prange(rows):
        s = _row_exp(x, r, n, out)[1]
        for j in range(n):
            out[r, j] = out[r, j] / s


@_jit
def softmax_bwd(y, g, out):
    """out = g y - y sum(g y)."""
    rows, n = y.shape
    for r in prange(rows):
        s = out.dtype.type(_row_dot(g, y, r, n))
        for j in range(n):
            out[r, j] = g[r, j] * y[r, j] - y[r, j] * s


@_jit
def log_softmax_fwd(x, out):
    """out = (x - max) - log(sum(exp(x - max)))."""
    rows, n = x.shape
    for r in prange(rows):
        mx, s = _row_exp(x, r, n, out)
        ls = np.log(s)
        for j in range(n):
            out[r, j] = (x[r, j] - mx) - ls


@_jit
def log_softmax_bwd(y, g, out):
    """out = g - exp(y) sum(g)."""
    rows, n = y.shape
    for r in prange(rows):
        s = out.dtype.type(_row_sum(g, r, n))
        for j in range(n):
            out[r, j] = g[r, j] - vexp(y[r, j]) * s


@_jit
def cross_entropy_bwd(logp, coef, t, out):
    """CrossEntropy's gradient: exp(logp) coef[r], minus coef[r] at the
    target column t[r]."""
    rows, n = logp.shape
    for r in prange(rows):
        c = coef[r]
        for j in range(n):
            out[r, j] = vexp(logp[r, j]) * c
        k = t[r]
        out[r, k] = out[r, k] - c


# ========================================================== layer norm ==

@_jit
def layer_norm_fwd(x, w, b, eps, out, xhat, rstd, has_w, has_b):
    """Rows of (rows, n): mean, biased variance of (x - mean) (float64
    sums), rstd = 1 / sqrt(var + eps), xhat = (x - mean) rstd, out =
    xhat w + b."""
    rows, n = x.shape
    one = x.dtype.type(1)
    for r in prange(rows):
        mu = x.dtype.type(_row_sum(x, r, n) / n)
        for j in range(n):
            xhat[r, j] = x[r, j] - mu
        var = x.dtype.type(_row_dot(xhat, xhat, r, n) / n)
        rs = one / np.sqrt(var + eps)
        rstd[r] = rs
        for j in range(n):
            h = xhat[r, j] * rs
            xhat[r, j] = h
            if has_w:
                h = h * w[j]
            if has_b:
                h = h + b[j]
            out[r, j] = h


@_jit
def layer_norm_bwd_x(g, xhat, rstd, w, has_w, out):
    """gx = rstd (gh - mean(gh) - xhat mean(gh xhat)), gh = g w (held in
    ``out`` until the last loop)."""
    rows, n = g.shape
    for r in prange(rows):
        if has_w:
            for j in range(n):
                out[r, j] = g[r, j] * w[j]
            gh = out
        else:
            gh = g
        m1 = out.dtype.type(_row_sum(gh, r, n) / n)
        m2 = out.dtype.type(_row_dot(gh, xhat, r, n) / n)
        rs = rstd[r]
        for j in range(n):
            out[r, j] = rs * (gh[r, j] - m1 - xhat[r, j] * m2)


@_jit
def column_sums(g, xhat, gw, gb):
    """gw = sum over rows of g xhat, gb = sum of g: float64 partial sums
    over 16 fixed row chunks (one per task, no shared accumulators), then
    added in chunk order, so the result does not depend on the thread
    count."""
    rows, n = g.shape
    nch = min(rows, 16)
    pw = np.zeros((nch, n), np.float64)
    pb = np.zeros((nch, n), np.float64)
    for c in prange(nch):
        for r in range(rows * c // nch, rows * (c + 1) // nch):
            for j in range(n):
                gi = g[r, j]
                pw[c, j] += gi * xhat[r, j]
                pb[c, j] += gi
    for j in range(n):
        sw = 0.0
        sb = 0.0
        for c in range(nch):
            sw += pw[c, j]
            sb += pb[c, j]
        gw[j] = sw
        gb[j] = sb


# ========================================================== batch norm ==
# x as (N, C, L) (L: the positions); one thread per channel (prange over
# C), each summing its channel in float64 (four running sums per image
# row, _row_sum: no chain through one accumulator), so the result does not
# depend on the thread count. The sums' order differs from
# NumPy's pairwise float32 ones (float rounding); the element-wise steps
# are the NumPy path's, in its order.

@_jit
def batch_norm_fwd(x, w, b, eps, out, xhat, mean, var, has_w, has_b):
    """mean, biased var per channel (into ``mean``, ``var``); xhat =
    (x - mean) rstd with rstd = 1 / sqrt(var + eps) (the caller computes
    the same rstd from var for backward), out = xhat w + b."""
    n, c, L = x.shape
    one = x.dtype.type(1)
    m = n * L
    for ch in prange(c):
        s = 0.0
        for i in range(n):
            s += _row_sum(x[i], ch, L)
        mu = x.dtype.type(s / m)
        s = 0.0
        for i in range(n):
            for j in range(L):
                xhat[i, ch, j] = x[i, ch, j] - mu
            s += _row_dot(xhat[i], xhat[i], ch, L)
        v = x.dtype.type(s / m)
        mean[ch] = mu
        var[ch] = v
        rs = one / np.sqrt(v + eps)
        wc = w[ch] if has_w else one
        bc = b[ch] if has_b else x.dtype.type(0)
        for i in range(n):
            for j in range(L):
                h = xhat[i, ch, j] * rs
                xhat[i, ch, j] = h
                if has_w:
                    h = h * wc
                if has_b:
                    h = h + bc
                out[i, ch, j] = h


@_jit
def batch_norm_bwd(g, xhat, rstd, w, has_w, need_x, gx, gsum, gxh):
    """gsum = sum g, gxh = sum g xhat per channel; (need_x) gx = scale
    (g - (gsum + xhat gxh) / m), scale = rstd w."""
    n, c, L = g.shape
    m = g.dtype.type(n * L)
    for ch in prange(c):
        s0 = 0.0
        s1 = 0.0
        for i in range(n):
            s0 += _row_sum(g[i], ch, L)
            s1 += _row_dot(g[i], xhat[i], ch, L)
        a = g.dtype.type(s0)
        bb = g.dtype.type(s1)
        gsum[ch] = a
        gxh[ch] = bb
        if need_x:
            sc = rstd[ch] * w[ch] if has_w else rstd[ch]
            for i in range(n):
                for j in range(L):
                    gx[i, ch, j] = sc * (g[i, ch, j]
                                         - (a + xhat[i, ch, j] * bb) / m)


# ====================================================== channel affine ==
# y = x s[c] + t[c] over x as (N, C, L): eval-mode batch norm and group
# norm's weight and bias (dtorch/ops/norm.py ChannelAffine). The product
# and the sum round as NumPy's two broadcast passes do (the same bits);
# threads split the N*C planes. Backward's per-channel sums are float64,
# one thread per channel (batch norm's scheme: the same bits at any
# thread count, another order than NumPy's pairwise sums).

@_jit
def channel_affine(x, s, t, has_s, has_t, out):
    n, c, L = x.shape
    for p in prange(n * c):
        i = p // c
        ch = p - i * c
        sc = s[ch] if has_s else x.dtype.type(1)
        tc = t[ch] if has_t else x.dtype.type(0)
        if has_s and has_t:
            for j in range(L):
                out[i, ch, j] = x[i, ch, j] * sc + tc
        elif has_s:
            for j in range(L):
                out[i, ch, j] = x[i, ch, j] * sc
        elif has_t:
            for j in range(L):
                out[i, ch, j] = x[i, ch, j] + tc
        else:
            for j in range(L):
                out[i, ch, j] = x[i, ch, j]


@_jit
def channel_affine_bwd(g, x, s, has_s, need_x, need_s, gx, gs, gt):
    """gt = sum g, (need_s) gs = sum g x per channel; (need_x) gx = g s."""
    n, c, L = g.shape
    for ch in prange(c):
        s0 = 0.0
        s1 = 0.0
        for i in range(n):
            s0 += _row_sum(g[i], ch, L)
            if need_s:
                s1 += _row_dot(g[i], x[i], ch, L)
        gt[ch] = s0
        gs[ch] = s1
        if need_x:
            sc = s[ch] if has_s else g.dtype.type(1)
            for i in range(n):
                for j in range(L):
                    gx[i, ch, j] = g[i, ch, j] * sc


# ============================================================= pooling ==
# The 2x2 max pool that tiles a contiguous input (dtorch/ops/pool.py's
# ``pairs`` path): x as (R, 2, OW, 2), R = N*C*OH window rows; threads
# split window rows. Comparisons and np.maximum's rule ((a > b or a is
# NaN) ? a : b; b on ties: max(0., -0.) is -0.) as the NumPy path's: the
# same bits.

@numba.njit(inline="always")
def _np_max(a, b):
    return a if (a > b or a != a) else b


@_jit
def max_pool2x2_fwd(x, col, low, best):
    """col[r, t, j]: the right cell of window row t won (greater, or NaN);
    low[r, j]: the lower row won; best[r, j]: the window's maximum."""
    rows, _, ow, _ = x.shape
    for r in prange(rows):
        for j in range(ow):
            a, b = x[r, 0, j, 0], x[r, 0, j, 1]
            col[r, 0, j] = b > a or b != b
            m0 = _np_max(a, b)
            a, b = x[r, 1, j, 0], x[r, 1, j, 1]
            col[r, 1, j] = b > a or b != b
            m1 = _np_max(a, b)
            low[r, j] = m1 > m0 or m1 != m1
            best[r, j] = _np_max(m0, m1)


@_jit
def max_pool2x2_bwd(g, col, low, gx, finite):
    """g (R, OW) to each window's winning cell of gx (R, 2, OW, 2): finite g
    as the NumPy path's products (g low, g - g low, ...), else selects."""
    rows, ow = g.shape
    zero = g.dtype.type(0)
    one = g.dtype.type(1)
    for r in prange(rows):
        for j in range(ow):
            gi = g[r, j]
            if finite:
                g1 = gi * (one if low[r, j] else zero)
                g0 = gi - g1
                for t, gt in ((0, g0), (1, g1)):
                    c1 = gt * (one if col[r, t, j] else zero)
                    gx[r, t, j, 1] = c1
                    gx[r, t, j, 0] = gt - c1
            else:
                lw = low[r, j]
                for t in range(2):
                    gt = gi if (lw == (t == 1)) else zero
                    cw = col[r, t, j]
                    gx[r, t, j, 1] = gt if cw else zero
                    gx[r, t, j, 0] = zero if cw else gt


# Average pool (dtorch/ops/pool.py AvgPool2d) over planes (N*C, H, W) of a
# (padded) input: threads split planes. Forward sums each window in
# (row, column) order in the input's dtype, then divides by div (OH, OW);
# backward adds g / div into each window's cells one kernel offset at a
# time, the NumPy path's order per cell: its bits.

@_jit
def avg_pool_fwd(x, out, div, kh, kw, sh, sw):
    planes, oh, ow = out.shape
    for p in prange(planes):
        for oy in range(oh):
            for ox in range(ow):
                s = x[p, oy * sh, ox * sw]
                for j in range(1, kw):
                    s += x[p, oy * sh, ox * sw + j]
                for i in range(1, kh):
                    for j in range(kw):
                        s += x[p, oy * sh + i, ox * sw + j]
                out[p, oy, ox] = s / div[oy, ox]


@_jit
def avg_pool_bwd(g, div, gx, kh, kw, sh, sw):
    """gx (zero on entry) += g / div at every window's cells, kernel
    offset by offset."""
    planes, oh, ow = g.shape
    for p in prange(planes):
        for i in range(kh):
            for j in range(kw):
                for oy in range(oh):
                    row = gx[p, oy * sh + i]
                    for ox in range(ow):
                        row[ox * sw + j] += g[p, oy, ox] / div[oy, ox]


# ================================================================ relu ==
# Flat views. np.maximum(x, 0)'s rule (x if x > 0 or NaN, else +0) and
# keep_grad's product g * (out > 0 or NaN), so the same bits; backward
# counts the NaN products (the caller then takes keep_grad's where()).

@_jit
def relu_fwd(x, out):
    zero = x.dtype.type(0)
    for i in prange(x.size):
        xi = x[i]
        out[i] = xi if (xi > zero or xi != xi) else zero


@_jit
def relu_bwd(out, g, gx):
    zero = g.dtype.type(0)
    one = g.dtype.type(1)
    nans = 0
    for i in prange(g.size):
        o = out[i]
        r = g[i] * (zero if o <= zero else one)
        gx[i] = r
        if r != r:
            nans += 1
    return nans


# ============================================================= dropout ==

@_jit
def mask_scale(x, keep, scale, out):
    """out = x * keep * scale (keep boolean), the NumPy path's two
    products in its order: the same bits (x * False is a signed 0, inf *
    False NaN, as there)."""
    zero = x.dtype.type(0)
    one = x.dtype.type(1)
    for i in prange(x.size):
        out[i] = (x[i] * (one if keep[i] else zero)) * scale


# ==================================================== embedding backward ==

@_jit
def index_add_rows(idx, src, out):
    """out[idx[i]] += src[i] for rows i in order (out zero on entry; a
    target row starts as its first source row): sequential float sums in
    index order, where NumPy's reduce over each segment may pair them
    (float rounding apart; the same bits at any thread count). Threads
    split the columns in blocks of 64."""
    m, d = src.shape
    nb = (d + 63) // 64
    for blk in prange(nb):
        j0 = blk * 64
        j1 = min(j0 + 64, d)
        fresh = np.ones(out.shape[0], np.bool_)
        for i in range(m):
            r = idx[i]
            if fresh[r]:
                fresh[r] = False
                for j in range(j0, j1):
                    out[r, j] = src[i, j]
            else:
                for j in range(j0, j1):
                    out[r, j] += src[i, j]


# ======================================================= deterministic ==

@_jit
def fixed_point_add(acc, g, scale):
    """acc (float64) += rint(g * scale): deterministic data parallelism's
    rounding of a shard gradient onto its fixed-point grid
    (nn/parallel/_fixed_point.py), the NumPy path's bits in one pass
    instead of three (``scale`` a power of two in the multiply's dtype:
    the product is exact, rint rounds half to even, the add is exact)."""
    for i in prange(g.size):
        acc[i] += np.float64(np.rint(g[i] * scale))


# the convolution kernels live in their own file (this one's size)
from ._numba_conv import (  # noqa: E402,F401
    im2col_nhwc, col2im_nhwc, wino_in, wino_out, wino_grad_out, wino_weight,
    wino_weight_grad)
