#version 450
#extension GL_GOOGLE_include_directive : require
#ifdef RM
#extension GL_EXT_control_flow_attributes : require
#endif
#include "common.glsl"
// Batched C = act(alpha * A @ B + beta * bias), tiled 64x64 with 4x4 outputs per
// invocation (or, built with RM, RN, WX and WY, the register-blocked tiles below).
// A's element (m, k) is at a[offA + m*a_rs + k*a_cs], B's (k, n) at
// b[offB + k*b_rs + n*b_cs], so transposes are strides. Batch dimensions (up to
// 3) broadcast through per-dimension strides sa and sb. The output is dense.
#ifndef RM
#define TM 64
#define TN 64
#define TK 16
layout(local_size_x = 16, local_size_y = 16, local_size_z = 1) in;
#else
// The register-blocked variants (build_shaders.py builds them as matmul_<TM>x<TN>, launch.REG_TILES): a
// WX x WY workgroup, each invocation RM x RN outputs (multiples of 4: rows ly*4 + 4*WY*p + r, columns
// lx*4 + 4*WX*q + c), so a k step reads RM/4 + RN/4 vec4s of shared memory for RM*RN FMAs.
#define TM (WY * RM)
#define TN (WX * RN)
#define TK 16
#define NT (WX * WY)
layout(local_size_x = WX, local_size_y = WY, local_size_z = 1) in;
#endif
layout(std430, set = 0, binding = 0) writeonly buffer O { STORE o[]; };
layout(std430, set = 0, binding = 1) readonly buffer A { STORE a[]; };
layout(std430, set = 0, binding = 2) readonly buffer B { STORE b[]; };
layout(std430, set = 0, binding = 3) readonly buffer Bias { STORE bias[]; };
// Fused into a 1x1 convolution (B = the image X, K its channels): a residual added after the activation,
// and a scale per image and input channel applied to X (a squeeze-and-excitation block's Mul).
layout(std430, set = 0, binding = 4) readonly buffer Res { STORE res[]; };
layout(std430, set = 0, binding = 5) readonly buffer Scale { STORE scale[]; };
layout(constant_id = 3) const int ACT = 0;
layout(constant_id = 4) const bool RES = false;
layout(constant_id = 5) const bool SCALE = false;
#include "matmul_shape.glsl"

#ifndef RM
shared float As[TK][TM + 1];
shared float Bs[TK][TN + 1];

void main() {
    int lx = int(gl_LocalInvocationID.x), ly = int(gl_LocalInvocationID.y);
    int tid = ly * 16 + lx;
    int bz = int(gl_WorkGroupID.z);
    ivec2 off = batch_offsets(bz);
    int offA = off.x, offB = off.y;
    int m0 = int(gl_WorkGroupID.y) * TM, n0 = int(gl_WorkGroupID.x) * TN;
    float acc[4][4];
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0;
    for (int k0 = 0; k0 < K; k0 += TK) {
        // 256 invocations load a 64x16 tile of A and a 16x64 tile of B, 4 values each.
        for (int t = 0; t < 4; ++t) {
            int e = tid + t * 256;
            int mm = e / TK, kk = e % TK;
            int gm = m0 + mm, gk = k0 + kk;
            As[kk][mm] = (gm < M && gk < K) ? float(a[offA + gm * A_RS + gk * A_CS]) : 0.0;
            int kb = e / TN, nn = e % TN;
            int gn = n0 + nn, gkb = k0 + kb;
            Bs[kb][nn] = (gn < N && gkb < K) ? float(b[offB + gkb * B_RS + gn * B_CS]) : 0.0;
            if (SCALE && gkb < K) Bs[kb][nn] *= float(scale[bz * K + gkb]);
        }
        barrier();
        for (int kk = 0; kk < TK; ++kk) {
            float av[4], bv[4];
            for (int i = 0; i < 4; ++i) av[i] = As[kk][ly + 16 * i];
            for (int j = 0; j < 4; ++j) bv[j] = Bs[kk][lx + 16 * j];
            for (int i = 0; i < 4; ++i)
                for (int j = 0; j < 4; ++j) acc[i][j] += av[i] * bv[j];
        }
        barrier();
    }
    int ob = bz * M * N;
    for (int i = 0; i < 4; ++i) {
        int gm = m0 + ly + 16 * i;
        if (gm >= M) continue;
        for (int j = 0; j < 4; ++j) {
            int gn = n0 + lx + 16 * j;
            if (gn >= N) continue;
            float v = ALPHA * acc[i][j];
            if (HAS_BIAS != 0) v += BETA * float(bias[gm * C_RS + gn * C_CS]);
            v = unary_op(v, ACT, ACT_A, ACT_B);
            if (RES) v += float(res[ob + gm * N + gn]);
            o[ob + gm * N + gn] = STORE(v);
        }
    }
}
#else
// A transposed (As[k][m]) and B, as vec4s along m and n, one vec4 of padding a row.
shared vec4 As[TK][TM / 4 + 1];
shared vec4 Bs[TK][TN / 4 + 1];
#define LA (TM * TK / NT)  // the A and B values each invocation loads per k step
#define LB (TN * TK / NT)
float ra[LA], rb[LB];  // the next k step's values, fetched while the current one is summed

