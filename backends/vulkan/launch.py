"""How a dispatch covers its work, and the workgroup sizes tuning may choose from.

Work says what a kernel iterates over:
  Grid(n)        a grid-stride loop over n items (elementwise, conv, pool, copy, resize);
  Rows(n, l)     one workgroup per row, l invocations reducing it (reduce, softmax, layernorm);
  Matmul(m,n,b)  a batch of m x n outputs: the tiled shared-memory kernel, or the direct one.
  Convolution    a convolution: the implicit-GEMM kernel with a tile shape, or the direct one.

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

from .device import KERNEL_BINDINGS, SHADER_DIR

if TYPE_CHECKING:
    from .device import Context
    from .memory import Loc


class Work:
    pass


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


@dataclass(frozen=True)
class Convolution(Work):
    m: int       # output channels per group: the GEMM's rows
    n: int       # output pixels of all images: its columns
    k: int       # input channels per group x kernel taps: its depth
    groups: int
    direct: int  # invocations of the direct kernel (4 output channels of one pixel each)


KERNEL_BINDINGS.setdefault("conv_gemm", 4)  # as conv


@lru_cache(maxsize=None)
def shader_hash(kernel: str) -> str:
    """A short hash of a kernel's built SPIR-V (both variants), from the shader manifest."""
    try:
        files = json.loads((SHADER_DIR / "manifest.json").read_text()).get("files", {})
    except (OSError, ValueError):
        return "unknown"
    text = f"{files.get(kernel + '.spv', {}).get('spv')}|{files.get(kernel + '_fp16.spv', {}).get('spv')}"
    return hashlib.sha1(text.encode()).hexdigest()[:10]


GRID_SIZES = (64, 128, 256, 32, 512, 16, 1024)
ROW_SIZES = (64, 128, 256, 32)
#: conv_gemm's tiles, (output channels, pixels): the workgroup is (pixels / 4, channels / 4).
CONV_TILES = ((64, 64), (32, 64), (64, 32), (32, 32), (16, 64), (128, 64), (64, 128), (32, 128), (16, 128),
              (128, 32))
#: The implicit GEMM needs this deep a sum to beat the direct kernel (the first layers' 3 x 3 x 3 is about even).
CONV_GEMM_MIN_K = 27
#: Nor is it for fewer output channels per group than this (depthwise convolutions have one).
CONV_GEMM_MIN_M = 8
#: Without tuning, tiles shrink until a convolution has this many workgroups (a few per multiprocessor).
CONV_GEMM_MIN_GROUPS = 256


class Launch:
    __slots__ = ("ctx", "kernel", "fp16", "consts", "push", "work", "locs", "key")

    def __init__(self, ctx: "Context", kernel: str, fp16: bool, consts: tuple[int, ...], push: bytes, work: Work,
                 locs: list["Loc"]):
        self.ctx, self.kernel, self.fp16, self.consts = ctx, kernel, fp16, tuple(consts)
        self.push, self.work, self.locs = push, work, locs
        digest = hashlib.sha1(push).hexdigest()[:16]
        built = shader_hash(kernel) + ("+" + shader_hash("conv_gemm") if isinstance(work, Convolution) else "")
        self.key = (f"vulkan/{kernel}@{built}|{'f16' if fp16 else 'f32'}|{list(self.consts)}"
                    f"|{type(work).__name__}{list(vars(work).values())}|{digest}")

    @property
    def tunable(self) -> bool:
        return len(self.choices(8)) > 1

    def default(self) -> Any:
        w = self.work
        if isinstance(w, Rows):
            return w.local
        if isinstance(w, Matmul):
            # Workgroup barriers are dear on CPU implementations (lavapipe): there the direct kernel is the default.
            return "tiled" if self.ctx.info.is_gpu else ["direct", 8]
        if isinstance(w, Convolution):
            return self.conv_default()
        return 64

    def conv_default(self) -> Any:
        """The implicit GEMM for deep enough sums, with the largest tile that keeps the GPU busy; else direct."""
        w = self.work
        if w.k < CONV_GEMM_MIN_K or w.m < CONV_GEMM_MIN_M:
            return 64
        bm = 16 if w.m <= 16 else 32 if w.m <= 32 else 64
        best = None
        for bn in (64, 32):
            for m in (bm, 32, 16):
                c = ["gemm", min(m, bm), bn]
                if self.valid(c):
                    best = best or c
                    if -(-w.m // c[1]) * -(-w.n // bn) * w.groups >= CONV_GEMM_MIN_GROUPS:
                        return c
        return best or 64

    def choices(self, limit: int) -> list[Any]:
        w = self.work
        if isinstance(w, (Grid, Convolution)):
            n = w.direct if isinstance(w, Convolution) else w.n
            top = max(64, min(1 << (max(n, 1) - 1).bit_length(), self.ctx.max_invocations))
            options = [s for s in GRID_SIZES if s <= top]
            if isinstance(w, Convolution):
                options = [["gemm", bm, bn] for bm, bn in CONV_TILES] + options
        elif isinstance(w, Rows):
            options = list(ROW_SIZES)
        else:
            options = ["tiled", ["direct", 8], ["direct", 16], ["direct", 4]]
        default = self.default()
        ordered = [default] + [o for o in options if o != default]
        return [o for o in ordered if self.valid(o)][:max(1, limit)]

    def valid(self, choice: Any) -> bool:
        w = self.work
        if isinstance(w, Convolution) and isinstance(choice, list):
            if len(choice) != 3 or choice[0] != "gemm" or tuple(choice[1:]) not in CONV_TILES:
                return False
            bm, bn = choice[1:]
            groups = (-(-w.n // bn), -(-w.m // bm), w.groups)
            return (w.m >= CONV_GEMM_MIN_M and bm * bn // 16 <= self.ctx.max_invocations
                    and all(g <= c for g, c in zip(groups, self.ctx.max_groups)))
        if isinstance(w, (Grid, Rows, Convolution)):
            if not isinstance(choice, int) or isinstance(choice, bool) or choice < 1:
                return False
            if choice & (choice - 1) or choice > self.ctx.max_invocations:
                return False
            return choice <= 256 if isinstance(w, Rows) else True
        if choice == "tiled":
            return self.ctx.max_invocations >= 256
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
        if isinstance(w, Rows):
            x = max(1, min(w.n, cap[0], 65535))
            return self.kernel, (choice, 1, 1), (x, -(-w.n // x), 1)
        if isinstance(w, Convolution):
            if isinstance(choice, int):
                return "conv", (choice, 1, 1), (max(1, min(-(-w.direct // choice), cap[0], 65535)), 1, 1)
            bm, bn = choice[1:]
            return "conv_gemm", (bn // 4, bm // 4, 1), (-(-w.n // bn), -(-w.m // bm), w.groups)
        if choice == "tiled":
            return "matmul", (16, 16, 1), (-(-w.n // 64), -(-w.m // 64), w.batch)
        s = choice[1]
        return "matmul_direct", (s, s, 1), (-(-w.n // (4 * s)), -(-w.m // (4 * s)), w.batch)
