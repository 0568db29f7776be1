"""The tile loops, compiled by numba (loops.py): the conv's (positions along the vectors, or the output channels:
channels), and a dense product's. Their blocks of sums (sums/)
are written by tools/make_tiles.py.

conv computes y[n, m, oy * wo + ox] = act(bias[m] + sum over k of w[m, k] * x[n * xs + offs[k] + p]), act being
scalars.activate's (a code with alpha and beta: an activation, then perhaps a scale and shift), for the output
positions p = oy * rw + ox of images [first, last) and positions [p_first, p_last), in chunks (which the crew's
pieces share, crew.py): runs of tiles, each for one of `groups` groups of channels (groups let a conv of few
positions and many channels use many threads): x holds each image's input laid out so that every tap k of a kernel
reads a contiguous run of positions (ops/direct.py makes that layout with planes.conv_input: padded rows, split
into stride phases), and positions with ox >= wo are the padding columns, computed and dropped.

The sums of one tile, MR output channels x NR positions, are scalars that LLVM keeps in registers and
vectorizes along the positions, over the taps in blocks of KC (so a block's inputs stay in L1 while every
channel's tile uses them); w is packed as [channel block, tap, MR]. dense(...) is the same idea for x @ w with
w packed once in panels of DC columns: a tile is DR rows of x by one panel, vectorized along the columns, over
all of x's columns. The tile shapes follow the vector width (vectors.py). Indices are unsigned: numba tests
signed ones for wrap-around, which keeps LLVM from vectorizing. The blocks of sums (sums/, one
module a tile shape) are written by tools/make_tiles.py and inlined here (LLVM's alwaysinline). numba's disk cache checks only this file for changes:
SUMS is the SHA-256 of those files, which make_tiles.py writes here with them, so that new sums make new loops.
A piece's arrays are views without references (fields.py), as numba's reference counts at every call and view
took a third of a small conv's time; the pieces' scratch arrays come from the caller, which keeps them alive.
"""

from __future__ import annotations

from . import vectors

vectors.wide()  # before numba loads: it fixes the vector width numba compiles for (vectors.py)

import numba  # noqa: E402
import numpy as np  # noqa: E402

from .fields import array1, array2, array3, f32, fields, i64, pieces, share  # noqa: E402
from .sums import tile  # noqa: E402
from .scalars import FAST, activate  # noqa: E402

U = np.uint64
F = np.float32
MR, NR = vectors.conv_tile()
DR, DC = vectors.dense_tile()
_sums = tile("conv", MR, NR)
_dense_sums = tile("dense", DR, DC)
_channel_sums = tile("channels", DR, DC)
#: The SHA-256 of the files of sums/, in make_tiles.TILES's order (tools/make_tiles.py writes them and this).
SUMS = "98a839f20cb31328be63c204ec9ae3908f44202cdd85069ddd386031fd9f5536"
#: The SHA-256 of the modules whose functions the loops here inline (make_tiles.INLINED: scalars.py, fields.py,
#: atomics.py): numba's disk cache checks only this file for changes, so a change there comes with a new stamp here
#: (tools/make_tiles.py writes it).
INLINED = "3b2a267be929e2d6acd0c87283c3fff5366ce7c8c17d34523e6f0fd3e02201b2"
#: Taps a block: a block's inputs and weights stay in L1 (vectors.conv_block).
KC = U(vectors.conv_block())


def conv(args, piece):
    """A piece of the conv for the crew (crew.py): its share of the chunks. Fields x, xs, offs, far, w, bias, y, rw,
    wo, first, last, p_first, p_last, act, alpha, beta, chunks, groups, and the pieces' scratch: sums (a row of a
    tile's sums for each channel block) and spans (its output runs), one of each a piece."""
    a = fields(args, 20)
    x, offs, w, bias, y = array1(a, 0, F), array1(a, 2, U), array3(a, 4, F), array1(a, 5, F), array3(a, 6, F)
    sums, spans = array2(a, 18, F)[piece], array3(a, 19, U)[piece]
    chunks = i64(a, 16)
    for c in range(*share(a, piece, chunks)):
        _conv_chunk(x, U(i64(a, 1)), offs, U(i64(a, 3)), w, bias, y, U(i64(a, 7)), U(i64(a, 8)), U(i64(a, 9)),
                    U(i64(a, 10)), U(i64(a, 11)), U(i64(a, 12)), i64(a, 13), f32(a, 14), f32(a, 15), chunks,
                    i64(a, 17), U(c), sums, spans)


