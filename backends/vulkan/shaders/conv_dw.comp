#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"
// Depthwise 2-D convolution (each output channel reads its own input channel: G = C = CO), NCHW, with strides,
// dilations, pads, bias and a fused activation, as conv.comp has them. Each invocation computes PX consecutive
// pixels of one output row: a kernel row's inputs for all PX of them are loaded once into registers (SPAN of
// them, at most SEG; ops/conv.py checks) and each weight once, where conv.comp loads every tap's input and
// weight again for each pixel. The strides and kernel sizes are specialization constants: the loops unroll,
// and the register indices are constants.
layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;
layout(std430, set = 0, binding = 0) writeonly buffer O { STORE o[]; };
layout(std430, set = 0, binding = 1) readonly buffer X { STORE x[]; };
layout(std430, set = 0, binding = 2) readonly buffer Wt { STORE w[]; };
layout(std430, set = 0, binding = 3) readonly buffer Bias { STORE bias[]; };
layout(constant_id = 3) const int ACT = 0;
#include "conv_shape.glsl"
#define PX 4
#define SEG 32
const int SPAN = (PX - 1) * SW + (KW - 1) * DW + 1;

void main() {
    int qw = (OW + PX - 1) / PX;  // runs of PX pixels a row
    int total = N * CO * OH * qw;
    int stride = int(gl_NumWorkGroups.x * gl_WorkGroupSize.x);
    for (int i = int(gl_GlobalInvocationID.x); i < total; i += stride) {
        int q = i % qw;
        int r = i / qw;
        int oh = r % OH;
        r /= OH;
        int c = r % CO;
        int n = r / CO;
        int ow0 = q * PX, ih0 = oh * SH - PH, iw0 = ow0 * SW - PW;
        int xb = (n * C + c) * H * W, wb = c * KH * KW;
        float acc[PX];
        [[unroll]] for (int p = 0; p < PX; ++p) acc[p] = 0.0;
        [[unroll]] for (int kh = 0; kh < KH; ++kh) {
            int ih = ih0 + kh * DH;
            if (uint(ih) >= uint(H)) continue;
            float seg[SEG];
            [[unroll]] for (int s = 0; s < SEG; ++s) {
                if (s >= SPAN) break;
                int iw = iw0 + s;
                seg[s] = uint(iw) < uint(W) ? float(x[xb + ih * W + iw]) : 0.0;
            }
            [[unroll]] for (int kw = 0; kw < KW; ++kw) {
                float wv = float(w[wb + kh * KW + kw]);
                [[unroll]] for (int p = 0; p < PX; ++p) acc[p] += wv * seg[p * SW + kw * DW];
            }
        }
        float bv = HAS_BIAS != 0 ? float(bias[c]) : 0.0;
        int ob = ((n * CO + c) * OH + oh) * OW + ow0;
        [[unroll]] for (int p = 0; p < PX; ++p)
            if (ow0 + p < OW) o[ob + p] = STORE(unary_op(acc[p] + bv, ACT, ALPHA, BETA));
    }
}
