#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
// 2-D transposed convolution, gathered per output element: output index o
// takes input i and tap k where i*stride + k*dilation == o + head.
// Weights are [C, CO/G, KH, KW]. An invocation computes four consecutive
// output channels of a group at one output pixel: each input it gathers feeds
// all four (the weights of neighbouring invocations are the same or a tap
// apart, cached).
layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;
layout(std430, set = 0, binding = 0) writeonly buffer O { STORE o[]; };
layout(std430, set = 0, binding = 1) readonly buffer X { STORE x[]; };
layout(std430, set = 0, binding = 2) readonly buffer Wt { STORE w[]; };
layout(std430, set = 0, binding = 3) readonly buffer Bias { STORE bias[]; };
layout(constant_id = 3) const int ACT = 0;
#include "conv_shape.glsl"

void main() {
    int cig = C / G, cog = CO / G, cob = (cog + 3) / 4, taps = KH * KW;
    int total = N * G * cob * OH * OW;
    int stride = int(gl_NumWorkGroups.x * gl_WorkGroupSize.x);
    for (int i = int(gl_GlobalInvocationID.x); i < total; i += stride) {
        int ow = i % OW;
        int r = i / OW;
        int oh = r % OH;
        r /= OH;
        int col = r % cob * 4;
        r /= cob;
        int g = r % G, n = r / G;
        // The four channels' weight offsets: past the group's last channel, its last one again (results unused).
        ivec4 wo = ivec4(min(col, cog - 1), min(col + 1, cog - 1), min(col + 2, cog - 1), min(col + 3, cog - 1)) * taps;
        vec4 acc = vec4(0.0);
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
                int xi = ((n * C + g * cig) * H + ih) * W + iw, wi = g * cig * cog * taps + kh * KW + kw;
                for (int ci = 0; ci < cig; ++ci) {
                    acc += float(x[xi]) * vec4(float(w[wi + wo.x]), float(w[wi + wo.y]), float(w[wi + wo.z]),
                                               float(w[wi + wo.w]));
                    xi += H * W;
                    wi += cog * taps;
                }
            }
        }
        int ob = ((n * CO + g * cog + col) * OH + oh) * OW + ow;
        for (int j = 0; j < 4 && col + j < cog; ++j) {
            float bv = HAS_BIAS != 0 ? float(bias[g * cog + col + j]) : 0.0;
            o[ob + j * OH * OW] = STORE(unary_op(acc[j] + bv, ACT, ALPHA, BETA));
        }
    }
}