// Coalesced loads: consecutive invocations take consecutive addresses of A (along k, unless A is stored
// m-fastest: a transpose) and of B (along n, unless B is stored k-fastest). The strides are specialization
// constants: the driver keeps one branch.
#define A_MFAST (A_RS == 1 && A_CS != 1)
#define B_KFAST (B_RS == 1 && B_CS != 1)
#define A_AT(e) int mm = A_MFAST ? (e) % TM : (e) / TK, kk = A_MFAST ? (e) / TM : (e) % TK
#define B_AT(e) int nn = B_KFAST ? (e) / TK : (e) % TN, kb = B_KFAST ? (e) % TK : (e) / TN

void fetch(int tid, int bz, int offA, int offB, int m0, int n0, int k0) {
    [[unroll]] for (int t = 0; t < LA; ++t) {
        A_AT(tid + t * NT);
        int gm = m0 + mm, gk = k0 + kk;
        ra[t] = (gm < M && gk < K) ? float(a[offA + gm * A_RS + gk * A_CS]) : 0.0;
    }
    [[unroll]] for (int t = 0; t < LB; ++t) {
        B_AT(tid + t * NT);
        int gn = n0 + nn, gk = k0 + kb;
        rb[t] = (gn < N && gk < K) ? float(b[offB + gk * B_RS + gn * B_CS]) : 0.0;
        if (SCALE && gk < K) rb[t] *= float(scale[bz * K + gk]);
    }
}

void main() {
    int lx = int(gl_LocalInvocationID.x), ly = int(gl_LocalInvocationID.y);
    int tid = ly * WX + lx;
    int bz = int(gl_WorkGroupID.z);
    ivec2 off = batch_offsets(bz);
    int offA = off.x, offB = off.y;
    int m0 = int(gl_WorkGroupID.y) * TM, n0 = int(gl_WorkGroupID.x) * TN;
    vec4 acc[RM][RN / 4];
    [[unroll]] for (int i = 0; i < RM; ++i)
        [[unroll]] for (int j = 0; j < RN / 4; ++j) acc[i][j] = vec4(0.0);
    fetch(tid, bz, offA, offB, m0, n0, 0);
    for (int k0 = 0; k0 < K; k0 += TK) {
        [[unroll]] for (int t = 0; t < LA; ++t) {
            A_AT(tid + t * NT);
            As[kk][mm >> 2][mm & 3] = ra[t];
        }
        [[unroll]] for (int t = 0; t < LB; ++t) {
            B_AT(tid + t * NT);
            Bs[kb][nn >> 2][nn & 3] = rb[t];
        }
        barrier();
        if (k0 + TK < K) fetch(tid, bz, offA, offB, m0, n0, k0 + TK);
        [[unroll]] for (int kk = 0; kk < TK; ++kk) {
            vec4 av[RM / 4], bv[RN / 4];
            [[unroll]] for (int p = 0; p < RM / 4; ++p) av[p] = As[kk][ly + WY * p];
            [[unroll]] for (int q = 0; q < RN / 4; ++q) bv[q] = Bs[kk][lx + WX * q];
            [[unroll]] for (int p = 0; p < RM / 4; ++p)
                [[unroll]] for (int r = 0; r < 4; ++r)
                    [[unroll]] for (int q = 0; q < RN / 4; ++q) acc[4 * p + r][q] += av[p][r] * bv[q];
        }
        barrier();
    }
    int ob = bz * M * N;
    [[unroll]] for (int p = 0; p < RM / 4; ++p)
        [[unroll]] for (int r = 0; r < 4; ++r) {
            int gm = m0 + 4 * (ly + WY * p) + r;
            if (gm >= M) continue;
            [[unroll]] for (int q = 0; q < RN / 4; ++q)
                [[unroll]] for (int c = 0; c < 4; ++c) {
                    int gn = n0 + 4 * (lx + WX * q) + c;
                    if (gn >= N) continue;
                    float v = ALPHA * acc[4 * p + r][q][c];
                    if (HAS_BIAS != 0) v += BETA * float(bias[gm * C_RS + gn * C_CS]);
                    v = unary_op(v, ACT, ACT_A, ACT_B);
                    if (RES) v += float(res[ob + gm * N + gn]);
                    o[ob + gm * N + gn] = STORE(v);
                }
        }
}
#endif
