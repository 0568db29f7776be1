#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
// out = op(x) over n dense elements. VEC4 has each invocation take 4 consecutive ones, read and written as
// vec4s (f16vec4 with FP16) through second views of the bindings: the host sets it where n is a multiple
// of 4 and both bindings start 16 bytes aligned (8 with FP16). The arithmetic per element is the scalar
// path's (the conversions to and from the storage type componentwise), so both give the same bits.
layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;
layout(std430, set = 0, binding = 0) writeonly buffer O { STORE o[]; };
layout(std430, set = 0, binding = 1) readonly buffer X { STORE x[]; };
layout(std430, set = 0, binding = 0) writeonly buffer O4 { STORE4 o4[]; };
layout(std430, set = 0, binding = 1) readonly buffer X4 { STORE4 x4[]; };
layout(constant_id = 3) const int OP = 0;
layout(constant_id = 4) const int VEC4 = 0;
layout(push_constant) uniform P { int n; float a; float b; } p;

float apply(float v) {
    return unary_op(v, OP, p.a, p.b);
}

void main() {
    int stride = int(gl_NumWorkGroups.x * gl_WorkGroupSize.x);
    if (VEC4 != 0) {
        int n4 = p.n >> 2;
        for (int q = int(gl_GlobalInvocationID.x); q < n4; q += stride) {
            vec4 v = vec4(x4[q]);
            o4[q] = STORE4(vec4(apply(v.x), apply(v.y), apply(v.z), apply(v.w)));
        }
        return;
    }
    for (int i = int(gl_GlobalInvocationID.x); i < p.n; i += stride)
        o[i] = STORE(apply(float(x[i])));
}
