#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
// Reduce x viewed as [outer, R, inner] over R: one workgroup per output.
// Also GlobalAveragePool/GlobalMaxPool (inner = 1).
layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;
layout(std430, set = 0, binding = 0) writeonly buffer O { STORE o[]; };
layout(std430, set = 0, binding = 1) readonly buffer X { STORE x[]; };
layout(push_constant) uniform P {
    int outer; int R; int inner;
} p;
// 0 sum 1 mean 2 max 3 min 4 sum-square 5 L1 6 L2 7 log-sum 8 prod 9 log-sum-exp
layout(constant_id = 3) const int OP = 0;

shared float red[256];

float combine(float u, float v, int op) {
    if (op == 2) return (isnan(u) || isnan(v)) ? NAN_ : max(u, v);
    if (op == 3) return (isnan(u) || isnan(v)) ? NAN_ : min(u, v);
    if (op == 8) return u * v;
    return u + v;
}

float reduce_all(float v, int op) {
    int lid = int(gl_LocalInvocationID.x);
    int ls = int(gl_WorkGroupSize.x);
    red[lid] = v;
    barrier();
    for (int s = ls / 2; s > 0; s >>= 1) {
        if (lid < s) red[lid] = combine(red[lid], red[lid + s], op);
        barrier();
    }
    float r = red[0];
    barrier();
    return r;
}

void main() {
    int idx = int(gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x);
    if (idx >= p.outer * p.inner) return;
    int oi = idx / p.inner, ii = idx % p.inner;
    int base = oi * p.R * p.inner + ii;
    int lid = int(gl_LocalInvocationID.x);
    int ls = int(gl_WorkGroupSize.x);
    const int op = OP;
    float init = op == 2 ? -INF : (op == 3 ? INF : (op == 8 ? 1.0 : 0.0));
    float shift = 0.0;
    if (op == 9) {
        float m = -INF;
        for (int r = lid; r < p.R; r += ls) m = max(m, float(x[base + r * p.inner]));
        shift = reduce_all(m, 2);
        if (isinf(shift)) shift = 0.0;
    }
    float acc = init;
    for (int r = lid; r < p.R; r += ls) {
        float v = float(x[base + r * p.inner]);
        if (op == 4 || op == 6) v = v * v;
        else if (op == 5) v = abs(v);
        else if (op == 9) v = exp(v - shift);
        acc = combine(acc, v, op);
    }
    float total = reduce_all(acc, op);
    if (lid == 0) {
        if (op == 1) total /= float(p.R);
        else if (op == 6) total = sqrt(total);
        else if (op == 7) total = log(total);
        else if (op == 9) total = log(total) + shift;
        o[idx] = STORE(total);
    }
}
