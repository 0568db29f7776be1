"""Scaled dot-product attention as one CUDA kernel: the chain aiomnn/attention.py finds (MatMul(q, k^T), a scale,
a mask, Softmax, MatMul(., v), with the views around it read and written as strides and offsets), on that module's
tiling. The plan (plan.py) finds the chains before memory is planned: the chain's inner values (the scores, the
probabilities) get no memory, its other steps launch nothing, and its last step launches this kernel.

The tiles of q, k and v and the tile's probabilities are staged in shared memory as floats, whatever the storage.
A row group's CT lanes lie in one warp: a row's maximum and sum are shuffles among them, and the probabilities a
group writes only its own lanes read, so one tile needs two barriers.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Callable

import numpy as np

from aiomnn import attention
from aiomnn.offered import Steps

from .program import launcher

if TYPE_CHECKING:
    from .plan import Plan

#: The static shared memory a block may have.
SHARED = 48 * 1024
NT = attention.THREADS


def choose(ch: attention.Chain, sms: int) -> attention.Tiling | None:
    return attention.tiling(ch, sms, SHARED)


def find(plan: Plan) -> dict[int, attention.Chain]:
    """The attention chains among the plan's steps that the kernel takes, by their last step.
    AIOMNN_CUDA_ATTENTION=0 finds none (the ops then run one by one), for comparison and debugging."""
    if os.environ.get("AIOMNN_CUDA_ATTENTION", "1") == "0":
        return {}
    tensors = plan.tensors
    st = Steps([(s.node, s.exe, [tensors.get(x) if x else None for x in s.ins], [tensors[o] for o in s.outs if o])
                for s in plan.steps])
    taken: set[int] = set()
    found = {}
    for s in plan.steps:
        if s.exe is None or s.index in taken or s.node.op_type != "MatMul":
            continue
        ch = attention.match(st, s.index, taken)
        if ch is not None and choose(ch, plan.rt.sm_count) is not None:
            taken.update(ch.steps)
            found[ch.final] = ch
    return found


def source(ch: attention.Chain, sh: attention.Tiling) -> str:
    """The kernel for one chain: its sizes and strides are constants."""
    s, t, d = ch.queries, ch.keys, ch.head
    qs, ks, vs, os_ = ch.q.strides, ch.k.strides, ch.v.strides, ch.out
    ms = ch.mask.strides if ch.mask is not None else [0, 0, 0, 0]
    dw = sh.dp // sh.ct
    nqb = -(-s // sh.bq)
    if ch.scale is None:
        scaled = "x"
    else:
        c = np.float32(ch.scale[1])
        lit = f"__int_as_float({int(c.view(np.int32))})"
        scaled = f"x / {lit}" if ch.scale[0] == "Div" else f"x * {lit}"
    masked = (f"z += LD(mask[(size_t)b * {ms[0]} + (size_t)h * {ms[1]} + (size_t)row * {ms[2]} "
              f"+ (size_t)key * {ms[3]}]);" if ch.mask is not None else "")
    return f"""
