#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
// 2-D transposed convolution, gathered per output element: output index o
// takes input i and tap k where i*stride + k*dilation == o + head.
// Weights are [C, CO/G, KH, KW].
layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;
layout(std430, set = 0, binding = 0) writeonly buffer O { STORE o[]; };
layout(std430, set = 0, binding = 1) readonly buffer X { STORE x[]; };
layout(std430, set = 0, binding = 2) readonly buffer W { STORE w[]; };
layout(std430, set = 0, binding = 3) readonly buffer Bias { STORE bias[]; };
layout(constant_id = 3) const int ACT = 0;
layout(push_constant) uniform P {
    int N; int C; int H; int W; int CO; int OH; int OW;
    int KH; int KW; int SH; int SW; int DH; int DW; int HH; int HW;
    int G; int has_bias; float alpha; float beta;
} p;

void main() {
    int cig = p.C / p.G, cog = p.CO / p.G;
    int total = p.N * p.CO * p.OH * p.OW;
    int stride = int(gl_NumWorkGroups.x * gl_WorkGroupSize.x);
    for (int i = int(gl_GlobalInvocationID.x); i < total; i += stride) {
        int ow = i % p.OW;
        int r = i / p.OW;
        int oh = r % p.OH;
        r /= p.OH;
        int co = r % p.CO;
        int n = r / p.CO;
        int g = co / cog, col = co % cog;
        float acc = p.has_bias != 0 ? float(bias[co]) : 0.0;
        int fh = oh + p.HH, fw = ow + p.HW;
        for (int kh = 0; kh < p.KH; ++kh) {
            int th = fh - kh * p.DH;
            if (th < 0 || th % p.SH != 0) continue;
            int ih = th / p.SH;
            if (ih >= p.H) continue;
            for (int kw = 0; kw < p.KW; ++kw) {
                int tw = fw - kw * p.DW;
                if (tw < 0 || tw % p.SW != 0) continue;
                int iw = tw / p.SW;
                if (iw >= p.W) continue;
                for (int ci = 0; ci < cig; ++ci) {
                    int c = g * cig + ci;
                    acc += float(x[((n * p.C + c) * p.H + ih) * p.W + iw]) *
                           float(w[((c * cog + col) * p.KH + kh) * p.KW + kw]);
                }
            }
        }
        o[i] = STORE(unary_op(acc, ACT, p.alpha, p.beta));
    }
}
