#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
// 2-D transposed convolution whose kernel is its stride, without dilation or pads (an upsampling by a learned
// kernel): every input pixel makes its own KH x KW block of outputs, and no two blocks overlap. An invocation
// takes one input pixel and four output channels of a group: it reads the pixel's input channels once and writes
// the block of each channel. (convt.comp gathers per output: the invocations of a row take alternate taps, and
// the sum over the input channels runs once per tap column, half of them idle each time.) Weights are
// [C, CO/G, KH, KW]; past a group's last channel its last one is read again, the results unused.
layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;
layout(std430, set = 0, binding = 0) writeonly buffer O { STORE o[]; };
layout(std430, set = 0, binding = 1) readonly buffer X { STORE x[]; };
layout(std430, set = 0, binding = 2) readonly buffer Wt { STORE w[]; };
layout(std430, set = 0, binding = 3) readonly buffer Bias { STORE bias[]; };
layout(constant_id = 3) const int ACT = 0;
#include "conv_shape.glsl"

const int TAPS = KH * KW;

void main() {
    int cig = C / G, cog = CO / G, cob = (cog + 3) / 4;
    int total = N * G * cob * H * W;
    int stride = int(gl_NumWorkGroups.x * gl_WorkGroupSize.x);
    for (int i = int(gl_GlobalInvocationID.x); i < total; i += stride) {
        int iw = i % W;
        int r = i / W;
        int ih = r % H;
        r /= H;
        int col = r % cob * 4;
        r /= cob;
        int g = r % G, n = r / G;
        ivec4 wo = ivec4(min(col, cog - 1), min(col + 1, cog - 1), min(col + 2, cog - 1), min(col + 3, cog - 1)) * TAPS;
        vec4 acc[TAPS];
        for (int t = 0; t < TAPS; ++t) acc[t] = vec4(0.0);
        int xi = ((n * C + g * cig) * H + ih) * W + iw, wi = g * cig * cog * TAPS;
        for (int ci = 0; ci < cig; ++ci) {
            float v = float(x[xi]);
            for (int t = 0; t < TAPS; ++t)
                acc[t] += v * vec4(float(w[wi + wo.x + t]), float(w[wi + wo.y + t]), float(w[wi + wo.z + t]),
                                   float(w[wi + wo.w + t]));
            xi += H * W;
            wi += cog * TAPS;
        }
        for (int j = 0; j < 4 && col + j < cog; ++j) {
            int co = g * cog + col + j;
            float bv = HAS_BIAS != 0 ? float(bias[co]) : 0.0;
            int ob = ((n * CO + co) * OH + ih * KH) * OW + iw * KW;
            for (int t = 0; t < TAPS; ++t)
                o[ob + t / KW * OW + t % KW] = STORE(unary_op(acc[t][j] + bv, ACT, ALPHA, BETA));
        }
    }
}
