#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
// out = act(op(a, b)) with numpy broadcasting, expressed as per-dimension strides
// (0 where an input is broadcast) over the output shape, at most 6 dimensions.
//
// VEC4 (bit 0) has each invocation take 4 consecutive outputs, read and written as vec4s (f16vec4 with
// FP16) through second views of the bindings. The host sets it only where the innermost dimension is a
// multiple of 4, each input's innermost stride is 1 (with every other stride a multiple of 4: a vector
// starts at an element index that is a multiple of 4) or 0 (bits 1 and 2: a, b take one element for all
// 4, broadcast), and the bindings a vector is read or written through start 16 bytes aligned (8 with FP16).
// The arithmetic per element is the scalar path's (and the conversions to and from the storage type, one
// componentwise vector conversion), so both give the same bits.
layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;
layout(std430, set = 0, binding = 0) writeonly buffer O { STORE o[]; };
layout(std430, set = 0, binding = 1) readonly buffer A { STORE a[]; };
layout(std430, set = 0, binding = 2) readonly buffer B { STORE b[]; };
layout(std430, set = 0, binding = 0) writeonly buffer O4 { STORE4 o4[]; };
layout(std430, set = 0, binding = 1) readonly buffer A4 { STORE4 a4[]; };
layout(std430, set = 0, binding = 2) readonly buffer B4 { STORE4 b4[]; };
layout(constant_id = 3) const int OP = 0;
layout(constant_id = 4) const int ACT = 0;
layout(constant_id = 5) const int NDIM = 1;  // 1 to 6
layout(constant_id = 6) const int VEC4 = 0;  // bit 0: 4 outputs an invocation; bit 1: a broadcast along them; bit 2: b
layout(push_constant) uniform P {
    int n; float alpha; float beta;
    int shape[6]; int sa[6]; int sb[6];
} p;

// The element indices of a and b that output element i reads.
void index(int i, out int ia, out int ib) {
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
}

float apply(float x, float y) {
    return unary_op(binary_op(x, y, OP), ACT, p.alpha, p.beta);
}

void main() {
    int stride = int(gl_NumWorkGroups.x * gl_WorkGroupSize.x);
    if ((VEC4 & 1) != 0) {
        int n4 = p.n >> 2;
        for (int q = int(gl_GlobalInvocationID.x); q < n4; q += stride) {
            int ia, ib;
            index(4 * q, ia, ib);
            vec4 x = (VEC4 & 2) != 0 ? vec4(float(a[ia])) : vec4(a4[ia >> 2]);
            vec4 y = (VEC4 & 4) != 0 ? vec4(float(b[ib])) : vec4(b4[ib >> 2]);
            o4[q] = STORE4(vec4(apply(x.x, y.x), apply(x.y, y.y), apply(x.z, y.z), apply(x.w, y.w)));
        }
        return;
    }
    for (int i = int(gl_GlobalInvocationID.x); i < p.n; i += stride) {
        int ia, ib;
        index(i, ia, ib);
        o[i] = STORE(apply(float(a[ia]), float(b[ib])));
    }
}
