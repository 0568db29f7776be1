#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
// One raster region (aiomnn/regions.py): for i < size0, j < size1, k < size2,
// o[ob + i*os0 + j*os1 + k*os2] = x[ib + i*is0 + j*is1 + k*is2], over the n = size0*size1*size2 elements.
// Every op that only moves data is regions of this, one dispatch a region (ops/raster.py).
// FILL = 1 instead sets o[0..n) to the fill value (Pad's constant), before the regions copy: x is not read.
// Strides may be negative (a backward Slice); the host checks that every index fits an int.
layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;
layout(std430, set = 0, binding = 0) writeonly buffer O { STORE o[]; };
layout(std430, set = 0, binding = 1) readonly buffer X { STORE x[]; };
layout(constant_id = 3) const int FILL = 0;
layout(push_constant) uniform P {
    int n; int ib; int ob;
    int size1; int size2;
    int is0; int is1; int is2;
    int os0; int os1; int os2;
    float fill;
} p;

void main() {
    int stride = int(gl_NumWorkGroups.x * gl_WorkGroupSize.x);
    if (FILL != 0) {
        for (int i = int(gl_GlobalInvocationID.x); i < p.n; i += stride)
            o[i] = STORE(p.fill);
        return;
    }
    for (int i = int(gl_GlobalInvocationID.x); i < p.n; i += stride) {
        int k = i % p.size2;
        int r = i / p.size2;
        int j = r % p.size1;
        int a = r / p.size1;
        o[p.ob + a * p.os0 + j * p.os1 + k * p.os2] = x[p.ib + a * p.is0 + j * p.is1 + k * p.is2];
    }
}
