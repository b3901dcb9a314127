"""The convolution kernels of ``dtorch._kernels._numba`` (which imports
them, so they are reached as ``_numba.<name>``): the channels-last im2col /
col2im copies and the Winograd F(2x2, 3x3) transforms. The same compile
options and exactness rules as ``_numba``'s (its docstring)."""
import numba
import numpy as np
from numba import prange

_jit = numba.njit(parallel=True, cache=True, fastmath=False, nogil=True)


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
