#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#include "common.glsl"
// A squeeze-and-excitation block's squeeze, one workgroup per image: s = act2(W2 act1(W1 mean(x) + b1) + b2),
// for x (C, HW), W1 (C1, C), W2 (C, C1): the GlobalAveragePool and the two pointwise convs on its (C, 1, 1)
// result, in one dispatch. Each of the three steps gives every output (a channel's mean, a row's dot product)
// t lanes of one subgroup, t a power of two, and adds their partial sums by shuffles within the subgroup: two
// barriers in all, between the steps. On an H100, cls b1's nine se dispatches took 95 us with the lanes' sums in
// shared memory (a barrier each step of the tree), 85 us with shuffles, and 70 us with x read as vec4 as well.
layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;
layout(std430, set = 0, binding = 0) writeonly buffer O { STORE o[]; };
layout(std430, set = 0, binding = 1) readonly buffer X { STORE x[]; };
layout(std430, set = 0, binding = 1) readonly buffer X4 { STORE4 x4[]; };
layout(std430, set = 0, binding = 2) readonly buffer W1 { STORE w1[]; };
layout(std430, set = 0, binding = 3) readonly buffer B1 { STORE b1[]; };
layout(std430, set = 0, binding = 4) readonly buffer W2 { STORE w2[]; };
layout(std430, set = 0, binding = 5) readonly buffer B2 { STORE b2[]; };
layout(constant_id = 3) const int ACT1 = 0;
layout(constant_id = 4) const int ACT2 = 0;
// x read 4 values a load (HW a multiple of 4, the binding on a 4-value boundary).
layout(constant_id = 5) const bool VEC4 = false;
// The layer's shapes and activation parameters: constants of its own pipeline (a SPECIALIZED kernel).
layout(constant_id = 16) const int C = 1;
layout(constant_id = 17) const int HW = 1;
layout(constant_id = 18) const int C1 = 1;
layout(constant_id = 19) const int HAS_B1 = 0;
layout(constant_id = 20) const int HAS_B2 = 0;
layout(constant_id = 21) const float A1A = 0.0;
layout(constant_id = 22) const float A1B = 0.0;
layout(constant_id = 23) const float A2A = 0.0;
layout(constant_id = 24) const float A2B = 0.0;

// At most C <= 1024 channels and C1 <= 256 (the planner checks).
shared float g[1024];
shared float h[256];

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
#define X_AT(i) float(x[xb + c * HW + (i)])
#define X4_AT(i) hsum(vec4(x4[(xb + c * HW) / 4 + (i)]))
#define W1G(i) (float(w1[j * C + (i)]) * g[i])
#define W2H(i) (float(w2[j * C1 + (i)]) * h[i])

float hsum(vec4 v) {
    return (v.x + v.y) + (v.z + v.w);
}

// How one step spreads `rows` outputs: t lanes each (the most, up to a subgroup, that keep every row in one pass
// where the rows fill the workgroup), slot = which row of a pass this invocation's lanes take, rows a pass.
struct Spread { int t; int lane; int slot; int per_pass; };

Spread spread(int rows) {
    int S = int(gl_SubgroupSize), L = int(gl_WorkGroupSize.x);
    int t = 1;
    while (2 * t <= S && 2 * t * rows <= L) t *= 2;
    int si = int(gl_SubgroupInvocationID);
    return Spread(t, si % t, int(gl_SubgroupID) * (S / t) + si / t, int(gl_NumSubgroups) * (S / t));
}

// The sum of s over each run of t lanes (t a power of two), in every lane of the run; called by every lane.
float lanes_sum(float s, int t) {
    for (int k = t >> 1; k > 0; k >>= 1) s += subgroupShuffleXor(s, uint(k));
    return s;
}

void main() {
    int img = int(gl_WorkGroupID.x);
    int xb = img * C * HW;
    // The means
    Spread d = spread(C);
    for (int c0 = 0; c0 < C; c0 += d.per_pass) {
        int c = c0 + d.slot;
        float s = 0.0;
        if (c < C && VEC4)
            STRIDED_SUM(s, d.lane, HW / 4, d.t, X4_AT)
        else if (c < C)
            STRIDED_SUM(s, d.lane, HW, d.t, X_AT)
        s = lanes_sum(s, d.t);
        if (d.lane == 0 && c < C) g[c] = s / float(HW);
    }
    barrier();
    // h = act1(W1 g + b1)
    d = spread(C1);
    for (int j0 = 0; j0 < C1; j0 += d.per_pass) {
        int j = j0 + d.slot;
        float s = 0.0;
        if (j < C1)
            STRIDED_SUM(s, d.lane, C, d.t, W1G)
        s = lanes_sum(s, d.t);
        if (d.lane == 0 && j < C1) {
            if (HAS_B1 != 0) s += float(b1[j]);
            h[j] = unary_op(s, ACT1, A1A, A1B);
        }
    }
    barrier();
    // out = act2(W2 h + b2)
    d = spread(C);
    for (int j0 = 0; j0 < C; j0 += d.per_pass) {
        int j = j0 + d.slot;
        float s = 0.0;
        if (j < C)
            STRIDED_SUM(s, d.lane, C1, d.t, W2H)
        s = lanes_sum(s, d.t);
        if (d.lane == 0 && j < C) {
            if (HAS_B2 != 0) s += float(b2[j]);
            o[img * C + j] = STORE(unary_op(s, ACT2, A2A, A2B));
        }
    }
}