@numba.njit(forceinline=True, nogil=True, cache=True, fastmath=FAST - {"reassoc"}, error_model="numpy",
            boundscheck=False)
def _conv_chunk(x, xs, offs, far, w, bias, y, rw, wo, first, last, p_first, p_last, act, alpha, beta, chunks,
                groups, c, t, seg):
    """Chunk c of conv: run c // groups of the tiles, for group c % groups of the blocks of channels; t holds its
    tile's sums, flat, and seg its output runs."""
    kk = U(offs.shape[0])
    mb = U(w.shape[0])
    m = U(y.shape[1])  # channels
    xn = U(x.shape[0])
    per = (p_last - p_first + U(NR - 1)) // U(NR)  # tiles an image
    total = (last - first) * per
    runs = U(chunks) // U(groups)
    r, q = c // U(groups), c % U(groups)
    b0, b1 = q * mb // U(groups), (q + U(1)) * mb // U(groups)
    for g in range(r * total // runs, (r + U(1)) * total // runs):
        n = first + g // per
        base = n * xs
        p = p_first + (g % per) * U(NR)
        # A last tile that would end past p_last ends there instead, overlapping the one before (it computes
        # some positions twice, the same values) and reading no further than they need; not before p_first,
        # where another piece writes.
        p0 = p_last - U(NR) if p + U(NR) > p_last and p_last >= p_first + U(NR) else p
        safe = base + far + p0 + U(NR) <= xn
        for k0 in range(U(0), kk, KC):
            k1 = min(kk, k0 + KC)
            for i0 in range(b0, b1):
                at = i0 * U(MR * NR)
                if safe:
                    _sums(x, base + p0, offs, k0, k1, w, i0, t, at, bias, i0 * U(MR), k0 == U(0))
                else:  # the last tile of the last image, whose row of NR would read past x
                    if k0 == U(0):
                        for i in range(MR):
                            for j in range(NR):
                                t[at + U(i * NR + j)] = bias[i0 * U(MR) + U(i)]
                    for k in range(k0, k1):
                        q = base + offs[k] + p0
                        for i in range(MR):
                            a = w[i0, k, U(i)]
                            for j in range(NR):
                                if q + U(j) < xn:
                                    t[at + U(i * NR + j)] += a * x[q + U(j)]
        # The tile's positions as runs that each lie in one output row, padding columns and positions past
        # p_last left out: (first position in the tile, first output index, length). One division a run.
        runs_n = 0
        j = U(0)
        while j < U(NR):
            pj = p0 + j
            col = pj % rw
            span = min(U(NR) - j, rw - col)  # to the end of this padded row
            keep = min(span, wo - col) if col < wo else U(0)
            keep = min(keep, p_last - pj) if pj < p_last else U(0)
            if keep > U(0):
                seg[runs_n, 0], seg[runs_n, 1], seg[runs_n, 2] = j, (pj // rw) * wo + col, keep
                runs_n += 1
            j += span
        for i in range(b0 * U(MR), min(m, b1 * U(MR))):
            row = i * U(NR)  # tile i // MR, its row i % MR
            activate(t, row, row + U(NR), act, alpha, beta)
            for k in range(runs_n):
                j0, d, length = seg[k, 0], seg[k, 1], seg[k, 2]
                for j in range(length):
                    y[n, i, d + j] = t[row + j0 + j]


def channels(args, piece):
    """A piece of a conv with the output channels along the vectors: the dense loop's tile (DR output positions
    by a panel of DC output channels, the panel's weights streamed once a tile) over the conv's layout, each
    position's input broadcast from where its taps start. A map of a few positions (10 x 10: 100) fills its tiles
    of DR positions where the tile loop's rows of NR padded positions left a third of them empty. y is flat: output
    position r of channel c at outs[r] + c * plane. The jobs are (panel, block of positions), panel by panel, and
    the pieces share them, so that a piece reads the weights of its panels. Fields x, offs, wp (P, taps, DC: panel
    p holds channels min(p DC, co - DC) on), bias (co, zeros where none), y, pos (each position's start in x),
    outs, plane, act, alpha, beta, and the pieces' scratch: a tile's sums and its positions' starts."""
    a = fields(args, 13)
    x, offs, wp, bias, y = array1(a, 0, F), array1(a, 1, U), array3(a, 2, F), array1(a, 3, F), array1(a, 4, F)
    pos, outs, plane = array1(a, 5, U), array1(a, 6, U), U(i64(a, 7))
    blocks = (U(pos.shape[0]) + U(DR - 1)) // U(DR)
    first, last = share(a, piece, wp.shape[0] * blocks)
    _channel_jobs(x, offs, wp, bias, y, pos, outs, plane, i64(a, 8), f32(a, 9), f32(a, 10), U(first), U(last),
                  array2(a, 11, F)[piece], array2(a, 12, U)[piece])


@numba.njit(forceinline=True, nogil=True, cache=True, fastmath=FAST - {"reassoc"}, error_model="numpy",
            boundscheck=False)
def _channel_jobs(x, offs, wp, bias, y, pos, outs, plane, act, alpha, beta, first, last, t, qs):
    """Jobs [first, last) of channels; t holds a tile's sums, qs its positions' starts. A last block of positions
    overlaps the one before (it computes some positions twice, the same values) and writes only its own; the last
    panel likewise."""
    kk = U(offs.shape[0])
    m = U(pos.shape[0])
    n = U(bias.shape[0])
    blocks = (m + U(DR - 1)) // U(DR)
    flat = wp.reshape(-1)
    for job in range(first, last):
        p, b = job // blocks, job % blocks
        lo = p * U(DC)  # the first channel this panel writes
        n0 = min(lo, n - U(DC))  # the first it computes
        top = b * U(DR)
        m0 = top if top + U(DR) <= m else m - U(DR)
        for i in range(DR):
            qs[i] = pos[m0 + U(i)]
        _channel_sums(x, qs, offs, wp, p, kk, t, bias, n0, flat, p * kk * U(DC))
        activate(t, U(0), U(DR * DC), act, alpha, beta)
        for i in range(DR):
            r = m0 + U(i)
            if r >= top:
                row, d = U(i * DC), outs[r]
                for j in range(lo - n0, U(DC)):
                    y[d + (n0 + j) * plane] = t[row + j]


def dense(args, c):
    """Chunk c of y = act(x @ w + bias) for x (M, K) and the weights packed in panels of DC columns, wp (P, K, DC):
    panel p holds columns c .. c + DC of w, c = min(p DC, N - DC), so the last panel overlaps the one before it
    rather than run past N; it writes only the columns the others leave. An empty bias adds nothing. The pieces are
    the chunks: `cols` runs of panels, each for chunks // cols runs of the blocks of DR rows. A last block of rows
    likewise overlaps the one before (or, with fewer than DR rows in all, reads the last row again) and writes only
    its own rows. Fields x, wp, bias, y, act, alpha, beta, cols, and the pieces' scratch: sums and picks (the rows
    a tile reads), one row of each a chunk."""
    a = fields(args, 10)
    _dense_chunk(array2(a, 0, F), array3(a, 1, F), array1(a, 2, F), array2(a, 3, F), i64(a, 4), f32(a, 5), f32(a, 6), pieces(a),
                 i64(a, 7), U(c), array2(a, 8, F)[c], array2(a, 9, U)[c])


@numba.njit(forceinline=True, nogil=True, cache=True, fastmath=FAST - {"reassoc"}, error_model="numpy",
            boundscheck=False)
def _dense_chunk(x, wp, bias, y, act, alpha, beta, chunks, cols, c, t, rs):
    """Chunk c of dense: run c % cols of the panels, for run c // cols of the blocks of rows; t holds its tile's
    sums and rs the rows it reads."""
    m = U(x.shape[0])
    kk = U(x.shape[1])
    n = U(y.shape[1])
    panels = U(wp.shape[0])
    blocks = (m + U(DR - 1)) // U(DR)
    biased = bias.shape[0] > 0
    runs = U(chunks) // U(cols)
    flat = wp.reshape(-1)
    pc, rc = c % U(cols), c // U(cols)
    for p in range(pc * panels // U(cols), (pc + U(1)) * panels // U(cols)):
        lo = p * U(DC)  # the first column this panel writes
        n0 = min(lo, n - U(DC))  # the first it computes
        for b in range(rc * blocks // runs, (rc + U(1)) * blocks // runs):
            top = b * U(DR)  # the first row this block writes
            m0 = top if top + U(DR) <= m or m < U(DR) else m - U(DR)
            for i in range(DR):
                rs[i] = min(m0 + U(i), m - U(1))
            _dense_sums(x, rs, wp, p, kk, t, bias, n0, biased, flat, p * kk * U(DC))
            for i in range(DR):
                r = m0 + U(i)
                if r >= top and r < m:
                    row = U(i * DC)
                    activate(t, row, row + U(DC), act, alpha, beta)
                    for j in range(lo - n0, U(DC)):
                        y[r, n0 + j] = t[row + j]
