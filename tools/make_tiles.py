"""Write backends/cpu/sums/, the blocks of sums that the compiled tile loops (backends/cpu/tiles.py) inline,
one module a tile shape (a process imports only those of its vector width), and stamp their SHA-256 into
tiles.py (numba's disk cache checks only tiles.py for changes).

    python tools/make_tiles.py

numba has no vector type, and LLVM keeps a tile of sums in registers only when each sum is its own scalar
variable: an array of sums stays in memory (numba allocates it on the heap, and LLVM must assume it may
overlap the input). So the block names its MR x NR sums one by one, and LLVM's SLP vectorizer packs each row of
NR into NR / 8 AVX (NR / 16 AVX-512) registers. Writing hundreds of sums by hand would hide the loop's shape; this
script writes them into files that numba compiles and caches (a function made by exec cannot be cached on
disk).
"""

from __future__ import annotations

import hashlib
import pathlib
import re
from typing import Callable

#: The tiles written, as (loop, rows, columns): each tile loop's shape for narrow (256-bit) and wide (512-bit)
#: vectors, as backends/cpu/vectors.py chooses them. A narrow conv tile is 6 x 16 sums in 12 AVX registers (with 2
#: for a row of inputs and 1 for a broadcast weight: enough sums in flight to cover the multiply-add latency;
#: 4 x 16 and 8 x 8 ran slower, benchmarks/RESULTS.md); a wide one 8 x 48 in 24 AVX-512 registers (vectors.SHAPES).
TILES = (("conv", 6, 16), ("conv", 8, 48), ("dense", 6, 16), ("dense", 8, 32), ("channels", 6, 16),
         ("channels", 8, 32))
HEADER = '''"""The {loop} tile loop's block of sums for a tile of {mr} x {nr} (tiles.py), written by tools/make_tiles.py:
edit that, not this (tiles.py holds the SHA-256 of the sums, so that numba's disk cache compiles the loops again
when they change)."""

from __future__ import annotations

import numba
import numpy as np

from ..scalars import {imports}

U = np.uint64
'''
#: Inlined by LLVM (forceinline, LLVM's alwaysinline), not by numba (inline="always"): numba's inlining takes a
#: reference to each array argument, atomic calls (and spilled registers) around every block of sums; left to
#: LLVM's own threshold, the block of 256 sums stayed a call, with its arguments, references and sums loaded and
#: stored around every block of taps (benchmarks/RESULTS.md, session 25). As in loops.compile, no reassociation.
DECORATOR = '@numba.njit(fastmath=FAST - {"reassoc"}, error_model="numpy", boundscheck=False, forceinline=True)'


def conv(mr: int, nr: int) -> str:
    """conv_MRxNR: a block of taps [k0, k1) added into one tile's sums, which start from the bias (fresh) or
    from the tile's store t[at:] (flat, row by row), and end there; a tap reads nr input positions in a row and
    the mr weights of channel block b."""
    lines = [DECORATOR,
             f"def conv_{mr}x{nr}(x, q0, offs, k0, k1, w, b, t, at, bias, c0, fresh):",
             "    if fresh:"]
    lines += _rows(8, mr, nr, lambda i, j: f"s{i}_{j} = bias[c0 + U({i})]")
    lines += ["    else:"]
    lines += _rows(8, mr, nr, lambda i, j: f"s{i}_{j} = t[at + U({i * nr + j})]")
    lines += ["    for k in range(k0, k1):", "        q = offs[k] + q0"]
    lines += _step(mr, nr, "x{j} = x[q + U({j})]", "w[b, k, U({i})]", "x")
    lines += _rows(4, mr, nr, lambda i, j: f"t[at + U({i * nr + j})] = s{i}_{j}")
    return "\n".join(lines) + "\n"


def _rows(indent: int, mr: int, nr: int, statement: Callable[[int, int], str]) -> list[str]:
    """`statement(i, j)` for each of the tile's mr x nr sums, a line a row of the tile:
    Python compiles statements joined by semicolons to the same bytecode as statements a line each, so numba
    makes the same machine code, and the file stays short enough to read."""
    return [" " * indent + "; ".join(statement(i, j) for j in range(nr)) for i in range(mr)]


def _step(mr: int, nr: int, load: str, row_value: str, name: str) -> list[str]:
    """One step of a block of sums: the nr values of the vectorized side loaded (`load`, formatted with j, into
    {name}{j}), then each row's value (`row_value`, formatted with i) times them, added into row i's sums."""
    lines = ["        " + "; ".join(load.format(j=j) for j in range(nr))]
    for i in range(mr):
        lines += [f"        a = {row_value.format(i=i)}"]
        lines += ["        " + "; ".join(f"s{i}_{j} += a * {name}{j}" for j in range(nr))]
    return lines


#: How far ahead of its reads the dense tile loop asks for its weights, in floats (8 KB: 2 KB and 16 KB streamed
#: slower from memory on the 2-core VM).
AHEAD = 2048


