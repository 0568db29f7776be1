#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
// out = act(op(a, b)) with numpy broadcasting, expressed as per-dimension strides
// (0 where an input is broadcast) over the output shape, at most 6 dimensions.
layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;
layout(std430, set = 0, binding = 0) writeonly buffer O { STORE o[]; };
layout(std430, set = 0, binding = 1) readonly buffer A { STORE a[]; };
layout(std430, set = 0, binding = 2) readonly buffer B { STORE b[]; };
layout(constant_id = 3) const int OP = 0;
layout(constant_id = 4) const int ACT = 0;
layout(constant_id = 5) const int NDIM = 1;  // 1 to 6
layout(push_constant) uniform P {
    int n; float alpha; float beta;
    int shape[6]; int sa[6]; int sb[6];
} p;

void main() {
    int stride = int(gl_NumWorkGroups.x * gl_WorkGroupSize.x);
    for (int i = int(gl_GlobalInvocationID.x); i < p.n; i += stride) {
        int ia, ib;
        if (NDIM == 1) {
            ia = i * p.sa[0];
            ib = i * p.sb[0];
        } else {
            ia = 0;
            ib = 0;
            int r = i;
            for (int d = NDIM - 1; d > 0; --d) {
                int c = r % p.shape[d];
                r /= p.shape[d];
                ia += c * p.sa[d];
                ib += c * p.sb[d];
            }
            ia += r * p.sa[0];
            ib += r * p.sb[0];
        }
        float v = binary_op(float(a[ia]), float(b[ib]), OP);
        o[i] = STORE(unary_op(v, ACT, p.alpha, p.beta));
    }
}
