#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
// LayerNormalization of x viewed as [rows, N]: y = (x - mean) / sqrt(var + eps) * scale + bias.
layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;
layout(std430, set = 0, binding = 0) writeonly buffer O { STORE o[]; };
layout(std430, set = 0, binding = 1) readonly buffer X { STORE x[]; };
layout(std430, set = 0, binding = 2) readonly buffer S { STORE scale[]; };
layout(std430, set = 0, binding = 3) readonly buffer Bias { STORE bias[]; };
layout(push_constant) uniform P { int rows; int N; float eps; int has_bias; } p;

shared float red[256];

float sum_all(float v) {
    int lid = int(gl_LocalInvocationID.x);
    red[lid] = v;
    barrier();
    for (int s = int(gl_WorkGroupSize.x) / 2; s > 0; s >>= 1) {
        if (lid < s) red[lid] += red[lid + s];
        barrier();
    }
    float r = red[0];
    barrier();
    return r;
}

void main() {
    int row = int(gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x);
    if (row >= p.rows) return;
    int base = row * p.N;
    int lid = int(gl_LocalInvocationID.x);
    int ls = int(gl_WorkGroupSize.x);
    float s = 0.0;
    for (int j = lid; j < p.N; j += ls) s += float(x[base + j]);
    float mean = sum_all(s) / float(p.N);
    float q = 0.0;
    for (int j = lid; j < p.N; j += ls) {
        float d = float(x[base + j]) - mean;
        q += d * d;
    }
    float inv = 1.0 / sqrt(sum_all(q) / float(p.N) + p.eps);
    for (int j = lid; j < p.N; j += ls) {
        float v = (float(x[base + j]) - mean) * inv * float(scale[j]);
        if (p.has_bias != 0) v += float(bias[j]);
        o[base + j] = STORE(v);
    }
}
