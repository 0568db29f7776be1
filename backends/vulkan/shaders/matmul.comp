#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
// Batched C = act(alpha * A @ B + beta * bias), tiled 64x64 with 4x4 outputs per
// invocation. A's element (m, k) is at a[offA + m*a_rs + k*a_cs], B's (k, n) at
// b[offB + k*b_rs + n*b_cs], so transposes are strides. Batch dimensions (up to
// 3) broadcast through per-dimension strides sa and sb. The output is dense.
#define TM 64
#define TN 64
#define TK 16
layout(local_size_x = 16, local_size_y = 16, local_size_z = 1) in;
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
