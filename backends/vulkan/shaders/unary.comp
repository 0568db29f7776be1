#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;
layout(std430, set = 0, binding = 0) writeonly buffer O { STORE o[]; };
layout(std430, set = 0, binding = 1) readonly buffer X { STORE x[]; };
layout(constant_id = 3) const int OP = 0;
layout(push_constant) uniform P { int n; float a; float b; } p;

void main() {
    int stride = int(gl_NumWorkGroups.x * gl_WorkGroupSize.x);
    for (int i = int(gl_GlobalInvocationID.x); i < p.n; i += stride)
        o[i] = STORE(unary_op(float(x[i]), OP, p.a, p.b));
}
