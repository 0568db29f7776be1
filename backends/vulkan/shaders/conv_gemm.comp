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
// Split K: the grid's z is groups x S. With S > 1 each of a tile's S workgroups sums one
// slice of k into `part`, and the last of them to finish (counted in `cnt`, which it resets)
// adds the S partial sums in order, so results do not depend on timing. Bias and the fused
// activation come last.
layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;
layout(std430, set = 0, binding = 0) writeonly buffer O { STORE o[]; };
layout(std430, set = 0, binding = 1) readonly buffer X { STORE x[]; };
layout(std430, set = 0, binding = 2) readonly buffer Wt { STORE w[]; };
layout(std430, set = 0, binding = 3) readonly buffer Bias { STORE bias[]; };
layout(std430, set = 0, binding = 4) coherent buffer Part { float part[]; };  // S x CO x pixels
layout(std430, set = 0, binding = 5) coherent buffer Cnt { uint cnt[]; };     // per tile, zero between runs
layout(constant_id = 3) const int ACT = 0;
#include "conv_shape.glsl"

#define TK 16
const int LX = int(gl_WorkGroupSize.x), LY = int(gl_WorkGroupSize.y);
const int BM = 4 * LY, BN = 4 * LX, T = LX * LY;
const int LA = BM * TK / T;  // weights each invocation loads per step
const int RS = T / BN;       // invocations per pixel of the input tile
const int LB = TK / RS;      // inputs each invocation loads per step: rows kb + j * RS of its pixel
#define OUT (-(1 << 29))     // a row far outside the input

#ifdef FP16
// float16 weights go two at a time (one 32-bit load through this second view of binding 2) where K is even, so a
// pair never straddles rows; ra[t] holds k = 2 * (e % (TK / 2)) + t % 2 of row e / (TK / 2), e = tid + t / 2 * T.
layout(std430, set = 0, binding = 2) readonly buffer W2 { f16vec2 w2[]; };
#define WK(t) (2 * ((tid + (t) / 2 * T) % (TK / 2)) + (t) % 2)
#define WM(t) ((tid + (t) / 2 * T) / (TK / 2))
#define LOAD_W(k1)                                                                                      \
        [[unroll]] for (int t = 0; t < LA; t += 2) {                                                \
            int kk = (k1) + WK(t), i = wb + WM(t) * K + kk;                                         \
            vec2 v = vec2(0.0);                                                                     \
            if (m0 + WM(t) < cog && kk < kend)                                                      \
                v = K % 2 == 0 ? vec2(w2[i >> 1]) : vec2(float(w[i]), kk + 1 < kend ? float(w[i + 1]) : 0.0); \
            ra[t] = v.x;                                                                            \
            ra[t + 1] = v.y;                                                                        \
        }
#else
#define WK(t) ((tid + (t) * T) % TK)
#define WM(t) ((tid + (t) * T) / TK)
#define LOAD_W(k1)                                                                                      \
        [[unroll]] for (int t = 0; t < LA; ++t) {                                                   \
            int e = tid + t * T, kk = e % TK, mm = e / TK;                                          \
            ra[t] = 0.0;                                                                            \
            if (m0 + mm < cog && (k1) + kk < kend) ra[t] = float(w[wb + mm * K + (k1) + kk]);       \
        }
#endif

shared float As[TK][BM + 1];
shared float Bs[TK][BN];
shared ivec3 kt[2][TK];      // per row of a step: offset in the input, and the tap's (dh, dw)
shared bool last;

void main() {
    int lx = int(gl_LocalInvocationID.x), ly = int(gl_LocalInvocationID.y);
    int tid = ly * LX + lx;
    int S = int(gl_NumWorkGroups.z) / G, z = int(gl_WorkGroupID.z), g = z / S, s = z - g * S;
    int cig = C / G, cog = CO / G, ksz = KH * KW, K = cig * ksz, hw = H * W;
    int per = (K + TK * S - 1) / (TK * S) * TK;  // this split's slice of k
    int kbeg = s * per, kend = min(K, kbeg + per);
    int ohw = OH * OW, npix = N * ohw;
    int m0 = int(gl_WorkGroupID.y) * BM, n0 = int(gl_WorkGroupID.x) * BN;
    int wb = (g * cog + m0) * K;  // the tile's first weight row

    // The pixel whose inputs this invocation gathers.
    int nn = tid % BN, kb = tid / BN;
    int ih0, iw0, xo;
    {
        int pix = n0 + nn, n = pix / ohw, r = pix - n * ohw, oh = r / OW, ow = r - oh * OW;
        ih0 = pix < npix ? oh * SH - PH : OUT;
        iw0 = ow * SW - PW;
        xo = pix < npix ? (n * C + g * cig) * hw + ih0 * W + iw0 : 0;
    }
    // Row k of the unfolded input: its offset from the pixel's first tap and the tap's (dh, dw); OUT past the slice.
#define ROW(k) ((k) < kend ? ivec3(((k) / ksz) * hw + ((k) % ksz / KW) * DH * W + ((k) % KW) * DW, \
                                  ((k) % ksz / KW) * DH, ((k) % KW) * DW) : ivec3(0, OUT, 0))
    float ra[LA], rb[LB];
