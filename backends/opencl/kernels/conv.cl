/* Convolutions, NCHW, with bias and a fused activation. Most run on gemm.cl's
 * conv_gemm; these are the direct kernels.
 *
 * conv2d:    any kernel, stride, dilation, pads and groups, with conv_gemm's
 *            arguments (it is one of that launch's choices, tiles.py): for
 *            shallow sums or few output channels per group, where a tile of a
 *            GEMM would stay mostly empty. One work item makes 4 output
 *            channels x 4 output columns of one row, reading ONNX's weights.
 * depthwise: one input channel per group and one output channel per group.
 *            One work item makes 4 output columns; weights [C][KH][KW].
 * deconv2d:  ConvTranspose as a gather: each output pixel sums the taps that
 *            land on it. Weights packed [G][OCB][ICg][KH][KW][4].
 * deconv_tile, conv_narrow (below, built with their layer's shapes): the
 *            ConvTranspose that upsamples, a block of outputs per input pixel;
 *            the conv of few output channels (aiomnn/narrow.py).
 */

__kernel void conv2d(BUF(const T, x), BUF(const T, w), BUF(const T, bias), BUF(T, y), BUF(const int, taps),
                     BUF(float, part), BUF(uint, counts),
                     const int N, const int C, const int H, const int W, const int CO, const int OH, const int OW,
                     const int G, const int KH, const int KW, const int SH, const int SW, const int PH, const int PW,
                     const int DH, const int DW, const float p0, const float p1 EPI_ARGS) {
    const int cig = C / G, cog = CO / G, ocb = (cog + 3) / 4, K = cig * KH * KW;
    const int ox0 = get_global_id(0) * 4;
    const int oy = get_global_id(1);
    const int z = get_global_id(2);
    if (ox0 >= OW || oy >= OH || z >= N * G * ocb) return;
    SHIFT(x); SHIFT(w); SHIFT(bias); SHIFT(y); EPI_SHIFT
    const int ob = z % ocb;
    const int g = (z / ocb) % G;
    const int n = z / (ocb * G);
    /* The weight rows of the 4 channels; past the group's last channel, its last row again (results unused). */
    const __global T* w0 = w + (g * cog + min(ob * 4, cog - 1)) * K;
    const __global T* w1 = w + (g * cog + min(ob * 4 + 1, cog - 1)) * K;
    const __global T* w2 = w + (g * cog + min(ob * 4 + 2, cog - 1)) * K;
    const __global T* w3 = w + (g * cog + min(ob * 4 + 3, cog - 1)) * K;
    float4 a0 = (float4)(0.0f), a1 = (float4)(0.0f), a2 = (float4)(0.0f), a3 = (float4)(0.0f);
    const int iy0 = oy * SH - PH;
    const int ix0 = ox0 * SW - PW;
    const __global T* xg = x + (n * C + g * cig) * H * W;
    for (int ic = 0; ic < cig; ++ic) {
        const __global T* xc = xg + ic * H * W;
        for (int ky = 0; ky < KH; ++ky) {
            const int iy = iy0 + ky * DH;
            if (iy < 0 || iy >= H) continue;
            const __global T* row = xc + iy * W;
            for (int kx = 0; kx < KW; ++kx) {
                const int t = (ic * KH + ky) * KW + kx;
                const float4 wv = (float4)(LD(w0, t), LD(w1, t), LD(w2, t), LD(w3, t));
                const int ix = ix0 + kx * DW;
                const float v0 = (ix >= 0 && ix < W) ? LD(row, ix) : 0.0f;
                const float v1 = (ix + SW >= 0 && ix + SW < W) ? LD(row, ix + SW) : 0.0f;
                const float v2 = (ix + 2 * SW >= 0 && ix + 2 * SW < W) ? LD(row, ix + 2 * SW) : 0.0f;
                const float v3 = (ix + 3 * SW >= 0 && ix + 3 * SW < W) ? LD(row, ix + 3 * SW) : 0.0f;
                a0 += (float4)(v0) * wv;
                a1 += (float4)(v1) * wv;
                a2 += (float4)(v2) * wv;
                a3 += (float4)(v3) * wv;
            }
        }
    }
    float acc[4][4];
    vstore4(a0, 0, acc[0]); vstore4(a1, 0, acc[1]); vstore4(a2, 0, acc[2]); vstore4(a3, 0, acc[3]);
    for (int c = 0; c < 4; ++c) {
        const int oc = ob * 4 + c;
        if (oc >= cog) break;
        const float b = LD(bias, g * cog + oc);
        __global T* yo = y + ((n * G + g) * cog + oc) * OH * OW + oy * OW;
        for (int j = 0; j < 4; ++j)
            if (ox0 + j < OW) {
                float v = ACTIVATE(acc[j][c] + b);
                EPILOGUE(v, n, g * cog + oc, oy * OW + ox0 + j)
                ST(yo, ox0 + j, v);
            }
    }
}

