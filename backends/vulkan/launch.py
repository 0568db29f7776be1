"""How a dispatch covers its work, and the workgroup sizes tuning may choose from.

Work says what a kernel iterates over:
  Grid(n)          a grid-stride loop over n items (elementwise, conv, pool, copy, resize);
  Rows(n, l)       one workgroup per row, l invocations reducing it (reduce, softmax, layernorm);
  Matmul(m,n,b,k)  a batch of m x n outputs, sums of k products: the tiled shared-memory kernel (64 x 64
                   tiles, or one of the register-blocked ones, REG_TILES), the direct one, the small one, or,
                   in half floats where the device has cooperative matrices, matmul_coop's tensor cores.
  Convolution      an implicit-GEMM convolution (conv_gemm): a tile shape (or one of the register-blocked
                   tiles, CONV_REG_TILES) and how many ways to split the sum; or, for few output channels,
                   conv_narrow; or, in half floats where the device has cooperative matrices, conv_coop.
  Blocks(n, l)     one workgroup of l invocations per item (se: an image), not tuned.

Each Work's `cost` ranks what to tune first where a model has more ops than are tuned: multiply-adds for
products, items otherwise.

A Launch is one dispatch as the tuner sees it: a key (kernel, shader build,
specialization, work and push constants, so equal keys time alike), the
candidate choices (JSON values, the default first) and how a choice becomes a
kernel, a workgroup size and a grid.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from aiomnn import narrow as narrow_conv

from .program import CONV_REG_LOCAL, COOP_LOCAL, REG_TILE_LOCAL, SHADER_DIR

if TYPE_CHECKING:
    from .device import Context
    from .memory import Loc


class Work:
    @property
    def cost(self) -> int:
        return self.n


@dataclass(frozen=True)
class Grid(Work):
    n: int


@dataclass(frozen=True)
class Rows(Work):
    n: int
    local: int  # the default workgroup size (a power of two, at most 256: the shaders' shared arrays)


@dataclass(frozen=True)
class Matmul(Work):
    m: int
    n: int
    batch: int
    k: int

    @property
    def cost(self) -> int:
        return self.m * self.n * self.batch * self.k


@dataclass(frozen=True)
class Convolution(Work):
    m: int       # output channels per group: the GEMM's rows
    n: int       # output pixels of all images: its columns
    k: int       # input channels per group x kernel taps: the depth of its sums
    groups: int
    splits: int  # the most workgroups a tile's sum may be split between (the scratch is planned for it)
    narrow: tuple[int, int, int] | tuple[()] = ()  # (images, output rows, columns) where conv_narrow can run

    @property
    def cost(self) -> int:
        return self.m * self.n * self.k * self.groups


@dataclass(frozen=True)
class Blocks(Work):
    n: int
    local: int


#: matmul's register-blocked tiles, (rows, columns) -> workgroup (x, y): each invocation computes
#: (rows / y) x (columns / x) outputs. Built from matmul.comp as matmul_<rows>x<columns> (tools/build_shaders.py, EXTRA).
REG_TILES = {tuple(map(int, name.removeprefix("matmul_").split("x"))): local[:2]
             for name, local in REG_TILE_LOCAL.items()}
#: A register-blocked tile is among the first candidates tuning tries where it makes at least this many
#: workgroups and at least half of its outputs fall inside the matrix (64 x 64: always); otherwise after the
#: other kernels.
REG_BUSY = 64


#: conv_gemm's register-blocked tiles, (output channels, pixels) -> workgroup (x, y), the same way: built from
#: conv_gemm.comp as conv_gemm_<channels>x<pixels>.
CONV_REG_TILES = {tuple(map(int, name.removeprefix("conv_gemm_").split("x"))): local[:2]
                  for name, local in CONV_REG_LOCAL.items()}


def reg_kernel(tile: tuple[int, int]) -> str:
    return f"matmul_{tile[0]}x{tile[1]}"


def conv_reg_kernel(tile: tuple[int, int]) -> str:
    return f"conv_gemm_{tile[0]}x{tile[1]}"


@lru_cache(maxsize=None)
def shader_hash(kernel: str) -> str:
    """A short hash of a kernel's built SPIR-V (both variants), from the shader manifest. The matmul's and
    conv_gemm's cover their register-blocked tiles too (tuning chooses among them): tuned choices are redone
    when any changes."""
    try:
        files = json.loads((SHADER_DIR / "manifest.json").read_text()).get("files", {})
    except (OSError, ValueError):
        return "unknown"
    tiles = {"matmul": [reg_kernel(t) for t in REG_TILES] + ["matmul_coop"],
             "conv_gemm": [conv_reg_kernel(t) for t in CONV_REG_TILES] + ["conv_coop"]}
    names = [kernel] + tiles.get(kernel, [])
    text = "|".join(f"{files.get(k + '.spv', {}).get('spv')}|{files.get(k + '_fp16.spv', {}).get('spv')}"
                    for k in names)
    return hashlib.sha1(text.encode()).hexdigest()[:10]


GRID_SIZES = (64, 128, 256, 32, 512, 16, 1024)
ROW_SIZES = (64, 128, 256, 32)
#: conv_gemm's tiles, (output channels, pixels): the workgroup is (pixels / 4, channels / 4), and its splits.
CONV_TILES = ((64, 64), (32, 64), (64, 32), (32, 32), (16, 64), (16, 128), (32, 128), (64, 128))
CONV_SPLITS = (1, 2, 4, 8, 16, 32, 64)
#: Without tuning: 32 x 64 tiles (16 x 128 for 16 channels or fewer), and the sum split until there are this
#: many workgroups (three per multiprocessor of a large GPU), each slice at least CONV_SLICE deep.
CONV_BUSY = 384
CONV_SLICE = 96
#: A matmul of fewer 64 x 64 tiles than this takes matmul_small by default (on GPUs).
FEW_TILES = 8
#: matmul_small's workgroups, (invocations along the outputs, ways the sum is split): at most 256 invocations.
SMALL_SHAPES = ((64, 1), (64, 4), (32, 8), (128, 2), (16, 16))


def few_tiles(m: int, n: int, batch: int) -> bool:
    """Whether an m x n matmul (batch of them) is fewer than FEW_TILES 64 x 64 tiles."""
    return -(-m // 64) * -(-n // 64) * batch < FEW_TILES


class Launch:
    __slots__ = ("ctx", "kernel", "fp16", "consts", "push", "work", "locs", "key")

    def __init__(self, ctx: "Context", kernel: str, fp16: bool, consts: tuple[int, ...], push: bytes, work: Work,
                 locs: list["Loc"]):
        self.ctx, self.kernel, self.fp16, self.consts = ctx, kernel, fp16, tuple(consts)
        self.push, self.work, self.locs = push, work, locs
        digest = hashlib.sha1(push).hexdigest()[:16]
        self.key = self._key(self.consts, digest)

    def _key(self, consts: tuple[int, ...], digest: str) -> str:
        return (f"vulkan/{self.kernel}@{shader_hash(self.kernel)}|{'f16' if self.fp16 else 'f32'}|{list(consts)}"
                f"|{type(self.work).__name__}{list(vars(self.work).values())}|{digest}")

    @property
    def tunable(self) -> bool:
        return len(self.choices(8)) > 1

    def default(self) -> Any:
        w = self.work
        if isinstance(w, (Rows, Blocks)):
            return w.local
        if isinstance(w, Matmul):
            # Workgroup barriers are dear on CPU implementations (lavapipe): there the direct kernel is the default.
            if not self.ctx.info.is_gpu:
                return ["direct", 8]
            # A product of a few 64 x 64 tiles takes matmul_small, its sum split 16 ways: each tile would walk the
            # whole sum alone, a barrier every step. (What a launch runs that tuning leaves at its default, such
            # as cls's final 1 x 200 x 2 product with its bias.)
            few = few_tiles(w.m, w.n, w.batch)
            if few and self.valid(["small", 16, 16]):
                return ["small", 16, 16]
            # Half floats on tensor cores where the device has cooperative matrices (matmul_coop).
            return ["coop"] if self.valid(["coop"]) else "tiled"
        if isinstance(w, Convolution):
            if w.m >= 32 and self.valid(["coop"]):  # half floats on tensor cores (conv_coop)
                return ["coop"]
            return self._gemm_default()
        return 64

    def _coop_grid(self) -> tuple[int, int, int]:
        """matmul_coop's and conv_coop's workgroups: 64 x 64 tiles of the columns and rows, for each matrix of a
        batch (a group of a convolution)."""
        w = self.work
        return -(-w.n // 64), -(-w.m // 64), w.batch if isinstance(w, Matmul) else w.groups

    def _gemm_default(self) -> list:
        """conv_gemm's default choice: 32 x 64 tiles (16 x 128 for 16 channels or fewer), split as _conv_split
        says."""
        bm, bn = (16, 128) if self.work.m <= 16 else (32, 64)
        return ["gemm", bm, bn, self._conv_split("gemm", (bm, bn))]

    def choices(self, limit: int) -> list[Any]:
        w = self.work
        if isinstance(w, Grid):
            top = max(64, min(1 << (max(w.n, 1) - 1).bit_length(), self.ctx.max_invocations))
            options = [s for s in GRID_SIZES if s <= top]
        elif isinstance(w, Rows):
            options = list(ROW_SIZES)
        elif isinstance(w, Blocks):
            options = [w.local]
        elif isinstance(w, Convolution):
            # In half floats with cooperative matrices, conv_coop first; where it may run, conv_narrow's likeliest
            # shapes (aiomnn/narrow.py; the others last). Then conv_gemm's default tile (the
            # default without them) and its neighbours: split in half as many, twice or four times as many (a
            # small map's deep conv at batch 1 is a few tiles, which the default's CONV_SLICE-deep slices leave
            # too few workgroups). Then the register-blocked tiles at least half full of outputs, best fitting
            # first, each split as the default would split it, and the first one also split in half as many and
            # twice as many. Then the other tiles, the default's split first, and the other register-blocked
            # choices.
            _, dm, dn, ds = self._gemm_default()
            gemm = sorted([["gemm", bm, bn, s] for s in CONV_SPLITS for bm, bn in CONV_TILES],
                          key=lambda c: abs(c[3].bit_length() - ds.bit_length()) + 1.5 * ((c[1], c[2]) != (dm, dn)))
            split = {t: self._conv_split("greg", t) for t in CONV_REG_TILES}
            tiles = sorted(CONV_REG_TILES, key=lambda t: self._conv_rank(t, split[t]), reverse=True)
            early = [t for t in tiles if 2 * self._conv_fill(t) >= 1]
            reg = [["greg", *t, s] for t in tiles
                   for s in sorted(CONV_SPLITS, key=lambda s: abs(s.bit_length() - split[t].bit_length()))]
            narrow = [["narrow", *shape] for shape in narrow_conv.SHAPES] if w.narrow else []
            options = [["coop"]] + narrow[:3] + [["gemm", dm, dn, ds], ["gemm", dm, dn, ds // 2],
                                                 ["gemm", dm, dn, 2 * ds], ["gemm", dm, dn, 4 * ds]]
            options += [["greg", *t, split[t]] for t in early]
            if early:
                options += [["greg", *early[0], split[early[0]] // 2], ["greg", *early[0], 2 * split[early[0]]]]
            options += gemm + reg + narrow[3:]
        else:
            # The register-blocked tiles right after the 64 x 64 one where they fill the device and the matrix
            # (large products), else last (small ones: the small and direct kernels first).
            early = [t for t in REG_TILES if self._reg_fits(t)]
            options = ([["coop"], "tiled"] + [["reg", *t] for t in early]
                       + [["direct", 8], ["small", 64, 1], ["small", 64, 4], ["small", 32, 8], ["small", 16, 16],
                          ["direct", 16], ["direct", 4], ["small", 128, 2]]
                       + [["reg", *t] for t in REG_TILES if t not in early])
        default = self.default()
        ordered = [default]
        for o in options:
            if o not in ordered:
                ordered.append(o)
        return [o for o in ordered if self.valid(o)][:max(1, limit)]

    def valid(self, choice: Any) -> bool:
        w = self.work
        if isinstance(w, Blocks):
            return choice == w.local
        if isinstance(w, (Grid, Rows)):
            if not isinstance(choice, int) or isinstance(choice, bool) or choice < 1:
                return False
            if choice & (choice - 1) or choice > self.ctx.max_invocations:
                return False
            return choice <= 256 if isinstance(w, Rows) else True
        if choice == ["coop"] and isinstance(w, (Matmul, Convolution)):
            return (self.fp16 and self.ctx.coop and COOP_LOCAL[0] <= self.ctx.max_invocations
                    and all(g <= c for g, c in zip(self._coop_grid(), self.ctx.max_groups)))
        if isinstance(w, Convolution):
            if isinstance(choice, list) and choice[:1] == ["narrow"]:
                return (bool(w.narrow) and tuple(choice[1:]) in narrow_conv.SHAPES
                        and narrow_conv.X * choice[1] * choice[2] <= self.ctx.max_invocations
                        and narrow_conv.work_groups(*w.narrow, choice[1]) <= self.ctx.max_groups[0])
            if not (isinstance(choice, list) and len(choice) == 4 and choice[0] in ("gemm", "greg")
                    and tuple(choice[1:3]) in (CONV_TILES if choice[0] == "gemm" else tuple(CONV_REG_TILES))
                    and choice[3] in CONV_SPLITS):
                return False
            bm, bn, s = choice[1:]
            wx, wy = CONV_REG_TILES[(bm, bn)] if choice[0] == "greg" else (bn // 4, bm // 4)
            groups = (-(-w.n // bn), -(-w.m // bm), w.groups * s)
            return (s <= w.splits and wx * wy <= self.ctx.max_invocations
                    and all(g <= c for g, c in zip(groups, self.ctx.max_groups)))
        if choice == "tiled":
            return self.ctx.max_invocations >= 256
        if isinstance(choice, list) and len(choice) == 3 and choice[0] == "reg":
            tile = tuple(choice[1:])
            if tile not in REG_TILES:
                return False
            wx, wy = REG_TILES[tile]
            groups = (-(-w.n // tile[1]), -(-w.m // tile[0]), w.batch)
            return wx * wy <= self.ctx.max_invocations and all(g <= c for g, c in zip(groups, self.ctx.max_groups))
        if isinstance(choice, list) and len(choice) == 3 and choice[0] == "small":
            if tuple(choice[1:]) not in SMALL_SHAPES or choice[1] * choice[2] > self.ctx.max_invocations:
                return False
            return self._small_groups(choice[1]) <= self.ctx.max_groups[0] and w.batch <= self.ctx.max_groups[2]
        return (isinstance(choice, list) and len(choice) == 2 and choice[0] == "direct"
                and isinstance(choice[1], int) and not isinstance(choice[1], bool)
                and 1 <= choice[1] and choice[1] * choice[1] <= self.ctx.max_invocations)

    def resolve(self, choice: Any) -> tuple[str, tuple[int, int, int], tuple[int, int, int]]:
        """(kernel, workgroup size, group counts) for a choice (the default where it is not valid)."""
        if choice is None or not self.valid(choice):
            choice = self.default()
        w = self.work
        cap = self.ctx.max_groups
        if isinstance(w, Grid):
            return self.kernel, (choice, 1, 1), (max(1, min(-(-w.n // choice), cap[0], 65535)), 1, 1)
        if isinstance(w, Blocks):
            return self.kernel, (w.local, 1, 1), (w.n, 1, 1)
        if isinstance(w, Rows):
            x = max(1, min(w.n, cap[0], 65535))
            return self.kernel, (choice, 1, 1), (x, -(-w.n // x), 1)
        if isinstance(w, Convolution):
            if choice[0] == "narrow":
                groups = narrow_conv.work_groups(*w.narrow, choice[1])
                return "conv_narrow", (narrow_conv.X, choice[1], choice[2]), (groups, 1, 1)
            if choice == ["coop"]:
                return "conv_coop", COOP_LOCAL, self._coop_grid()
            bm, bn, s = choice[1:]
            groups = (-(-w.n // bn), -(-w.m // bm), w.groups * s)
            if choice[0] == "greg":
                return conv_reg_kernel((bm, bn)), (*CONV_REG_TILES[(bm, bn)], 1), groups
            return "conv_gemm", (bn // 4, bm // 4, 1), groups
        if choice == "tiled":
            return "matmul", (16, 16, 1), (-(-w.n // 64), -(-w.m // 64), w.batch)
        if choice == ["coop"]:
            return "matmul_coop", COOP_LOCAL, self._coop_grid()
        if choice[0] == "reg":
            tm, tn = choice[1:]
            wx, wy = REG_TILES[(tm, tn)]
            return reg_kernel((tm, tn)), (wx, wy, 1), (-(-w.n // tn), -(-w.m // tm), w.batch)
        if choice[0] == "small":
            return "matmul_small", (choice[1], choice[2], 1), (self._small_groups(choice[1]), 1, w.batch)
        s = choice[1]
        return "matmul_direct", (s, s, 1), (-(-w.n // (4 * s)), -(-w.m // (4 * s)), w.batch)

    def _conv_split(self, kind: str, tile: tuple[int, int]) -> int:
        """How many ways a conv_gemm tile ("gemm" or "greg") splits the sum by default: doubled while the grid
        has fewer than CONV_BUSY workgroups and each slice stays at least CONV_SLICE deep."""
        w = self.work
        tiles = -(-w.m // tile[0]) * -(-w.n // tile[1]) * w.groups
        s = 1
        while tiles * s < CONV_BUSY and 2 * s * CONV_SLICE <= w.k and self.valid([kind, *tile, 2 * s]):
            s *= 2
        return s

    def _conv_fill(self, tile: tuple[int, int]) -> float:
        """The share of a conv_gemm tile grid's outputs that fall inside the convolution's."""
        w = self.work
        return w.m * w.n / (-(-w.m // tile[0]) * tile[0] * -(-w.n // tile[1]) * tile[1])

    def _conv_rank(self, tile: tuple[int, int], split: int) -> tuple:
        """How well a register-blocked tile fits a convolution, larger first: the share of its rows inside the
        output channels; then its workgroups (split `split` ways) up to CONV_BUSY, as fuller grids keep more of a
        large GPU busy; then its size, as larger tiles read each input fewer times."""
        w = self.work
        rows = -(-w.m // tile[0])
        groups = rows * -(-w.n // tile[1]) * w.groups * split
        return w.m / (rows * tile[0]), min(groups, CONV_BUSY), tile[0] * tile[1]

    def _reg_fits(self, tile: tuple[int, int]) -> bool:
        """Whether a register-blocked tile makes REG_BUSY workgroups or more, at least half of its outputs in the
        matrix; the 64 x 64 one always (the default tile's grid, fewer shared-memory reads)."""
        if tile == (64, 64):
            return True
        w = self.work
        gm, gn = -(-w.m // tile[0]), -(-w.n // tile[1])
        return gm * gn * w.batch >= REG_BUSY and 2 * w.m * w.n >= gm * gn * tile[0] * tile[1]

    def _small_groups(self, lx: int) -> int:
        """matmul_small's workgroups per batch entry: each invocation along x takes 4 rows of one column."""
        w = self.work
        return -(-(-(-w.m // 4) * w.n) // lx)
