/* Convolutions, NCHW, with bias and a fused activation.
 *
 * conv2d:    any kernel, stride, dilation, pads and groups. One work item
 *            makes 4 output channels x 4 output columns of one row. Weights
 *            are packed [G][OCB][ICg][KH][KW][4] (4 output channels together,
 *            zero-padded), so each tap is one 4-wide load.
 * conv1x1:   1x1, stride 1, no pads, one group: a GEMM over pixels. One work
 *            item makes 4 output channels x 4 pixels; weights [OCB][IC][4].
 * depthwise: one input channel per group and one output channel per group.
 *            One work item makes 4 output columns; weights [C][KH][KW].
 * deconv2d:  ConvTranspose as a gather: each output pixel sums the taps that
 *            land on it. Weights packed [G][OCB][ICg][KH][KW][4].
 */

__kernel void conv2d(BUF(const T, x), BUF(const T, w), BUF(const T, bias), BUF(T, y),
                     const int N, const int G, const int ICg, const int H, const int W,
                     const int OCg, const int OCB, const int OH, const int OW,
                     const int KH, const int KW, const int SH, const int SW, const int PH, const int PW,
                     const int DH, const int DW, const float p0, const float p1) {
    const int ox0 = get_global_id(0) * 4;
    const int oy = get_global_id(1);
    const int z = get_global_id(2);
    if (ox0 >= OW || oy >= OH || z >= N * G * OCB) return;
    SHIFT(x); SHIFT(w); SHIFT(bias); SHIFT(y);
    const int ob = z % OCB;
    const int g = (z / OCB) % G;
    const int n = z / (OCB * G);
    float4 a0 = (float4)(0.0f), a1 = (float4)(0.0f), a2 = (float4)(0.0f), a3 = (float4)(0.0f);
    const int iy0 = oy * SH - PH;
    const int ix0 = ox0 * SW - PW;
    const __global T* xg = x + (n * G + g) * ICg * H * W;
    const __global T* wg = w + (g * OCB + ob) * ICg * KH * KW * 4;
    for (int ic = 0; ic < ICg; ++ic) {
        const __global T* xc = xg + ic * H * W;
        const __global T* wc = wg + ic * KH * KW * 4;
        for (int ky = 0; ky < KH; ++ky) {
            const int iy = iy0 + ky * DH;
            if (iy < 0 || iy >= H) continue;
            const __global T* row = xc + iy * W;
            for (int kx = 0; kx < KW; ++kx) {
                const float4 wv = LD4(wc, (ky * KW + kx) * 4);
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
        if (oc >= OCg) break;
        const float b = LD(bias, g * OCg + oc);
        __global T* yo = y + ((n * G + g) * OCg + oc) * OH * OW + oy * OW;
        for (int j = 0; j < 4; ++j)
            if (ox0 + j < OW) ST(yo, ox0 + j, ACTIVATE(acc[j][c] + b));
    }
}

__kernel void conv1x1(BUF(const T, x), BUF(const T, w), BUF(const T, bias), BUF(T, y),
                      const int N, const int IC, const int OC, const int OCB, const int P,
                      const float p0, const float p1) {
    const int p0i = get_global_id(0) * 4;
    const int ob = get_global_id(1);
    const int n = get_global_id(2);
    if (p0i >= P || ob >= OCB || n >= N) return;
    SHIFT(x); SHIFT(w); SHIFT(bias); SHIFT(y);
    const __global T* xn = x + n * IC * P + p0i;
    const __global T* wb = w + ob * IC * 4;
    float4 a0 = (float4)(0.0f), a1 = (float4)(0.0f), a2 = (float4)(0.0f), a3 = (float4)(0.0f);
    if (p0i + 4 <= P) {
        for (int ic = 0; ic < IC; ++ic) {
            const float4 wv = LD4(wb, ic * 4);
            const float4 xv = LD4(xn, ic * P);
            a0 += (float4)(xv.s0) * wv;
            a1 += (float4)(xv.s1) * wv;
            a2 += (float4)(xv.s2) * wv;
            a3 += (float4)(xv.s3) * wv;
        }
    } else {
        const int m = P - p0i;
        for (int ic = 0; ic < IC; ++ic) {
            const float4 wv = LD4(wb, ic * 4);
            const __global T* xi = xn + ic * P;
            a0 += (float4)(LD(xi, 0)) * wv;
            if (m > 1) a1 += (float4)(LD(xi, 1)) * wv;
            if (m > 2) a2 += (float4)(LD(xi, 2)) * wv;
        }
    }
    float acc[4][4];
    vstore4(a0, 0, acc[0]); vstore4(a1, 0, acc[1]); vstore4(a2, 0, acc[2]); vstore4(a3, 0, acc[3]);
    for (int c = 0; c < 4; ++c) {
        const int oc = ob * 4 + c;
        if (oc >= OC) break;
        const float b = LD(bias, oc);
        __global T* yo = y + (n * OC + oc) * P + p0i;
        if (p0i + 4 <= P) {
            ST4(yo, 0, (float4)(ACTIVATE(acc[0][c] + b), ACTIVATE(acc[1][c] + b),
                                ACTIVATE(acc[2][c] + b), ACTIVATE(acc[3][c] + b)));
        } else {
            for (int j = 0; j < 4 && p0i + j < P; ++j) ST(yo, j, ACTIVATE(acc[j][c] + b));
        }
    }
}

__kernel void depthwise(BUF(const T, x), BUF(const T, w), BUF(const T, bias), BUF(T, y),
                        const int NC, const int C, const int H, const int W, const int OH, const int OW,
                        const int KH, const int KW, const int SH, const int SW, const int PH, const int PW,
                        const int DH, const int DW, const float p0, const float p1) {
    const int ox0 = get_global_id(0) * 4;
    const int oy = get_global_id(1);
    const int nc = get_global_id(2);
    if (ox0 >= OW || oy >= OH || nc >= NC) return;
    SHIFT(x); SHIFT(w); SHIFT(bias); SHIFT(y);
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
        if (ox0 + j < OW) ST(yo, ox0 + j, ACTIVATE(r[j] + b));
}

__kernel void deconv2d(BUF(const T, x), BUF(const T, w), BUF(const T, bias), BUF(T, y),
                       const int N, const int G, const int ICg, const int H, const int W,
                       const int OCg, const int OCB, const int OH, const int OW,
                       const int KH, const int KW, const int SH, const int SW, const int PH, const int PW,
                       const int DH, const int DW, const float p0, const float p1) {
    const int ox = get_global_id(0);
    const int oy = get_global_id(1);
    const int z = get_global_id(2);
    if (ox >= OW || oy >= OH || z >= N * G * OCB) return;
    SHIFT(x); SHIFT(w); SHIFT(bias); SHIFT(y);
    const int ob = z % OCB;
    const int g = (z / OCB) % G;
    const int n = z / (OCB * G);
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
        ST(y, ((n * G + g) * OCg + oc) * OH * OW + oy * OW + ox, ACTIVATE(r[c] + b));
    }
}

/* Weights that are not constants are packed on the device before each run.
 * pack_oc4:    [G*OCg][inner] -> [G][OCB][inner][4], zero-padded channels.
 * pack_deconv: [G*ICg][OCg][KK] -> [G][OCB][ICg][KK][4]. */
__kernel void pack_oc4(BUF(const T, w), BUF(T, wp), const int G, const int OCg, const int OCB, const int inner) {
    const int i = get_global_id(0);
    if (i >= G * OCB * inner * 4) return;
    SHIFT(w); SHIFT(wp);
    const int c = i % 4;
    int r = i / 4;
    const int j = r % inner;
    r /= inner;
    const int ob = r % OCB, g = r / OCB;
    const int oc = ob * 4 + c;
    ST(wp, i, oc < OCg ? LD(w, (g * OCg + oc) * inner + j) : 0.0f);
}

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
