#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
// A squeeze-and-excitation block's squeeze, one workgroup per image: s = act2(W2 act1(W1 mean(x) + b1) + b2),
// for x (C, HW), W1 (C1, C), W2 (C, C1): the GlobalAveragePool and the two pointwise convs on its (C, 1, 1)
// result, in one dispatch. Each of the three steps gives every output (a channel's mean, a row's dot product)
// t lanes, the most that fit the workgroup (a power of two), and adds their partial sums in shared memory.
layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;
layout(std430, set = 0, binding = 0) writeonly buffer O { STORE o[]; };
layout(std430, set = 0, binding = 1) readonly buffer X { STORE x[]; };
layout(std430, set = 0, binding = 2) readonly buffer W1 { STORE w1[]; };
layout(std430, set = 0, binding = 3) readonly buffer B1 { STORE b1[]; };
layout(std430, set = 0, binding = 4) readonly buffer W2 { STORE w2[]; };
layout(std430, set = 0, binding = 5) readonly buffer B2 { STORE b2[]; };
layout(constant_id = 3) const int ACT1 = 0;
layout(constant_id = 4) const int ACT2 = 0;
layout(push_constant) uniform P {
    int C; int HW; int C1; int has_b1; int has_b2;
    float a1a; float a1b; float a2a; float a2b;
} p;

// At most 1024 invocations, C <= 1024 channels and C1 <= 256 (the planner checks).
shared float red[1024];
shared float g[1024];
shared float h[256];

int lanes(int rows) {
    int L = int(gl_WorkGroupSize.x), t = 1;
    while (t * 2 * rows <= L) t *= 2;
    return t;
}

// s = the sum of TERM(i) for i = first, first + step, ... below n, in four partial sums: four loads in flight
// per invocation instead of one. With one workgroup doing all the work, the shader waits on memory latency.
#define STRIDED_SUM(s, first, n, step, TERM) { \
    float s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0; \
    int i = first; \
    for (; i + 3 * (step) < (n); i += 4 * (step)) { \
        s0 += TERM(i); s1 += TERM(i + (step)); s2 += TERM(i + 2 * (step)); s3 += TERM(i + 3 * (step)); \
    } \
    for (; i < (n); i += (step)) s0 += TERM(i); \
    s = (s0 + s1) + (s2 + s3); \
}
#define X_AT(i) float(x[xb + c * p.HW + (i)])
#define W1G(i) (float(w1[j * p.C + (i)]) * g[i])
#define W2H(i) (float(w2[j * p.C1 + (i)]) * h[i])

// Adds the partial sums of each run of t lanes into its first; every invocation calls it.
float reduce_lanes(int tid, int lane, int t, float s) {
    red[tid] = s;
    barrier();
    for (int k = t / 2; k > 0; k >>= 1) {
        if (lane < k) red[tid] += red[tid + k];
        barrier();
    }
    float v = red[tid];
    barrier();
    return v;
}

void main() {
    int L = int(gl_WorkGroupSize.x);
    int img = int(gl_WorkGroupID.x), tid = int(gl_LocalInvocationID.x);
    int xb = img * p.C * p.HW;
    // The means
    int t = lanes(p.C), lane = tid % t, row = tid / t, G = L / t;
    for (int c0 = 0; c0 < p.C; c0 += G) {
        int c = c0 + row;
        float s = 0.0;
        if (c < p.C)
            STRIDED_SUM(s, lane, p.HW, t, X_AT)
        s = reduce_lanes(tid, lane, t, s);
        if (lane == 0 && c < p.C) g[c] = s / float(p.HW);
    }
    barrier();
    // h = act1(W1 g + b1)
    t = lanes(p.C1); lane = tid % t; row = tid / t; G = L / t;
    for (int j0 = 0; j0 < p.C1; j0 += G) {
        int j = j0 + row;
        float s = 0.0;
        if (j < p.C1)
            STRIDED_SUM(s, lane, p.C, t, W1G)
        s = reduce_lanes(tid, lane, t, s);
        if (lane == 0 && j < p.C1) {
            if (p.has_b1 != 0) s += float(b1[j]);
            h[j] = unary_op(s, ACT1, p.a1a, p.a1b);
        }
    }
    barrier();
    // out = act2(W2 h + b2)
    t = lanes(p.C); lane = tid % t; row = tid / t; G = L / t;
    for (int j0 = 0; j0 < p.C; j0 += G) {
        int j = j0 + row;
        float s = 0.0;
        if (j < p.C)
            STRIDED_SUM(s, lane, p.C1, t, W2H)
        s = reduce_lanes(tid, lane, t, s);
        if (lane == 0 && j < p.C) {
            if (p.has_b2 != 0) s += float(b2[j]);
            o[img * p.C + j] = STORE(unary_op(s, ACT2, p.a2a, p.a2b));
        }
    }
}
