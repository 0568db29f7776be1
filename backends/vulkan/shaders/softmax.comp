#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
// Softmax / LogSoftmax of x viewed as [outer, A, inner] along A: one workgroup per row.
layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;
layout(std430, set = 0, binding = 0) writeonly buffer O { STORE o[]; };
layout(std430, set = 0, binding = 1) readonly buffer X { STORE x[]; };
layout(constant_id = 3) const int LOG = 0;
layout(push_constant) uniform P { int outer; int A; int inner; } p;

shared float red[256];

float reduce_all(float v, bool is_max) {
    int lid = int(gl_LocalInvocationID.x);
    red[lid] = v;
    barrier();
    for (int s = int(gl_WorkGroupSize.x) / 2; s > 0; s >>= 1) {
        if (lid < s) red[lid] = is_max ? max(red[lid], red[lid + s]) : red[lid] + red[lid + s];
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
    int base = oi * p.A * p.inner + ii;
    int lid = int(gl_LocalInvocationID.x);
    int ls = int(gl_WorkGroupSize.x);
    float m = -INF;
    for (int a = lid; a < p.A; a += ls) m = max(m, float(x[base + a * p.inner]));
    m = reduce_all(m, true);
    float s = 0.0;
    for (int a = lid; a < p.A; a += ls) s += exp(float(x[base + a * p.inner]) - m);
    s = reduce_all(s, false);
    if (LOG != 0) {
        float ls_ = log(s);
        for (int a = lid; a < p.A; a += ls) o[base + a * p.inner] = STORE(float(x[base + a * p.inner]) - m - ls_);
    } else {
        float inv = 1.0 / s;
        for (int a = lid; a < p.A; a += ls) o[base + a * p.inner] = STORE(exp(float(x[base + a * p.inner]) - m) * inv);
    }
}
