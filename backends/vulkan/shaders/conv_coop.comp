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
// values fetched into registers meanwhile. The sum is not split (bindings 4 and 5, conv_gemm's scratch for
// that, go unused); the sums go through shared memory to the bias and activation, written along the pixels.
#include "coop.glsl"
layout(local_size_x = NT, local_size_y = 1, local_size_z = 1) in;
layout(std430, set = 0, binding = 0) writeonly buffer O { STORE o[]; };
layout(std430, set = 0, binding = 1) readonly buffer X { STORE x[]; };
layout(std430, set = 0, binding = 2) readonly buffer Wt { STORE w[]; };
layout(std430, set = 0, binding = 3) readonly buffer Bias { STORE bias[]; };
layout(constant_id = 3) const int ACT = 0;
#include "conv_shape.glsl"

shared ivec3 kt[2][TK];  // per row of a step: offset in the input, and the tap's (dh, dw)

#define LA (TM * TK / NT)  // weights each invocation loads per step
#define RS (NT / TN)       // invocations per pixel of the input tile
#define LB (TK / RS)       // inputs each invocation loads per step: rows kb + j * RS of its pixel
#define OUT (-(1 << 29))   // a row far outside the input

void main() {
    int tid = int(gl_LocalInvocationID.x);
    int g = int(gl_WorkGroupID.z);
    int cig = C / G, cog = CO / G, ksz = KH * KW, K = cig * ksz, hw = H * W;
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
    // Row k of the unfolded input: its offset from the pixel's first tap and the tap's (dh, dw); OUT past K.
#define ROW(k) ((k) < K ? ivec3(((k) / ksz) * hw + ((k) % ksz / KW) * DH * W + ((k) % KW) * DW, \
                                ((k) % ksz / KW) * DH, ((k) % KW) * DW) : ivec3(0, OUT, 0))
    float16_t ra[LA], rb[LB];
#define LOAD(k1, buf) {                                                                          \
        [[unroll]] for (int t = 0; t < LA; ++t) {                                                 \
            int e = tid + t * NT, kk = e % TK, mm = e / TK;                                       \
            ra[t] = (m0 + mm < cog && (k1) + kk < K) ? w[wb + mm * K + (k1) + kk] : float16_t(0.0); \
        }                                                                                         \
        [[unroll]] for (int j = 0; j < LB; ++j) {                                                 \
            ivec3 r = kt[buf][kb + j * RS];                                                       \
            rb[j] = float16_t(0.0);                                                               \
            if (uint(ih0 + r.y) < uint(H) && uint(iw0 + r.z) < uint(W)) rb[j] = x[xo + r.x];      \
        }                                                                                         \
    }

    COOP_BEGIN
    if (tid < TK) kt[0][tid] = ROW(tid);
    barrier();
    LOAD(0, 0)
    int buf = 0;
    for (int k0 = 0; k0 < K; k0 += TK) {
        [[unroll]] for (int t = 0; t < LA; ++t) {
            int e = tid + t * NT;
            As[(e / TK) * AS + e % TK] = ra[t];
        }
        [[unroll]] for (int j = 0; j < LB; ++j) Bs[(kb + j * RS) * BS + nn] = rb[j];
        if (tid < TK) kt[buf ^ 1][tid] = ROW(k0 + TK + tid);
        barrier();
        buf ^= 1;
        if (k0 + TK < K) LOAD(k0 + TK, buf)  // in flight while this step computes
        COOP_STEP
        barrier();
    }
    COOP_END
    [[unroll]] for (int t = 0; t < TM * TN / NT; ++t) {
        int e = tid + t * NT, mm = e / TN, pj = e % TN;
        int co = m0 + mm, pix = n0 + pj;
        if (co >= cog || pix >= npix) continue;
        int n = pix / ohw;
        float bv = HAS_BIAS != 0 ? float(bias[g * cog + co]) : 0.0;
        o[(n * CO + g * cog + co) * ohw + pix - n * ohw] = STORE(unary_op(Cs[mm * CS + pj] + bv, ACT, ALPHA, BETA));
    }
}
