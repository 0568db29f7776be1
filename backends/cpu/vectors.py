"""The vector width of numba's loops, chosen once a process, before numba loads, and the tile shapes it gives.

LLVM compiles for Intel's server cores with 256-bit vectors even where AVX-512 is there (its tuning for the
cores that slowed their clock on 512-bit work). The tile loops (tiles.py) keep a tile's sums in registers, and
with 512-bit vectors twice as many fit, as onnxruntime's kernels use them. So where the CPU has AVX-512 and
nothing has set numba's target already, numba is told to prefer 512-bit vectors (NUMBA_CPU_FEATURES, the host's
own features plus "-prefer-256-bit"): this holds for every numba function the process compiles, the caller's
too. AIOMNN_VECTORS=256 keeps LLVM's choice. The choice is part of numba's cache key, so each has its own code.

This module imports llvmlite alone, not numba: the plans (ops/direct.py) read the tile shapes from here.
"""

from __future__ import annotations

import functools
import os
import sys

_PREFER_WIDE = "-prefer-256-bit"
#: A tile's rows and columns of sums by vector width: (conv tile loop, dense tile loop). Narrow: 6 x 16 sums in
#: 12 AVX registers. Wide: the conv's 8 x 48 in 24 AVX-512 registers, the dense loop's 8 x 32 in 16; 8 rows divide
#: most layers' channel counts, where a 12 x 16 tile left an eighth of a 64-channel conv's rows empty and ran it
#: slower. A conv tap's 8 weights serve 3 vectors of positions in a tile 48 wide, 2 in one 32 wide: with a third
#: fewer weight loads a multiply-add the 3x3 convs ran faster, the 10 x 10 pointwise convs, whose 100 positions
#: fill tiles of 48 worse, slower (benchmarks/RESULTS.md, session 35).
SHAPES = {False: ((6, 16), (6, 16)), True: ((8, 48), (8, 32))}


@functools.cache
def wide() -> bool:
    """Whether numba's loops are compiled for 512-bit vectors in this process (see above); sets numba's target
    the first time, when numba has not loaded yet."""
    if os.environ.get("AIOMNN_VECTORS") == "256":
        return False
    chosen = os.environ.get("NUMBA_CPU_FEATURES")
    if chosen is not None or "numba" in sys.modules or os.environ.get("NUMBA_CPU_NAME"):
        if "numba" in sys.modules:
            chosen = sys.modules["numba"].config.CPU_FEATURES
        return bool(chosen) and _PREFER_WIDE in chosen.split(",")
    try:
        import llvmlite.binding as ll

        features = ll.get_host_cpu_features()
    except Exception:  # no llvmlite (so no numba either): the numpy paths serve
        return False
    if not features.get("avx512f"):
        return False
    os.environ["NUMBA_CPU_FEATURES"] = features.flatten() + "," + _PREFER_WIDE
    return True


def conv_tile() -> tuple[int, int]:
    """(output channels, output positions) of the conv tile loop's tile."""
    return SHAPES[wide()][0]


def dense_tile() -> tuple[int, int]:
    """(rows, columns) of the dense tile loop's tile."""
    return SHAPES[wide()][1]


def l1_data_bytes() -> int:
    """The L1 data cache of the first core, in bytes, from Linux's sysfs; 32 KiB where it cannot be read."""
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for index in sorted(os.listdir(base)):
            folder = os.path.join(base, index)
            with open(os.path.join(folder, "level")) as level, open(os.path.join(folder, "type")) as kind:
                if level.read().strip() != "1" or kind.read().strip() not in ("Data", "Unified"):
                    continue
            with open(os.path.join(folder, "size")) as size:
                text = size.read().strip().upper()
            scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
            return int(text.rstrip("KM")) * scale
    except (OSError, ValueError):
        pass
    return 32 << 10


@functools.cache
def conv_block() -> int:
    """Taps a block of the conv tile loop (tiles.KC): a block's inputs, a row of positions a tap, and its weights
    stay in L1 while every channel block uses them. With 512-bit vectors and 48 KiB of L1 or more, 160 taps (30
    KiB of inputs in rows of 48; with rows of 32, 256 taps ran the 3x3 convs a few percent faster than 128,
    benchmarks/RESULTS.md, session 22); else 128."""
    return 160 if wide() and l1_data_bytes() >= 48 << 10 else 128
