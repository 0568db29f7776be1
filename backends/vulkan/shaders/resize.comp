#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
// Separable resampling of the last two axes with per-axis tables made on the host:
// for every output row, TH source rows and their weights (and the same for
// columns with TW taps), plus a flag per output row/column that is outside the
// crop (tf_crop_and_resize), where the output is the extrapolation value.
// Nearest is one tap of weight 1; linear two; cubic four. A nearest upsampling
// by whole factors (FH, FW > 0) reads its source pixel without the tables.
// The layer's words are specialization constants (program.SPECIALIZED): the
// driver folds the divisions by its shapes and the tap loops' counts.
layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;
layout(std430, set = 0, binding = 0) writeonly buffer O { STORE o[]; };
layout(std430, set = 0, binding = 1) readonly buffer X { STORE x[]; };
layout(std430, set = 0, binding = 2) readonly buffer T { int t[]; };
layout(constant_id = 16) const int NC = 1;
layout(constant_id = 17) const int H = 1;
layout(constant_id = 18) const int W = 1;
layout(constant_id = 19) const int OH = 1;
layout(constant_id = 20) const int OW = 1;
layout(constant_id = 21) const int TH = 1;
layout(constant_id = 22) const int TW = 1;
layout(constant_id = 23) const int H_IDX = 0;  // table offsets, in ints
layout(constant_id = 24) const int H_W = 0;
layout(constant_id = 25) const int H_EX = 0;
layout(constant_id = 26) const int W_IDX = 0;
layout(constant_id = 27) const int W_W = 0;
layout(constant_id = 28) const int W_EX = 0;
layout(constant_id = 29) const int HAS_EX = 0;
layout(constant_id = 30) const int EX_AT = 0;  // where the table holds the extrapolation value's bits
layout(constant_id = 31) const int FH = 0;
layout(constant_id = 32) const int FW = 0;

void main() {
    int total = NC * OH * OW;
    int stride = int(gl_NumWorkGroups.x * gl_WorkGroupSize.x);
    for (int i = int(gl_GlobalInvocationID.x); i < total; i += stride) {
        int ow = i % OW;
        int r = i / OW;
        int oh = r % OH;
        int nc = r / OH;
        int b = nc * H * W;
        if (FH > 0 && FW > 0) {
            o[i] = x[b + oh / FH * W + ow / FW];
            continue;
        }
        if (HAS_EX != 0 && (t[H_EX + oh] != 0 || t[W_EX + ow] != 0)) {
            o[i] = STORE(intBitsToFloat(t[EX_AT]));
            continue;
        }
        float acc = 0.0;
        for (int th = 0; th < TH; ++th) {
            float wh = intBitsToFloat(t[H_W + oh * TH + th]);
            if (wh == 0.0) continue;
            int rb = b + t[H_IDX + oh * TH + th] * W;
            float row = 0.0;
            for (int tw = 0; tw < TW; ++tw) {
                float wv = intBitsToFloat(t[W_W + ow * TW + tw]);
                if (wv != 0.0) row += wv * float(x[rb + t[W_IDX + ow * TW + tw]]);
            }
            acc += wh * row;
        }
        o[i] = STORE(acc);
    }
}
