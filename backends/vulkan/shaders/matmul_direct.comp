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
#include "matmul_shape.glsl"

void main() {
    int bz = int(gl_GlobalInvocationID.z);
    ivec2 off = batch_offsets(bz);
    int offA = off.x, offB = off.y;
    int n0 = int(gl_GlobalInvocationID.x) * 4, m0 = int(gl_GlobalInvocationID.y) * 4;
    if (n0 >= N || m0 >= M) return;
    int mi[4], ni[4];
    for (int i = 0; i < 4; ++i) {
        mi[i] = min(m0 + i, M - 1);
        ni[i] = min(n0 + i, N - 1);
    }
    vec4 acc[4] = vec4[4](vec4(0.0), vec4(0.0), vec4(0.0), vec4(0.0));
    for (int k = 0; k < K; ++k) {
        vec4 av = vec4(float(a[offA + mi[0] * A_RS + k * A_CS]), float(a[offA + mi[1] * A_RS + k * A_CS]),
                       float(a[offA + mi[2] * A_RS + k * A_CS]), float(a[offA + mi[3] * A_RS + k * A_CS]));
        int kb = offB + k * B_RS;
        vec4 bv = vec4(float(b[kb + ni[0] * B_CS]), float(b[kb + ni[1] * B_CS]),
                       float(b[kb + ni[2] * B_CS]), float(b[kb + ni[3] * B_CS]));
        if (SCALE) bv *= float(scale[bz * K + k]);
        acc[0] += av.x * bv;
        acc[1] += av.y * bv;
        acc[2] += av.z * bv;
        acc[3] += av.w * bv;
    }
    int ob = bz * M * N;
    for (int i = 0; i < 4; ++i) {
        int gm = m0 + i;
        if (gm >= M) break;
        for (int j = 0; j < 4; ++j) {
            int gn = n0 + j;
            if (gn >= N) break;
            float v = ALPHA * acc[i][j];
            if (HAS_BIAS != 0) v += BETA * float(bias[gm * C_RS + gn * C_CS]);
            v = unary_op(v, ACT, ACT_A, ACT_B);
            if (RES) v += float(res[ob + gm * N + gn]);
            o[ob + gm * N + gn] = STORE(v);
        }
    }
}
