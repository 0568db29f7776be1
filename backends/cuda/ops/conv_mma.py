"""Conv's tensor-core algorithms on CUDA (see conv.py): an implicit GEMM for fp16 storage (precision="low")
whose products run as PTX `mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32`, accumulating in f32.

The GEMM is out[co][p] = sum_k W[co][k] * X[k][p], k = (c * KH + ky) * KW + kx, p an output pixel (batch
included). A block computes a BM x BN tile (output channels by pixels) with BM * BN / 1024 warps, each a
32 x 32 part of it: 2 m16 by 4 n8 fragments. Per step of BK (32 or 64) along K it stages, as halves in shared
memory:
- A, the weights, [channel][k]: the weights are constants, so they are packed on the host at bind time
  (pack_weights) as one contiguous BM x BK block per tile and step, zero-padded to whole tiles and steps, and
  each thread copies 16-byte pieces with no bounds checks;
- B, the input patches, [pixel][k]: each thread decodes one output pixel once and gathers a run of
  consecutive k for it (zeros for padding, past K and past the last pixel), so its run is stored as 16-byte
  pieces too. Where the input's channels fill whole steps, K runs tap by tap: a step's run is then
  channels of one tap, its bounds tested once and its values read at one stride (Conv.by_taps).
Rows of both are BK + 8 halves long: the 8 rows a fragment load reads then fall in distinct banks.

The next step's global loads are in registers while this step multiplies, and the shared tiles are
double-buffered, so a step needs one barrier; each step waits once on those loads. (Kernels that copied the
weights, and a pointwise conv's input, straight to shared memory by cp.async, several steps in flight, ran no
faster on an H200: what limits these kernels is not the loads alone; on large maps the per-element epilogue weighs
as much.)

The accumulators are staged through shared memory as floats before the epilogue, so that consecutive threads
run `epi(i, acc)` on consecutive pixels of a channel: coalesced stores, and coalesced reads for whatever the
fused chain adds (a residual). Split K (Conv.split_k) stores each slice's accumulators to a workspace; the tile's
last slice sums them all in slice order, as the scalar implicit GEMM does.

Half storage only: in fp32 the scalar implicit GEMM keeps full precision (conv.py never offers these there).
The tuner times them against each other and cuBLAS (conv.py's "gemm", and "im2col" for 3x3 convs) per conv: they
win on few-channel convs over large maps and short K, cuBLAS on long K over few tiles.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numpy as np

from ..kernels import last_slice

if TYPE_CHECKING:
    from .conv import Conv

#: The tensor-core algorithms' tiles: (output channels, output pixels) per block, and K per step (BK), staged in
#: shared memory. 64x64 suits most convs; 64x128 halves the weight traffic per pixel where the maps are large;
#: 32x128 computes fewer channels of zeros for convs of at most 32 output channels. The gather of the input
#: waits on memory once per step, so "mma_k64" takes half as many steps (with twice the registers, and as much
#: shared memory as a static array may have, so only at 64x64).
MMA_TILES = {"mma": (64, 64, 32), "mma_k64": (64, 64, 64), "mma64x128": (64, 128, 32), "mma32x128": (32, 128, 32)}
#: Fragments are read from shared memory with ldmatrix (4 8x8 matrices per instruction); 0 reads them with
#: plain 32-bit loads instead (for comparison and debugging).
LDMATRIX = os.environ.get("AIOMNN_CUDA_MMA_LDMATRIX", "1") != "0"
#: AIOMNN_CUDA_MMA=0 stops conv.py from offering these algorithms (forcing one still works).
ENABLED = os.environ.get("AIOMNN_CUDA_MMA", "1") != "0"


def mma_threads(algo: str) -> int:
    bm, bn, _ = MMA_TILES[algo]
    return bm * bn // 32  # a warp per 32 x 32


def pack_weights(w: np.ndarray, bm: int, bk: int) -> np.ndarray:
    """The weights [CO][...] (K the rest, in the order the gather walks it) as [CO / BM][K / BK][BM][BK],
    zero-padded to whole tiles and steps: a block's A tile for one step is then one contiguous piece of BM * BK
    values."""
    co = w.shape[0]
    wm = w.reshape(co, -1)
    k = wm.shape[1]
    cop, kp = -(-co // bm) * bm, -(-k // bk) * bk
    out = np.zeros((cop, kp), np.float32)
    out[:co, :k] = wm
    return np.ascontiguousarray(out.reshape(cop // bm, bm, kp // bk, bk).transpose(0, 2, 1, 3))


def mma_smem(bm: int, bn: int, bk: int) -> int:
    """Bytes of shared memory: the double-buffered A and B tiles (rows of BK + 8 halves), or the float tile of
    the epilogue, which reuses them."""
    return max(2 * (bm + bn) * (bk + 8) * 2, bm * (bn + 8) * 4)


def _frag_a(bm: int, ld: int) -> str:
    # ldmatrix x4: lanes 8j..8j+7 give the row addresses of matrix j; each lane gets, per matrix, row lane / 4
    # and columns 2 * (lane % 4) + {0, 1}, which is the mma's fragment layout. For A, matrices 0..3 are
    # (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15): a0..a3.
    return f"""      #pragma unroll
      for (int mi = 0; mi < 2; ++mi) {{
        const unsigned at = g_sa + ((buf * {bm} + g_wm + mi * 16 + (g_lane & 15)) * {ld} + kk + (g_lane >> 4) * 8) * 2;
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {{%0, %1, %2, %3}}, [%4];"
                     : "=r"(a[mi][0]), "=r"(a[mi][1]), "=r"(a[mi][2]), "=r"(a[mi][3]) : "r"(at));
      }}