#define LOAD(k1, buf) {                                                                          \
        LOAD_W(k1)                                                                                \
        [[unroll]] for (int j = 0; j < LB; ++j) {                                                 \
            ivec3 r = kt[buf][kb + j * RS];                                                       \
            rb[j] = 0.0;                                                                          \
            if (uint(ih0 + r.y) < uint(H) && uint(iw0 + r.z) < uint(W)) rb[j] = float(x[xo + r.x]); \
        }                                                                                         \
    }

    float acc[4][4];
    [[unroll]] for (int i = 0; i < 4; ++i)
        [[unroll]] for (int j = 0; j < 4; ++j) acc[i][j] = 0.0;
    if (tid < TK) kt[0][tid] = ROW(kbeg + tid);
    barrier();
    LOAD(kbeg, 0)
    int buf = 0;
    for (int k0 = kbeg; k0 < kend; k0 += TK) {
        [[unroll]] for (int t = 0; t < LA; ++t) As[WK(t)][WM(t)] = ra[t];
        [[unroll]] for (int j = 0; j < LB; ++j) Bs[kb + j * RS][nn] = rb[j];
        if (tid < TK) kt[buf ^ 1][tid] = ROW(k0 + TK + tid);
        barrier();
        buf ^= 1;
        if (k0 + TK < kend) LOAD(k0 + TK, buf)  // in flight while this step computes
        [[unroll]] for (int kk = 0; kk < TK; ++kk) {
            float av[4], bv[4];
            [[unroll]] for (int i = 0; i < 4; ++i) av[i] = As[kk][ly + LY * i];
            [[unroll]] for (int j = 0; j < 4; ++j) bv[j] = Bs[kk][lx + LX * j];
            [[unroll]] for (int i = 0; i < 4; ++i)
                [[unroll]] for (int j = 0; j < 4; ++j) acc[i][j] += av[i] * bv[j];
        }
        barrier();
    }

    int pj[4], ob[4];  // this invocation's output pixels, and where they go (-1: none)
    [[unroll]] for (int j = 0; j < 4; ++j) {
        pj[j] = n0 + lx + LX * j;
        int n = pj[j] / ohw;
        ob[j] = pj[j] < npix ? (n * CO + g * cog) * ohw + pj[j] - n * ohw : -1;
    }
    if (S > 1) {
        [[unroll]] for (int i = 0; i < 4; ++i) {
            int co = m0 + ly + LY * i, pr = (s * CO + g * cog + co) * npix;
            [[unroll]] for (int j = 0; j < 4; ++j)
                if (co < cog && ob[j] >= 0) part[pr + pj[j]] = acc[i][j];
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
        // The whole tile from the partial sums (acc stays out of it, in registers).
        for (int e = tid; e < BM * BN; e += T) {
            int co = m0 + e / BN, pix = n0 + e % BN;
            if (co >= cog || pix >= npix) continue;
            float v = 0.0;
            for (int t = 0; t < S; ++t) v += part[(t * CO + g * cog + co) * npix + pix];
            if (HAS_BIAS != 0) v += float(bias[g * cog + co]);
            int n = pix / ohw;
            o[(n * CO + g * cog + co) * ohw + pix - n * ohw] = STORE(unary_op(v, ACT, ALPHA, BETA));
        }
        return;
    }
    [[unroll]] for (int i = 0; i < 4; ++i) {
        int co = m0 + ly + LY * i;
        if (co >= cog) continue;
        float bv = HAS_BIAS != 0 ? float(bias[g * cog + co]) : 0.0;
        [[unroll]] for (int j = 0; j < 4; ++j)
            if (ob[j] >= 0) o[ob[j] + co * ohw] = STORE(unary_op(acc[i][j] + bv, ACT, ALPHA, BETA));
    }
}
