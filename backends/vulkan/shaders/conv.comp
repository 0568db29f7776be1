#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
// Direct 2-D convolution, NCHW, with groups, strides, dilations, pads, bias and
// a fused activation. Each invocation computes up to 4 output channels of one
// pixel that share the input taps (the same group).
layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;
layout(std430, set = 0, binding = 0) writeonly buffer O { STORE o[]; };
layout(std430, set = 0, binding = 1) readonly buffer X { STORE x[]; };
layout(std430, set = 0, binding = 2) readonly buffer W { STORE w[]; };
layout(std430, set = 0, binding = 3) readonly buffer Bias { STORE bias[]; };
layout(constant_id = 3) const int ACT = 0;
layout(push_constant) uniform P {
    int N; int C; int H; int W; int CO; int OH; int OW;
    int KH; int KW; int SH; int SW; int DH; int DW; int PH; int PW;
    int G; int has_bias; float alpha; float beta;
    int blocks;  // output-channel blocks of 4 per group
} p;

void main() {
    int cig = p.C / p.G, cog = p.CO / p.G;
    int total = p.N * p.G * p.blocks * p.OH * p.OW;
    int stride = int(gl_NumWorkGroups.x * gl_WorkGroupSize.x);
    for (int i = int(gl_GlobalInvocationID.x); i < total; i += stride) {
        int ow = i % p.OW;
        int r = i / p.OW;
        int oh = r % p.OH;
        r /= p.OH;
        int blk = r % p.blocks;
        r /= p.blocks;
        int g = r % p.G;
        int n = r / p.G;
        int co0 = g * cog + blk * 4;
        int cnt = min(4, cog - blk * 4);
        vec4 acc = vec4(0.0);
        int ih0 = oh * p.SH - p.PH, iw0 = ow * p.SW - p.PW;
        int khs = 0, khe = p.KH, kws = 0, kwe = p.KW;
        // Clip the taps to the input, so the inner loop has no bounds tests.
        while (khs < khe && ih0 + khs * p.DH < 0) khs++;
        while (khe > khs && ih0 + (khe - 1) * p.DH >= p.H) khe--;
        while (kws < kwe && iw0 + kws * p.DW < 0) kws++;
        while (kwe > kws && iw0 + (kwe - 1) * p.DW >= p.W) kwe--;
        int ksz = p.KH * p.KW;
        int wstride = cig * ksz;  // between output channels
        for (int ci = 0; ci < cig; ++ci) {
            int xb = ((n * p.C + g * cig + ci) * p.H) * p.W;
            int wb = (co0 * cig + ci) * ksz;
            for (int kh = khs; kh < khe; ++kh) {
                int xr = xb + (ih0 + kh * p.DH) * p.W + iw0;
                int wr = wb + kh * p.KW;
                for (int kw = kws; kw < kwe; ++kw) {
                    float v = float(x[xr + kw * p.DW]);
                    int wi = wr + kw;
                    acc.x += v * float(w[wi]);
                    if (cnt > 1) acc.y += v * float(w[wi + wstride]);
                    if (cnt > 2) acc.z += v * float(w[wi + 2 * wstride]);
                    if (cnt > 3) acc.w += v * float(w[wi + 3 * wstride]);
                }
            }
        }
        int ob = ((n * p.CO + co0) * p.OH + oh) * p.OW + ow;
        int plane = p.OH * p.OW;
        for (int j = 0; j < cnt; ++j) {
            float v = acc[j];
            if (p.has_bias != 0) v += float(bias[co0 + j]);
            o[ob + j * plane] = STORE(unary_op(v, ACT, p.alpha, p.beta));
        }
    }
}
