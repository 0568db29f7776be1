#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
// The same contract as matmul.comp, for small matrices (a few hundred rows and columns, short sums): many
// small workgroups. Each invocation computes 4 rows of one output column; the invocations of a workgroup
// (x) take consecutive (row block, column) pairs, columns fastest, so a wide B is read coalesced and A's
// rows broadcast, and a single column (a matrix-vector product) spreads its rows over the lanes. The
// workgroup's y invocations split the sum between them (every y-th step of k) and add their partial sums
// in shared memory at the end: one barrier, none per step.
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

// Partial sums of the k-split: 4 per invocation, at most 256 invocations.
shared vec4 part[256];

void main() {
    int lx = int(gl_LocalInvocationID.x), ky = int(gl_LocalInvocationID.y);
    int LX = int(gl_WorkGroupSize.x), KS = int(gl_WorkGroupSize.y);
    int bz = int(gl_WorkGroupID.z);
    ivec2 off = batch_offsets(bz);
    int offA = off.x, offB = off.y;
    int idx = int(gl_WorkGroupID.x) * LX + lx;
    int gn = idx % N, m0 = (idx / N) * 4;
    bool live = m0 < M;
    int m1 = min(m0 + 1, M - 1), m2 = min(m0 + 2, M - 1), m3 = min(m0 + 3, M - 1);
    int r0 = offA + min(m0, M - 1) * A_RS, r1 = offA + m1 * A_RS, r2 = offA + m2 * A_RS,
        r3 = offA + m3 * A_RS;
    int cb = offB + gn * B_CS;
    vec4 acc = vec4(0.0);
    if (live) {
        for (int k = ky; k < K; k += KS) {
            float bv = float(b[cb + k * B_RS]);
            if (SCALE) bv *= float(scale[bz * K + k]);
            int ka = k * A_CS;
            acc += vec4(float(a[r0 + ka]), float(a[r1 + ka]), float(a[r2 + ka]), float(a[r3 + ka])) * bv;
        }
    }
    if (KS > 1) {
        part[ky * LX + lx] = acc;
        barrier();
        if (ky != 0) return;
        for (int y = 1; y < KS; ++y) acc += part[y * LX + lx];
    }
    if (!live) return;
    int ob = bz * M * N;
    for (int i = 0; i < 4; ++i) {
        int gm = m0 + i;
        if (gm >= M) break;
        float v = ALPHA * acc[i];
        if (HAS_BIAS != 0) v += BETA * float(bias[gm * C_RS + gn * C_CS]);
        v = unary_op(v, ACT, ACT_A, ACT_B);
        if (RES) v += float(res[ob + gm * N + gn]);
        o[ob + gm * N + gn] = STORE(v);
    }
}
