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
// tile choice (launch.py). Built with WX, WY, RM and RN: the register-blocked tiles below.
//
// Split K: the grid's z is groups x S. With S > 1 each of a tile's S workgroups sums one
// slice of k into `part`, and the last of them to finish (counted in `cnt`, which it resets)
// adds the S partial sums in order, so results do not depend on timing: each invocation its
// own outputs, with the loads of several slices in flight at once. Those loads are not
// conditional: past the last slice or outside the tile they read a valid address whose value
// goes unused (on an H100 the same loads under conditions took about 0.6 us a slice). Bias
// and the fused activation come last, as without a split.
#define TK 16
#ifdef RM
// The register-blocked variants (build_shaders.py builds them as conv_gemm_<BM>x<BN>, launch.CONV_REG_TILES): a
// WX x WY workgroup, each invocation RM x RN outputs (multiples of 4: rows ly*4 + 4*WY*p + r, pixels
// lx*4 + 4*WX*q + c), so a k step reads RM/4 + RN/4 vec4s of shared memory for RM*RN FMAs (the tiles above: 8
// floats for 16).
layout(local_size_x = WX, local_size_y = WY, local_size_z = 1) in;
const int LX = WX, LY = WY, IM = RM, JN = RN;
#else
layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;
const int LX = int(gl_WorkGroupSize.x), LY = int(gl_WorkGroupSize.y), IM = 4, JN = 4;
#endif
layout(std430, set = 0, binding = 0) writeonly buffer O { STORE o[]; };
layout(std430, set = 0, binding = 1) readonly buffer X { STORE x[]; };
layout(std430, set = 0, binding = 2) readonly buffer Wt { STORE w[]; };
layout(std430, set = 0, binding = 3) readonly buffer Bias { STORE bias[]; };
layout(std430, set = 0, binding = 4) coherent buffer Part { float part[]; };  // S x CO x pixels
layout(std430, set = 0, binding = 5) coherent buffer Cnt { uint cnt[]; };     // per tile, zero between runs
layout(constant_id = 3) const int ACT = 0;
#include "conv_shape.glsl"

const int BM = IM * LY, BN = JN * LX, T = LX * LY;
const int CH = 64 / (IM * JN);  // split K: the slices an invocation reads at once (64 loads in flight)
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

#ifdef RM
// As[k][m] and Bs[k][pixel] as vec4s along m and the pixels (AT: one float of them), one vec4 of padding a row of As.
shared vec4 As[TK][BM / 4 + 1];
shared vec4 Bs[TK][BN / 4];
#define AT(s, k, c) s[k][(c) >> 2][(c) & 3]
// The tile's row of this invocation's output i and its pixel of output j, and the sum of (i, j).
#define MI(i) (4 * (ly + WY * ((i) >> 2)) + ((i) & 3))
#define NJ(j) (4 * (lx + WX * ((j) >> 2)) + ((j) & 3))
#define ACC(i, j) acc[i][(j) >> 2][(j) & 3]
#else
shared float As[TK][BM + 1];
shared float Bs[TK][BN];
#define AT(s, k, c) s[k][c]
#define MI(i) (ly + LY * (i))
#define NJ(j) (lx + LX * (j))
#define ACC(i, j) acc[i][j]
#endif
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

#ifdef RM
    vec4 acc[RM][RN / 4];
    [[unroll]] for (int i = 0; i < RM; ++i)
        [[unroll]] for (int j = 0; j < RN / 4; ++j) acc[i][j] = vec4(0.0);
#else
    float acc[4][4];
    [[unroll]] for (int i = 0; i < 4; ++i)
        [[unroll]] for (int j = 0; j < 4; ++j) acc[i][j] = 0.0;