extern "C" __global__ void __launch_bounds__({NT}) attention(T* __restrict__ y, const T* __restrict__ q,
    const T* __restrict__ k, const T* __restrict__ v, const T* __restrict__ mask) {{
  constexpr int BQ = {sh.bq}, RM = {sh.rm}, RN = {sh.rn}, CT = {sh.ct}, TK = {sh.tk}, DP = {sh.dp}, DW = {dw};
  constexpr int S = {s}, TT = {t}, D = {d};
  __shared__ __align__(16) float Qs[BQ][DP + 4];
  __shared__ __align__(16) float Ks[TK][DP + 4];
  __shared__ __align__(16) float Vs[TK][DP];
  __shared__ __align__(16) float Ps[BQ][TK + 4];
  const int tid = threadIdx.x, tr = tid / CT, tc = tid % CT;
  const int bh = blockIdx.x / {nqb}, q0 = blockIdx.x % {nqb} * BQ;
  const int b = bh / {ch.heads[1]}, h = bh % {ch.heads[1]};
  const T* qp = q + {ch.q.offset} + (size_t)b * {qs[0]} + (size_t)h * {qs[1]};
  const T* kp = k + {ch.k.offset} + (size_t)b * {ks[0]} + (size_t)h * {ks[1]};
  const T* vp = v + {ch.v.offset} + (size_t)b * {vs[0]} + (size_t)h * {vs[1]};
  for (int e = tid; e < BQ * DP; e += {NT}) {{
    const int r = e / DP, c = e % DP;
    Qs[r][c] = (q0 + r < S && c < D) ? LD(qp[(size_t)(q0 + r) * {qs[2]} + (size_t)c * {qs[3]}]) : 0.f;
  }}
  float m[RM], l[RM], o[RM][DW];
  #pragma unroll
  for (int r = 0; r < RM; ++r) {{
    m[r] = -3.402823466e38f;  // as the Softmax kernel starts: a row of -inf scores sums to 0 and gives NaN
    l[r] = 0.f;
    #pragma unroll
    for (int c = 0; c < DW; ++c) o[r][c] = 0.f;
  }}
  for (int t0 = 0; t0 < TT; t0 += TK) {{
    __syncthreads();  // the last tile's k, v (and the q tile's stores, the first time) are done with
    for (int e = tid; e < TK * DP; e += {NT}) {{
      const int j = e / DP, c = e % DP;
      const bool in = t0 + j < TT && c < D;
      Ks[j][c] = in ? LD(kp[(size_t)(t0 + j) * {ks[2]} + (size_t)c * {ks[3]}]) : 0.f;
      Vs[j][c] = in ? LD(vp[(size_t)(t0 + j) * {vs[2]} + (size_t)c * {vs[3]}]) : 0.f;
    }}
    __syncthreads();
    float sc[RM][RN];
    #pragma unroll
    for (int r = 0; r < RM; ++r)
      #pragma unroll
      for (int j = 0; j < RN; ++j) sc[r][j] = 0.f;
    #pragma unroll 4
    for (int c = 0; c < DP; c += 4) {{
      float4 qv[RM], kv[RN];
      #pragma unroll
      for (int r = 0; r < RM; ++r) qv[r] = *reinterpret_cast<const float4*>(&Qs[tr * RM + r][c]);
      #pragma unroll
      for (int j = 0; j < RN; ++j) kv[j] = *reinterpret_cast<const float4*>(&Ks[tc + CT * j][c]);
      #pragma unroll
      for (int r = 0; r < RM; ++r)
        #pragma unroll
        for (int j = 0; j < RN; ++j)
          sc[r][j] += qv[r].x * kv[j].x + qv[r].y * kv[j].y + qv[r].z * kv[j].z + qv[r].w * kv[j].w;
    }}
    #pragma unroll
    for (int r = 0; r < RM; ++r) {{
      const int row = min(q0 + tr * RM + r, S - 1);  // rows past the end compute on zeros, unstored
      float mx = m[r];
      #pragma unroll
      for (int j = 0; j < RN; ++j) {{
        const int key = t0 + tc + CT * j;
        const float x = sc[r][j];
        float z = {scaled};
        {masked}
        sc[r][j] = key < TT ? z : __int_as_float(0xff800000);
        mx = fmaxf(mx, sc[r][j]);
      }}
      #pragma unroll
      for (int w = CT / 2; w > 0; w >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, w));
      const float alpha = expf(m[r] - mx);
      m[r] = mx;
      float sum = 0.f;
      #pragma unroll
      for (int j = 0; j < RN; ++j) {{
        const float p = expf(sc[r][j] - mx);
        sum += p;
        Ps[tr * RM + r][tc + CT * j] = p;
      }}
      #pragma unroll
      for (int w = CT / 2; w > 0; w >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, w);
      l[r] = l[r] * alpha + sum;
      #pragma unroll
      for (int c = 0; c < DW; ++c) o[r][c] *= alpha;
    }}
    __syncwarp();  // a row group's probabilities, read by its own lanes alone
    #pragma unroll 2
    for (int j = 0; j < TK; j += 4) {{
      float4 pv[RM];
      #pragma unroll
      for (int r = 0; r < RM; ++r) pv[r] = *reinterpret_cast<const float4*>(&Ps[tr * RM + r][j]);
      #pragma unroll
      for (int jj = 0; jj < 4; ++jj) {{
        float vv[DW];
        #pragma unroll
        for (int c = 0; c < DW; ++c) vv[c] = Vs[j + jj][tc * DW + c];
        #pragma unroll
        for (int r = 0; r < RM; ++r) {{
          const float p = jj == 0 ? pv[r].x : jj == 1 ? pv[r].y : jj == 2 ? pv[r].z : pv[r].w;
          #pragma unroll
          for (int c = 0; c < DW; ++c) o[r][c] += p * vv[c];
        }}
      }}
    }}
  }}
  #pragma unroll
  for (int r = 0; r < RM; ++r) {{
    const int row = q0 + tr * RM + r;
    if (row >= S) continue;
    const float inv = 1.f / l[r];
    #pragma unroll
    for (int c = 0; c < DW; ++c) {{
      const int col = tc * DW + c;
      if (col < D)
        y[(size_t)b * {os_[0]} + (size_t)h * {os_[1]} + (size_t)row * {os_[2]} + (size_t)col * {os_[3]}] =
            ST(o[r][c] * inv);
    }}
  }}
}}
"""


def launch(plan: Plan, ch: attention.Chain) -> Callable[[], None]:
    """The chain's kernel, compiled for its sizes and strides, and the call that launches it."""
    sh = choose(ch, plan.rt.sm_count)
    assert sh is not None  # find() took only chains the kernel takes
    kern = plan.rt.programs.kernel(source(ch, sh), plan.half, "attention")
    q, k, v = (plan.view(x.tensor.name) for x in (ch.q, ch.k, ch.v))
    mask = plan.view(ch.mask.tensor.name) if ch.mask is not None else q
    y = plan.view(ch.output.name)
    blocks = ch.heads[0] * ch.heads[1] * -(-ch.queries // sh.bq)
    return launcher(kern, blocks * NT, (y, q, k, v, mask), block=NT, grid=blocks)
