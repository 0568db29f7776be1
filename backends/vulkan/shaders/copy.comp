#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
// A strided copy over an index space of at most 6 dimensions:
// o[ob + sum(c_d * os_d)] = x[ib + sum(c_d * is_d)]. Transpose, Slice, Expand,
// Concat and Split (one dispatch per piece) and copies are all this.
layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;
layout(std430, set = 0, binding = 0) writeonly buffer O { STORE o[]; };
layout(std430, set = 0, binding = 1) readonly buffer X { STORE x[]; };
layout(constant_id = 3) const int NDIM = 1;  // 1 to 6
layout(push_constant) uniform P {
    int n; int ib; int ob;
    int shape[6]; int is_[6]; int os[6];
} p;

void main() {
    int stride = int(gl_NumWorkGroups.x * gl_WorkGroupSize.x);
    for (int i = int(gl_GlobalInvocationID.x); i < p.n; i += stride) {
        int ii = p.ib, io = p.ob, r = i;
        for (int d = NDIM - 1; d > 0; --d) {
            int c = r % p.shape[d];
            r /= p.shape[d];
            ii += c * p.is_[d];
            io += c * p.os[d];
        }
        ii += r * p.is_[0];
        io += r * p.os[0];
        o[io] = x[ii];
    }
}
