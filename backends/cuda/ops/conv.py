"""Conv, and ConvBase, what it shares with ConvTranspose (conv_transpose.py).

Conv algorithms:
- "gemm": a 1x1 stride-1 unpadded conv is a GEMM of the weights with the input.
- "im2col": other group-1 convs unfold the input into scratch, then one GEMM.
- "direct": grouped and depthwise convs are computed inline, in the fused
  kernel of their epilogue, one output element per thread.
- "igemm", "igemm32", "igemm32x128": an implicit GEMM, tiled 64x64, 32x32 or 32x128
  (output channels by output pixels), that gathers input patches into shared memory as it goes
  (no im2col buffer) and runs the epilogue on its accumulators: one kernel.
  Where there are few tiles, K is split into slices that run on other SMs
  (split_k).
- "narrow" (conv_narrow.py): convs of few output channels (at most NARROW_CO)
  on large maps; each thread computes every output channel for a few pixels.
- "mma", "mma_k64", "mma64x128", "mma32x128" (conv_mma.py), with fp16 storage only: the implicit GEMM on
  tensor cores (PTX mma.sync, f16 products, f32 sums), with the same epilogue and split K.
The cuBLAS algorithms write the raw product into the output buffer; bias,
activation and any elementwise chain that follows run in one fused kernel.
"""

from __future__ import annotations

import math
import os

import cupy
import numpy as np

from aiomnn.window import window_params

from .. import kernels
from ..fused import Expr, Inline, Raw, Val
from ..program import launcher
from .base import CudaOp, Decline, check_tensors, float_inputs, op
from .conv_mma import MMA_TILES, mma_code, mma_threads, pack_weights
from .conv_mma import ENABLED as MMA_ENABLED
from .conv_narrow import NARROW_PIXELS, narrow_bounds, narrow_channels, narrow_code, narrow_launch
from .elementwise import activation
from .matmul import gemm_fn

#: Force a conv algorithm (for tests): "gemm", "im2col", "direct", "igemm", "igemm32", "igemm32x128", "narrow",
#: or, with fp16 storage, one of conv_mma.MMA_TILES (in fp32 a forced one of these is ignored).
FORCE_ALGO: str | None = None
#: Group-1 convs with at most this many multiply-adds run "direct": one fused kernel
#: instead of im2col, GEMM and epilogue, which for small convs costs less than the launches.
DIRECT_MACS = int(os.environ.get("AIOMNN_CUDA_DIRECT_MACS", 1 << 20))
#: The implicit GEMM's tiles, by algorithm: (output channels, output pixels) per block.
#: 32x128 suits convs of few output channels on large maps (det's 96 -> 24 3x3 convs at 160x160,
#: where a 64-channel tile computes 40 channels of zeros).
TILES = {"igemm": (64, 64), "igemm32": (32, 32), "igemm32x128": (32, 128)}
#: The implicit GEMM's K per step (staged in shared memory).
BK = 32
#: Larger convs with at least this many output pixels (batch included) start as "igemm" before
#: tuning: its 64x64 tiles fill the GPU there, and it writes no im2col buffer.
IGEMM_PIXELS = 1024
#: Such convs with at most this many output channels start as "igemm32x128" and may run "narrow".
NARROW_CO = int(os.environ.get("AIOMNN_CUDA_NARROW_CO", 32))


def tile_shape(algo: str) -> tuple[int, int]:
    """An implicit GEMM's block tile: (output channels, output pixels)."""
    return TILES[algo] if algo in TILES else MMA_TILES[algo][:2]


