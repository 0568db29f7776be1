"""The choices of the tiled kernels: what tuning picks between for a Conv or a MatMul/Gemm launch, the untuned
default, and how a choice becomes the launch that runs.

A Conv launch (ops/conv.py) chooses one of
  ["gemm", BM, BN, RM, RN, S]  kernels/gemm.cl's conv_gemm: a BM (output channels) x BN (pixels) tile per work
                               group, RM x RN values per work item, the sums split S ways;
  ["direct"]                   kernels/conv.cl's conv2d, which takes the same arguments;
  ["narrow", ROWS, WAYS]       kernels/conv.cl's conv_narrow (aiomnn/narrow.py), built for the layer, where a conv
                               of one group has few output channels: ROWS output rows a work group, each step's
                               channels split WAYS ways.
A MatMul or Gemm launch (ops/matmul.py) chooses one of
  ["tile", BM, BN, RM, RN]     kernels/gemm.cl's matmul, tiled the same way;
  ["small", SX, SY]            kernels/matmul.cl's matmul_small: SX x SY work items, the sums split SY ways.
A choice is JSON, cached by tuning under the launch's key (tune.py); `apply` makes it a concrete Launch: its
program, kernel, build options, work items and local size.

The defaults are the fast choices on a large GPU, as the Vulkan backend found them (backends/vulkan/launch.py):
they run whenever tuning is off, and until it has run.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from aiomnn import narrow as narrow_conv

#: The depth of one step of a tiled kernel's sums (kernels/gemm.cl's TK).
TK = 16
#: conv_gemm's tiles, (BM, BN, RM, RN): the work group is (BN / RN) x (BM / RM).
CONV_TILES = ((32, 64, 4, 4), (16, 128, 4, 4), (64, 64, 4, 4), (32, 32, 4, 4), (64, 32, 4, 4), (32, 128, 4, 8),
              (64, 64, 8, 4), (64, 128, 4, 8))
#: matmul's tiles, the same way.
MATMUL_TILES = ((64, 64, 4, 4), (32, 64, 4, 4), (64, 64, 8, 4), (128, 64, 8, 4), (64, 128, 4, 8), (128, 128, 8, 8),
                (32, 32, 4, 4))
SPLITS = (1, 2, 4, 8, 16)
#: The implicit GEMM takes convolutions with this many output channels per group, and sums at least this deep
#: unless they are pointwise (the Vulkan backend runs those as its tiled matmul whatever their depth: a large
#: image's few channels are one step of k, each input read once); others run the direct kernel by default.
MIN_K = 27
MIN_M = 8
#: Without tuning, a convolution's sums are split until its grid has this many work groups (three per
#: multiprocessor of a large GPU), each slice at least SLICE deep.
BUSY = 384
SLICE = 96
#: Bytes of float partial sums one convolution may use to split its sums.
SCRATCH = 4 << 20
#: A product of fewer 64 x 64 tiles than this runs matmul_small by default.
FEW_TILES = 8
#: A register-blocked matmul tile comes early among the candidates where it makes this many work groups or more,
#: at least half of its outputs inside the matrix.
REG_BUSY = 64
#: matmul_small's work groups, (SX, SY): at most 256 work items.
SMALL_SHAPES = ((16, 16), (64, 1), (64, 4), (32, 8), (128, 2))


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _tile_options(tile: tuple[int, ...]) -> tuple[str, ...]:
    bm, bn, rm, rn = tile
    return (f"-DBM={bm}", f"-DBN={bn}", f"-DRM={rm}", f"-DRN={rn}")


def local_bytes(tile: tuple[int, ...]) -> int:
    """The local memory a tile of kernels/gemm.cl takes: As and Bs, and conv_gemm's table of taps."""
    bm, bn = tile[:2]
    return 16 * TK * (bm // 4 + 1 + bn // 4) + 16 * 2 * TK + 4


def conv_splits(k: int, co: int, npix: int) -> int:
    """The most ways a convolution's sums may be split: each slice two steps deep at least, and its partial sums
    (S x all output channels x pixels, floats) within SCRATCH."""
    return max(s for s in SPLITS if s == 1 or (s * co * npix * 4 <= SCRATCH and s * 2 * TK <= k))


def conv_counts(m: int, n: int, groups: int) -> int:
    """The counters a split convolution needs: one per tile of its smallest tiles."""
    return groups * max(_cdiv(m, t[0]) * _cdiv(n, t[1]) for t in CONV_TILES)


@dataclass(frozen=True)
class ConvTiles:
    m: int  # output channels per group: the GEMM's rows
    n: int  # output pixels of all images: its columns
    k: int  # input channels per group x kernel taps: the depth of its sums
    groups: int
    taps: int  # kernel taps: 1 for a pointwise convolution
    splits: int  # the most ways its sums may be split (its scratch is planned for that many)
    direct: tuple[int, int, int]  # conv2d's work items
    # Where conv_narrow may run it: (images, output rows, columns) and the window (kernel, strides, dilations as
    # (height, width) pairs); else ().
    narrow: tuple = ()
    window: tuple = ()
    programs = ("gemm", "conv")

    def default(self) -> list:
        if self.m < MIN_M or (self.k < MIN_K and self.taps > 1):
            return ["direct"]
        tile = (16, 128, 4, 4) if self.m <= 16 else (32, 64, 4, 4)
        return ["gemm", *tile, self._split(tile)]

    def choices(self) -> list[list]:
        """Every valid choice, the default first, then what is likeliest to beat it: the default tile split half
        and twice as many ways; the tiles that fit the output best, each split as its default would be; the direct
        kernel; then every other tile and split."""
        first = self.default()
        ranked = sorted(CONV_TILES, key=self._rank, reverse=True)
        narrow = [["narrow", *shape] for shape in narrow_conv.SHAPES] if self.narrow else []
        options = [first] + narrow[:3]
        if first[0] == "gemm":
            options += [first[:5] + [first[5] // 2], first[:5] + [first[5] * 2]]
        options += [["gemm", *t, self._split(t)] for t in ranked] + [["direct"]]
        options += [["gemm", *t, s] for t in ranked
                    for s in sorted(SPLITS, key=lambda s: abs(s.bit_length() - self._split(t).bit_length()))]
        return _unique(o for o in options + narrow[3:] if self.valid(o))

    def valid(self, choice: Any) -> bool:
        if choice == ["direct"]:
            return True
        if isinstance(choice, list) and choice[:1] == ["narrow"]:
            return bool(self.narrow) and tuple(choice[1:]) in narrow_conv.SHAPES
        return (isinstance(choice, list) and len(choice) == 6 and choice[0] == "gemm"
                and tuple(choice[1:5]) in CONV_TILES and choice[5] in SPLITS and choice[5] <= self.splits)

    def apply(self, launch: Any, choice: list) -> Any:
        if choice == ["direct"]:
            return replace(launch, program="conv", kernel="conv2d", size=self.direct, local=None, tune=False,
                           tiles=None)
        if choice[0] == "narrow":
            rows, ways = choice[1:]
            (kh, kw), (sh, sw), (dh, dw) = self.window
            shape = {"NCO": self.m, "NKH": kh, "NKW": kw, "NSH": sh, "NSW": sw, "NDH": dh, "NDW": dw,
                     "NX": narrow_conv.X, "NY": rows, "NZ": ways, "NPX": narrow_conv.PX, "NSTEP": narrow_conv.STEP}
            local = (narrow_conv.X, rows, ways)
            size = (narrow_conv.work_groups(*self.narrow, rows) * narrow_conv.X, rows, ways)
            shared = narrow_conv.shared_bytes(self.m, (kh, kw), (sh, sw), (dh, dw), rows)
            return replace(launch, program="conv", kernel="conv_narrow", size=size, local=local, tune=False,
                           options=launch.options + tuple(f"-D{k}={v}" for k, v in shape.items()), tiles=None,
                           shared=shared)
        bm, bn, rm, rn, s = choice[1:]
        wx, wy = bn // rn, bm // rm
        size = (_cdiv(self.n, bn) * wx, _cdiv(self.m, bm) * wy, self.groups * s)
        return replace(launch, program="gemm", kernel="conv_gemm", size=size, local=(wx, wy, 1), tune=False,
                       options=launch.options + _tile_options((bm, bn, rm, rn)), tiles=None,
                       shared=local_bytes((bm, bn)))

    def _split(self, tile: tuple[int, ...]) -> int:
        """How many ways a tile splits the sums by default: doubled while the grid has fewer than BUSY work
        groups and each slice stays at least SLICE deep."""
        tiles = _cdiv(self.m, tile[0]) * _cdiv(self.n, tile[1]) * self.groups
        s = 1
        while tiles * s < BUSY and 2 * s * SLICE <= self.k and 2 * s <= self.splits:
            s *= 2
        return s

    def _rank(self, tile: tuple[int, ...]) -> tuple:
        """How well a tile fits, larger first: the share of its rows inside the output channels; then its work
        groups (split by default) up to BUSY, as a fuller grid keeps more of a large GPU busy; then its size, as
        a larger tile reads each input fewer times."""
        rows = _cdiv(self.m, tile[0])
        groups = rows * _cdiv(self.n, tile[1]) * self.groups * self._split(tile)
        return self.m / (rows * tile[0]), min(groups, BUSY), tile[0] * tile[1]


@dataclass(frozen=True)
class MatmulTiles:
    m: int
    n: int
    k: int
    batch: int
    programs = ("gemm", "matmul")

    def default(self) -> list:
        few = _cdiv(self.m, 64) * _cdiv(self.n, 64) * self.batch < FEW_TILES
        return ["small", 16, 16] if few else ["tile", 64, 64, 4, 4]

    def choices(self) -> list[list]:
        """Every valid choice, the default first; the register-blocked tiles right after the 64 x 64 one where
        they fill the device and the matrix (large products), else after the small kernel's shapes."""
        early = [t for t in MATMUL_TILES if self._fits(t)]
        options = [self.default(), ["tile", 64, 64, 4, 4]] + [["tile", *t] for t in early]
        options += [["small", *s] for s in SMALL_SHAPES] + [["tile", *t] for t in MATMUL_TILES]
        return _unique(o for o in options if self.valid(o))

    def valid(self, choice: Any) -> bool:
        if not isinstance(choice, list) or not choice:
            return False
        if choice[0] == "small":
            return len(choice) == 3 and tuple(choice[1:]) in SMALL_SHAPES
        return len(choice) == 5 and choice[0] == "tile" and tuple(choice[1:]) in MATMUL_TILES

    def apply(self, launch: Any, choice: list) -> Any:
        if choice[0] == "small":
            sx, sy = choice[1:]
            groups = _cdiv(_cdiv(self.m, 4) * self.n, sx)
            return replace(launch, program="matmul", kernel="matmul_small", size=(groups * sx, sy, self.batch),
                           local=(sx, sy, 1), tune=False, options=launch.options + (f"-DSX={sx}", f"-DSY={sy}"),
                           tiles=None)
        bm, bn, rm, rn = choice[1:]
        wx, wy = bn // rn, bm // rm
        size = (_cdiv(self.n, bn) * wx, _cdiv(self.m, bm) * wy, self.batch)
        return replace(launch, program="gemm", kernel="matmul", size=size, local=(wx, wy, 1), tune=False,
                       options=launch.options + _tile_options((bm, bn, rm, rn)), tiles=None,
                       shared=local_bytes((bm, bn)))

    def _fits(self, tile: tuple[int, ...]) -> bool:
        gm, gn = _cdiv(self.m, tile[0]), _cdiv(self.n, tile[1])
        return gm * gn * self.batch >= REG_BUSY and 2 * self.m * self.n >= gm * gn * tile[0] * tile[1]


def _unique(options) -> list:
    out: list = []
    for o in options:
        if o not in out:
            out.append(o)
    return out