__kernel void depthwise(BUF(const T, x), BUF(const T, w), BUF(const T, bias), BUF(T, y),
                        const int NC, const int C, const int H, const int W, const int OH, const int OW,
                        const int KH, const int KW, const int SH, const int SW, const int PH, const int PW,
                        const int DH, const int DW, const float p0, const float p1 EPI_ARGS) {
    const int ox0 = get_global_id(0) * 4;
    const int oy = get_global_id(1);
    const int nc = get_global_id(2);
    if (ox0 >= OW || oy >= OH || nc >= NC) return;
    SHIFT(x); SHIFT(w); SHIFT(bias); SHIFT(y); EPI_SHIFT
    const int c = nc % C;
    const __global T* xc = x + nc * H * W;
    const __global T* wc = w + c * KH * KW;
    float4 acc = (float4)(0.0f);
    const int iy0 = oy * SH - PH;
    const int ix0 = ox0 * SW - PW;
    for (int ky = 0; ky < KH; ++ky) {
        const int iy = iy0 + ky * DH;
        if (iy < 0 || iy >= H) continue;
        const __global T* row = xc + iy * W;
        for (int kx = 0; kx < KW; ++kx) {
            const float wv = LD(wc, ky * KW + kx);
            const int ix = ix0 + kx * DW;
            float4 v;
            v.s0 = (ix >= 0 && ix < W) ? LD(row, ix) : 0.0f;
            v.s1 = (ix + SW >= 0 && ix + SW < W) ? LD(row, ix + SW) : 0.0f;
            v.s2 = (ix + 2 * SW >= 0 && ix + 2 * SW < W) ? LD(row, ix + 2 * SW) : 0.0f;
            v.s3 = (ix + 3 * SW >= 0 && ix + 3 * SW < W) ? LD(row, ix + 3 * SW) : 0.0f;
            acc += v * (float4)(wv);
        }
    }
    const float b = LD(bias, c);
    __global T* yo = y + nc * OH * OW + oy * OW;
    float r[4];
    vstore4(acc, 0, r);
    for (int j = 0; j < 4; ++j)
        if (ox0 + j < OW) {
            float v = ACTIVATE(r[j] + b);
            EPILOGUE(v, nc / C, c, oy * OW + ox0 + j)
            ST(yo, ox0 + j, v);
        }
}

/* deconv2d's and deconv_tile's arguments. */
#define DECONV_ARGS BUF(const T, x), BUF(const T, w), BUF(const T, bias), BUF(T, y), const int N, const int G,      \
    const int ICg, const int H, const int W, const int OCg, const int OCB, const int OH, const int OW, const int KH, \
    const int KW, const int SH, const int SW, const int PH, const int PW, const int DH, const int DW, const float p0, \
    const float p1 EPI_ARGS
/* A work item's start: its column and row (cx, cy, within nx x ny) and its block of 4 output channels, group and
 * image (ob, g, n). */
#define DECONV_START(cx, cy, nx, ny)                                                                  \
    const int cx = get_global_id(0), cy = get_global_id(1), z = get_global_id(2);                       \
    if (cx >= (nx) || cy >= (ny) || z >= N * G * OCB) return;                                           \
    SHIFT(x); SHIFT(w); SHIFT(bias); SHIFT(y); EPI_SHIFT                                                \
    const int ob = z % OCB, g = z / OCB % G, n = z / (OCB * G)

__kernel void deconv2d(DECONV_ARGS) {
    DECONV_START(ox, oy, OW, OH);
    float4 acc = (float4)(0.0f);
    const __global T* xg = x + (n * G + g) * ICg * H * W;
    const __global T* wg = w + (g * OCB + ob) * ICg * KH * KW * 4;
    for (int ky = 0; ky < KH; ++ky) {
        const int ty = oy + PH - ky * DH;
        if (ty < 0 || ty % SH) continue;
        const int iy = ty / SH;
        if (iy >= H) continue;
        for (int kx = 0; kx < KW; ++kx) {
            const int tx = ox + PW - kx * DW;
            if (tx < 0 || tx % SW) continue;
            const int ix = tx / SW;
            if (ix >= W) continue;
            const __global T* xp = xg + iy * W + ix;
            const __global T* wp = wg + (ky * KW + kx) * 4;
            for (int ic = 0; ic < ICg; ++ic)
                acc += (float4)(LD(xp, ic * H * W)) * LD4(wp, ic * KH * KW * 4);
        }
    }
    float r[4];
    vstore4(acc, 0, r);
    for (int c = 0; c < 4; ++c) {
        const int oc = ob * 4 + c;
        if (oc >= OCg) break;
        const float b = LD(bias, g * OCg + oc);
        float v = ACTIVATE(r[c] + b);
        EPILOGUE(v, n, g * OCg + oc, oy * OW + ox)
        ST(y, ((n * G + g) * OCg + oc) * OH * OW + oy * OW + ox, v);
    }
}

