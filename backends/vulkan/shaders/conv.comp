#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
// Direct 2-D convolution, NCHW, with groups, strides, dilations, pads, bias and
// a fused activation. Each invocation computes up to 4 output channels of one
// pixel that share the input taps (the same group).
layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;
layout(std430, set = 0, binding = 0) writeonly buffer O { STORE o[]; };
layout(std430, set = 0, binding = 1) readonly buffer X { STORE x[]; };
layout(std430, set = 0, binding = 2) readonly buffer Wt { STORE w[]; };
layout(std430, set = 0, binding = 3) readonly buffer Bias { STORE bias[]; };
layout(constant_id = 3) const int ACT = 0;
#include "conv_shape.glsl"

void main() {
    int cig = C / G, cog = CO / G;
    int total = N * G * BLOCKS * OH * OW;
    int stride = int(gl_NumWorkGroups.x * gl_WorkGroupSize.x);
    for (int i = int(gl_GlobalInvocationID.x); i < total; i += stride) {
        int ow = i % OW;
        int r = i / OW;
        int oh = r % OH;
        r /= OH;
        int blk = r % BLOCKS;
        r /= BLOCKS;
        int g = r % G;
        int n = r / G;
        int co0 = g * cog + blk * 4;
        int cnt = min(4, cog - blk * 4);
        vec4 acc = vec4(0.0);
        int ih0 = oh * SH - PH, iw0 = ow * SW - PW;
        int ksz = KH * KW;
        int wstride = cig * ksz;  // between output channels
        // Every tap, skipping those in the padding: the loops have constant counts, which the driver unrolls.
        for (int ci = 0; ci < cig; ++ci) {
            int xb = ((n * C + g * cig + ci) * H) * W;
            int wb = (co0 * cig + ci) * ksz;
            for (int kh = 0; kh < KH; ++kh) {
                int ih = ih0 + kh * DH;
                if (uint(ih) >= uint(H)) continue;
                int xr = xb + ih * W + iw0;
                int wr = wb + kh * KW;
                for (int kw = 0; kw < KW; ++kw) {
                    if (uint(iw0 + kw * DW) >= uint(W)) continue;
                    float v = float(x[xr + kw * DW]);
                    int wi = wr + kw;
                    acc.x += v * float(w[wi]);
                    if (cnt > 1) acc.y += v * float(w[wi + wstride]);
                    if (cnt > 2) acc.z += v * float(w[wi + 2 * wstride]);
                    if (cnt > 3) acc.w += v * float(w[wi + 3 * wstride]);
                }
            }
        }
        int ob = ((n * CO + co0) * OH + oh) * OW + ow;
        int plane = OH * OW;
        for (int j = 0; j < cnt; ++j) {
            float v = acc[j];
            if (HAS_BIAS != 0) v += float(bias[co0 + j]);
            o[ob + j * plane] = STORE(unary_op(v, ACT, ALPHA, BETA));
        }
    }
}