"""


def _frag_b(bn: int, ld: int) -> str:
    """B's fragments, stored [pixel][k], two n8 fragments per ldmatrix x4: matrices (pixels 0-7, k 0-7), (0-7,
    k 8-15), (8-15, k 0-7), (8-15, k 8-15): b0 b1 of the first, then of the second."""
    return f"""      #pragma unroll
      for (int nj = 0; nj < 2; ++nj) {{
        const unsigned at = g_sb + ((buf * {bn} + g_wn + nj * 16 + (g_lane & 7) + ((g_lane >> 4) << 3)) * {ld} + kk
                                    + ((g_lane >> 3) & 1) * 8) * 2;
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {{%0, %1, %2, %3}}, [%4];"
                     : "=r"(b[2 * nj][0]), "=r"(b[2 * nj][1]), "=r"(b[2 * nj + 1][0]), "=r"(b[2 * nj + 1][1])
                     : "r"(at));
      }}
"""


def _fragments(bm: int, bn: int, ld: int) -> str:
    """One k16 step's fragment loads for the warp's 2 x 4 fragments, from buffer `buf` at column kk."""
    if LDMATRIX:
        return _frag_a(bm, ld) + _frag_b(bn, ld)
    # Plain 32-bit loads of the same fragments: lane (g, t) = (lane / 4, lane % 4) holds A rows g and g + 8,
    # k 2t, 2t + 1 and 2t + 8, 2t + 9; B pixel g, the same k.
    w = ld // 2
    return f"""      const unsigned* sa = reinterpret_cast<const unsigned*>(&g_As[buf][0][0]) + kk / 2 + g_t;
      const unsigned* sb = reinterpret_cast<const unsigned*>(&g_Bs[buf][0][0]) + kk / 2 + g_t;
      #pragma unroll
      for (int mi = 0; mi < 2; ++mi) {{
        const unsigned r = g_wm + mi * 16 + g_g;
        a[mi][0] = sa[r * {w}]; a[mi][1] = sa[(r + 8) * {w}];
        a[mi][2] = sa[r * {w} + 4]; a[mi][3] = sa[(r + 8) * {w} + 4];
      }}
      #pragma unroll
      for (int ni = 0; ni < 4; ++ni) {{
        const unsigned r = g_wn + ni * 8 + g_g;
        b[ni][0] = sb[r * {w}]; b[ni][1] = sb[r * {w} + 4];
      }}
