"""Write backends/cpu/tiles.py, the conv's compiled tile loop, from the template below.

    python tools/make_tiles.py

numba has no vector type, and LLVM keeps a tile of sums in registers only when each sum is its own scalar
variable: an array of sums stays in memory (numba allocates it on the heap, and LLVM must assume it may
overlap the input). So the loop names its MR x NR sums one by one, and LLVM's SLP vectorizer packs each row of
NR into NR / 8 AVX registers. Writing 64 sums by hand would hide the loop's shape; this script writes them, and
the file it writes is the one numba compiles and caches (a function made by exec cannot be cached on disk).
"""

from __future__ import annotations

import pathlib

#: Rows (output channels) and columns (output positions) of one tile: 6 x 16 sums are 12 AVX registers, with 2
#: for a row of inputs and 1 for a broadcast weight: enough sums in flight to cover the multiply-add latency
#: (4 x 16 and 8 x 8 ran 20% slower on the 2-core VM; ops/direct.py packs the weights by MR).
MR, NR = 6, 16

HEAD = '''"""The conv's tile loop, compiled by numba (written by tools/make_tiles.py: edit that, not this file).

conv(x, ...) computes y[n, m, oy * wo + ox] = act(bias[m] + sum over k of w[m, k] * x[n * xs + offs[k] + p])
(or y[n, oy * wo + ox, m] with `across`, for a matrix product's rows)
for the output positions p = oy * rw + ox of images [first, last) and positions [p_first, p_last), in `chunks`
pieces: runs of tiles, each for one of `groups` groups of channels (the threads of numba's parallel loops share
them, in the parallel build; groups let a conv of few positions and many channels use many threads): x holds
each image's input laid out so that every tap k of a kernel reads a contiguous run of positions (ops/direct.py
makes that layout with loops.conv_input: padded rows, split into stride phases), and positions with ox >= wo
are the padding columns, computed and dropped.

The sums of one tile, {mr} output channels x {nr} positions, are scalars that LLVM keeps in registers and
vectorizes along the positions, over the taps in blocks of KC (so a block's inputs stay in L1 while every
channel's tile uses them); w is packed as [channel block, tap, {mr}]. Indices are unsigned: numba tests signed
ones for wrap-around, which keeps LLVM from vectorizing.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from .scalars import activate

U = np.uint64
F = np.float32
MR, NR = {mr}, {nr}
#: Taps a block: a block's inputs ({nr} positions a tap) and weights stay in L1.
KC = U(128)


def conv(x, xs, offs, far, w, bias, y, rw, wo, first, last, p_first, p_last, act, alpha, beta, chunks, groups,
         across):
    kk = U(offs.shape[0])
    mb = U(w.shape[0])
    m = U(y.shape[2]) if across else U(y.shape[1])  # channels
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
{fast}
                    else:  # the last tile of the last image, whose row of {nr} would read past x
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
                if across:  # y[n] is (positions, channels): a product's rows
                    if full:
                        for j in range(NR):
                            yn[d0 + U(j), i] = tr[j]
                    else:
                        for j in range(NR):
                            d = dest[j]
                            if d >= 0:
                                yn[d, i] = tr[j]
                    continue
                yr = yn[i]
                if full:
                    for j in range(NR):
                        yr[d0 + U(j)] = tr[j]
                else:
                    for j in range(NR):
                        d = dest[j]
                        if d >= 0:
                            yr[d] = tr[j]
'''


def fast_path(indent: str = " " * 24) -> str:
    lines = ["if k0 == U(0):"]
    lines += [f"    s{i}_{j} = bias[i0 * U(MR) + U({i})]" for i in range(MR) for j in range(NR)]
    lines += ["else:"]
    lines += [f"    s{i}_{j} = ti[{i}, {j}]" for i in range(MR) for j in range(NR)]
    lines += ["for k in range(k0, k1):", "    q = base + offs[k] + p0"]
    lines += [f"    x{j} = x[q + U({j})]" for j in range(NR)]
    for i in range(MR):
        lines += [f"    a = wi[k, U({i})]"]
        lines += [f"    s{i}_{j} += a * x{j}" for j in range(NR)]
    lines += [f"ti[{i}, {j}] = s{i}_{j}" for i in range(MR) for j in range(NR)]
    return "\n".join(indent + line for line in lines)


def main() -> None:
    out = pathlib.Path(__file__).resolve().parent.parent / "backends" / "cpu" / "tiles.py"
    out.write_text(HEAD.format(mr=MR, nr=NR, fast=fast_path()))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
