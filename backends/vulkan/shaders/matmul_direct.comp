#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
// The same contract as matmul.comp without shared memory: each invocation computes
// a 4x4 block of outputs straight from memory. For CPU devices (lavapipe), where
// workgroup barriers are expensive, and small matrices.
layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;
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

void main() {
    int bz = int(gl_GlobalInvocationID.z);
    int offA = 0, offB = 0, r = bz;
    for (int d = p.nb - 1; d >= 0; --d) {
        int c = r % p.bshape[d];
        r /= p.bshape[d];
        offA += c * p.sa[d];
        offB += c * p.sb[d];
    }
    int n0 = int(gl_GlobalInvocationID.x) * 4, m0 = int(gl_GlobalInvocationID.y) * 4;
    if (n0 >= p.N || m0 >= p.M) return;
    int mi[4], ni[4];
    for (int i = 0; i < 4; ++i) {
        mi[i] = min(m0 + i, p.M - 1);
        ni[i] = min(n0 + i, p.N - 1);
    }
    vec4 acc[4] = vec4[4](vec4(0.0), vec4(0.0), vec4(0.0), vec4(0.0));
    for (int k = 0; k < p.K; ++k) {
        vec4 av = vec4(float(a[offA + mi[0] * p.a_rs + k * p.a_cs]), float(a[offA + mi[1] * p.a_rs + k * p.a_cs]),
                       float(a[offA + mi[2] * p.a_rs + k * p.a_cs]), float(a[offA + mi[3] * p.a_rs + k * p.a_cs]));
        int kb = offB + k * p.b_rs;
        vec4 bv = vec4(float(b[kb + ni[0] * p.b_cs]), float(b[kb + ni[1] * p.b_cs]),
                       float(b[kb + ni[2] * p.b_cs]), float(b[kb + ni[3] * p.b_cs]));
        if (SCALE) bv *= float(scale[bz * p.K + k]);
        acc[0] += av.x * bv;
        acc[1] += av.y * bv;
        acc[2] += av.z * bv;
        acc[3] += av.w * bv;
    }
    int ob = bz * p.M * p.N;
    for (int i = 0; i < 4; ++i) {
        int gm = m0 + i;
        if (gm >= p.M) break;
        for (int j = 0; j < 4; ++j) {
            int gn = n0 + j;
            if (gn >= p.N) break;
            float v = p.alpha * acc[i][j];
            if (p.has_bias != 0) v += p.beta * float(bias[gm * p.c_rs + gn * p.c_cs]);
            v = unary_op(v, ACT, p.act_a, p.act_b);
            if (RES) v += float(res[ob + gm * p.N + gn]);
            o[ob + gm * p.N + gn] = STORE(v);
        }
    }
}
