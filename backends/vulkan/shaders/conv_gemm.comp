#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"
// Implicit-GEMM 2-D convolution, NCHW, per group:
//   out[co][pixel] = sum_k W[co][k] * X[k][pixel],  k = (ci, kh, kw), pixel = (n, oh, ow),
// where X is the input unfolded (im2col) on the fly, zero in the padding. A workgroup of
// (BN/4) x (BM/4) invocations computes a BM (output channels) x BN (pixels) tile, 4x4 values
// per invocation, like matmul.comp: TK values of k at a time go through shared memory, and
// the next TK are loaded into registers while these are used. The workgroup size is the
// tile choice (launch.py).
//
// Split K: the grid's z is groups x S. With S > 1 each of the tile's S workgroups sums one
// slice of k into `part`, and the last of them to finish (counted in `cnt`, which it resets)
// adds the S partial sums in order, so results do not depend on timing. Bias and the fused
// activation come last. Push constants as conv.comp's.
layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;
layout(std430, set = 0, binding = 0) writeonly buffer O { STORE o[]; };
layout(std430, set = 0, binding = 1) readonly buffer X { STORE x[]; };
layout(std430, set = 0, binding = 2) readonly buffer W { STORE w[]; };
layout(std430, set = 0, binding = 3) readonly buffer Bias { STORE bias[]; };
layout(std430, set = 0, binding = 4) coherent buffer Part { float part[]; };  // S x CO x pixels
layout(std430, set = 0, binding = 5) coherent buffer Cnt { uint cnt[]; };     // per tile, zero between runs
layout(constant_id = 3) const int ACT = 0;
layout(push_constant) uniform P {
    int N; int C; int H; int W; int CO; int OH; int OW;
    int KH; int KW; int SH; int SW; int DH; int DW; int PH; int PW;
    int G; int has_bias; float alpha; float beta;
    int blocks;  // unused here (conv.comp's)
} p;

#define TK 16
const int LX = int(gl_WorkGroupSize.x), LY = int(gl_WorkGroupSize.y);
const int BM = 4 * LY, BN = 4 * LX, T = LX * LY;
const int LA = BM * TK / T;  // weights each invocation loads per step (at most MAXL)
const int CB = T / TK;       // invocations per row of the input tile
const int LB = BN / CB;      // inputs each invocation loads per step, all in one row (at most MAXL)
#define MAXL 16
#define OUT (-(1 << 29))     // a row far outside the input

shared float As[TK][BM + 1];
shared float Bs[TK][BN];
shared bool last;

// Per invocation: the pixels whose inputs it gathers, and the values it loads for the next step.
int tid, kb, cb, m0, cog, K, kend, ksz, hw, wb;
int ih0[MAXL], iw0[MAXL], xo[MAXL];
float ra[MAXL], rb[MAXL];

void load(int k0) {
    [[unroll]] for (int t = 0; t < LA; ++t) {
        int e = tid + t * T, kk = e % TK, mm = e / TK;
        ra[t] = 0.0;
        if (m0 + mm < cog && k0 + kk < kend) ra[t] = float(w[wb + mm * K + k0 + kk]);
    }
    int k = k0 + kb, ci = k / ksz, r = k - ci * ksz, kh = r / p.KW;
    int dh = kh * p.DH, dw = (r - kh * p.KW) * p.DW;
    int ko = ci * hw + dh * p.W + dw;
    if (k >= kend) dh = OUT;
    [[unroll]] for (int j = 0; j < LB; ++j) {
        rb[j] = 0.0;
        if (uint(ih0[j] + dh) < uint(p.H) && uint(iw0[j] + dw) < uint(p.W)) rb[j] = float(x[xo[j] + ko]);
    }
}