#ifdef KTAPS
/* deconv_tile: ConvTranspose whose kernel is its stride, without dilation or pads (an upsampling by a learned
 * kernel), with deconv2d's arguments: every input pixel makes its own KH x KW block of outputs, no two
 * overlapping. A work item takes one input pixel and 4 output channels: it reads the pixel's input channels once
 * and writes its block of each (deconv2d gathers per output: neighbouring work items take alternate taps, and each
 * tap column's sum runs with the others idle). KTAPS = KH * KW, a build option. */
__kernel void deconv_tile(DECONV_ARGS) {
    DECONV_START(ix, iy, W, H);
    float4 acc[KTAPS];
    for (int t = 0; t < KTAPS; ++t) acc[t] = (float4)(0.0f);
    const __global T* xp = x + (n * G + g) * ICg * H * W + iy * W + ix;
    const __global T* wg = w + (g * OCB + ob) * ICg * KTAPS * 4;
    for (int ic = 0; ic < ICg; ++ic) {
        const float v = LD(xp, ic * H * W);
        #pragma unroll
        for (int t = 0; t < KTAPS; ++t) acc[t] += (float4)(v) * LD4(wg, (ic * KTAPS + t) * 4);
    }
    for (int c = 0; c < 4; ++c) {
        const int oc = ob * 4 + c;
        if (oc >= OCg) break;
        const float b = LD(bias, g * OCg + oc);
        for (int t = 0; t < KTAPS; ++t) {
            float r[4];
            vstore4(acc[t], 0, r);
            const int oy = iy * KH + t / KW, ox = ix * KW + t % KW;
            float v = ACTIVATE(r[c] + b);
            EPILOGUE(v, n, g * OCg + oc, oy * OW + ox)
            ST(y, ((n * G + g) * OCg + oc) * OH * OW + oy * OW + ox, v);
        }
    }
}
#endif

/* ConvTranspose's weights, where they are not constants, are packed on the
 * device before each run: [G*ICg][OCg][KK] -> [G][OCB][ICg][KK][4]. */
__kernel void pack_deconv(BUF(const T, w), BUF(T, wp), const int G, const int ICg, const int OCg, const int OCB,
                          const int KK) {
    const int i = get_global_id(0);
    if (i >= G * OCB * ICg * KK * 4) return;
    SHIFT(w); SHIFT(wp);
    const int c = i % 4;
    int r = i / 4;
    const int k = r % KK;
    r /= KK;
    const int ic = r % ICg;
    r /= ICg;
    const int ob = r % OCB, g = r / OCB;
    const int oc = ob * 4 + c;
    ST(wp, i, oc < OCg ? LD(w, ((g * ICg + ic) * OCg + oc) * KK + k) : 0.0f);
}

#ifdef NCO
/* conv_narrow: a conv of one group and few output channels on a large map (aiomnn/narrow.py), with conv_gemm's
 * arguments (one of that launch's choices, tiles.py). Built per layer: NCO output channels, the kernel NKH x NKW,
 * strides NSH x NSW, dilations NDH x NDW; a work group of NX x NY x NZ work items covers NY output rows of
 * NX * NPX pixels of one image, each work item every output channel of NPX pixels of a row. Per step of NSTEP
 * input channels the work group stages the input rows its outputs read (zero outside) and the step's weights,
 * [channel, tap][output channel] as float4s, in local memory; a work item keeps a row's span of inputs in
 * registers and multiplies each tap's weights for all channels into its sums, one input feeding them all. The NZ
 * work items of a pixel pair take the step's channels z, z + NZ, ... and add their sums through xs at the end. */
#define NC4 ((NCO + 3) / 4)
#define NTW (NX * NPX)
#define NIH ((NY - 1) * NSH + (NKH - 1) * NDH + 1)
#define NIW ((NTW - 1) * NSW + (NKW - 1) * NDW + 1)
#define NSPAN ((NPX - 1) * NSW + (NKW - 1) * NDW + 1)
#define NTAPS (NKH * NKW)
#define NTXY (NX * NY)
#define NT (NTXY * NZ)
/* The slices a round of the final sums holds: xs takes at least 4 * NTXY floats (NIH >= NY, NIW >= NTW). */
#define NZR (NZ - 1 < NSTEP * NIH * NIW / (4 * NTXY) ? NZ - 1 : NSTEP * NIH * NIW / (4 * NTXY))

