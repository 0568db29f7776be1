#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#include "common.glsl"
#ifndef FP16
#error conv_coop multiplies half floats: it is built for float16 storage only
#endif
// conv_gemm.comp's implicit-GEMM convolution (the input unfolded on the fly, zero in the padding) on the tensor
// cores, as matmul_coop.comp multiplies: a workgroup of four subgroups of 32 computes 64 output channels x 64
// pixels, each subgroup a 32 x 32 quarter in 2 x 2 half-float fragments summed in float32. A step stages
// 32 rows of k, the weights' 64 x 32 and the unfolded input's 32 x 64, in shared memory, the next step's
// values fetched into registers meanwhile. The sums go through shared memory to the bias and activation,
// written along the pixels.
//
// Split K (a small map's deep conv at batch 1 is a few tiles, each walking its whole sum alone): built with
// SPLIT = S > 1 (build_shaders.py: conv_coop_s<S>), the grid's z is groups x S, and each of a tile's S workgroups
// sums one slice of k and writes it to `part`; the last of them to finish (counted in `cnt`, which it resets)
// adds the S partial sums in order, so results do not depend on timing, before the bias and activation, as
// conv_gemm.comp's split does. S is a constant of the build, not read from the grid. Unsplit, bindings 4 and 5
// go unused.
#include "coop.glsl"
layout(local_size_x = NT, local_size_y = 1, local_size_z = 1) in;
layout(std430, set = 0, binding = 0) writeonly buffer O { STORE o[]; };
layout(std430, set = 0, binding = 1) readonly buffer X { STORE x[]; };
layout(std430, set = 0, binding = 2) readonly buffer Wt { STORE w[]; };
layout(std430, set = 0, binding = 3) readonly buffer Bias { STORE bias[]; };
#ifndef SPLIT
#define SPLIT 1
#endif
#if SPLIT > 1
layout(std430, set = 0, binding = 4) coherent buffer Part { float part[]; };  // S x CO x pixels
layout(std430, set = 0, binding = 5) coherent buffer Cnt { uint cnt[]; };     // per tile, zero between runs
shared bool last;
#endif
layout(constant_id = 3) const int ACT = 0;
#include "conv_shape.glsl"

shared ivec3 kt[2][TK];  // per row of a step: offset in the input, and the tap's (dh, dw)

#define LA (TM * TK / NT)  // weights each invocation loads per step
#define RS (NT / TN)       // invocations per pixel of the input tile
#define LB (TK / RS)       // inputs each invocation loads per step: rows kb + j * RS of its pixel
#define OUT (-(1 << 29))   // a row far outside the input

void main() {
    int tid = int(gl_LocalInvocationID.x);
    int z = int(gl_WorkGroupID.z), g = z / SPLIT, s = z - g * SPLIT;
    int cig = C / G, cog = CO / G, ksz = KH * KW, K = cig * ksz, hw = H * W;
    int per = (K + TK * SPLIT - 1) / (TK * SPLIT) * TK;  // each split's slice of k
    int kbeg = s * per, kend = min(K, kbeg + per);
    int ohw = OH * OW, npix = N * ohw;
    int m0 = int(gl_WorkGroupID.y) * TM, n0 = int(gl_WorkGroupID.x) * TN;
    int wb = (g * cog + m0) * K;  // the tile's first weight row

    // The pixel whose inputs this invocation gathers.
    int nn = tid % TN, kb = tid / TN;
    int ih0, iw0, xo;
    {
        int pix = n0 + nn, n = pix / ohw, r = pix - n * ohw, oh = r / OW, ow = r - oh * OW;
        ih0 = pix < npix ? oh * SH - PH : OUT;
        iw0 = ow * SW - PW;
        xo = pix < npix ? (n * C + g * cig) * hw + ih0 * W + iw0 : 0;
    }
    // Row k of the unfolded input: its offset from the pixel's first tap and the tap's (dh, dw); OUT past the slice.
#define ROW(k) ((k) < kend ? ivec3(((k) / ksz) * hw + ((k) % ksz / KW) * DH * W + ((k) % KW) * DW, \
                                ((k) % ksz / KW) * DH, ((k) % KW) * DW) : ivec3(0, OUT, 0))
    float16_t ra[LA], rb[LB];