def conv_choices(node, x_shape, w_shape, out_shape, half: bool) -> tuple[str, list[str]]:
    """A conv's tuning key and its algorithms, the heuristic's pick first.

    With fp16 storage the tensor-core implicit GEMMs (conv_mma.py) join: first where the scalar one would be
    picked, second or later elsewhere, so that tuning may pick them."""
    kernel, strides, dils, pads = window_params(node, x_shape, node.attrs.get("kernel_shape", w_shape[2:]))
    g = int(node.attrs.get("group", 1))
    key = (f"conv x{tuple(x_shape)} w{tuple(w_shape)} k{list(kernel)} s{list(strides)} d{list(dils)} "
           f"p{list(pads)} g{g} {'fp16' if half else 'fp32'}")
    if g > 1:
        return key, ["direct"]
    pointwise = list(kernel) == [1, 1] and list(strides) == [1, 1] and not any(pads)
    pixels = x_shape[0] * math.prod(out_shape[2:])
    macs = pixels * w_shape[0] * x_shape[1] * math.prod(kernel)
    blas = "gemm" if pointwise else "im2col"
    mma = half and MMA_ENABLED
    if macs <= DIRECT_MACS:
        return key, ["direct", blas, "igemm32", "igemm"] + (["mma"] if mma else [])
    if pixels >= IGEMM_PIXELS:
        if w_shape[0] <= NARROW_CO:
            small = ["mma32x128"] if mma else []
            if not narrow_channels(w_shape[0], kernel, strides, dils):
                return key, ["igemm32x128", *small, "igemm", blas, "igemm32", "direct"]
            if pixels >= NARROW_PIXELS:
                return key, ["narrow", *small, "igemm32x128", "igemm", blas, "igemm32", "direct"]
            return key, ["igemm32x128", *small, "narrow", "igemm", blas, "igemm32", "direct"]
        if mma:
            return key, ["mma", "mma_k64", "mma64x128", "mma32x128", "igemm", blas, "igemm32", "igemm32x128",
                         "direct"]
        return key, ["igemm", blas, "igemm32", "igemm32x128", "direct"]
    return key, [blas, *(["mma"] if mma else []), "igemm32", "igemm", "igemm32x128", "direct"]


class ConvBase(CudaOp):
    """What Conv and ConvTranspose (conv_transpose.py) share: the checks on their inputs and the epilogue."""

    def _common(self, ins, outs):
        check_tensors(ins, outs)
        if not float_inputs(ins):
            raise Decline("float32 only")
        x, w = ins[0], ins[1]
        if len(x.shape) != 4:
            raise Decline("only 2-D convolutions")
        if not w.is_const:
            raise Decline("runtime weights")
        self.bias = ins[2] if len(ins) > 2 and ins[2] is not None else None
        if self.bias is not None and not self.bias.is_const:
            raise Decline("runtime bias")
        self.group_count = int(self.attrs.get("group", 1))

    def epilogue(self, leaf, channels: int):
        root = leaf
        if self.bias is not None:
            root = Expr("Add", (root, Val(self.bias.name, (1, channels, 1, 1))))
        return activation(root, self.attrs.get("_activation"))


