"""The loops numba compiles that go over image planes (loops.py compiles them, as it does its own): the conv tile
loop's input layout, depthwise convs, max pooling, nearest upscales and ConvTranspose's scatter. Each is a plain
loop over float32 rows that LLVM vectorizes, as loops.py's docstring says.
"""

from __future__ import annotations

from . import vectors

vectors.wide()  # before numba loads: it fixes the vector width numba compiles for (vectors.py)

import numba  # noqa: E402
import numpy as np  # noqa: E402

from . import scalars  # noqa: E402
from .scalars import NEG_INF  # noqa: E402
from .fields import array1, array2, array3, array4, f32, fields, i64, share  # noqa: E402

F = np.float32
#: conv_input splits a plane's rows into bands where it has fewer jobs than this for its pieces to share.
JOBS = 64
#: The SHA-256 of the modules whose functions the loops here inline (make_tiles.INLINED: scalars.py, fields.py,
#: atomics.py): numba's disk cache checks only this file for changes, so a change there comes with a new stamp here
#: (tools/make_tiles.py writes it).
INLINED = "3b2a267be929e2d6acd0c87283c3fff5366ce7c8c17d34523e6f0fd3e02201b2"


def conv_input(args, piece):
    """The layout tiles.conv reads, rows [row0, row1) of each plane, for images [first, last) of x (N x c*h*w)
    (pieces of a conv that split its output rows lay out the input rows they read): each channel's input with pt
    rows and pl columns of zeros before it (and zeros after, to hq * s rows and wq * s columns), split into its
    s x s stride phases, phase (a, b) holding rows a, a + s, ... and columns b, b + s, ... as an hq x wq plane.
    Planes follow one another by channel, then a, then b; the rest of each row of xp is zeros. With s = 1 this
    is the zero-padded input, whose taps are then plain shifts. Indices are unsigned, as in tiles.py. Fields x,
    xp, c, h, w, pt, pl, s, hq, wq, first, last, row0, row1.

    A job is one image's channel and row phase, all its column phases, or a band of its rows where that gives
    fewer than JOBS jobs: jobs of whole channels left most threads idle where a conv has few input channels (3 in
    a first conv). The zeros past the last plane are one job more, where row1 is the last row. The pieces share
    the jobs."""
    a = fields(args, 14)
    x, xp = array2(a, 0, F), array2(a, 1, F)
    c, h, w, pt, pl, s, hq, wq = i64(a, 2), i64(a, 3), i64(a, 4), i64(a, 5), i64(a, 6), i64(a, 7), i64(a, 8), i64(a, 9)
    first, last, row0, row1 = i64(a, 10), i64(a, 11), i64(a, 12), i64(a, 13)
    for job in range(*share(a, piece, layout_jobs(c, s, hq, first, last, row0, row1))):  # rows that do not overlap
        _layout_job(x, xp, c, h, w, pt, pl, s, hq, wq, first, last, row0, row1, job)