void main() {
    int lx = int(gl_LocalInvocationID.x), ly = int(gl_LocalInvocationID.y);
    tid = ly * LX + lx;
    int S = int(gl_NumWorkGroups.z) / p.G, z = int(gl_WorkGroupID.z), g = z / S, s = z - g * S;
    int cig = p.C / p.G;
    cog = p.CO / p.G;
    ksz = p.KH * p.KW;
    K = cig * ksz;
    int per = (K + TK * S - 1) / (TK * S) * TK;  // this split's slice of k
    int kbeg = s * per;
    kend = min(K, kbeg + per);
    hw = p.H * p.W;
    int ohw = p.OH * p.OW, npix = p.N * ohw;
    m0 = int(gl_WorkGroupID.y) * BM;
    int n0 = int(gl_WorkGroupID.x) * BN;
    wb = (g * cog + m0) * K;  // the tile's first weight row

    // This invocation gathers row kb of the input tile, pixels n0 + cb + j * CB.
    kb = tid / CB;
    cb = tid % CB;
    [[unroll]] for (int j = 0; j < LB; ++j) {
        int pix = n0 + cb + j * CB;
        int n = pix / ohw, r = pix - n * ohw;
        int oh = r / p.OW, ow = r - oh * p.OW;
        ih0[j] = oh * p.SH - p.PH;
        iw0[j] = ow * p.SW - p.PW;
        xo[j] = (n * p.C + g * cig) * hw + ih0[j] * p.W + iw0[j];
        if (pix >= npix) ih0[j] = OUT;
    }

    float acc[4][4];
    [[unroll]] for (int i = 0; i < 4; ++i)
        [[unroll]] for (int j = 0; j < 4; ++j) acc[i][j] = 0.0;
    if (kbeg < kend) load(kbeg);
    for (int k0 = kbeg; k0 < kend; k0 += TK) {
        [[unroll]] for (int t = 0; t < LA; ++t) {
            int e = tid + t * T;
            As[e % TK][e / TK] = ra[t];
        }
        [[unroll]] for (int j = 0; j < LB; ++j) Bs[kb][cb + j * CB] = rb[j];
        barrier();
        if (k0 + TK < kend) load(k0 + TK);  // in flight while this step computes
        [[unroll]] for (int kk = 0; kk < TK; ++kk) {
            float av[4], bv[4];
            [[unroll]] for (int i = 0; i < 4; ++i) av[i] = As[kk][ly + LY * i];
            [[unroll]] for (int j = 0; j < 4; ++j) bv[j] = Bs[kk][lx + LX * j];
            [[unroll]] for (int i = 0; i < 4; ++i)
                [[unroll]] for (int j = 0; j < 4; ++j) acc[i][j] += av[i] * bv[j];
        }
        barrier();
    }

    int pj[4], ob[4];  // this invocation's pixels, and where their outputs go (-1: none)
    [[unroll]] for (int j = 0; j < 4; ++j) {
        pj[j] = n0 + lx + LX * j;
        int n = pj[j] / ohw;
        ob[j] = pj[j] < npix ? (n * p.CO + g * cog) * ohw + pj[j] - n * ohw : -1;
    }
    if (S > 1) {
        int pb = (s * p.CO + g * cog) * npix;
        [[unroll]] for (int i = 0; i < 4; ++i) {
            int co = m0 + ly + LY * i;
            [[unroll]] for (int j = 0; j < 4; ++j)
                if (co < cog && ob[j] >= 0) part[pb + co * npix + pj[j]] = acc[i][j];
        }
        memoryBarrierBuffer();
        barrier();
        uint tile = (uint(g) * gl_NumWorkGroups.y + gl_WorkGroupID.y) * gl_NumWorkGroups.x + gl_WorkGroupID.x;
        if (tid == 0) {
            last = atomicAdd(cnt[tile], 1u) == uint(S - 1);
            if (last) cnt[tile] = 0u;  // for the next run
        }
        barrier();
        if (!last) return;
        memoryBarrierBuffer();
        [[unroll]] for (int i = 0; i < 4; ++i) {
            int co = m0 + ly + LY * i;
            [[unroll]] for (int j = 0; j < 4; ++j) {
                if (co >= cog || ob[j] < 0) continue;
                float v = 0.0;
                for (int t = 0; t < S; ++t) v += part[(t * p.CO + g * cog + co) * npix + pj[j]];
                acc[i][j] = v;
            }
        }
    }
    [[unroll]] for (int i = 0; i < 4; ++i) {
        int co = m0 + ly + LY * i;
        if (co >= cog) continue;
        float bv = p.has_bias != 0 ? float(bias[g * cog + co]) : 0.0;
        [[unroll]] for (int j = 0; j < 4; ++j)
            if (ob[j] >= 0) o[ob[j] + co * ohw] = STORE(unary_op(acc[i][j] + bv, ACT, p.alpha, p.beta));
    }
}