__kernel __attribute__((reqd_work_group_size(NX, NY, NZ)))
void conv_narrow(BUF(const T, x), BUF(const T, w), BUF(const T, bias), BUF(T, y), BUF(const int, taps),
                 BUF(float, part), BUF(uint, counts),
                 const int N, const int C, const int H, const int W, const int CO, const int OH, const int OW,
                 const int G, const int KH, const int KW, const int SH, const int SW, const int PH, const int PW,
                 const int DH, const int DW, const float p0, const float p1 EPI_ARGS) {
    __local float xs[NSTEP * NIH * NIW];
    __local float4 ws[NSTEP * NTAPS * NC4];
    SHIFT(x); SHIFT(w); SHIFT(bias); SHIFT(y); EPI_SHIFT
    const int tx = get_local_id(0), ty = get_local_id(1), tz = get_local_id(2);
    const int txy = ty * NX + tx, tid = tz * NTXY + txy;
    const int ntx = (OW + NTW - 1) / NTW, nty = (OH + NY - 1) / NY, b = get_group_id(0);
    const int n = b / (ntx * nty), oy0 = (b / ntx % nty) * NY, ox0 = (b % ntx) * NTW;
    const int iy0 = oy0 * NSH - PH, ix0 = ox0 * NSW - PW, K = C * NTAPS;
    const __global T* xn = x + n * C * H * W;
    float4 acc[NC4][NPX];
    for (int c4 = 0; c4 < NC4; ++c4)
        for (int p = 0; p < NPX; ++p) acc[c4][p] = (float4)(0.0f);
    for (int c0 = 0; c0 < C; c0 += NSTEP) {
        for (int e = tid; e < NSTEP * NIH * NIW; e += NT) {
            const int c = e / (NIH * NIW), r = e - c * (NIH * NIW), iy = iy0 + r / NIW, ix = ix0 + r % NIW;
            xs[e] = c0 + c < C && (uint)iy < (uint)H && (uint)ix < (uint)W ? LD(xn, ((c0 + c) * H + iy) * W + ix)
                                                                               : 0.0f;
        }
        for (int e = tid; e < NSTEP * NTAPS * NC4; e += NT) {
            const int r = e / NC4, co = (e - r * NC4) * 4, k = c0 * NTAPS + r;
            float4 v = (float4)(0.0f);
            if (k < K) {
                v.x = LD(w, co * K + k);
                if (co + 1 < NCO) v.y = LD(w, (co + 1) * K + k);
                if (co + 2 < NCO) v.z = LD(w, (co + 2) * K + k);
                if (co + 3 < NCO) v.w = LD(w, (co + 3) * K + k);
            }
            ws[e] = v;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int c = tz; c < NSTEP; c += NZ) {
            #pragma unroll
            for (int ky = 0; ky < NKH; ++ky) {
                float xr[NSPAN];
                const int row = (c * NIH + ty * NSH + ky * NDH) * NIW + tx * NPX * NSW;
                #pragma unroll
                for (int j = 0; j < NSPAN; ++j) xr[j] = xs[row + j];
                #pragma unroll
                for (int kx = 0; kx < NKW; ++kx) {
                    const int wr = ((c * NKH + ky) * NKW + kx) * NC4;
                    #pragma unroll
                    for (int c4 = 0; c4 < NC4; ++c4) {
                        const float4 wv = ws[wr + c4];
                        #pragma unroll
                        for (int p = 0; p < NPX; ++p) acc[c4][p] += wv * xr[p * NSW + kx * NDW];
                    }
                }
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    #pragma unroll
    for (int c4 = 0; c4 < NC4; ++c4)
        #pragma unroll
        for (int p = 0; p < NPX; ++p)
            for (int z0 = 1; z0 < NZ; z0 += NZR) {
                if (tz >= z0 && tz < z0 + NZR) vstore4(acc[c4][p], (tz - z0) * NTXY + txy, xs);
                barrier(CLK_LOCAL_MEM_FENCE);
                if (tz == 0)
                    for (int z = 0; z < min(NZR, NZ - z0); ++z) acc[c4][p] += vload4(z * NTXY + txy, xs);
                barrier(CLK_LOCAL_MEM_FENCE);
            }
    const int oy = oy0 + ty;
    if (tz != 0 || oy >= OH) return;
    for (int c4 = 0; c4 < NC4; ++c4)
        for (int p = 0; p < NPX; ++p) {
            const int ox = ox0 + tx * NPX + p;
            if (ox >= OW) continue;
            float r[4];
            vstore4(acc[c4][p], 0, r);
            for (int j = 0; j < 4 && c4 * 4 + j < NCO; ++j) {
                const int co = c4 * 4 + j;
                float v = ACTIVATE(r[j] + LD(bias, co));
                EPILOGUE(v, n, co, oy * OW + ox)
                ST(y, ((n * NCO + co) * OH + oy) * OW + ox, v);
            }
        }
}
#endif
