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
layout(push_constant) uniform P {
    int M; int N; int K; int nb;
    int bshape[3]; int sa[3]; int sb[3];
    int a_rs; int a_cs; int b_rs; int b_cs;
    int has_bias; int c_rs; int c_cs;
    float alpha; float beta; float act_a; float act_b;
} p;

shared float As[TK][TM + 1];
shared float Bs[TK][TN + 1];

void main() {
    int lx = int(gl_LocalInvocationID.x), ly = int(gl_LocalInvocationID.y);
    int tid = ly * 16 + lx;
    int bz = int(gl_WorkGroupID.z);
    int offA = 0, offB = 0, r = bz;
    for (int d = p.nb - 1; d >= 0; --d) {
        int c = r % p.bshape[d];
        r /= p.bshape[d];
        offA += c * p.sa[d];
        offB += c * p.sb[d];
    }
    int m0 = int(gl_WorkGroupID.y) * TM, n0 = int(gl_WorkGroupID.x) * TN;
    float acc[4][4];
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0;
    for (int k0 = 0; k0 < p.K; k0 += TK) {
        // 256 invocations load a 64x16 tile of A and a 16x64 tile of B, 4 values each.
        for (int t = 0; t < 4; ++t) {
            int e = tid + t * 256;
            int mm = e / TK, kk = e % TK;
            int gm = m0 + mm, gk = k0 + kk;
            As[kk][mm] = (gm < p.M && gk < p.K) ? float(a[offA + gm * p.a_rs + gk * p.a_cs]) : 0.0;
            int kb = e / TN, nn = e % TN;
            int gn = n0 + nn, gkb = k0 + kb;
            Bs[kb][nn] = (gn < p.N && gkb < p.K) ? float(b[offB + gkb * p.b_rs + gn * p.b_cs]) : 0.0;
            if (SCALE && gkb < p.K) Bs[kb][nn] *= float(scale[bz * p.K + gkb]);
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
    int ob = bz * p.M * p.N;
    for (int i = 0; i < 4; ++i) {
        int gm = m0 + ly + 16 * i;
        if (gm >= p.M) continue;
        for (int j = 0; j < 4; ++j) {
            int gn = n0 + lx + 16 * j;
            if (gn >= p.N) continue;
            float v = p.alpha * acc[i][j];
            if (p.has_bias != 0) v += p.beta * float(bias[gm * p.c_rs + gn * p.c_cs]);
            v = unary_op(v, ACT, p.act_a, p.act_b);
            if (RES) v += float(res[ob + gm * p.N + gn]);
            o[ob + gm * p.N + gn] = STORE(v);
        }
    }
}
