#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#include "common.glsl"
#ifndef FP16
#error matmul_coop multiplies half floats: it is built for float16 storage only
#endif
// matmul.comp's product, C = act(alpha * A @ B + beta * bias) with its fusions, on the tensor cores through
// cooperative matrices (VK_NV_cooperative_matrix): half-float fragments of 16 x 16, summed in float32.
// A workgroup of four subgroups of 32 computes a 64 x 64 tile, each subgroup a 32 x 32 quarter of it
// (2 x 2 fragments). A 64 x 32 slice of A and a 32 x 64 slice of B are staged in shared memory a step,
// the next step's values fetched into registers while this one is summed; the sums go through shared
// memory to the epilogue (bias, activation, residual), which writes rows of the output coalesced.
#include "coop.glsl"
layout(local_size_x = NT, local_size_y = 1, local_size_z = 1) in;
layout(std430, set = 0, binding = 0) writeonly buffer O { STORE o[]; };
layout(std430, set = 0, binding = 1) readonly buffer A { STORE a[]; };
layout(std430, set = 0, binding = 2) readonly buffer B { STORE b[]; };
layout(std430, set = 0, binding = 3) readonly buffer Bias { STORE bias[]; };
layout(std430, set = 0, binding = 4) readonly buffer Res { STORE res[]; };
layout(std430, set = 0, binding = 5) readonly buffer Scale { STORE scale[]; };
layout(constant_id = 3) const int ACT = 0;
layout(constant_id = 4) const bool RES = false;
layout(constant_id = 5) const bool SCALE = false;
#include "matmul_shape.glsl"

#define LA (TM * TK / NT)
#define LB (TN * TK / NT)
float16_t ra[LA], rb[LB];

// Coalesced loads, as matmul.comp's: consecutive invocations take consecutive addresses of A (along k, unless
// A is stored m-fastest) and of B (along n, unless B is stored k-fastest).
#define A_MFAST (A_RS == 1 && A_CS != 1)
#define B_KFAST (B_RS == 1 && B_CS != 1)
#define A_AT(e) int mm = A_MFAST ? (e) % TM : (e) / TK, kk = A_MFAST ? (e) / TM : (e) % TK
#define B_AT(e) int nn = B_KFAST ? (e) / TK : (e) % TN, kb = B_KFAST ? (e) % TK : (e) / TN

void fetch(int tid, int bz, int offA, int offB, int m0, int n0, int k0) {
    [[unroll]] for (int t = 0; t < LA; ++t) {
        A_AT(tid + t * NT);
        int gm = m0 + mm, gk = k0 + kk;
        ra[t] = (gm < M && gk < K) ? float16_t(a[offA + gm * A_RS + gk * A_CS]) : float16_t(0.0);
    }
    [[unroll]] for (int t = 0; t < LB; ++t) {
        B_AT(tid + t * NT);
        int gn = n0 + nn, gk = k0 + kb;
        rb[t] = (gn < N && gk < K) ? float16_t(b[offB + gk * B_RS + gn * B_CS]) : float16_t(0.0);
        if (SCALE && gk < K) rb[t] = float16_t(float(rb[t]) * float(scale[bz * K + gk]));
    }
}

void main() {
    int tid = int(gl_LocalInvocationID.x);
    int bz = int(gl_WorkGroupID.z);
    ivec2 off = batch_offsets(bz);
    int offA = off.x, offB = off.y;
    int m0 = int(gl_WorkGroupID.y) * TM, n0 = int(gl_WorkGroupID.x) * TN;
    COOP_BEGIN
    fetch(tid, bz, offA, offB, m0, n0, 0);
    for (int k0 = 0; k0 < K; k0 += TK) {
        [[unroll]] for (int t = 0; t < LA; ++t) {
            A_AT(tid + t * NT);
            As[mm * AS + kk] = ra[t];
        }
        [[unroll]] for (int t = 0; t < LB; ++t) {
            B_AT(tid + t * NT);
            Bs[kb * BS + nn] = rb[t];
        }
        barrier();
        if (k0 + TK < K) fetch(tid, bz, offA, offB, m0, n0, k0 + TK);
        COOP_STEP
        barrier();
    }
    COOP_END
    int ob = bz * M * N;
    [[unroll]] for (int t = 0; t < TM * TN / NT; ++t) {
        int e = tid + t * NT;
        int gm = m0 + e / TN, gn = n0 + e % TN;
        if (gm >= M || gn >= N) continue;
        float v = ALPHA * Cs[(e / TN) * CS + e % TN];
        if (HAS_BIAS != 0) v += BETA * float(bias[gm * C_RS + gn * C_CS]);
        v = unary_op(v, ACT, ACT_A, ACT_B);
        if (RES) v += float(res[ob + gm * N + gn]);
        o[ob + gm * N + gn] = STORE(v);
    }
}
