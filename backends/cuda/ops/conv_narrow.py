"""Conv's "narrow" algorithm on CUDA (see conv.py): convs of few output channels on large maps, like det's
96 -> 24 3x3 convs at 160x160. Each thread computes every output channel for a few pixels of a row, from
input rows and weights staged in shared memory: one input value feeds all the channels from a register, and
the tap's index needs no division (the implicit GEMM decodes every k of its sum, and its tiles have at least
32 channels).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiomnn.window import window_span

if TYPE_CHECKING:
    from .conv import Conv

#: The narrow algorithm's block: output rows, output columns and pixels of a row per thread. On det's
#: 96 -> 24 3x3 convs, 16 x 16 with 2 pixels a thread beat 8 x 16 blocks, 1 pixel a thread and 4 (which
#: hold 96 accumulators a thread), and all of them beat the implicit GEMM.
NARROW = (16, 16, 2)
#: Blocks of the narrow algorithm each SM holds at once (nvcc caps the registers to match: 128).
NARROW_BLOCKS = 4
#: The most shared memory (bytes) the narrow algorithm stages per block.
NARROW_SMEM = 40 << 10
#: Convs with at least this many output pixels (batch included) start as "narrow" before tuning: on det's
#: 96 -> 24 3x3 convs "igemm32x128" won at 8x40x40 output pixels and "narrow" at 1x160x160.
NARROW_PIXELS = 1 << 14


def narrow_channels(co: int, kernel, strides, dils) -> int:
    """Input channels the narrow algorithm stages per step (its input rows and their weights fit
    NARROW_SMEM), or 0 where even 4 do not fit."""
    th, tw, _ = NARROW
    ih, iw = window_span(th, kernel[0], strides[0], dils[0]), window_span(tw, kernel[1], strides[1], dils[1])
    per_channel = 4 * (ih * iw + kernel[0] * kernel[1] * -(-co // 4) * 4)
    return next((cb for cb in (16, 8, 4) if cb * per_channel <= NARROW_SMEM), 0)


def narrow_launch(out_shape) -> tuple[int, int]:
    """Grid and block: one block per image and tile of output rows and columns."""
    th, tw, px = NARROW
    n, _, oh, ow = out_shape
    return n * -(-oh // th) * -(-ow // tw), th * tw // px


def narrow_bounds(out_shape) -> str:
    return f"__launch_bounds__({narrow_launch(out_shape)[1]}, {NARROW_BLOCKS})"


def narrow_code(conv: "Conv", ptrs: list[str], epi: str) -> str:
    """The kernel body for `conv`; `epi(i, acc)` stores output element i. Per step, the block stages CB input
    channels of the rows its outputs read (zero outside the input) and their weights, [k][output channel];
    each thread then keeps a row's span of inputs in registers and, per tap, multiplies the tap's weights
    for every channel (read as float4, the same for all threads) into its pixels' accumulators."""
    th, tw, px = NARROW
    x, w = ptrs[:2]
    n, ci, h, wd = conv.in_shape(0)
    co, oh, ow = conv.out_shape[1:]
    kh, kw = conv.kernel
    sh, sw = conv.strides
    dh, dw = conv.dils
    cb = narrow_channels(co, conv.kernel, conv.strides, conv.dils)
    ih, iw, span = window_span(th, kh, sh, dh), window_span(tw, kw, sw, dw), window_span(px, kw, sw, dw)
    cop, taps = -(-co // 4) * 4, kh * kw
    ty, tx = -(-oh // th), -(-ow // tw)
    return f"""  __shared__ float g_xs[{cb}][{ih}][{iw}];
  __shared__ __align__(16) float g_ws[{cb * taps}][{cop}];
  const int g_tid = threadIdx.x, g_tx = g_tid % {tw // px}, g_ty = g_tid / {tw // px};
  const int g_bx = blockIdx.x % {tx}, g_by = blockIdx.x / {tx} % {ty}, g_n = blockIdx.x / {tx * ty};
  const int g_oy0 = g_by * {th}, g_ox0 = g_bx * {tw};
  const int g_iy0 = g_oy0 * {sh} - {conv.pads[0]}, g_ix0 = g_ox0 * {sw} - {conv.pads[1]};
  const T* g_x = {x} + (size_t)g_n * {ci * h * wd};
  float g_acc[{cop}][{px}];
  #pragma unroll
  for (int o = 0; o < {cop}; ++o)
    #pragma unroll
    for (int p = 0; p < {px}; ++p) g_acc[o][p] = 0.f;
  for (int c0 = 0; c0 < {ci}; c0 += {cb}) {{
    for (int e = g_tid; e < {cb * ih * iw}; e += {th * tw // px}) {{
      const int c = e / {ih * iw}, r = e % {ih * iw}, iy = g_iy0 + r / {iw}, ix = g_ix0 + r % {iw};
      float v = 0.f;
      if (c0 + c < {ci} && iy >= 0 && iy < {h} && ix >= 0 && ix < {wd})
        v = LD(g_x[((size_t)(c0 + c) * {h} + iy) * {wd} + ix]);
      g_xs[c][r / {iw}][r % {iw}] = v;
    }}
    for (int e = g_tid; e < {cb * taps * cop}; e += {th * tw // px}) {{
      const int r = e / {cop}, o = e % {cop}, k = c0 * {taps} + r;
      g_ws[r][o] = (o < {co} && k < {ci * taps}) ? LD({w}[(size_t)k * {co} + o]) : 0.f;
    }}
    __syncthreads();
    #pragma unroll 1
    for (int c = 0; c < {cb}; ++c) {{
      #pragma unroll
      for (int ky = 0; ky < {kh}; ++ky) {{
        float xr[{span}];
        #pragma unroll
        for (int j = 0; j < {span}; ++j) xr[j] = g_xs[c][g_ty * {sh} + ky * {dh}][g_tx * {px * sw} + j];
        #pragma unroll
        for (int kx = 0; kx < {kw}; ++kx) {{
          const float* wr = g_ws[(c * {kh} + ky) * {kw} + kx];
          #pragma unroll
          for (int o = 0; o < {cop}; o += 4) {{
            const float4 wv = *reinterpret_cast<const float4*>(wr + o);
            #pragma unroll
            for (int p = 0; p < {px}; ++p) {{
              const float xv = xr[p * {sw} + kx * {dw}];
              g_acc[o][p] += wv.x * xv; g_acc[o + 1][p] += wv.y * xv;
              g_acc[o + 2][p] += wv.z * xv; g_acc[o + 3][p] += wv.w * xv;
            }}
          }}
        }}
      }}
    }}
    __syncthreads();
  }}
  const int g_oy = g_oy0 + g_ty;
  if (g_oy < {oh}) {{
    #pragma unroll
    for (int o = 0; o < {co}; ++o)
      #pragma unroll
      for (int p = 0; p < {px}; ++p) {{
        const int ox = g_ox0 + g_tx * {px} + p;
        if (ox < {ow}) {epi}(((unsigned)(g_n * {co} + o) * {oh} + g_oy) * {ow} + ox, g_acc[o][p]);
      }}
  }}
"""
