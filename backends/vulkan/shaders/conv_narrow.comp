#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"
// 2-D convolution of few output channels (group 1) on large maps, NCHW: each invocation computes
// every output channel for PX pixels of one output row. A workgroup of X x Y x Z invocations covers
// Y output rows of X * PX pixels of one image. Per step of CB input channels it stages the input
// rows its outputs read (zero outside the input) and their weights, as [channel, tap][output
// channel], in shared memory; each invocation then keeps a row's span of inputs in registers and,
// per tap, multiplies the tap's weights for all the channels (vec4 reads, the same for the whole
// workgroup) into its accumulators. One input value feeds every output channel from a register,
// and no tap index is decoded per multiply, unlike conv_gemm, whose tile has rows to spare when
// there are few channels. The Z invocations of a pixel pair share a step's channels (z, z + Z, ...)
// and add their sums through shared memory at the end: an invocation's chain of multiplies is the
// whole sum, so on a map of few workgroups (batch 1) Z cuts the time it takes. launch.py's
// NARROW_X, NARROW_PX and NARROW_STEP match X, PX and CB here.
layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;
layout(std430, set = 0, binding = 0) writeonly buffer O { STORE o[]; };
layout(std430, set = 0, binding = 1) readonly buffer X { STORE x[]; };
layout(std430, set = 0, binding = 2) readonly buffer Wt { STORE w[]; };
layout(std430, set = 0, binding = 3) readonly buffer Bias { STORE bias[]; };
layout(constant_id = 3) const int ACT = 0;
#include "conv_shape.glsl"

const int PX = 2, CB = 8;
const int TX = int(gl_WorkGroupSize.x), TH = int(gl_WorkGroupSize.y), TZ = int(gl_WorkGroupSize.z);
const int TW = TX * PX, TXY = TX * TH, T = TXY * TZ;
const int IH = (TH - 1) * SH + (KH - 1) * DH + 1, IW = (TW - 1) * SW + (KW - 1) * DW + 1;
const int TAPS = KH * KW, C4 = (CO + 3) / 4, SPAN = (PX - 1) * SW + (KW - 1) * DW + 1;

shared float xs[CB * IH * IW];
shared vec4 ws[CB * TAPS * C4];

void main() {
    int tid = int(gl_LocalInvocationIndex), tx = int(gl_LocalInvocationID.x), ty = int(gl_LocalInvocationID.y);
    int tz = int(gl_LocalInvocationID.z), txy = tid - tz * TXY;
    int ntx = (OW + TW - 1) / TW, nty = (OH + TH - 1) / TH, b = int(gl_WorkGroupID.x);
    int n = b / (ntx * nty), oy0 = (b / ntx % nty) * TH, ox0 = (b % ntx) * TW;
    int iy0 = oy0 * SH - PH, ix0 = ox0 * SW - PW, xb = n * C * H * W, K = C * TAPS;

    vec4 acc[C4][PX];
    [[unroll]] for (int c4 = 0; c4 < C4; ++c4)
        [[unroll]] for (int p = 0; p < PX; ++p) acc[c4][p] = vec4(0.0);
    for (int c0 = 0; c0 < C; c0 += CB) {
        for (int e = tid; e < CB * IH * IW; e += T) {
            int c = e / (IH * IW), r = e - c * (IH * IW), iy = iy0 + r / IW, ix = ix0 + r % IW;
            float v = 0.0;
            if (c0 + c < C && uint(iy) < uint(H) && uint(ix) < uint(W)) v = float(x[xb + ((c0 + c) * H + iy) * W + ix]);
            xs[e] = v;
        }
        for (int e = tid; e < CB * TAPS * C4; e += T) {
            int r = e / C4, co = (e - r * C4) * 4, k = c0 * TAPS + r;
            vec4 v = vec4(0.0);
            if (k < K) {
                [[unroll]] for (int j = 0; j < 4; ++j)
                    if (co + j < CO) v[j] = float(w[(co + j) * K + k]);
            }
            ws[e] = v;
        }
        barrier();
        for (int c = tz; c < CB; c += TZ) {
            [[unroll]] for (int ky = 0; ky < KH; ++ky) {
                float xr[SPAN];
                int row = (c * IH + ty * SH + ky * DH) * IW + tx * PX * SW;
                [[unroll]] for (int j = 0; j < SPAN; ++j) xr[j] = xs[row + j];
                [[unroll]] for (int kx = 0; kx < KW; ++kx) {
                    int wr = ((c * KH + ky) * KW + kx) * C4;
                    [[unroll]] for (int c4 = 0; c4 < C4; ++c4) {
                        vec4 wv = ws[wr + c4];
                        [[unroll]] for (int p = 0; p < PX; ++p) acc[c4][p] += wv * xr[p * SW + kx * DW];
                    }
                }
            }
        }
        barrier();
    }

    // The Z slices' sums, one vec4 of each invocation a round, through xs (free after the last step): as many
    // slices a round as xs holds (TXY vec4s each; xs holds at least 4 * TXY floats, IH >= TH and IW >= 2 * TX).
    const int ZR = max(1, min(TZ - 1, CB * IH * IW / (4 * TXY)));
    [[unroll]] for (int c4 = 0; c4 < C4; ++c4)
        [[unroll]] for (int p = 0; p < PX; ++p)
            for (int z0 = 1; z0 < TZ; z0 += ZR) {
                if (tz >= z0 && tz < z0 + ZR) {
                    int at = ((tz - z0) * TXY + txy) * 4;
                    [[unroll]] for (int j = 0; j < 4; ++j) xs[at + j] = acc[c4][p][j];
                }
                barrier();
                if (tz == 0)
                    for (int z = 0; z < min(ZR, TZ - z0); ++z) {
                        int at = (z * TXY + txy) * 4;
                        acc[c4][p] += vec4(xs[at], xs[at + 1], xs[at + 2], xs[at + 3]);
                    }
                barrier();
            }

    int oy = oy0 + ty;
    if (tz != 0 || oy >= OH) return;
    [[unroll]] for (int c4 = 0; c4 < C4; ++c4)
        [[unroll]] for (int j = 0; j < 4; ++j) {
            int co = c4 * 4 + j;
            if (co >= CO) break;
            float bv = HAS_BIAS != 0 ? float(bias[co]) : 0.0;
            [[unroll]] for (int p = 0; p < PX; ++p) {
                int ox = ox0 + tx * PX + p;
                if (ox < OW) o[((n * CO + co) * OH + oy) * OW + ox] = STORE(unary_op(acc[c4][p][j] + bv, ACT, ALPHA, BETA));
            }
        }
}
