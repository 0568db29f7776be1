/* Tiled products: Conv as an implicit GEMM (conv_gemm) and MatMul/Gemm (matmul).
 *
 * A work group computes a BM x BN tile of the output, each work item RM x RN
 * values of it, so the work group is WX x WY = (BN / RN) x (BM / RM). The tile
 * is a build option (-DBM, -DBN, -DRM, -DRN: the choice tuning makes, tiles.py).
 * Work item (lx, ly) owns rows 4 * (ly + WY * p) + r and columns
 * 4 * (lx + WX * q) + c (p < RM / 4, q < RN / 4, r, c < 4): each step of k
 * reads RM / 4 + RN / 4 float4s of local memory for RM * RN multiply-adds.
 *
 * The sums go TK values of k at a time through local memory. The next TK are
 * fetched from global memory into registers (ra, rb) while the current ones
 * are multiplied, so the loads' latency hides behind the arithmetic.
 * Sums are in float whatever the storage type T.
 */
#ifndef BM  /* tiles.py always gives a tile; this default only lets the file build alone */
#define BM 32
#define BN 64
#define RM 4
#define RN 4
#endif
#define TK 16
#define WX (BN / RN)
#define WY (BM / RM)
#define NT (WX * WY)
#define LA (BM * TK / NT)  /* values of A each work item fetches per step */
#define LB (TK * BN / NT)  /* values of B */
/* As[k][m] and Bs[k][n] as float4s along m and n. A row of As has one float4 of
 * padding: work items that store consecutive k of one m then hit different banks. */
#define AS_ROW (BM / 4 + 1)
#define BS_ROW (BN / 4)
#define OUT (-(1 << 29))  /* a row far outside any input */

