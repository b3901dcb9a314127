"""The compiled CPU kernels (numba), imported only by ``dtorch._kernels``
when numba is installed and enabled; never by ``import dtorch``.

Each kernel fuses what the NumPy path does in several passes over memory
(one temporary per ufunc) into one pass, threaded with ``prange`` over
elements or rows. ``fastmath=False``: no FMA contraction or reassociation,
so element-wise arithmetic rounds as NumPy's does. Scalars arrive already
cast to the arrays' dtype (``dtorch._kernels.scalars``), as NumPy 2 casts a
Python float against a float32 array, so float32 stays float32 throughout.

What is exact and what is not (tests/test_cpu_kernels.py pins both):
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
# (tests/test_cpu_kernels.py checks it against float64 exp over the whole
# range, inf, -inf and NaN). float64 keeps np.exp.

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


@_jit
def softmax_fwd(x, out):
    rows, n = x.shape
    for r in prange(rows):
        mx = _row_max(x, r, n)
        for j in range(n):
            out[r, j] = vexp(x[r, j] - mx)
        s = out.dtype.type(_row_sum(out, r, n))
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
        mx = _row_max(x, r, n)
        for j in range(n):
            out[r, j] = vexp(x[r, j] - mx)
        ls = np.log(out.dtype.type(_row_sum(out, r, n)))
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


# ======================================================== convolution ==
# Copies and scatter-adds of the channels-last convolution
# (dtorch/ops/conv.py): pure data movement, or additions in the NumPy
# path's order, so bit for bit equal to it. Threads split images or image
# rows; each writes its own part of the output.

@_jit
def im2col_nhwc(xpad, out, s0, kh, kw, sh, sw, dh, dw, oh, ow):
    """Columns of images s0.. of a padded (N, Hp, Wp, C) input: out row
    (image, y, x), columns (i, j, C) = xpad[image, y sh + i dh,
    x sw + j dw, :] (the window view reshaped)."""
    c = xpad.shape[3]
    rows = out.shape[0] // (oh * ow)
    for r in prange(rows * oh):
        img = s0 + r // oh
        y = r % oh
        for x in range(ow):
            row = r * ow + x
            for i in range(kh):
                for j in range(kw):
                    src = xpad[img, y * sh + i * dh, x * sw + j * dw]
                    col = (i * kw + j) * c
                    for ch in range(c):
                        out[row, col + ch] = src[ch]


@_jit
def col2im_nhwc(gk, gxp, kh, kw, sh, sw, dh, dw):
    """gxp[image, y sh + i dh, x sw + j dw, :] += gk[(i, j), image, y, x, :]
    for each kernel offset in order (the NumPy path's order of additions
    per element); threads split images."""
    _, n, oh, ow, c = gk.shape
    for img in prange(n):
        for i in range(kh):
            for j in range(kw):
                o = i * kw + j
                for y in range(oh):
                    for x in range(ow):
                        dst = gxp[img, y * sh + i * dh, x * sw + j * dw]
                        src = gk[o, img, y, x]
                        for ch in range(c):
                            dst[ch] += src[ch]


# Winograd F(2x2, 3x3) for the stride-1 3x3 convolution (dtorch/ops/conv.py
# ``_winograd``): 4x4 input tiles d (stride 2) go to V = B^T d B, the
# output-gradient tiles (2x2) to A g A^T, and the products in the
# transformed domain, 2x2 outputs per tile, back by Y = A^T M A; between
# them 16 GEMMs (one per transformed position) replace the 9 of the column
# matrix with 4/9 of the multiplications. The transforms are +, - only,
# per channel in a fixed order (no reductions): the same bits at any
# thread count. Tiles are numbered (image, tile row, tile col); the
# threads split tile rows; the channel loops are innermost and contiguous.

@numba.njit(inline="always")
def _tile_row(r, s0, th):
    """The image and the first input / output row of tile row r (tile
    rows numbered from image s0, th per image)."""
    return s0 + r // th, 2 * (r % th)


@numba.njit(inline="always")
def _wino_tile(src, img, y, x, v, t, c):
    """v[:, t, :] = B^T d B of the 4x4 tile d at (y, x) of src[img]. Row i
    of B^T is d[p_i] + s_i d[q_i] ((p, q, s): (0, 2, -), (1, 2, +),
    (2, 1, -), (1, 3, -)), so entry (i, j) is (d[p_i, p_j] + s_i
    d[q_i, p_j]) + s_j (d[p_i, q_j] + s_i d[q_i, q_j]): multiplying by
    +-1 is exact, so these are the two passes' sums, computed one entry
    at a time over a contiguous channel run (5 streams: vectorised; the
    16 entries in one loop were 12x slower)."""
    one = src.dtype.type(1)
    for i in range(4):
        pi = (0, 1, 2, 1)[i]
        qi = (2, 2, 1, 3)[i]
        si = one if i == 1 else -one
        for j in range(4):
            pj = (0, 1, 2, 1)[j]
            qj = (2, 2, 1, 3)[j]
            sj = one if j == 1 else -one
            a = src[img, y + pi, x + pj]
            b = src[img, y + qi, x + pj]
            e = src[img, y + pi, x + qj]
            d = src[img, y + qi, x + qj]
            o = v[i * 4 + j, t]
            for ch in range(c):
                o[ch] = (a[ch] + si * b[ch]) + sj * (e[ch] + si * d[ch])


@_jit
def wino_in(xpad, v, s0, th, tw):
    """v[(i, j), t, :] = (B^T d B)[i, j] for the 4x4 tile d at rows
    2 ty.., cols 2 tx.. of image s0 + img of xpad (N, Hp, Wp, C). Tiles
    inside xpad go a whole tile row per entry (i, j) (few input channels:
    per tile and entry, 3x slower at C 16); a tile that reaches past Hp or
    Wp (odd output sizes) reads zeros there, through a zeroed copy."""
    _, hp, wp, c = xpad.shape
    rows = v.shape[1] // tw
    one = xpad.dtype.type(1)
    for r in prange(rows):
        img, y = _tile_row(r, s0, th)
        t0 = r * tw
        full = min(tw, (wp - 2) // 2) if y + 4 <= hp else 0
        for i in range(4 if full else 0):
            ra = xpad[img, y + (0, 1, 2, 1)[i]]
            rb = xpad[img, y + (2, 2, 1, 3)[i]]
            si = one if i == 1 else -one
            for j in range(4):
                pj = (0, 1, 2, 1)[j]
                qj = (2, 2, 1, 3)[j]
                sj = one if j == 1 else -one
                o = v[i * 4 + j]
                for tx in range(full):
                    xa = 2 * tx + pj
                    xb = 2 * tx + qj
                    for ch in range(c):
                        o[t0 + tx, ch] = (ra[xa, ch] + si * rb[xa, ch]) \
                            + sj * (ra[xb, ch] + si * rb[xb, ch])
        if full < tw:
            buf = np.zeros((1, 4, 4, c), xpad.dtype)
            for tx in range(full, tw):
                x = 2 * tx
                for i in range(4):
                    for j in range(4):
                        inside = y + i < hp and x + j < wp
                        for ch in range(c):
                            buf[0, i, j, ch] = xpad[img, y + i, x + j, ch] \
                                if inside else xpad.dtype.type(0)
                _wino_tile(buf, 0, 0, 0, v, t0 + tx, c)


@_jit
def wino_out(m, out, bias, has_b, s0, th, tw):
    """out[s0 + img, 2 ty + a, 2 tx + b, :] = (A^T M A)[a, b] (+ bias) for
    the products m (16, T, O); the last tile row / column writes only the
    outputs inside out (N, OH, OW, O)."""
    o = m.shape[2]
    oh, ow = out.shape[1], out.shape[2]
    rows = m.shape[1] // tw
    zero = out.dtype.type(0)
    for r in prange(rows):
        img, y = _tile_row(r, s0, th)
        for tx in range(tw):
            t = r * tw + tx
            x = 2 * tx
            for ch in range(o):
                # A^T M: rows 0 + 1 + 2 and 1 - 2 - 3 of each column
                p0 = m[0, t, ch] + m[4, t, ch] + m[8, t, ch]
                p1 = m[1, t, ch] + m[5, t, ch] + m[9, t, ch]
                p2 = m[2, t, ch] + m[6, t, ch] + m[10, t, ch]
                p3 = m[3, t, ch] + m[7, t, ch] + m[11, t, ch]
                q0 = m[4, t, ch] - m[8, t, ch] - m[12, t, ch]
                q1 = m[5, t, ch] - m[9, t, ch] - m[13, t, ch]
                q2 = m[6, t, ch] - m[10, t, ch] - m[14, t, ch]
                q3 = m[7, t, ch] - m[11, t, ch] - m[15, t, ch]
                bc = bias[ch] if has_b else zero
                out[img, y, x, ch] = p0 + p1 + p2 + bc
                if x + 1 < ow:
                    out[img, y, x + 1, ch] = p1 - p2 - p3 + bc
                if y + 1 < oh:
                    out[img, y + 1, x, ch] = q0 + q1 + q2 + bc
                    if x + 1 < ow:
                        out[img, y + 1, x + 1, ch] = q1 - q2 - q3 + bc


@numba.njit(inline="always")
def _a_row(gm, k, t, ch, u0, u1):
    """Entries k..k+3 of gm[:, t, ch]: (u0, u1) A^T."""
    gm[k, t, ch] = u0
    gm[k + 1, t, ch] = u0 + u1
    gm[k + 2, t, ch] = u0 - u1
    gm[k + 3, t, ch] = -u1


@_jit
def wino_grad_out(g, gm, s0, th, tw):
    """gm[(i, j), t, :] = (A G A^T)[i, j] for the 2x2 tile G of the output
    gradient g (N, OH, OW, O) at 2 ty, 2 tx (zero past OH, OW): the adjoint
    of ``wino_out``."""
    _, oh, ow, o = g.shape
    zero = g.dtype.type(0)
    for r in prange(gm.shape[1] // tw):
        img, y = _tile_row(r, s0, th)
        yr = y + 1 < oh         # the tile's second row is inside g
        for tx in range(tw):
            t = r * tw + tx
            x = 2 * tx
            xr = x + 1 < ow
            for ch in range(o):
                g00 = g[img, y, x, ch]
                g01 = g[img, y, x + 1, ch] if xr else zero
                g10 = g[img, y + 1, x, ch] if yr else zero
                g11 = g[img, y + 1, x + 1, ch] if xr and yr else zero
                # A G: rows g0, g0 + g1, g0 - g1, -g1 of each column,
                # then (.) A^T the same combinations of each row
                _a_row(gm, 0, t, ch, g00, g01)
                _a_row(gm, 4, t, ch, g00 + g10, g01 + g11)
                _a_row(gm, 8, t, ch, g00 - g10, g01 - g11)
                _a_row(gm, 12, t, ch, -g10, -g11)


@numba.njit(inline="always")
def _g3(w0, w1, w2, half):
    """G (w0, w1, w2): the kernel transform of one row or column."""
    return w0, ((w0 + w1) + w2) * half, ((w0 - w1) + w2) * half, w2


@numba.njit(inline="always")
def _gt4(d0, d1, d2, d3, half):
    """G^T (d0, d1, d2, d3): its adjoint."""
    return d0 + (d1 + d2) * half, (d1 - d2) * half, (d1 + d2) * half + d3


@_jit
def wino_weight(w, u):
    """u[(i, j), c, o] = (G w[o, c] G^T)[i, j], G = [[1, 0, 0],
    [1/2, 1/2, 1/2], [1/2, -1/2, 1/2], [0, 0, 1]] (columns first)."""
    o, c = w.shape[0], w.shape[1]
    half = w.dtype.type(0.5)
    # channels outer, outputs inner: u[., ch, :] is written in order
    for ch in prange(c):
        for k in range(o):
            r0 = _g3(w[k, ch, 0, 0], w[k, ch, 0, 1], w[k, ch, 0, 2], half)
            r1 = _g3(w[k, ch, 1, 0], w[k, ch, 1, 1], w[k, ch, 1, 2], half)
            r2 = _g3(w[k, ch, 2, 0], w[k, ch, 2, 1], w[k, ch, 2, 2], half)
            for j in range(4):
                col = _g3(r0[j], r1[j], r2[j], half)
                for i in range(4):
                    u[i * 4 + j, ch, k] = col[i]


@_jit
def wino_weight_grad(du, gw):
    """The adjoint of ``wino_weight``: gw[o, c] = G^T du[:, c, o] G."""
    o, c = gw.shape[0], gw.shape[1]
    half = gw.dtype.type(0.5)
    # channels outer, outputs inner: du[., ch, :] is read in order
    for ch in prange(c):
        for k in range(o):
            r0 = _gt4(du[0, ch, k], du[1, ch, k], du[2, ch, k],
                      du[3, ch, k], half)
            r1 = _gt4(du[4, ch, k], du[5, ch, k], du[6, ch, k],
                      du[7, ch, k], half)
            r2 = _gt4(du[8, ch, k], du[9, ch, k], du[10, ch, k],
                      du[11, ch, k], half)
            r3 = _gt4(du[12, ch, k], du[13, ch, k], du[14, ch, k],
                      du[15, ch, k], half)
            for b in range(3):
                col = _gt4(r0[b], r1[b], r2[b], r3[b], half)
                for a in range(3):
                    gw[k, ch, a, b] = col[a]

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
