#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
// 2-D max, average and Lp pooling, NCHW. Average divides by the taps inside
// [lo, hi) per axis: the input, or the input plus its explicit pads.
layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;
layout(std430, set = 0, binding = 0) writeonly buffer O { STORE o[]; };
layout(std430, set = 0, binding = 1) readonly buffer X { STORE x[]; };
layout(constant_id = 3) const int MODE = 0;  // 0 max, 1 average, 2 Lp
layout(push_constant) uniform P {
    int NC; int H; int W; int OH; int OW;
    int KH; int KW; int SH; int SW; int DH; int DW; int PH; int PW;
    int lo_h; int hi_h; int lo_w; int hi_w;
    float lp;
} p;

void main() {
    int total = p.NC * p.OH * p.OW;
    int stride = int(gl_NumWorkGroups.x * gl_WorkGroupSize.x);
    for (int i = int(gl_GlobalInvocationID.x); i < total; i += stride) {
        int ow = i % p.OW;
        int r = i / p.OW;
        int oh = r % p.OH;
        int nc = r / p.OH;
        int ih0 = oh * p.SH - p.PH, iw0 = ow * p.SW - p.PW;
        int xb = nc * p.H * p.W;
        float acc = MODE == 0 ? -INF : 0.0;
        int cnt_h = 0, cnt_w = 0;
        for (int kh = 0; kh < p.KH; ++kh) {
            int ih = ih0 + kh * p.DH;
            if (ih >= p.lo_h && ih < p.hi_h) cnt_h++;
            if (ih < 0 || ih >= p.H) continue;
            for (int kw = 0; kw < p.KW; ++kw) {
                int iw = iw0 + kw * p.DW;
                if (iw < 0 || iw >= p.W) continue;
                float v = float(x[xb + ih * p.W + iw]);
                if (MODE == 0) acc = (isnan(v) || v > acc) ? v : acc;
                else if (MODE == 1) acc += v;
                else acc += p.lp == 1.0 ? abs(v) : (p.lp == 2.0 ? v * v : pow(abs(v), p.lp));
            }
        }
        for (int kw = 0; kw < p.KW; ++kw) {
            int iw = iw0 + kw * p.DW;
            if (iw >= p.lo_w && iw < p.hi_w) cnt_w++;
        }
        if (MODE == 1) {
            int cnt = cnt_h * cnt_w;
            acc /= float(cnt == 0 ? 1 : cnt);
        } else if (MODE == 2) {
            acc = p.lp == 1.0 ? acc : (p.lp == 2.0 ? sqrt(acc) : pow(acc, 1.0 / p.lp));
        }
        o[i] = STORE(acc);
    }
}