inline float lane(float4 v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

/* One step: every work item adds its RM x RN products of the TK values in local memory. */
#define MULTIPLY(As, Bs, acc)                                                             \
    _Pragma("unroll") for (int kk = 0; kk < TK; ++kk) {                                   \
        float4 av[RM / 4], bv[RN / 4];                                                    \
        _Pragma("unroll") for (int p = 0; p < RM / 4; ++p) av[p] = As[kk * AS_ROW + ly + WY * p]; \
        _Pragma("unroll") for (int q = 0; q < RN / 4; ++q) bv[q] = Bs[kk * BS_ROW + lx + WX * q]; \
        _Pragma("unroll") for (int i = 0; i < RM; ++i) {                                  \
            const float a = lane(av[i / 4], i % 4);                                       \
            _Pragma("unroll") for (int q = 0; q < RN / 4; ++q) {                          \
                acc[i][4 * q] += a * bv[q].x;                                             \
                acc[i][4 * q + 1] += a * bv[q].y;                                         \
                acc[i][4 * q + 2] += a * bv[q].z;                                         \
                acc[i][4 * q + 3] += a * bv[q].w;                                         \
            }                                                                             \
        }                                                                                 \
    }

/* This work item's output i (row in the tile) and j (column in the tile). */
#define MI(i) (4 * (ly + WY * ((i) / 4)) + (i) % 4)
#define NJ(j) (4 * (lx + WX * ((j) / 4)) + (j) % 4)

/* Conv, NCHW, one group per grid z (times S, the ways its sums are split):
 *   y[co][pixel] = sum_k w[co][k] * X[k][pixel],  k = (ci, kh, kw), pixel = (n, oh, ow),
 * X being the input unfolded (im2col) as it is read, zero in the padding. The
 * weights are ONNX's [CO][C/G][KH][KW], rows of K. `taps` holds, for each k, the
 * offset of its input from a pixel's first tap and the tap's (dh, dw): a table
 * from the host, so no division by a shape happens per step.
 *
 * Split K (S > 1, where the grid would have too few tiles to fill the GPU):
 * each of a tile's S work groups sums one slice of k into `part` (float,
 * S x CO x pixels). The last of them to finish, counted per tile in `counts`
 * (zero between launches: the last one resets it), adds the S partial sums in
 * order of the slice, so results do not depend on timing, then applies bias and
 * activation as without a split. */
__kernel __attribute__((reqd_work_group_size(WX, WY, 1)))
void conv_gemm(BUF(const T, x), BUF(const T, w), BUF(const T, bias), BUF(T, y), BUF(const int, taps),
               BUF(float, part), BUF(uint, counts),
               const int N, const int C, const int H, const int W, const int CO, const int OH, const int OW,
               const int G, const int KH, const int KW, const int SH, const int SW, const int PH, const int PW,
               const int DH, const int DW, const float p0, const float p1 EPI_ARGS) {
    __local float4 As[TK * AS_ROW], Bs[TK * BS_ROW];
    __local int4 kt[2][TK];  /* the taps of this step's rows and of the next step's */
    __local int last;
    SHIFT(x); SHIFT(w); SHIFT(bias); SHIFT(y); SHIFT(taps); SHIFT(part); SHIFT(counts); EPI_SHIFT
    __local float* Af = (__local float*)As;
    __local float* Bf = (__local float*)Bs;
    const int lx = get_local_id(0), ly = get_local_id(1), tid = ly * WX + lx;
    const int S = get_num_groups(2) / G, g = get_group_id(2) / S, s = get_group_id(2) % S;
    const int cig = C / G, cog = CO / G, K = cig * KH * KW, hw = H * W, ohw = OH * OW, npix = N * ohw;
    const int per = (K + TK * S - 1) / (TK * S) * TK;  /* each slice of k: whole steps */
    const int kbeg = min(K, s * per), kend = min(K, kbeg + per);
    const int m0 = get_group_id(1) * BM, n0 = get_group_id(0) * BN;
    const __global T* wt = w + (g * cog + m0) * K;  /* the tile's first row of weights */

    /* The pixel whose inputs this work item gathers, rows kb + j * (NT / BN) of each step. */
    const int nn = tid % BN, kb = tid / BN;
    int ih0 = OUT, iw0 = 0, xo = 0;
    if (n0 + nn < npix) {
        const int pix = n0 + nn, n = pix / ohw, r = pix % ohw, oh = r / OW, ow = r % OW;
        ih0 = oh * SH - PH;
        iw0 = ow * SW - PW;
        xo = (n * C + g * cig) * hw + ih0 * W + iw0;
    }
#define TAP(k) ((k) < kend ? vload4((k), taps) : (int4)(0, OUT, 0, 0))
#define FETCH(k1, buf)                                                                      \
    _Pragma("unroll") for (int t = 0; t < LA; ++t) {                                        \
        const int e = tid + t * NT, kk = e % TK, mm = e / TK;                               \
        ra[t] = m0 + mm < cog && (k1) + kk < kend ? LD(wt, mm * K + (k1) + kk) : 0.0f;      \
    }                                                                                       \
    _Pragma("unroll") for (int j = 0; j < LB; ++j) {                                        \
        const int4 r = kt[buf][kb + j * (NT / BN)];                                         \
        rb[j] = (uint)(ih0 + r.y) < (uint)H && (uint)(iw0 + r.z) < (uint)W ? LD(x, xo + r.x) : 0.0f; \
    }

    float ra[LA], rb[LB], acc[RM][RN];
    #pragma unroll
    for (int i = 0; i < RM; ++i)
        #pragma unroll
        for (int j = 0; j < RN; ++j) acc[i][j] = 0.0f;
    if (tid < TK) kt[0][tid] = TAP(kbeg + tid);
    barrier(CLK_LOCAL_MEM_FENCE);
    FETCH(kbeg, 0)
    int buf = 0;
    for (int k0 = kbeg; k0 < kend; k0 += TK) {
        #pragma unroll
        for (int t = 0; t < LA; ++t) {
            const int e = tid + t * NT;
            Af[(e % TK) * 4 * AS_ROW + e / TK] = ra[t];
        }
        #pragma unroll
        for (int j = 0; j < LB; ++j) Bf[(kb + j * (NT / BN)) * BN + nn] = rb[j];
        if (tid < TK) kt[buf ^ 1][tid] = TAP(k0 + TK + tid);
        barrier(CLK_LOCAL_MEM_FENCE);
        buf ^= 1;
        if (k0 + TK < kend) {  /* in flight while this step multiplies */
            FETCH(k0 + TK, buf)
        }
        MULTIPLY(As, Bs, acc)
        barrier(CLK_LOCAL_MEM_FENCE);
    }

    int pj[RN], ob[RN];  /* this work item's pixels, and where their outputs start (-1: none) */
    #pragma unroll
    for (int j = 0; j < RN; ++j) {
        pj[j] = n0 + NJ(j);
        const int n = pj[j] / ohw;
        ob[j] = pj[j] < npix ? (n * CO + g * cog) * ohw + pj[j] - n * ohw : -1;
    }
    if (S > 1) {
        #pragma unroll
        for (int i = 0; i < RM; ++i) {
            const int co = m0 + MI(i), row = (s * CO + g * cog + co) * npix;
            #pragma unroll
            for (int j = 0; j < RN; ++j)
                if (co < cog && ob[j] >= 0) part[row + pj[j]] = acc[i][j];
        }
        /* Every partial sum of this group is visible device-wide before the count says so. */
        mem_fence(CLK_GLOBAL_MEM_FENCE);
        barrier(CLK_GLOBAL_MEM_FENCE | CLK_LOCAL_MEM_FENCE);
        if (tid == 0) {
            const int tile = (g * get_num_groups(1) + get_group_id(1)) * get_num_groups(0) + get_group_id(0);
            last = atomic_inc(counts + tile) == (uint)(S - 1);
            if (last) counts[tile] = 0;  /* for the next launch */
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (!last) return;
        mem_fence(CLK_GLOBAL_MEM_FENCE);
        /* volatile: the other groups' sums are read from memory, never from a cache this group filled */
        const volatile __global float* pv = part;
        #pragma unroll
        for (int i = 0; i < RM; ++i) {
            const int co = min(m0 + MI(i), cog - 1);
            #pragma unroll
            for (int j = 0; j < RN; ++j) {
                const int at = (g * cog + co) * npix + (ob[j] >= 0 ? pj[j] : 0);
                float sum = 0.0f;
                for (int t = 0; t < S; ++t) sum += t == s ? acc[i][j] : pv[t * CO * npix + at];
                acc[i][j] = sum;
            }
        }
    }
    #pragma unroll
    for (int i = 0; i < RM; ++i) {
        const int co = m0 + MI(i);
        if (co >= cog) continue;
        const float b = LD(bias, g * cog + co);
        #pragma unroll
        for (int j = 0; j < RN; ++j)
            if (ob[j] >= 0) {
                float v = ACTIVATE(acc[i][j] + b);
                EPILOGUE(v, pj[j] / ohw, g * cog + co, pj[j] % ohw)
                ST(y, ob[j] + co * ohw, v);
            }
    }
#undef TAP
#undef FETCH
}

/* Y[b] = act(alpha * A[b] B[b] + beta * C), for MatMul and Gemm (matmul.cl's
 * header says how A, B, C and the batches are laid out). Loads are coalesced:
 * consecutive work items take consecutive addresses of A (along k, or along m
 * where A is stored m-fastest: a transpose) and of B (along n, or along k
 * where B is stored k-fastest). */
__kernel __attribute__((reqd_work_group_size(WX, WY, 1)))
void matmul(BUF(const T, a), BUF(const T, b), BUF(const T, c), BUF(T, y), BUF(const int, meta),
            const int M, const int N, const int K, const int sam, const int sak, const int sbk, const int sbn,
            const int scm, const int scn, const int batches, const int brank,
            const float alpha, const float beta, const float p0, const float p1 EPI_ARGS) {
    __local float4 As[TK * AS_ROW], Bs[TK * BS_ROW];
    SHIFT(a); SHIFT(b); SHIFT(c); SHIFT(y); SHIFT(meta); EPI_SHIFT
    __local float* Af = (__local float*)As;
    __local float* Bf = (__local float*)Bs;
    const int lx = get_local_id(0), ly = get_local_id(1), tid = ly * WX + lx;
    const int bi = get_group_id(2);
    const int2 off = batch_offsets(meta, brank, bi);
    const int oa = off.x, ob = off.y;
    const __global T* ap = a + oa;
    const __global T* bp = b + ob;
    const int m0 = get_group_id(1) * BM, n0 = get_group_id(0) * BN;
    const bool a_mfast = sam == 1 && sak != 1, b_kfast = sbk == 1 && sbn != 1;
#define A_AT(e) const int mm = a_mfast ? (e) % BM : (e) / TK, kk = a_mfast ? (e) / BM : (e) % TK
#define B_AT(e) const int nn = b_kfast ? (e) / TK : (e) % BN, kb = b_kfast ? (e) % TK : (e) / BN
#define FETCH(k1)                                                                            \
    _Pragma("unroll") for (int t = 0; t < LA; ++t) {                                         \
        A_AT(tid + t * NT);                                                                  \
        ra[t] = m0 + mm < M && (k1) + kk < K ? LD(ap, (m0 + mm) * sam + ((k1) + kk) * sak) : 0.0f; \
    }                                                                                        \
    _Pragma("unroll") for (int t = 0; t < LB; ++t) {                                         \
        B_AT(tid + t * NT);                                                                  \
        rb[t] = n0 + nn < N && (k1) + kb < K ? LD(bp, ((k1) + kb) * sbk + (n0 + nn) * sbn) : 0.0f; \
    }

    float ra[LA], rb[LB], acc[RM][RN];
    #pragma unroll
    for (int i = 0; i < RM; ++i)
        #pragma unroll
        for (int j = 0; j < RN; ++j) acc[i][j] = 0.0f;
    FETCH(0)
    for (int k0 = 0; k0 < K; k0 += TK) {
        #pragma unroll
        for (int t = 0; t < LA; ++t) {
            A_AT(tid + t * NT);
            Af[kk * 4 * AS_ROW + mm] = ra[t];
        }
        #pragma unroll
        for (int t = 0; t < LB; ++t) {
            B_AT(tid + t * NT);
            Bf[kb * BN + nn] = rb[t];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (k0 + TK < K) {  /* in flight while this step multiplies */
            FETCH(k0 + TK)
        }
        MULTIPLY(As, Bs, acc)
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    __global T* yb = y + bi * M * N;
    #pragma unroll
    for (int i = 0; i < RM; ++i) {
        const int m = m0 + MI(i);
        if (m >= M) continue;
        #pragma unroll
        for (int j = 0; j < RN; ++j) {
            const int n = n0 + NJ(j);
            if (n >= N) continue;
            float v = alpha * acc[i][j];
            if (beta != 0.0f) v += beta * LD(c, m * scm + n * scn);
            v = ACTIVATE(v);
            EPILOGUE(v, bi, m, n)
            ST(yb, m * N + n, v);
        }
    }
#undef A_AT
#undef B_AT
#undef FETCH
}
