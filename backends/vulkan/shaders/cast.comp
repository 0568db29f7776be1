#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
// Converts between the host's float32 and the storage type (float16 under -DFP16), so fp16 sessions
// take and give float32 without the host converting: h is a device tensor, f a float32 staging area.
// TO_F32 = 0 fills h from f (an input), 1 fills f from h (an output).
layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;
layout(std430, set = 0, binding = 0) buffer H { STORE h[]; };
layout(std430, set = 0, binding = 1) buffer F { float f[]; };
layout(constant_id = 3) const int TO_F32 = 0;
layout(push_constant) uniform P { int n; } p;

void main() {
    int stride = int(gl_NumWorkGroups.x * gl_WorkGroupSize.x);
    for (int i = int(gl_GlobalInvocationID.x); i < p.n; i += stride) {
        if (TO_F32 != 0) f[i] = float(h[i]);
        else h[i] = STORE(f[i]);
    }
}