@numba.njit(inline="always")
def layout_jobs(c, s, hq, first, last, row0, row1):
    """conv_input's jobs: bands of rows of each image's channel and row phase, and the zeros after the planes."""
    bands = max(1, min(row1 - row0, JOBS // max(1, (last - first) * c * s)))
    return (last - first) * c * s * bands + (1 if row1 == hq else 0)


@numba.njit(forceinline=True, nogil=True, cache=True, fastmath=scalars.FAST, error_model="numpy")
def _layout_job(x, xp, c, h, w, pt, pl, s, hq, wq, first, last, row0, row1, job):
    U = np.uint64
    zero = F(0)
    plane = U(hq * wq)
    width = U(wq)
    rows = row1 - row0
    bands = max(1, min(rows, JOBS // max(1, (last - first) * c * s)))
    if job == (last - first) * c * s * bands:  # the zeros past the last plane of each image
        for n in range(first, last):
            pn = xp[n]
            for i in range(U(c * s * s) * plane, U(pn.shape[0])):
                pn[i] = zero
        return
    band, rest = job % bands, job // bands
    a, rest = rest % s, rest // s
    n, ch = first + rest // c, rest % c
    xn, pn = x[n], xp[n]
    for b in range(s):
        dst0 = U(((ch * s + a) * s + b)) * plane
        # columns qx whose input column qx * s + b - pl lies in [0, w)
        lo = min(wq, max(0, (pl - b + s - 1) // s))
        hi = max(lo, min(wq, (w - 1 + pl - b) // s + 1))
        ulo, uhi = U(lo), U(hi)
        for qy in range(row0 + band * rows // bands, row0 + (band + 1) * rows // bands):
            d = dst0 + U(qy) * width
            iy = qy * s + a - pt
            if iy < 0 or iy >= h:
                for qx in range(width):
                    pn[d + qx] = zero
                continue
            src = U(ch * h * w + iy * w + lo * s + b - pl)
            for qx in range(ulo):
                pn[d + qx] = zero
            if s == 1:
                for qx in range(uhi - ulo):
                    pn[d + ulo + qx] = xn[src + qx]
            elif s == 2:  # a constant stride, which LLVM copies faster than a variable one (RESULTS.md, session 35)
                for qx in range(uhi - ulo):
                    pn[d + ulo + qx] = xn[src + qx * U(2)]
            else:
                us = U(s)
                for qx in range(uhi - ulo):
                    pn[d + ulo + qx] = xn[src + qx * us]
            for qx in range(uhi, width):
                pn[d + qx] = zero


def depthwise(args, chunk):
    """A depthwise 2-D conv over planes [first, last) of x (N*C planes of H x W): plane p of y (Ho x Wo) is
    the conv of plane p with w[p % C] (kh x kw; stride sh x sw, padding pt above and pl left, dilation 1)
    plus bias[p % C], then the activation (scalars.activate: act, alpha, beta) on each row as it is made; the
    pieces share the planes. Fields x, w, bias, y, sh, sw, pt, pl, act, alpha, beta, first, last.

    Each plane is first copied between zero columns (its left and right padding), so a kernel tap adds to a
    whole output row with no test in the inner loop, whose indices LLVM can then prove non-negative (numba
    tests every possibly negative index for wrap-around, and that keeps LLVM from vectorizing); kernel rows
    that fall in the top or bottom padding are skipped."""
    a = fields(args, 13)
    x, w, bias, y = array3(a, 0, F), array3(a, 1, F), array1(a, 2, F), array3(a, 3, F)
    sh, sw, pt, pl, act, alpha, beta = i64(a, 4), i64(a, 5), i64(a, 6), i64(a, 7), i64(a, 8), f32(a, 9), f32(a, 10)
    first, last = i64(a, 11), i64(a, 12)
    C, kh, kw = w.shape
    H, W = x.shape[1], x.shape[2]
    Ho, Wo = y.shape[1], y.shape[2]
    Wp = (Wo - 1) * sw + kw
    inner = max(0, min(W, Wp - pl))
    buf = np.zeros((H, Wp), np.float32)  # its padding columns stay zero
    lo, hi = share(a, chunk, last - first)
    for plane in range(first + lo, first + hi):
        c = plane % C
        xp, yp = x[plane], y[plane]
        for r in range(H):
            src, dst = xp[r], buf[r, pl:]  # a view from pl: indices from 0, which vectorize (see below)
            for t in range(inner):
                dst[t] = src[t]
        for oh in range(Ho):
            row = yp[oh]
            b = bias[c]
            for ow in range(Wo):
                row[ow] = b
            for i in range(kh):
                ih = oh * sh - pt + i
                if ih < 0 or ih >= H:
                    continue
                xrow = buf[ih]
                if kw == 3 and sw == 1:  # a kernel row's taps at once: the output row is read and written once
                    w0, w1, w2 = w[c, i, 0], w[c, i, 1], w[c, i, 2]
                    for ow in range(Wo):
                        row[ow] += w0 * xrow[ow] + w1 * xrow[ow + 1] + w2 * xrow[ow + 2]
                elif kw == 5 and sw == 1:
                    w0, w1, w2, w3, w4 = w[c, i, 0], w[c, i, 1], w[c, i, 2], w[c, i, 3], w[c, i, 4]
                    for ow in range(Wo):
                        row[ow] += (w0 * xrow[ow] + w1 * xrow[ow + 1] + w2 * xrow[ow + 2] + w3 * xrow[ow + 3]
                                    + w4 * xrow[ow + 4])
                elif kw == 3 and sw == 2:
                    w0, w1, w2 = w[c, i, 0], w[c, i, 1], w[c, i, 2]
                    for ow in range(Wo):
                        row[ow] += w0 * xrow[2 * ow] + w1 * xrow[2 * ow + 1] + w2 * xrow[2 * ow + 2]
                elif kw == 5 and sw == 2:  # PP-OCRv4's downsampling depthwise convs
                    w0, w1, w2, w3, w4 = w[c, i, 0], w[c, i, 1], w[c, i, 2], w[c, i, 3], w[c, i, 4]
                    for ow in range(Wo):
                        row[ow] += (w0 * xrow[2 * ow] + w1 * xrow[2 * ow + 1] + w2 * xrow[2 * ow + 2]
                                    + w3 * xrow[2 * ow + 3] + w4 * xrow[2 * ow + 4])
                else:
                    for j in range(kw):
                        wv = w[c, i, j]
                        if sw == 1:
                            for ow in range(Wo):
                                row[ow] += wv * xrow[ow + j]
                        elif sw == 2:  # a stride known to LLVM: the loads vectorize
                            for ow in range(Wo):
                                row[ow] += wv * xrow[2 * ow + j]
                        else:
                            for ow in range(Wo):
                                row[ow] += wv * xrow[ow * sw + j]
            scalars.activate(row, 0, Wo, act, alpha, beta)


def max_pool(args, piece):
    """y[p] = the max over each kh x kw window of x[p], stride sh x sw, for the planes of x (P, H, W) into y (P,
    Ho, Wo); the pieces share the planes. With padding (pt rows above, pl columns left, and whatever more the
    windows reach: hp x wp in all), the planes are first copied into a buffer of -inf around them. At stride 1,
    the separable way over runs of planes (_max_flat); else a kernel row's taps go along whole output rows, so
    that each vectorizes. Fields x, y, kh, kw, sh, sw, pt, pl, hp, wp."""
    a = fields(args, 10)
    x, y, kh, kw, sh, sw = array3(a, 0, F), array3(a, 1, F), i64(a, 2), i64(a, 3), i64(a, 4), i64(a, 5)
    pt, pl, hp, wp = i64(a, 6), i64(a, 7), i64(a, 8), i64(a, 9)
    first, end = share(a, piece, x.shape[0])
    if sh == 1 and sw == 1:
        _max_flat(x, y, kh, kw, pt, pl, hp, wp, first, end)
        return
    H, W = x.shape[1], x.shape[2]
    Ho, Wo = y.shape[1], y.shape[2]
    padded = hp != H or wp != W
    buf = np.empty((hp, wp) if padded else (0, 0), np.float32)
    for p in range(first, end):
        xp, yp = x[p], y[p]
        if padded:
            for r in range(hp):
                row = buf[r]
                for c in range(wp):
                    row[c] = NEG_INF
            for r in range(H):
                src, dst = xp[r], buf[pt + r, pl:]
                for c in range(W):
                    dst[c] = src[c]
            xp = buf
        for oh in range(Ho):
            row = yp[oh]
            top = xp[oh * sh]
            for ow in range(Wo):
                row[ow] = top[ow * sw]
            for i in range(kh):
                xr = xp[oh * sh + i]
                for j in range(1 if i == 0 else 0, kw):
                    for ow in range(Wo):
                        row[ow] = max(row[ow], xr[ow * sw + j])


#: _max_flat's runs of planes: about this many floats in each of its two buffers, to stay in L1.
POOL_RUN = 4096


@numba.njit(forceinline=True, nogil=True, cache=True, fastmath=scalars.FAST, error_model="numpy")
def _max_flat(x, y, kh, kw, pt, pl, hp, wp, first, end):
    """Stride-1 max pooling of planes [first, end) of x into y, a run of planes at a time: the run laid out
    padded (hp x wp a plane) as one flat row (or read where it is, without padding), the window's max taken
    along rows, then along columns, each as one pass over the whole run (positions whose window wraps past a
    row or plane are computed and never read): passes as long as the run, which vectorize, where the output
    rows are as short as YOLOv8n's 10 x 10 maps.
    Indices are unsigned, so that no index needs a test for wrapping around (as in tiles.py)."""
    U = np.uint64
    H, W, Ho, Wo = U(x.shape[1]), U(x.shape[2]), U(y.shape[1]), U(y.shape[2])
    hp, wp, pt, pl = U(hp), U(wp), U(pt), U(pl)
    plane = hp * wp
    run = max(U(1), U(POOL_RUN) // plane)
    buf = np.empty(run * plane, np.float32)
    rows = np.empty(run * plane, np.float32)
    src, dst = x.reshape(-1), y.reshape(-1)
    padded = hp != H or wp != W
    for p0 in range(U(first), U(end), run):
        count = min(run, U(end) - p0)
        n = count * plane
        if padded:
            for i in range(n):
                buf[i] = NEG_INF
            for p in range(count):
                for r in range(H):
                    at, fr = (p * hp + pt + r) * wp + pl, ((p0 + p) * H + r) * W
                    for c in range(W):
                        buf[at + c] = src[fr + c]
            _window_max(buf, rows, n - U(kw - 1), kw, U(1))
        else:  # the planes as they are: no window reaches past them
            _window_max(src[p0 * plane:p0 * plane + n], rows, n - U(kw - 1), kw, U(1))
        _window_max(rows, buf, n - U(kh - 1) * wp - U(kw - 1), kh, wp)
        for p in range(count):
            for oh in range(Ho):
                at, to = (p * hp + oh) * wp, ((p0 + p) * Ho + oh) * Wo
                for ow in range(Wo):
                    dst[to + ow] = buf[at + ow]


@numba.njit(inline="always")
def _window_max(src, dst, n, k, step):
    """dst[i] = the max of src[i + t * step] over t < k, for i < n (unsigned n and step). The common windows
    are spelled out: a loop over the taps inside the loop over i kept LLVM from vectorizing it."""
    U = np.uint64
    if k == 2:
        for i in range(n):
            dst[i] = max(src[i], src[i + step])
    elif k == 3:
        s2 = U(2) * step
        for i in range(n):
            dst[i] = max(max(src[i], src[i + step]), src[i + s2])
    elif k == 5:
        s2, s3, s4 = U(2) * step, U(3) * step, U(4) * step
        for i in range(n):
            dst[i] = max(max(max(src[i], src[i + step]), max(src[i + s2], src[i + s3])), src[i + s4])
    else:
        for i in range(n):
            dst[i] = src[i]
        for t in range(U(1), U(k)):
            at = t * step
            for i in range(n):
                dst[i] = max(dst[i], src[i + at])


def upsample(args, piece):
    """y[p, i, j] = x[p, i // fy, j // fx] (+ z[p, i, j] where z has planes: an Add after the upsampling) for
    the planes of x (P, H, W) into y (P, H * fy, W * fx): a nearest upscale by whole factors, the rows of x
    shared by the pieces. Fields x, z, y, fy, fx."""
    f = fields(args, 5)
    x, z, y, fy, fx = array3(f, 0, F), array3(f, 1, F), array3(f, 2, F), i64(f, 3), i64(f, 4)
    H, W = x.shape[1], x.shape[2]
    added = z.shape[0] > 0
    for job in range(*share(f, piece, x.shape[0] * H)):
        p, i = job // H, job % H
        xr = x[p, i]
        for a in range(fy):
            row = y[p, i * fy + a]
            if added:
                zr = z[p, i * fy + a]
                if fx == 2:
                    for j in range(W):
                        row[2 * j] = xr[j] + zr[2 * j]
                        row[2 * j + 1] = xr[j] + zr[2 * j + 1]
                else:
                    for j in range(W):
                        for b in range(fx):
                            row[j * fx + b] = xr[j] + zr[j * fx + b]
            elif fx == 2:
                for j in range(W):
                    row[2 * j] = xr[j]
                    row[2 * j + 1] = xr[j]
            else:
                for j in range(W):
                    for b in range(fx):
                        row[j * fx + b] = xr[j]


def scatter_taps(args, piece):
    """y[p, h * kh + a, w * kw + b] = cols[p, a * kw + b, h, w] for cols (P, kh * kw, H, W) and y (P, H * kh,
    W * kw): the taps of a ConvTranspose whose stride is its kernel put in place (each output element comes from
    one tap), the rows of the input shared by the pieces. Fields cols, y, kh, kw."""
    f = fields(args, 4)
    cols, y, kh, kw = array4(f, 0, F), array3(f, 1, F), i64(f, 2), i64(f, 3)
    P, _, H, W = cols.shape
    for i in range(*share(f, piece, P * H)):
        p, h = i // H, i % H
        for a in range(kh):
            row = y[p, h * kh + a]
            if kw == 2:  # det's upsampling: two taps a row, interleaved
                c0, c1 = cols[p, 2 * a, h], cols[p, 2 * a + 1, h]
                for w in range(W):
                    row[2 * w] = c0[w]
                    row[2 * w + 1] = c1[w]
            else:
                for b in range(kw):
                    c = cols[p, a * kw + b, h]
                    for w in range(W):
                        row[w * kw + b] = c[w]


def winograd_layout(args, piece):
    """Winograd's input channel-last: xt[n, py, px * c + ch] = x[n, ch, py - pt, px - pl], zero outside x, for
    the hp x wp padded positions, so that the transforms read every channel of a position as one run. Fields x
    (N, c, h * w), xt (N, hp, wp * c), h, w, pt, pl. The pieces share the rows."""
    a = fields(args, 6)
    x, xt = array3(a, 0, F), array3(a, 1, F)
    h, w, pt, pl = i64(a, 2), i64(a, 3), i64(a, 4), i64(a, 5)
    c, hp = x.shape[1], xt.shape[1]
    wp = xt.shape[2] // c
    for job in range(*share(a, piece, x.shape[0] * hp)):
        py, n = job % hp, job // hp
        out = xt[n, py]
        iy = py - pt
        if iy < 0 or iy >= h:
            out[:] = F(0)
            continue
        for px in range(wp):
            ix = px - pl
            if ix < 0 or ix >= w:
                out[px * c:(px + 1) * c] = F(0)
            else:
                for ch in range(c):
                    out[px * c + ch] = x[n, ch, iy * w + ix]


def winograd_in(args, piece):
    """Winograd F(4x4, 3x3)'s input tiles transformed (ops/winograd.py has the method and its matrices): for each
    tile (n, ty, tx), numbered (n * th + ty) * tw + tx, BT d BT' of its 6 x 6 positions from (4 ty, 4 tx) of the
    channel-last input xt (winograd_layout), into v[a * 6 + b, tile, :], a run over the channels. Fields xt (N,
    hp, wp * c), v (36, N * th * tw, c), scratch (36 c a piece), th, tw. The pieces share the tiles."""
    a = fields(args, 5)
    xt, v, scratch = array3(a, 0, F), array3(a, 1, F), array2(a, 2, F)
    th, tw = i64(a, 3), i64(a, 4)
    c, tiles = v.shape[2], v.shape[1]
    r, flat = scratch[piece], v.reshape(-1)
    for t in range(*share(a, piece, tiles)):
        tx, ty, n = t % tw, t // tw % th, t // (tw * th)
        # BT down each column of the tile, into r[a * 6 + l], then along its rows; each loop over the channels
        # writes one run (LLVM checks a few runs against each other, not many, before it vectorizes a loop).
        for l in range(6):
            at = (4 * tx + l) * c
            d0, d1, d2 = xt[n, 4 * ty, at:at + c], xt[n, 4 * ty + 1, at:at + c], xt[n, 4 * ty + 2, at:at + c]
            d3, d4, d5 = xt[n, 4 * ty + 3, at:at + c], xt[n, 4 * ty + 4, at:at + c], xt[n, 4 * ty + 5, at:at + c]
            _bt(d0, d1, d2, d3, d4, d5, r, l * c, 6 * c)
        for k in range(6):
            e = r[6 * k * c:6 * (k + 1) * c]
            _bt(e[:c], e[c:2 * c], e[2 * c:3 * c], e[3 * c:4 * c], e[4 * c:5 * c], e[5 * c:], flat,
                (6 * k * tiles + t) * c, tiles * c)


@numba.njit(inline="always")
def _bt(d0, d1, d2, d3, d4, d5, out, at, step):
    """BT (d0 .. d5), over runs of channels, into out[at + a * step:][:len(d0)] for a = 0 .. 5: a loop a row."""
    c = d0.shape[0]
    o = out[at:]
    for ch in range(c):
        o[ch] = F(4) * d0[ch] - F(5) * d2[ch] + d4[ch]
    o = out[at + step:]
    for ch in range(c):
        o[ch] = F(4) * (d1[ch] + d2[ch]) - d3[ch] - d4[ch]
    o = out[at + 2 * step:]
    for ch in range(c):
        o[ch] = F(4) * (d2[ch] - d1[ch]) + d3[ch] - d4[ch]
    o = out[at + 3 * step:]
    for ch in range(c):
        o[ch] = F(2) * (d3[ch] - d1[ch]) + d4[ch] - d2[ch]
    o = out[at + 4 * step:]
    for ch in range(c):
        o[ch] = F(2) * (d1[ch] - d3[ch]) + d4[ch] - d2[ch]
    o = out[at + 5 * step:]
    for ch in range(c):
        o[ch] = F(4) * d1[ch] - F(5) * d3[ch] + d5[ch]


def winograd_out(args, piece):
    """Winograd F(4x4, 3x3)'s output tiles: for each image n and row of tiles ty, AT m AT' of every tile of the
    row plus the bias (an empty bias adds nothing), channel-last in the piece's scratch, activated there
    (scalars.activate), then copied channel by channel into rows 4 ty .. 4 ty + 3 of y, cut at ho rows and wo
    columns. Fields m (36, N * th * tw, co), bias, y (N, co, ho * wo), scratch (24 co + 16 tw co a piece), act,
    alpha, beta, ho, wo, th, tw. The pieces share the rows of tiles."""
    a = fields(args, 11)
    m, bias, y, scratch = array3(a, 0, F), array1(a, 1, F), array3(a, 2, F), array2(a, 3, F)
    act, alpha, beta = i64(a, 4), f32(a, 5), f32(a, 6)
    ho, wo, th, tw = i64(a, 7), i64(a, 8), i64(a, 9), i64(a, 10)
    co = y.shape[1]
    wt = 4 * tw
    s = scratch[piece]
    out = s[24 * co:24 * co + 4 * wt * co]
    none = bias[:0]
    for job in range(*share(a, piece, y.shape[0] * th)):
        ty, n = job % th, job // th
        for tx in range(tw):  # AT down each column of the tile (into s[i * 6 + b]), then along its rows
            t = (n * th + ty) * tw + tx
            for b in range(6):
                _at(m[b, t], m[6 + b, t], m[12 + b, t], m[18 + b, t], m[24 + b, t], m[30 + b, t], none, s, b * co,
                    6 * co)
            for i in range(4):
                q = s[6 * i * co:6 * (i + 1) * co]
                _at(q[:co], q[co:2 * co], q[2 * co:3 * co], q[3 * co:4 * co], q[4 * co:5 * co], q[5 * co:], bias, out,
                    (i * wt + 4 * tx) * co, co)
        rows = min(4, ho - 4 * ty)
        scalars.activate(out, 0, rows * wt * co, act, alpha, beta)
        for ch in range(co):
            for i in range(rows):
                dst = y[n, ch, (4 * ty + i) * wo:(4 * ty + i + 1) * wo]
                for x in range(wo):
                    dst[x] = out[(i * wt + x) * co + ch]


@numba.njit(inline="always")
def _at(m0, m1, m2, m3, m4, m5, bias, out, at, step):
    """AT (m0 .. m5) plus the bias (an empty bias adds nothing), over runs of channels, into out[at + i * step:]
    [:len(m0)] for i = 0 .. 3: a loop a row, as in _bt."""
    c = m0.shape[0]
    o = out[at:]
    for ch in range(c):
        o[ch] = m0[ch] + m1[ch] + m2[ch] + m3[ch] + m4[ch]
    o = out[at + step:]
    for ch in range(c):
        o[ch] = m1[ch] - m2[ch] + F(2) * (m3[ch] - m4[ch])
    o = out[at + 2 * step:]
    for ch in range(c):
        o[ch] = m1[ch] + m2[ch] + F(4) * (m3[ch] + m4[ch])
    o = out[at + 3 * step:]
    for ch in range(c):
        o[ch] = m1[ch] - m2[ch] + F(8) * (m3[ch] - m4[ch]) + m5[ch]
    if bias.shape[0] > 0:
        for i in range(4):
            o = out[at + i * step:]
            for ch in range(c):
                o[ch] += bias[ch]