@op("Conv")
class Conv(ConvBase):
    absorbable = True

    def __init__(self, be, node, ins, outs):
        super().__init__(be, node, ins, outs)
        self._common(ins, outs)
        x, w = ins[0], ins[1]
        kernel, strides, dils, pads = window_params(node, x.shape, self.attrs.get("kernel_shape", w.shape[2:]))
        self.kernel, self.strides, self.dils, self.pads = kernel, strides, dils, pads
        n, ci, h, wd = x.shape
        co = w.shape[0]
        g = self.group_count
        if ci % g or co % g or w.shape[1] != ci // g:
            raise Decline("group does not divide the channels")
        key, algos = conv_choices(node, x.shape, w.shape, self.out_shape, be.half)
        forced = self.attrs.get("_algo") or FORCE_ALGO  # "_algo": a tuning candidate
        if g > 1:
            self.algo = "direct"
        elif forced in ("direct", "im2col", *TILES) or (forced in MMA_TILES and be.half) or (
                forced == "narrow" and narrow_channels(co, kernel, strides, dils)):
            self.algo = forced
        elif forced == "gemm":  # the GEMM family: a plain GEMM where the conv is one
            self.algo = "gemm" if "gemm" in algos else "im2col"
        else:
            self.algo = be.rt.tuned(key, algos)
        self.igemm = self.algo in TILES or self.algo in MMA_TILES  # an implicit GEMM: tiles, split K
        self.tiled = self.igemm or self.algo == "narrow"
        self.group = self.epilogue(Inline(self) if self.algo == "direct" or self.tiled else Raw(self), co)
        self.splits, self.k_split = self.split_k() if self.igemm else (1, 0)

    def split_k(self) -> tuple[int, int]:
        """The implicit GEMM's slices of K, and the K of each (a multiple of its K per step, k_step).

        With few tiles most SMs idle while each tile walks all of K (a 3x3 conv at 20x20 with 64
        output channels is 7 tiles of 64x64 with K = 1152). Slices of K run as blocks of their own;
        the last to finish a tile sums the partial tiles in slice order (so the result does not
        depend on timing) and runs the epilogue. That block reads one partial tile per slice, so
        the slices stay near 2 * sqrt(steps of K), and no more than fill the GPU twice.
        """
        bk = self.k_step()
        steps = -(-self.k_total() // bk)
        s = max(1, min(steps, -(-2 * self.be.rt.sm_count // self.tiles()), round(2 * math.sqrt(steps))))
        ks = -(-steps // s) * bk
        return -(-self.k_total() // ks), ks

    def k_step(self) -> int:
        """The implicit GEMM's K per step: the slices of K start on steps (the mma weights are packed by step)."""
        return MMA_TILES[self.algo][2] if self.algo in MMA_TILES else BK

    def by_taps(self) -> bool:
        """Whether the implicit GEMM's K runs tap by tap (k = (ky * KW + kx) * C + c) rather than channel by channel:
        where the input's channels fill whole steps, a step then lies in one tap, so a thread tests its pixel's
        bounds once a step and reads its values at one stride, with no index arithmetic a value. (Channel by
        channel, the gather decoded and tested every value: on det's 96 -> 24 3x3 convs at 160 x 160 that was
        most of a tensor-core kernel's instructions.)"""
        kh, kw = self.kernel
        implicit = self.algo in TILES or self.algo in MMA_TILES  # "narrow" reads K channel by channel
        return implicit and self.in_shape(0)[1] % self.k_step() == 0 and kh * kw <= 32

    def k_total(self) -> int:
        return self.in_shape(0)[1] * self.kernel[0] * self.kernel[1]

    def tiles(self) -> int:
        bm, bn = tile_shape(self.algo)
        n, co, oh, ow = self.out_shape
        return -(-co // bm) * -(-(n * oh * ow) // bn)

    def workspace_bytes(self):
        if self.splits == 1:
            return 0
        bm, bn = tile_shape(self.algo)
        return self.tiles() * self.splits * bm * bn * 4

    def scratch_bytes(self):
        if self.algo != "im2col":
            return 0
        n, ci = self.in_shape(0)[:2]
        k = ci * self.kernel[0] * self.kernel[1]
        p = self.out_shape[2] * self.out_shape[3]
        return n * k * p * self.be.t_dtype.itemsize

    def bind(self, plan):
        if self.algo == "direct" or self.tiled:
            return
        be = self.be
        n, ci, h, w = self.in_shape(0)
        _, co, oh, ow = self.out_shape
        p = oh * ow
        if n * co * p == 0:
            return
        x, y = plan.view(self.in_names[0]), plan.view(self.out_names[0])
        wt = plan.view(self.in_names[1])
        if self.algo == "gemm":
            self.launches = [gemm_fn(be, False, False, co, p, ci, wt, ci, 0, x, p, ci * p, y, p, co * p, n)]
            return
        kh, kw = self.kernel
        k = ci * kh * kw
        col = plan.scratch(self, be.t_dtype, n * k * p)
        meta = [n, ci, h, w, oh, ow, kh, kw, self.strides[0], self.strides[1], self.pads[0], self.pads[1],
                self.dils[0], self.dils[1]]
        im2col = be.rt.programs.kernel(kernels.constants(kernels.IM2COL, meta), be.half, "im2col")
        total = n * k * p
        self.launches = [launcher(im2col, total, (x, col, np.uint32(total))),
                         gemm_fn(be, False, False, co, p, k, wt, k, 0, col, p, k * p, y, p, co * p, n)]

    # The direct algorithm, inline in the fused kernel; the implicit GEMM, around it.
    def inline_deps(self):
        return [self.in_names[0]]

    def inline_ptrs(self, plan):
        x = plan.view(self.in_names[0])
        if not self.tiled:
            return [x, plan.view(self.in_names[1])]
        wt = plan.view(self.be.derived(self.node, *self.gemm_weights(self.const(1))))
        if self.splits == 1:
            return [x, wt]
        bm, bn = tile_shape(self.algo)
        # Per tile, how many slices have finished; the last one resets it, ready for the next run.
        counters = cupy.zeros((self.tiles(),), np.uint32)
        self.keep.append(counters)
        return [x, wt, plan.workspace(np.float32, self.tiles() * self.splits * bm * bn), counters]

    def gemm_weights(self, w: np.ndarray) -> tuple[str, np.ndarray]:
        """The implicit GEMM's weights as its kernel reads them, and their name among the backend's derived
        constants: K in the gather's order (by_taps), then packed per tile and step of K for the tensor cores
        (conv_mma.pack_weights), else as [K][CO], so that a tile's loads are coalesced."""
        order = ""
        if self.by_taps():  # K as (ky, kx, c)
            w, order = w.transpose(0, 2, 3, 1), "t"
        if self.algo in MMA_TILES:
            bm, _, bk = MMA_TILES[self.algo]
            return f"weights_mma{bm}x{bk}{order}", pack_weights(w, bm, bk)
        return f"weights_kxco{order}", np.ascontiguousarray(w.reshape(w.shape[0], -1).T)

    def inline_types(self):
        if self.splits == 1:
            return None
        return ["const T* __restrict__", "const T* __restrict__", "float*", "unsigned*"]  # partials, counters

    def inline_meta(self):
        n, ci, h, w = self.in_shape(0)
        co, oh, ow = self.out_shape[1:]
        if self.tiled:
            return [ci, h, w, self.pads[0], self.pads[1], co, oh, ow, n * oh * ow, self.k_total(), self.splits,
                    self.k_split]
        g = self.group_count
        return [ci, h, w, self.pads[0], self.pads[1], ci // g, co // g]

    def launch_shape(self) -> tuple[int, int]:
        """The implicit GEMM's grid and block: one block per tile and slice of K, one thread per 4x4 outputs.
        The narrow algorithm's: one block per image and tile of output rows and columns."""
        if self.algo == "narrow":
            return narrow_launch(self.out_shape)
        if self.algo in MMA_TILES:
            return self.tiles() * self.splits, mma_threads(self.algo)
        bm, bn = TILES[self.algo]
        return self.tiles() * self.splits, bm * bn // 16

    def launch_bounds(self) -> str:
        if self.algo in MMA_TILES:
            return f"__launch_bounds__({mma_threads(self.algo)})"
        return narrow_bounds(self.out_shape) if self.algo == "narrow" else ""

    def tiled_code(self, ptrs: list[str], at: int, epi: str) -> str:
        """The implicit GEMM's kernel body; `epi(i, acc)` stores output element i from its accumulator.

        Each thread stages one column of the weight tile and one of the patch tile (so it decodes
        its output pixel once), loading the next k-step into registers while it multiplies the
        current one from shared memory. Names start with `g_`: the kernel's parameters are p0, q1_0...
        A block runs one slice of K (split_k); its tile is blockIdx.x / slices.
        """
        if self.algo == "narrow":
            return narrow_code(self, ptrs, epi)
        if self.algo in MMA_TILES:
            return mma_code(self, ptrs, at, epi)
        bm, bn = TILES[self.algo]
        nt, bk = bm * bn // 16, BK
        ra, rb = bk * bm // nt, bk * bn // nt  # values each thread stages per k-step
        sh, sw = self.strides
        x, w = ptrs[:2]
        return f"""  const int* g_q = m + {at};
  const int g_C = g_q[0], g_H = g_q[1], g_W = g_q[2], g_CO = g_q[5], g_OW = g_q[7];
  const unsigned g_NP = g_q[8], g_OHW = g_q[6] * g_OW, g_S = g_q[10];
  __shared__ __align__(16) float g_A[{bk}][{bm}];  // weights: [k][output channel]
  __shared__ __align__(16) float g_B[{bk}][{bn}];  // input patches: [k][output pixel]
  const unsigned g_tid = threadIdx.x, g_tiles = (g_NP + {bn - 1}) / {bn}, g_tile = blockIdx.x / g_S;
  const unsigned g_p0 = (g_tile % g_tiles) * {bn}, g_c0 = (g_tile / g_tiles) * {bm};
  const unsigned g_k0 = blockIdx.x % g_S * (unsigned)g_q[11], g_K = min((unsigned)g_q[9], g_k0 + g_q[11]);
  const unsigned g_ac = g_tid % {bm}, g_ar = g_tid / {bm}, g_bc = g_tid % {bn}, g_br = g_tid / {bn};
  const unsigned g_pp = g_p0 + g_bc;
  const bool g_pin = g_pp < g_NP, g_ain = g_c0 + g_ac < (unsigned)g_CO;
  const unsigned g_pr = g_pin ? g_pp % g_OHW : 0;
  const int g_iy0 = (int)(g_pr / g_OW) * {sh} - g_q[3], g_ix0 = (int)(g_pr % g_OW) * {sw} - g_q[4];
  const T* g_x = {x} + (size_t)(g_pin ? g_pp / g_OHW : 0) * g_C * g_H * g_W;
{self.taps_code() if self.by_taps() else ""}  float g_ra[{ra}], g_rb[{rb}];
  auto g_load = [&](unsigned k0) {{
    #pragma unroll
    for (int j = 0; j < {ra}; ++j) {{
      const unsigned k = k0 + g_ar + j * {nt // bm};
      g_ra[j] = (g_ain && k < g_K) ? LD({w}[(size_t)k * g_CO + g_c0 + g_ac]) : 0.f;
    }}
{self._gather_code(rb, nt // bn)}  }};
  float g_acc[4][4];
  #pragma unroll
  for (int i = 0; i < 4; ++i)
    #pragma unroll
    for (int j = 0; j < 4; ++j) g_acc[i][j] = 0.f;
  const unsigned g_ty = g_tid / {bn // 4}, g_tx = g_tid % {bn // 4};
  g_load(g_k0);
  for (unsigned k0 = g_k0; k0 < g_K; k0 += {bk}) {{
    #pragma unroll
    for (int j = 0; j < {ra}; ++j) g_A[g_ar + j * {nt // bm}][g_ac] = g_ra[j];
    #pragma unroll
    for (int j = 0; j < {rb}; ++j) g_B[g_br + j * {nt // bn}][g_bc] = g_rb[j];
    __syncthreads();
    if (k0 + {bk} < g_K) g_load(k0 + {bk});  // in flight while this step is multiplied
    #pragma unroll
    for (int kk = 0; kk < {bk}; ++kk) {{
      const float4 a = *reinterpret_cast<const float4*>(&g_A[kk][g_ty * 4]);
      const float4 b = *reinterpret_cast<const float4*>(&g_B[kk][g_tx * 4]);
      const float av[4] = {{a.x, a.y, a.z, a.w}}, bv[4] = {{b.x, b.y, b.z, b.w}};
      #pragma unroll
      for (int i = 0; i < 4; ++i)
        #pragma unroll
        for (int j = 0; j < 4; ++j) g_acc[i][j] += av[i] * bv[j];
    }}
    __syncthreads();
  }}
{self._reduce_code(ptrs) if self.splits > 1 else ""}  #pragma unroll
  for (int i = 0; i < 4; ++i) {{
    const unsigned co = g_c0 + g_ty * 4 + i;
    if (co >= (unsigned)g_CO) continue;
    #pragma unroll
    for (int j = 0; j < 4; ++j) {{
      const unsigned px = g_p0 + g_tx * 4 + j;
      if (px < g_NP) {epi}((px / g_OHW * g_CO + co) * g_OHW + px % g_OHW, g_acc[i][j]);
    }}
  }}
"""

    def taps_code(self) -> str:
        """By taps, the gather's start: which taps of this thread's pixel lie inside the input (bit t of g_ok)."""
        kh, kw = self.kernel
        dh, dw = self.dils
        return f"""  unsigned g_ok = 0u;
  #pragma unroll
  for (int t = 0; t < {kh * kw}; ++t) {{
    const int iy = g_iy0 + t / {kw} * {dh}, ix = g_ix0 + t % {kw} * {dw};
    if (g_pin && iy >= 0 && iy < g_H && ix >= 0 && ix < g_W) g_ok |= 1u << t;
  }}
"""

    def taps_gather(self, rb: str, n: int, first: str, rows: int, load: str) -> str:
        """By taps, the gather of one step from k0 into rb[0 .. n - 1]: channels k0 % C + first + j * rows of tap
        k0 / C (the step lies in one tap), through `load`; zeros where the tap falls outside the input."""
        kw = self.kernel[1]
        dh, dw = self.dils
        return f"""    const unsigned t = k0 / g_C;
    if (g_ok >> t & 1u) {{
      const T* src = g_x + (size_t)(k0 % g_C + {first}) * g_H * g_W + (g_iy0 + (int)(t / {kw}) * {dh}) * g_W + g_ix0
                     + (int)(t % {kw}) * {dw};
      #pragma unroll
      for (int j = 0; j < {n}; ++j) {rb}[j] = {load}(src[(size_t)j * {rows} * g_H * g_W]);
    }} else {{
      #pragma unroll
      for (int j = 0; j < {n}; ++j) {rb}[j] = 0;
    }}
"""

    def _gather_code(self, rb: int, rows: int) -> str:
        """The scalar implicit GEMM's gather of one step into g_rb, k = k0 + g_br + j * rows."""
        if self.by_taps():
            return self.taps_gather("g_rb", rb, "g_br", rows, "LD")
        kh, kw = self.kernel
        dh, dw = self.dils
        return f"""    #pragma unroll
    for (int j = 0; j < {rb}; ++j) {{
      const unsigned k = k0 + g_br + j * {rows};
      float v = 0.f;
      if (g_pin && k < g_K) {{
        const unsigned c = k / {kh * kw}, t = k % {kh * kw};
        const int iy = g_iy0 + (int)(t / {kw}) * {dh}, ix = g_ix0 + (int)(t % {kw}) * {dw};
        if (iy >= 0 && iy < g_H && ix >= 0 && ix < g_W) v = LD(g_x[((size_t)c * g_H + iy) * g_W + ix]);
      }}
      g_rb[j] = v;
    }}
"""

    def _reduce_code(self, ptrs: list[str]) -> str:
        """Split K: store this slice's partial tile; the tile's last slice sums them all in order."""
        bm, bn = TILES[self.algo]
        part, count = ptrs[2:]
        return f"""  float* g_part = {part} + (size_t)g_tile * g_S * {bm * bn} + (g_ty * 4) * {bn} + g_tx * 4;
  #pragma unroll
  for (int i = 0; i < 4; ++i)
    *reinterpret_cast<float4*>(g_part + (size_t)(blockIdx.x % g_S) * {bm * bn} + i * {bn}) =
        make_float4(g_acc[i][0], g_acc[i][1], g_acc[i][2], g_acc[i][3]);
{kernels.last_slice(count)}  #pragma unroll
  for (int i = 0; i < 4; ++i)
    #pragma unroll
    for (int j = 0; j < 4; ++j) g_acc[i][j] = 0.f;
  for (unsigned r = 0; r < g_S; ++r) {{
    #pragma unroll
    for (int i = 0; i < 4; ++i) {{
      const float4 v = __ldcg(reinterpret_cast<const float4*>(g_part + (size_t)r * {bm * bn} + i * {bn}));
      g_acc[i][0] += v.x; g_acc[i][1] += v.y; g_acc[i][2] += v.z; g_acc[i][3] += v.w;
    }}
  }}
  if (g_tid == 0) {count}[g_tile] = 0u;
"""

    def inline_code(self, v: str, ptrs: list[str], at: int) -> str:
        if self.tiled:
            return f"    const float {v} = acc;"
        kh, kw = self.kernel
        sh, sw = self.strides
        dh, dw = self.dils
        x, w = ptrs
        return f"""    float {v} = 0.f;
    {{
      const int* q = m + {at};
      const int CI = q[0], H = q[1], W = q[2], PH = q[3], PW = q[4], CIG = q[5], COG = q[6];
      const int g = (int)c1 / COG;
      const T* wp = {w} + (size_t)c1 * CIG * {kh * kw};
      for (int ci = 0; ci < CIG; ++ci) {{
        const T* xp = {x} + ((size_t)c0 * CI + g * CIG + ci) * H * W;
        #pragma unroll
        for (int ky = 0; ky < {kh}; ++ky) {{
          const int iy = (int)c2 * {sh} - PH + ky * {dh};
          if (iy < 0 || iy >= H) continue;
          #pragma unroll
          for (int kx = 0; kx < {kw}; ++kx) {{
            const int ix = (int)c3 * {sw} - PW + kx * {dw};
            if (ix < 0 || ix >= W) continue;
            {v} += LD(xp[iy * W + ix]) * LD(wp[(ci * {kh} + ky) * {kw} + kx]);
          }}
        }}
      }}
    }}"""
