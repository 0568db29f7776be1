#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
// 2-D transposed convolution, gathered per output element: output index o
// takes input i and tap k where i*stride + k*dilation == o + head.
// Weights are [C, CO/G, KH, KW].
layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;
layout(std430, set = 0, binding = 0) writeonly buffer O { STORE o[]; };
layout(std430, set = 0, binding = 1) readonly buffer X { STORE x[]; };
layout(std430, set = 0, binding = 2) readonly buffer Wt { STORE w[]; };
layout(std430, set = 0, binding = 3) readonly buffer Bias { STORE bias[]; };
layout(constant_id = 3) const int ACT = 0;
#include "conv_shape.glsl"

void main() {
    int cig = C / G, cog = CO / G;
    int total = N * CO * OH * OW;
    int stride = int(gl_NumWorkGroups.x * gl_WorkGroupSize.x);
    for (int i = int(gl_GlobalInvocationID.x); i < total; i += stride) {
        int ow = i % OW;
        int r = i / OW;
        int oh = r % OH;
        r /= OH;
        int co = r % CO;
        int n = r / CO;
        int g = co / cog, col = co % cog;
        float acc = HAS_BIAS != 0 ? float(bias[co]) : 0.0;
        int fh = oh + PH, fw = ow + PW;
        for (int kh = 0; kh < KH; ++kh) {
            int th = fh - kh * DH;
            if (th < 0 || th % SH != 0) continue;
            int ih = th / SH;
            if (ih >= H) continue;
            for (int kw = 0; kw < KW; ++kw) {
                int tw = fw - kw * DW;
                if (tw < 0 || tw % SW != 0) continue;
                int iw = tw / SW;
                if (iw >= W) continue;
                for (int ci = 0; ci < cig; ++ci) {
                    int c = g * cig + ci;
                    acc += float(x[((n * C + c) * H + ih) * W + iw]) *
                           float(w[((c * cog + col) * KH + kh) * KW + kw]);
                }
            }
        }
        o[i] = STORE(unary_op(acc, ACT, ALPHA, BETA));
    }
}