"""


def _head(at: int, bm: int, bn: int, smem: int, b_offset: int) -> str:
    """The kernel's start: its meta, shared memory (B's tiles at b_offset bytes), and where this thread, its
    warp and its block are in the tile, the tiles and K. A block runs one slice of K (split_k); its tile is
    blockIdx.x / slices."""
    return f"""  static_assert(sizeof(T) == 2, "the mma conv reads fp16 storage");
  const int* g_q = m + {at};
  const int g_C = g_q[0], g_H = g_q[1], g_W = g_q[2], g_CO = g_q[5], g_OW = g_q[7];
  const unsigned g_NP = g_q[8], g_OHW = g_q[6] * g_OW, g_S = g_q[10];
  __shared__ __align__(16) unsigned char g_sm[{smem}];
  unsigned g_sa;  // the shared-space address of g_sm, for ldmatrix
  asm("{{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }}" : "=r"(g_sa) : "l"((unsigned long long)g_sm));
  const unsigned g_sb = g_sa + {b_offset};
  const unsigned g_tid = threadIdx.x, g_lane = g_tid % 32, g_warp = g_tid / 32, g_g = g_lane / 4, g_t = g_lane % 4;
  const unsigned g_wm = g_warp / {bn // 32} * 32, g_wn = g_warp % {bn // 32} * 32;  // the warp's 32 x 32
  const unsigned g_tiles = (g_NP + {bn - 1}) / {bn}, g_tile = blockIdx.x / g_S;
  const unsigned g_tm = g_tile / g_tiles, g_p0 = (g_tile % g_tiles) * {bn}, g_c0 = g_tm * {bm};
  const unsigned g_k0 = blockIdx.x % g_S * (unsigned)g_q[11], g_K = min((unsigned)g_q[9], g_k0 + g_q[11]);
"""


def _gather_setup(conv: "Conv", x: str, bn: int, kpt: int) -> str:
    """The gather's per-thread start: it gathers k g_kb .. g_kb + kpt - 1 of each step for pixel g_p0 + g_bc."""
    sh, sw = conv.strides
    return f"""  const unsigned g_bc = g_tid % {bn}, g_kb = g_tid / {bn} * {kpt}, g_pp = g_p0 + g_bc;
  const bool g_pin = g_pp < g_NP;
  const unsigned g_pr = g_pin ? g_pp % g_OHW : 0;
  const int g_iy0 = (int)(g_pr / g_OW) * {sh} - g_q[3], g_ix0 = (int)(g_pr % g_OW) * {sw} - g_q[4];
  const T* g_x = {x} + (size_t)(g_pin ? g_pp / g_OHW : 0) * g_C * g_H * g_W;
""" + (conv.taps_code() if conv.by_taps() else "")


def _gather_body(conv: "Conv", rb: str, kpt: int) -> str:
    """The gather of one step's run into registers `rb`, for k from `k0`."""
    if conv.by_taps():
        return conv.taps_gather(rb, kpt, "g_kb", 1, "")
    kh, kw = conv.kernel
    dh, dw = conv.dils
    # A 1x1 kernel without padding reads inside the input at every k: no bounds test per value.
    inside = ("true" if (kh, kw) == (1, 1) and not any(conv.pads) else
              "iy >= 0 && iy < g_H && ix >= 0 && ix < g_W")
    return f"""    unsigned k = k0 + g_kb, c = k / {kh * kw};
    int ky = (int)(k % {kh * kw}) / {kw}, kx = (int)(k % {kh * kw}) % {kw};
    #pragma unroll
    for (int j = 0; j < {kpt}; ++j) {{
      T v = 0;
      if (g_pin && k + j < g_K) {{
        const int iy = g_iy0 + ky * {dh}, ix = g_ix0 + kx * {dw};
        if ({inside}) v = g_x[((size_t)c * g_H + iy) * g_W + ix];
      }}
      {rb}[j] = v;
      if (++kx == {kw}) {{ kx = 0; if (++ky == {kh}) {{ ky = 0; ++c; }} }}
    }}
"""


def _pack(rb: str) -> str:
    """Halves 8q .. 8q + 7 of `rb` (q the loop's piece) as the four words of a uint4."""
    return ", ".join(f"{rb}[8 * q + {2 * i}] | (unsigned){rb}[8 * q + {2 * i + 1}] << 16" for i in range(4))


def _mma_lambda(frags: str, bk: int) -> str:
    return f"""  float g_acc[2][4][4];  // [m16 fragment][n8 fragment][c0..c3]
  #pragma unroll
  for (int i = 0; i < 2; ++i)
    #pragma unroll
    for (int j = 0; j < 4; ++j)
      #pragma unroll
      for (int r = 0; r < 4; ++r) g_acc[i][j][r] = 0.f;
  auto g_mma = [&](unsigned buf) {{
    #pragma unroll
    for (int kk = 0; kk < {bk}; kk += 16) {{
      unsigned a[2][4], b[4][2];
{frags}      #pragma unroll
      for (int mi = 0; mi < 2; ++mi)
        #pragma unroll
        for (int ni = 0; ni < 4; ++ni)
          asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {{%0, %1, %2, %3}}, {{%4, %5, %6, %7}}, "
                       "{{%8, %9}}, {{%0, %1, %2, %3}};"
                       : "+f"(g_acc[mi][ni][0]), "+f"(g_acc[mi][ni][1]), "+f"(g_acc[mi][ni][2]), "+f"(g_acc[mi][ni][3])
                       : "r"(a[mi][0]), "r"(a[mi][1]), "r"(a[mi][2]), "r"(a[mi][3]), "r"(b[ni][0]), "r"(b[ni][1]));
    }}
  }};
"""


def _tail(conv: "Conv", ptrs: list[str], bm: int, bn: int, nt: int, epi: str) -> str:
    """The accumulators to the epilogue, after a barrier that ended the last step's reads of shared memory.

    Split K first: each slice stores its accumulators to the workspace as its threads hold them (float2 pieces,
    consecutive threads side by side), and the tile's last slice loads every slice's back into its registers
    and sums them in slice order: independent vector loads, where a sum per element through the float tile
    waited on one load after another. Then the accumulators go through shared memory as a float tile, so that
    consecutive threads run `epi(i, acc)` on consecutive pixels of a channel: each thread keeps one pixel (nt is
    a multiple of bn) and walks the channels, its output offset computed once."""
    assert nt % bn == 0, (nt, bn)
    code = ""
    if conv.splits > 1:
        part, count = ptrs[2:]
        pieces = [(mi, ni, h) for mi in range(2) for ni in range(4) for h in range(2)]
        stores = "\n".join(
            f"    g_mine[{j * nt}] = make_float2(g_acc[{mi}][{ni}][{2 * h}], g_acc[{mi}][{ni}][{2 * h + 1}]);"
            for j, (mi, ni, h) in enumerate(pieces))
        sums = "\n".join(
            f"      {{ const float2 v = __ldcg(src + {j * nt}); g_acc[{mi}][{ni}][{2 * h}] += v.x; "
            f"g_acc[{mi}][{ni}][{2 * h + 1}] += v.y; }}" for j, (mi, ni, h) in enumerate(pieces))
        code = f"""  // Split K: this slice's accumulators to the workspace; the tile's last slice sums them all in order.
  float2* g_part = reinterpret_cast<float2*>({part}) + (size_t)g_tile * g_S * {bm * bn // 2};
  {{
    float2* g_mine = g_part + (size_t)(blockIdx.x % g_S) * {bm * bn // 2} + g_tid;
{stores}
  }}
{last_slice(count)}  if (g_tid == 0) {count}[g_tile] = 0u;  // ready for the next run
  #pragma unroll
  for (int i = 0; i < 2; ++i)
    #pragma unroll
    for (int j = 0; j < 4; ++j)
      #pragma unroll
      for (int r = 0; r < 4; ++r) g_acc[i][j][r] = 0.f;
  for (unsigned r = 0; r < g_S; ++r) {{
    const float2* src = g_part + (size_t)r * {bm * bn // 2} + g_tid;
{sums}
  }}
"""
    return code + f"""  // The accumulators as a float tile [channel][pixel]: c0 c1 are row g, pixels 2t, 2t + 1; c2 c3 row g + 8.
  float (*g_Cs)[{bn + 8}] = reinterpret_cast<float (*)[{bn + 8}]>(g_sm);
  #pragma unroll
  for (int mi = 0; mi < 2; ++mi)
    #pragma unroll
    for (int ni = 0; ni < 4; ++ni) {{
      const unsigned r = g_wm + mi * 16 + g_g, col = g_wn + ni * 8 + 2 * g_t;
      *reinterpret_cast<float2*>(&g_Cs[r][col]) = make_float2(g_acc[mi][ni][0], g_acc[mi][ni][1]);
      *reinterpret_cast<float2*>(&g_Cs[r + 8][col]) = make_float2(g_acc[mi][ni][2], g_acc[mi][ni][3]);
    }}
  __syncthreads();
  const unsigned g_col = g_tid % {bn}, g_px = g_p0 + g_col;
  if (g_px < g_NP) {{
    const unsigned g_o = g_px / g_OHW * g_CO * g_OHW + g_px % g_OHW;  // channel 0 of this pixel in the output
    #pragma unroll 4
    for (unsigned r = g_tid / {bn}; r < {bm}; r += {nt // bn}) {{
      if (g_c0 + r >= (unsigned)g_CO) break;
      {epi}(g_o + (g_c0 + r) * g_OHW, g_Cs[r][g_col]);
    }}
  }}
"""


def mma_code(conv: "Conv", ptrs: list[str], at: int, epi: str) -> str:
    """The kernel body for `conv` (its algorithm one of MMA_TILES); `epi(i, acc)` stores output element i.
    Names start with `g_`: the kernel's parameters are p0, q1_0..."""
    bm, bn, bk = MMA_TILES[conv.algo]
    nt, ld = mma_threads(conv.algo), bk + 8
    aq = bm * bk // 8 // nt  # 16-byte pieces of the A tile each thread copies per step
    kpt = bk * bn // nt  # k of its pixel each thread gathers per step (a multiple of 8)
    assert aq >= 1 and kpt % 8 == 0, (bm, bn)
    assert conv.splits == 1 or conv.k_split % bk == 0, "slices of K start on a step of the packed weights"
    ksteps = -(-conv.k_total() // bk)
    x, w = ptrs[:2]
    body = _head(at, bm, bn, mma_smem(bm, bn, bk), 2 * bm * ld * 2)
    body += f"""  unsigned short (*g_As)[{bm}][{ld}] = reinterpret_cast<unsigned short (*)[{bm}][{ld}]>(g_sm);  // [buffer][channel][k]
  unsigned short (*g_Bs)[{bn}][{ld}] = reinterpret_cast<unsigned short (*)[{bn}][{ld}]>(g_sm + {2 * bm * ld * 2});  // [buffer][pixel][k]
{_gather_setup(conv, x, bn, kpt)}  const uint4* g_w = reinterpret_cast<const uint4*>({w}) + (size_t)g_tm * {ksteps * bm * bk // 8};
  uint4 g_ra[{aq}];
  T g_rb[{kpt}];
  auto g_load = [&](unsigned k0) {{
    #pragma unroll
    for (int j = 0; j < {aq}; ++j) g_ra[j] = g_w[(size_t)(k0 / {bk}) * {bm * bk // 8} + g_tid + j * {nt}];
{_gather_body(conv, "g_rb", kpt)}  }};
  auto g_store = [&](int buf) {{
    #pragma unroll
    for (int j = 0; j < {aq}; ++j) {{
      const unsigned e = g_tid + j * {nt};
      *reinterpret_cast<uint4*>(&g_As[buf][e / {bk // 8}][e % {bk // 8} * 8]) = g_ra[j];
    }}
    #pragma unroll
    for (int q = 0; q < {kpt // 8}; ++q)
      *reinterpret_cast<uint4*>(&g_Bs[buf][g_bc][g_kb + q * 8]) = make_uint4({_pack("g_rb")});
  }};
{_mma_lambda(_fragments(bm, bn, ld), bk)}  g_load(g_k0);
  g_store(0);
  __syncthreads();
  int g_buf = 0;
  for (unsigned k0 = g_k0; k0 < g_K; k0 += {bk}) {{
    const bool more = k0 + {bk} < g_K;
    if (more) g_load(k0 + {bk});  // in flight while this step multiplies
    g_mma(g_buf);
    if (more) g_store(g_buf ^ 1);  // the other buffer: last read a step ago, before the barrier
    __syncthreads();
    g_buf ^= 1;
  }}
"""
    return body + _tail(conv, ptrs, bm, bn, nt, epi)
