#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
// Separable resampling of the last two axes with per-axis tables made on the host:
// for every output row, TH source rows and their weights (and the same for
// columns with TW taps), plus a flag per output row/column that is outside the
// crop (tf_crop_and_resize), where the output is the extrapolation value.
// Nearest is one tap of weight 1; linear two; cubic four.
layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;
layout(std430, set = 0, binding = 0) writeonly buffer O { STORE o[]; };
layout(std430, set = 0, binding = 1) readonly buffer X { STORE x[]; };
layout(std430, set = 0, binding = 2) readonly buffer T { int t[]; };
layout(push_constant) uniform P {
    int NC; int H; int W; int OH; int OW; int TH; int TW;
    int h_idx; int h_w; int h_ex; int w_idx; int w_w; int w_ex;  // table offsets, in ints
    int has_ex; float ex_value;
} p;

void main() {
    int total = p.NC * p.OH * p.OW;
    int stride = int(gl_NumWorkGroups.x * gl_WorkGroupSize.x);
    for (int i = int(gl_GlobalInvocationID.x); i < total; i += stride) {
        int ow = i % p.OW;
        int r = i / p.OW;
        int oh = r % p.OH;
        int nc = r / p.OH;
        if (p.has_ex != 0 && (t[p.h_ex + oh] != 0 || t[p.w_ex + ow] != 0)) {
            o[i] = STORE(p.ex_value);
            continue;
        }
        int b = nc * p.H * p.W;
        float acc = 0.0;
        for (int th = 0; th < p.TH; ++th) {
            float wh = intBitsToFloat(t[p.h_w + oh * p.TH + th]);
            if (wh == 0.0) continue;
            int rb = b + t[p.h_idx + oh * p.TH + th] * p.W;
            float row = 0.0;
            for (int tw = 0; tw < p.TW; ++tw) {
                float wv = intBitsToFloat(t[p.w_w + ow * p.TW + tw]);
                if (wv != 0.0) row += wv * float(x[rb + t[p.w_idx + ow * p.TW + tw]]);
            }
            acc += wh * row;
        }
        o[i] = STORE(acc);
    }
}
