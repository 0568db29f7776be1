"""The conv's tile loop, compiled by numba (loops.py); its block of sums is written by tools/make_tiles.py.

conv(x, ...) computes y[n, m, oy * wo + ox] = act(bias[m] + sum over k of w[m, k] * x[n * xs + offs[k] + p])
for the output positions p = oy * rw + ox of images [first, last) and positions [p_first, p_last), in `chunks`
pieces: runs of tiles, each for one of `groups` groups of channels (the threads of numba's parallel loops share
them, in the parallel build; groups let a conv of few positions and many channels use many threads): x holds
each image's input laid out so that every tap k of a kernel reads a contiguous run of positions (ops/direct.py
makes that layout with loops.conv_input: padded rows, split into stride phases), and positions with ox >= wo
are the padding columns, computed and dropped.

The sums of one tile, 6 output channels x 16 positions, are scalars that LLVM keeps in registers and
vectorizes along the positions, over the taps in blocks of KC (so a block's inputs stay in L1 while every
channel's tile uses them); w is packed as [channel block, tap, 6]. Indices are unsigned: numba tests signed
ones for wrap-around, which keeps LLVM from vectorizing. The block of sums (_sums, below the marker) is written
by tools/make_tiles.py and inlined here by numba; it stays in this file because numba's disk cache checks only
the file of the function it caches for changes.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import prange

from .scalars import activate

U = np.uint64
F = np.float32
MR, NR = 6, 16
#: Taps a block: a block's inputs (16 positions a tap) and weights stay in L1.
KC = U(128)


def conv(x, xs, offs, far, w, bias, y, rw, wo, first, last, p_first, p_last, act, alpha, beta, chunks, groups):
    kk = U(offs.shape[0])
    mb = U(w.shape[0])
    m = U(y.shape[1])  # channels
    xn = U(x.shape[0])
    per = (p_last - p_first + U(NR - 1)) // U(NR)  # tiles an image
    total = (last - first) * per
    runs = U(chunks) // U(groups)
    for c in prange(chunks):  # in parallel where compiled so (loops.py), else one after another
        # chunk c: run c // groups of the tiles, for group c % groups of the blocks of channels
        r, q = U(c) // U(groups), U(c) % U(groups)
        b0, b1 = q * mb // U(groups), (q + U(1)) * mb // U(groups)
        t = np.empty((mb, MR, NR), np.float32)
        dest = np.empty(NR, np.int64)
        for g in range(r * total // runs, (r + U(1)) * total // runs):
            n = first + g // per
            base = n * xs
            yn = y[n]
            p = p_first + (g % per) * U(NR)
            # A last tile that would end past p_last ends there instead, overlapping the one before (it computes
            # some positions twice, the same values) and reading no further than they need; not before p_first,
            # where another piece writes.
            p0 = p_last - U(NR) if p + U(NR) > p_last and p_last >= p_first + U(NR) else p
            safe = base + far + p0 + U(NR) <= xn
            for k0 in range(U(0), kk, KC):
                k1 = min(kk, k0 + KC)
                for i0 in range(b0, b1):
                    ti = t[i0]
                    wi = w[i0]
                    if safe:
                        _sums(x, base + p0, offs, k0, k1, wi, ti, bias, i0 * U(MR), k0 == U(0))
                    else:  # the last tile of the last image, whose row of 16 would read past x
                        if k0 == U(0):
                            for i in range(MR):
                                for j in range(NR):
                                    ti[i, j] = bias[i0 * U(MR) + U(i)]
                        for k in range(k0, k1):
                            q = base + offs[k] + p0
                            for i in range(MR):
                                a = wi[k, U(i)]
                                for j in range(NR):
                                    if q + U(j) < xn:
                                        ti[i, j] += a * x[q + U(j)]
            full = p0 + U(NR) <= p_last and (rw == wo or p0 % rw + U(NR) <= wo)
            d0 = (p0 // rw) * wo + p0 % rw
            if not full:
                for j in range(NR):
                    p = p0 + U(j)
                    c = p % rw
                    if c < wo and p < p_last:
                        dest[j] = (p // rw) * wo + c
                    else:
                        dest[j] = -1
            for i in range(b0 * U(MR), min(m, b1 * U(MR))):
                tr = t[i // U(MR), i % U(MR)]
                activate(tr, act, alpha, beta)
                yr = yn[i]
                if full:
                    for j in range(NR):
                        yr[d0 + U(j)] = tr[j]
                else:
                    for j in range(NR):
                        d = dest[j]
                        if d >= 0:
                            yr[d] = tr[j]


# Written by tools/make_tiles.py from here to the end of the file: edit that, not this.
@numba.njit(inline="always")
def _sums(x, q0, offs, k0, k1, wi, ti, bias, c0, fresh):
    if fresh:
        s0_0 = bias[c0 + U(0)]
        s0_1 = bias[c0 + U(0)]
        s0_2 = bias[c0 + U(0)]
        s0_3 = bias[c0 + U(0)]
        s0_4 = bias[c0 + U(0)]
        s0_5 = bias[c0 + U(0)]
        s0_6 = bias[c0 + U(0)]
        s0_7 = bias[c0 + U(0)]
        s0_8 = bias[c0 + U(0)]
        s0_9 = bias[c0 + U(0)]
        s0_10 = bias[c0 + U(0)]
        s0_11 = bias[c0 + U(0)]
        s0_12 = bias[c0 + U(0)]
        s0_13 = bias[c0 + U(0)]
        s0_14 = bias[c0 + U(0)]
        s0_15 = bias[c0 + U(0)]
        s1_0 = bias[c0 + U(1)]
        s1_1 = bias[c0 + U(1)]
        s1_2 = bias[c0 + U(1)]
        s1_3 = bias[c0 + U(1)]
        s1_4 = bias[c0 + U(1)]
        s1_5 = bias[c0 + U(1)]
        s1_6 = bias[c0 + U(1)]
        s1_7 = bias[c0 + U(1)]
        s1_8 = bias[c0 + U(1)]
        s1_9 = bias[c0 + U(1)]
        s1_10 = bias[c0 + U(1)]
        s1_11 = bias[c0 + U(1)]
        s1_12 = bias[c0 + U(1)]
        s1_13 = bias[c0 + U(1)]
        s1_14 = bias[c0 + U(1)]
        s1_15 = bias[c0 + U(1)]
        s2_0 = bias[c0 + U(2)]
        s2_1 = bias[c0 + U(2)]
        s2_2 = bias[c0 + U(2)]
        s2_3 = bias[c0 + U(2)]
        s2_4 = bias[c0 + U(2)]
        s2_5 = bias[c0 + U(2)]
        s2_6 = bias[c0 + U(2)]
        s2_7 = bias[c0 + U(2)]
        s2_8 = bias[c0 + U(2)]
        s2_9 = bias[c0 + U(2)]
        s2_10 = bias[c0 + U(2)]
        s2_11 = bias[c0 + U(2)]
        s2_12 = bias[c0 + U(2)]
        s2_13 = bias[c0 + U(2)]
        s2_14 = bias[c0 + U(2)]
        s2_15 = bias[c0 + U(2)]
        s3_0 = bias[c0 + U(3)]
        s3_1 = bias[c0 + U(3)]
        s3_2 = bias[c0 + U(3)]
        s3_3 = bias[c0 + U(3)]
        s3_4 = bias[c0 + U(3)]
        s3_5 = bias[c0 + U(3)]
        s3_6 = bias[c0 + U(3)]
        s3_7 = bias[c0 + U(3)]
        s3_8 = bias[c0 + U(3)]
        s3_9 = bias[c0 + U(3)]
        s3_10 = bias[c0 + U(3)]
        s3_11 = bias[c0 + U(3)]
        s3_12 = bias[c0 + U(3)]
        s3_13 = bias[c0 + U(3)]
        s3_14 = bias[c0 + U(3)]
        s3_15 = bias[c0 + U(3)]
        s4_0 = bias[c0 + U(4)]
        s4_1 = bias[c0 + U(4)]
        s4_2 = bias[c0 + U(4)]
        s4_3 = bias[c0 + U(4)]
        s4_4 = bias[c0 + U(4)]
        s4_5 = bias[c0 + U(4)]
        s4_6 = bias[c0 + U(4)]
        s4_7 = bias[c0 + U(4)]
        s4_8 = bias[c0 + U(4)]
        s4_9 = bias[c0 + U(4)]
        s4_10 = bias[c0 + U(4)]
        s4_11 = bias[c0 + U(4)]
        s4_12 = bias[c0 + U(4)]
        s4_13 = bias[c0 + U(4)]
        s4_14 = bias[c0 + U(4)]
        s4_15 = bias[c0 + U(4)]
        s5_0 = bias[c0 + U(5)]
        s5_1 = bias[c0 + U(5)]
        s5_2 = bias[c0 + U(5)]
        s5_3 = bias[c0 + U(5)]
        s5_4 = bias[c0 + U(5)]
        s5_5 = bias[c0 + U(5)]
        s5_6 = bias[c0 + U(5)]
        s5_7 = bias[c0 + U(5)]
        s5_8 = bias[c0 + U(5)]
        s5_9 = bias[c0 + U(5)]
        s5_10 = bias[c0 + U(5)]
        s5_11 = bias[c0 + U(5)]
        s5_12 = bias[c0 + U(5)]
        s5_13 = bias[c0 + U(5)]
        s5_14 = bias[c0 + U(5)]
        s5_15 = bias[c0 + U(5)]
    else:
        s0_0 = ti[0, 0]
        s0_1 = ti[0, 1]
        s0_2 = ti[0, 2]
        s0_3 = ti[0, 3]
        s0_4 = ti[0, 4]
        s0_5 = ti[0, 5]
        s0_6 = ti[0, 6]
        s0_7 = ti[0, 7]
        s0_8 = ti[0, 8]
        s0_9 = ti[0, 9]
        s0_10 = ti[0, 10]
        s0_11 = ti[0, 11]
        s0_12 = ti[0, 12]
        s0_13 = ti[0, 13]
        s0_14 = ti[0, 14]
        s0_15 = ti[0, 15]
        s1_0 = ti[1, 0]
        s1_1 = ti[1, 1]
        s1_2 = ti[1, 2]
        s1_3 = ti[1, 3]
        s1_4 = ti[1, 4]
        s1_5 = ti[1, 5]
        s1_6 = ti[1, 6]
        s1_7 = ti[1, 7]
        s1_8 = ti[1, 8]
        s1_9 = ti[1, 9]
        s1_10 = ti[1, 10]
        s1_11 = ti[1, 11]
        s1_12 = ti[1, 12]
        s1_13 = ti[1, 13]
        s1_14 = ti[1, 14]
        s1_15 = ti[1, 15]
        s2_0 = ti[2, 0]
        s2_1 = ti[2, 1]
        s2_2 = ti[2, 2]
        s2_3 = ti[2, 3]
        s2_4 = ti[2, 4]
        s2_5 = ti[2, 5]
        s2_6 = ti[2, 6]
        s2_7 = ti[2, 7]
        s2_8 = ti[2, 8]
        s2_9 = ti[2, 9]
        s2_10 = ti[2, 10]
        s2_11 = ti[2, 11]
        s2_12 = ti[2, 12]
        s2_13 = ti[2, 13]
        s2_14 = ti[2, 14]
        s2_15 = ti[2, 15]
        s3_0 = ti[3, 0]
        s3_1 = ti[3, 1]
        s3_2 = ti[3, 2]
        s3_3 = ti[3, 3]
        s3_4 = ti[3, 4]
        s3_5 = ti[3, 5]
        s3_6 = ti[3, 6]
        s3_7 = ti[3, 7]
        s3_8 = ti[3, 8]
        s3_9 = ti[3, 9]
        s3_10 = ti[3, 10]
        s3_11 = ti[3, 11]
        s3_12 = ti[3, 12]
        s3_13 = ti[3, 13]
        s3_14 = ti[3, 14]
        s3_15 = ti[3, 15]
        s4_0 = ti[4, 0]
        s4_1 = ti[4, 1]
        s4_2 = ti[4, 2]
        s4_3 = ti[4, 3]
        s4_4 = ti[4, 4]
        s4_5 = ti[4, 5]
        s4_6 = ti[4, 6]
        s4_7 = ti[4, 7]
        s4_8 = ti[4, 8]
        s4_9 = ti[4, 9]
        s4_10 = ti[4, 10]
        s4_11 = ti[4, 11]
        s4_12 = ti[4, 12]
        s4_13 = ti[4, 13]
        s4_14 = ti[4, 14]
        s4_15 = ti[4, 15]
        s5_0 = ti[5, 0]
        s5_1 = ti[5, 1]
        s5_2 = ti[5, 2]
        s5_3 = ti[5, 3]
        s5_4 = ti[5, 4]
        s5_5 = ti[5, 5]
        s5_6 = ti[5, 6]
        s5_7 = ti[5, 7]
        s5_8 = ti[5, 8]
        s5_9 = ti[5, 9]
        s5_10 = ti[5, 10]
        s5_11 = ti[5, 11]
        s5_12 = ti[5, 12]
        s5_13 = ti[5, 13]
        s5_14 = ti[5, 14]
        s5_15 = ti[5, 15]
    for k in range(k0, k1):
        q = offs[k] + q0
        x0 = x[q + U(0)]
        x1 = x[q + U(1)]
        x2 = x[q + U(2)]
        x3 = x[q + U(3)]
        x4 = x[q + U(4)]
        x5 = x[q + U(5)]
        x6 = x[q + U(6)]
        x7 = x[q + U(7)]
        x8 = x[q + U(8)]
        x9 = x[q + U(9)]
        x10 = x[q + U(10)]
        x11 = x[q + U(11)]
        x12 = x[q + U(12)]
        x13 = x[q + U(13)]
        x14 = x[q + U(14)]
        x15 = x[q + U(15)]
        a = wi[k, U(0)]
        s0_0 += a * x0
        s0_1 += a * x1
        s0_2 += a * x2
        s0_3 += a * x3
        s0_4 += a * x4
        s0_5 += a * x5
        s0_6 += a * x6
        s0_7 += a * x7
        s0_8 += a * x8
        s0_9 += a * x9
        s0_10 += a * x10
        s0_11 += a * x11
        s0_12 += a * x12
        s0_13 += a * x13
        s0_14 += a * x14
        s0_15 += a * x15
        a = wi[k, U(1)]
        s1_0 += a * x0
        s1_1 += a * x1
        s1_2 += a * x2
        s1_3 += a * x3
        s1_4 += a * x4
        s1_5 += a * x5
        s1_6 += a * x6
        s1_7 += a * x7
        s1_8 += a * x8
        s1_9 += a * x9
        s1_10 += a * x10
        s1_11 += a * x11
        s1_12 += a * x12
        s1_13 += a * x13
        s1_14 += a * x14
        s1_15 += a * x15
        a = wi[k, U(2)]
        s2_0 += a * x0
        s2_1 += a * x1
        s2_2 += a * x2
        s2_3 += a * x3
        s2_4 += a * x4
        s2_5 += a * x5
        s2_6 += a * x6
        s2_7 += a * x7
        s2_8 += a * x8
        s2_9 += a * x9
        s2_10 += a * x10
        s2_11 += a * x11
        s2_12 += a * x12
        s2_13 += a * x13
        s2_14 += a * x14
        s2_15 += a * x15
        a = wi[k, U(3)]
        s3_0 += a * x0
        s3_1 += a * x1
        s3_2 += a * x2
        s3_3 += a * x3
        s3_4 += a * x4
        s3_5 += a * x5
        s3_6 += a * x6
        s3_7 += a * x7
        s3_8 += a * x8
        s3_9 += a * x9
        s3_10 += a * x10
        s3_11 += a * x11
        s3_12 += a * x12
        s3_13 += a * x13
        s3_14 += a * x14
        s3_15 += a * x15
        a = wi[k, U(4)]
        s4_0 += a * x0
        s4_1 += a * x1
        s4_2 += a * x2
        s4_3 += a * x3
        s4_4 += a * x4
        s4_5 += a * x5
        s4_6 += a * x6
        s4_7 += a * x7
        s4_8 += a * x8
        s4_9 += a * x9
        s4_10 += a * x10
        s4_11 += a * x11
        s4_12 += a * x12
        s4_13 += a * x13
        s4_14 += a * x14
        s4_15 += a * x15
        a = wi[k, U(5)]
        s5_0 += a * x0
        s5_1 += a * x1
        s5_2 += a * x2
        s5_3 += a * x3
        s5_4 += a * x4
        s5_5 += a * x5
        s5_6 += a * x6
        s5_7 += a * x7
        s5_8 += a * x8
        s5_9 += a * x9
        s5_10 += a * x10
        s5_11 += a * x11
        s5_12 += a * x12
        s5_13 += a * x13
        s5_14 += a * x14
        s5_15 += a * x15
    ti[0, 0] = s0_0
    ti[0, 1] = s0_1
    ti[0, 2] = s0_2
    ti[0, 3] = s0_3
    ti[0, 4] = s0_4
    ti[0, 5] = s0_5
    ti[0, 6] = s0_6
    ti[0, 7] = s0_7
    ti[0, 8] = s0_8
    ti[0, 9] = s0_9
    ti[0, 10] = s0_10
    ti[0, 11] = s0_11
    ti[0, 12] = s0_12
    ti[0, 13] = s0_13
    ti[0, 14] = s0_14
    ti[0, 15] = s0_15
    ti[1, 0] = s1_0
    ti[1, 1] = s1_1
    ti[1, 2] = s1_2
    ti[1, 3] = s1_3
    ti[1, 4] = s1_4
    ti[1, 5] = s1_5
    ti[1, 6] = s1_6
    ti[1, 7] = s1_7
    ti[1, 8] = s1_8
    ti[1, 9] = s1_9
    ti[1, 10] = s1_10
    ti[1, 11] = s1_11
    ti[1, 12] = s1_12
    ti[1, 13] = s1_13
    ti[1, 14] = s1_14
    ti[1, 15] = s1_15
    ti[2, 0] = s2_0
    ti[2, 1] = s2_1
    ti[2, 2] = s2_2
    ti[2, 3] = s2_3
    ti[2, 4] = s2_4
    ti[2, 5] = s2_5
    ti[2, 6] = s2_6
    ti[2, 7] = s2_7
    ti[2, 8] = s2_8
    ti[2, 9] = s2_9
    ti[2, 10] = s2_10
    ti[2, 11] = s2_11
    ti[2, 12] = s2_12
    ti[2, 13] = s2_13
    ti[2, 14] = s2_14
    ti[2, 15] = s2_15
    ti[3, 0] = s3_0
    ti[3, 1] = s3_1
    ti[3, 2] = s3_2
    ti[3, 3] = s3_3
    ti[3, 4] = s3_4
    ti[3, 5] = s3_5
    ti[3, 6] = s3_6
    ti[3, 7] = s3_7
    ti[3, 8] = s3_8
    ti[3, 9] = s3_9
    ti[3, 10] = s3_10
    ti[3, 11] = s3_11
    ti[3, 12] = s3_12
    ti[3, 13] = s3_13
    ti[3, 14] = s3_14
    ti[3, 15] = s3_15
    ti[4, 0] = s4_0
    ti[4, 1] = s4_1
    ti[4, 2] = s4_2
    ti[4, 3] = s4_3
    ti[4, 4] = s4_4
    ti[4, 5] = s4_5
    ti[4, 6] = s4_6
    ti[4, 7] = s4_7
    ti[4, 8] = s4_8
    ti[4, 9] = s4_9
    ti[4, 10] = s4_10
    ti[4, 11] = s4_11
    ti[4, 12] = s4_12
    ti[4, 13] = s4_13
    ti[4, 14] = s4_14
    ti[4, 15] = s4_15
    ti[5, 0] = s5_0
    ti[5, 1] = s5_1
    ti[5, 2] = s5_2
    ti[5, 3] = s5_3
    ti[5, 4] = s5_4
    ti[5, 5] = s5_5
    ti[5, 6] = s5_6
    ti[5, 7] = s5_7
    ti[5, 8] = s5_8
    ti[5, 9] = s5_9
    ti[5, 10] = s5_10
    ti[5, 11] = s5_11
    ti[5, 12] = s5_12
    ti[5, 13] = s5_13
    ti[5, 14] = s5_14
    ti[5, 15] = s5_15