def _prefetches(nr: int) -> list[str]:
    """A step's prefetches of a panel's weights, AHEAD floats on in `flat` from the step's row of nr: one a line."""
    return [f"        prefetch(flat, at + k * U({nr}) + U({AHEAD + line}))" for line in range(0, nr, 16)]


def dense(mr: int, nr: int) -> str:
    """dense_MRxNR: one tile of a product, rows rs of x (M, K) times panel p of nr columns of the weights
    wp (P, K, nr), from the bias at columns n0.. (where there is one) into t (flat, row by row); a step of k
    reads nr weights in a row and mr values of x, and prefetches the weights AHEAD floats on in `flat`, where
    the panel starts at `at`."""
    lines = [DECORATOR,
             f"def dense_{mr}x{nr}(x, rs, wp, p, kk, t, bias, n0, biased, flat, at):"]
    lines += ["    " + "; ".join(f"r{i} = rs[{i}]" for i in range(mr))]
    lines += ["    if biased:"]
    lines += _rows(8, mr, nr, lambda i, j: f"s{i}_{j} = bias[n0 + U({j})]")
    lines += ["    else:"]
    lines += _rows(8, mr, nr, lambda i, j: f"s{i}_{j} = np.float32(0)")
    lines += ["    for k in range(U(0), kk):"]
    lines += _prefetches(nr)
    lines += _step(mr, nr, "w{j} = wp[p, k, U({j})]", "x[r{i}, k]", "w")
    lines += _rows(4, mr, nr, lambda i, j: f"t[U({i * nr + j})] = s{i}_{j}")
    return "\n".join(lines) + "\n"


def channels(mr: int, nr: int) -> str:
    """channels_MRxNR: one tile of a conv with the output channels along the vectors (tiles.channels): mr output
    positions, whose inputs start at qs[0..mr) of the layout x, by panel p of nr output channels of the weights wp
    (P, taps, nr), over every tap (a tap k reads x at offs[k] past each position's start), from the bias at
    channels n0.. into t (flat, position by position); a step of k reads nr weights in a row and mr inputs, and
    prefetches the weights AHEAD floats on in `flat`, where the panel starts at `at`."""
    lines = [DECORATOR,
             f"def channels_{mr}x{nr}(x, qs, offs, wp, p, kk, t, bias, n0, flat, at):"]
    lines += ["    " + "; ".join(f"q{i} = qs[{i}]" for i in range(mr))]
    lines += _rows(4, mr, nr, lambda i, j: f"s{i}_{j} = bias[n0 + U({j})]")
    lines += ["    for k in range(U(0), kk):", "        o = offs[k]"]
    lines += _prefetches(nr)
    lines += _step(mr, nr, "w{j} = wp[p, k, U({j})]", "x[o + q{i}]", "w")
    lines += _rows(4, mr, nr, lambda i, j: f"t[U({i * nr + j})] = s{i}_{j}")
    return "\n".join(lines) + "\n"


#: What each loop's sums import.
IMPORTS = {"conv": "FAST", "dense": "FAST, prefetch", "channels": "FAST, prefetch"}


def main() -> None:
    folder = pathlib.Path(__file__).resolve().parent.parent / "backends" / "cpu"
    write = {"conv": conv, "dense": dense, "channels": channels}
    texts = b""
    for loop, mr, nr in TILES:  # the stamp: the files' texts in this order (tiles.SUMS)
        text = HEADER.format(loop=loop, mr=mr, nr=nr, imports=IMPORTS[loop]) + "\n\n" + write[loop](mr, nr)
        (folder / "sums" / f"{loop}_{mr}x{nr}.py").write_text(text)
        texts += text.encode()
    tiles = folder / "tiles.py"
    stamp = hashlib.sha256(texts).hexdigest()
    tiles.write_text(re.sub(r'^SUMS = ".*"$', f'SUMS = "{stamp}"', tiles.read_text(), count=1, flags=re.M))
    # The loops inline the functions of INLINED too: their stamp in each file of loops makes a change there new loops.
    inlined = stamp_of(folder)
    for loops in STAMPED:
        path = folder / loops
        path.write_text(re.sub(r'^INLINED = ".*"$', f'INLINED = "{inlined}"', path.read_text(), count=1, flags=re.M))
    print(f"wrote {len(TILES)} files of sums in {folder / 'sums'}, and the stamps in {', '.join(STAMPED)}")


#: The modules whose functions the compiled loops inline, and the files of loops that hold their stamp.
INLINED = ("scalars.py", "fields.py", "atomics.py")
STAMPED = ("tiles.py", "loops.py", "planes.py", "crew.py", "pooled.py")


def stamp_of(folder: pathlib.Path) -> str:
    """The SHA-256 of the INLINED modules' texts, in order."""
    return hashlib.sha256(b"".join((folder / name).read_bytes() for name in INLINED)).hexdigest()


if __name__ == "__main__":
    main()