#define LOAD(k1, buf) {                                                                          \
        [[unroll]] for (int t = 0; t < LA; ++t) {                                                 \
            int e = tid + t * NT, kk = e % TK, mm = e / TK;                                       \
            ra[t] = (m0 + mm < cog && (k1) + kk < kend) ? w[wb + mm * K + (k1) + kk] : float16_t(0.0); \
        }                                                                                         \
        [[unroll]] for (int j = 0; j < LB; ++j) {                                                 \
            ivec3 r = kt[buf][kb + j * RS];                                                       \
            rb[j] = float16_t(0.0);                                                               \
            if (uint(ih0 + r.y) < uint(H) && uint(iw0 + r.z) < uint(W)) rb[j] = x[xo + r.x];      \
        }                                                                                         \
    }

    COOP_BEGIN
    if (tid < TK) kt[0][tid] = ROW(kbeg + tid);
    barrier();
    LOAD(kbeg, 0)
    int buf = 0;
    // Every slice takes the same number of steps, a constant of the layer and the build (the last slice's rows
    // past K are zeros): a loop whose bounds came from the workgroup's id gave wrong sums on the H200.
    for (int step = 0; step < per / TK; ++step) {
        int k0 = kbeg + step * TK;
        [[unroll]] for (int t = 0; t < LA; ++t) {
            int e = tid + t * NT;
            As[(e / TK) * AS + e % TK] = ra[t];
        }
        [[unroll]] for (int j = 0; j < LB; ++j) Bs[(kb + j * RS) * BS + nn] = rb[j];
        if (tid < TK) kt[buf ^ 1][tid] = ROW(k0 + TK + tid);
        barrier();
        buf ^= 1;
        if (step + 1 < per / TK) LOAD(k0 + TK, buf)  // in flight while this step computes
        COOP_STEP
        barrier();
    }
    COOP_END
#if SPLIT > 1
    [[unroll]] for (int t = 0; t < TM * TN / NT; ++t) {
        int e = tid + t * NT, co = m0 + e / TN, pix = n0 + e % TN;
        if (co < cog && pix < npix) part[(s * CO + g * cog + co) * npix + pix] = Cs[(e / TN) * CS + e % TN];
    }
    // This shader is under Vulkan's memory model (cooperative matrices need its scopes), where a plain barrier()
    // orders shared memory only and a fence orders the invocation's own accesses: so the partial sums are
    // published by a barrier at device scope, then the release of the counter's increment, and the last
    // workgroup acquires them the same way round. (With conv_gemm.comp's fence and barrier here, the H200 read
    // another slice's sums, or stale ones.)
    controlBarrier(gl_ScopeWorkgroup, gl_ScopeDevice, gl_StorageSemanticsBuffer | gl_StorageSemanticsShared,
                   gl_SemanticsAcquireRelease | gl_SemanticsMakeAvailable | gl_SemanticsMakeVisible);
    // The tile's counter: its index among the grid's tiles, from the layer's shapes (a constant of the build).
    int tile = (g * ((cog + TM - 1) / TM) + int(gl_WorkGroupID.y)) * ((npix + TN - 1) / TN) + int(gl_WorkGroupID.x);
    if (tid == 0) {
        last = atomicAdd(cnt[tile], 1u, gl_ScopeDevice, gl_StorageSemanticsBuffer, gl_SemanticsAcquireRelease)
               == uint(SPLIT - 1);
        if (last) cnt[tile] = 0u;  // for the next run
    }
    controlBarrier(gl_ScopeWorkgroup, gl_ScopeDevice, gl_StorageSemanticsBuffer | gl_StorageSemanticsShared,
                   gl_SemanticsAcquireRelease | gl_SemanticsMakeAvailable | gl_SemanticsMakeVisible);
    // The last workgroup adds each output's S partials in order, its own slice's from shared memory.
    bool mine = last;
    if (mine) {
        [[unroll]] for (int t = 0; t < TM * TN / NT; ++t) {
            int e = tid + t * NT, co = min(m0 + e / TN, cog - 1), pix = min(n0 + e % TN, npix - 1);
            float v = 0.0;
            [[unroll]] for (int u = 0; u < SPLIT; ++u)
                v += u == s ? Cs[(e / TN) * CS + e % TN] : part[(u * CO + g * cog + co) * npix + pix];
            Cs[(e / TN) * CS + e % TN] = v;  // only this invocation reads it
        }
    }
#else
    const bool mine = true;
#endif
    [[unroll]] for (int t = 0; t < TM * TN / NT; ++t) {
        int e = tid + t * NT, mm = e / TN, pj = e % TN;
        int co = m0 + mm, pix = n0 + pj;
        if (!mine || co >= cog || pix >= npix) continue;
        int n = pix / ohw;
        float bv = HAS_BIAS != 0 ? float(bias[g * cog + co]) : 0.0;
        o[(n * CO + g * cog + co) * ohw + pix - n * ohw] = STORE(unary_op(Cs[mm * CS + pj] + bv, ACT, ALPHA, BETA));
    }
}