#endif
    if (tid < TK) kt[0][tid] = ROW(kbeg + tid);
    barrier();
    LOAD(kbeg, 0)
    int buf = 0;
    for (int k0 = kbeg; k0 < kend; k0 += TK) {
        [[unroll]] for (int t = 0; t < LA; ++t) AT(As, WK(t), WM(t)) = ra[t];
        [[unroll]] for (int j = 0; j < LB; ++j) AT(Bs, kb + j * RS, nn) = rb[j];
        if (tid < TK) kt[buf ^ 1][tid] = ROW(k0 + TK + tid);
        barrier();
        buf ^= 1;
        if (k0 + TK < kend) LOAD(k0 + TK, buf)  // in flight while this step computes
#ifdef RM
        [[unroll]] for (int kk = 0; kk < TK; ++kk) {
            vec4 av[RM / 4], bv[RN / 4];
            [[unroll]] for (int p = 0; p < RM / 4; ++p) av[p] = As[kk][ly + WY * p];
            [[unroll]] for (int q = 0; q < RN / 4; ++q) bv[q] = Bs[kk][lx + WX * q];
            [[unroll]] for (int p = 0; p < RM / 4; ++p)
                [[unroll]] for (int r = 0; r < 4; ++r)
                    [[unroll]] for (int q = 0; q < RN / 4; ++q) acc[4 * p + r][q] += av[p][r] * bv[q];
        }
#else
        [[unroll]] for (int kk = 0; kk < TK; ++kk) {
            float av[4], bv[4];
            [[unroll]] for (int i = 0; i < 4; ++i) av[i] = As[kk][ly + LY * i];
            [[unroll]] for (int j = 0; j < 4; ++j) bv[j] = Bs[kk][lx + LX * j];
            [[unroll]] for (int i = 0; i < 4; ++i)
                [[unroll]] for (int j = 0; j < 4; ++j) acc[i][j] += av[i] * bv[j];
        }
#endif
        barrier();
    }

    int pj[JN], ob[JN];  // this invocation's output pixels, and where they go (-1: none)
    [[unroll]] for (int j = 0; j < JN; ++j) {
        pj[j] = n0 + NJ(j);
        int n = pj[j] / ohw;
        ob[j] = pj[j] < npix ? (n * CO + g * cog) * ohw + pj[j] - n * ohw : -1;
    }
    if (S > 1) {
        [[unroll]] for (int i = 0; i < IM; ++i) {
            int co = m0 + MI(i), pr = (s * CO + g * cog + co) * npix;
            [[unroll]] for (int j = 0; j < JN; ++j)
                if (co < cog && ob[j] >= 0) part[pr + pj[j]] = ACC(i, j);
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
        // Each invocation sums its own outputs' S partials in order, its own slice from acc (the value it stored),
        // CH slices at a time.
        float sum[IM][JN];
        [[unroll]] for (int i = 0; i < IM; ++i)
            [[unroll]] for (int j = 0; j < JN; ++j) sum[i][j] = 0.0;
        for (int t0 = 0; t0 < S; t0 += CH) {
            float p[CH][IM][JN];
            [[unroll]] for (int u = 0; u < CH; ++u)
                [[unroll]] for (int i = 0; i < IM; ++i) {
                    int pr = (min(t0 + u, S - 1) * CO + g * cog + min(m0 + MI(i), cog - 1)) * npix;
                    [[unroll]] for (int j = 0; j < JN; ++j) p[u][i][j] = part[pr + (ob[j] >= 0 ? pj[j] : 0)];
                }
            [[unroll]] for (int u = 0; u < CH; ++u)
                [[unroll]] for (int i = 0; i < IM; ++i)
                    [[unroll]] for (int j = 0; j < JN; ++j)
                        if (t0 + u < S) sum[i][j] += t0 + u == s ? ACC(i, j) : p[u][i][j];
        }
        [[unroll]] for (int i = 0; i < IM; ++i)
            [[unroll]] for (int j = 0; j < JN; ++j) ACC(i, j) = sum[i][j];
    }
    [[unroll]] for (int i = 0; i < IM; ++i) {
        int co = m0 + MI(i);
        if (co >= cog) continue;
        float bv = HAS_BIAS != 0 ? float(bias[g * cog + co]) : 0.0;
        [[unroll]] for (int j = 0; j < JN; ++j)
            if (ob[j] >= 0) o[ob[j] + co * ohw] = STORE(unary_op(ACC(i, j) + bv, ACT, ALPHA, BETA));
    }
}
