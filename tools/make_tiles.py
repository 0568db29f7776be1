"""Write backends/cpu/tile_sums.py, the block of sums that the conv's compiled tile loop (backends/cpu/tiles.py)
inlines, and stamp its SHA-256 into tiles.py (numba's disk cache checks only tiles.py for changes).

    python tools/make_tiles.py

numba has no vector type, and LLVM keeps a tile of sums in registers only when each sum is its own scalar
variable: an array of sums stays in memory (numba allocates it on the heap, and LLVM must assume it may
overlap the input). So the block names its MR x NR sums one by one, and LLVM's SLP vectorizer packs each row of
NR into NR / 8 AVX registers. Writing 96 sums by hand would hide the loop's shape; this script writes them into
a file that numba compiles and caches (a function made by exec cannot be cached on disk).
"""

from __future__ import annotations

import hashlib
import pathlib
import re

#: Rows (output channels) and columns (output positions) of one tile: 6 x 16 sums are 12 AVX registers, with 2
#: for a row of inputs and 1 for a broadcast weight: enough sums in flight to cover the multiply-add latency
#: (4 x 16 and 8 x 8 ran 20% slower on the 2-core VM; tiles.py and ops/direct.py state MR and NR too).
MR, NR = 6, 16
HEADER = '''"""One tile's block of sums for the conv's tile loop (tiles.py), written by tools/make_tiles.py: edit that, not
this (tiles.py holds this file's SHA-256, so that numba's disk cache compiles the loop again when it changes)."""

from __future__ import annotations

import numba
import numpy as np

U = np.uint64


'''


def sums() -> str:
    """_sums: a block of taps [k0, k1) added into one tile's sums, which start from the bias (fresh) or from
    the tile's store ti, and end in ti."""
    lines = ['@numba.njit(inline="always")',
             "def _sums(x, q0, offs, k0, k1, wi, ti, bias, c0, fresh):",
             "    if fresh:"]
    lines += [f"        s{i}_{j} = bias[c0 + U({i})]" for i in range(MR) for j in range(NR)]
    lines += ["    else:"]
    lines += [f"        s{i}_{j} = ti[{i}, {j}]" for i in range(MR) for j in range(NR)]
    lines += ["    for k in range(k0, k1):", "        q = offs[k] + q0"]
    lines += [f"        x{j} = x[q + U({j})]" for j in range(NR)]
    for i in range(MR):
        lines += [f"        a = wi[k, U({i})]"]
        lines += [f"        s{i}_{j} += a * x{j}" for j in range(NR)]
    lines += [f"    ti[{i}, {j}] = s{i}_{j}" for i in range(MR) for j in range(NR)]
    return "\n".join(lines) + "\n"


def main() -> None:
    folder = pathlib.Path(__file__).resolve().parent.parent / "backends" / "cpu"
    text = HEADER + sums()
    (folder / "tile_sums.py").write_text(text)
    tiles = folder / "tiles.py"
    stamp = hashlib.sha256(text.encode()).hexdigest()
    tiles.write_text(re.sub(r'^SUMS = ".*"$', f'SUMS = "{stamp}"', tiles.read_text(), count=1, flags=re.M))
    print(f"wrote {folder / 'tile_sums.py'} and its stamp in {tiles}")


if __name__ == "__main__":
    main()
