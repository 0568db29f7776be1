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
ones for wrap-around, which keeps LLVM from vectorizing. The block of sums (tile_sums._sums) is written by
tools/make_tiles.py and inlined here by numba. numba's disk cache checks only this file for changes: SUMS is
the SHA-256 of tile_sums.py, which make_tiles.py writes here with it, so that new sums make a new loop.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import prange

from .scalars import activate
from .tile_sums import _sums

U = np.uint64
F = np.float32
MR, NR = 6, 16
#: The SHA-256 of tile_sums.py (tools/make_tiles.py writes both).
SUMS = "325ced6e7c7479d99d54e30cc000231e25bcbc93bd5775e335762cd6e1bac250"
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
