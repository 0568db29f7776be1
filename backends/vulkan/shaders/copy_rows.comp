#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
// Rows of four-vectors a stride apart: o[ob + r * os + c] = x[ib + r * is_ + c] for each row r and column
// c < n, every count in four-vectors: a batch's Concat and Split pieces (each image's block contiguous, a stride
// apart) and plain copies. One division an item of four, where copy.comp divides every element's index by
// each dimension, and 16-byte loads and stores (8 in fp16) where it moves one element at a time.
layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;
layout(std430, set = 0, binding = 0) writeonly buffer O { STORE4 o[]; };
layout(std430, set = 0, binding = 1) readonly buffer X { STORE4 x[]; };
layout(push_constant) uniform P {
    int total; int n; int ib; int ob; int is_; int os;
} p;

void main() {
    int stride = int(gl_NumWorkGroups.x * gl_WorkGroupSize.x);
    for (int i = int(gl_GlobalInvocationID.x); i < p.total; i += stride) {
        int r = i / p.n;
        int c = i - r * p.n;
        o[p.ob + r * p.os + c] = x[p.ib + r * p.is_ + c];
    }
}
