/* Pooling, NCHW. pool2d: one output element per work item; mode 0 max,
 * 1 average over the valid taps, 2 average counting the padding (the window
 * is clipped to the padded input). global_pool: one work group of 64 per
 * (n, c), reducing in local memory; mode 0 max, 1 average. */

__kernel void pool2d(BUF(const T, x), BUF(T, y), const int NC, const int H, const int W, const int OH, const int OW,
                     const int KH, const int KW, const int SH, const int SW, const int PH, const int PW,
                     const int PHE, const int PWE, const int DH, const int DW, const int mode) {
    const int ox = get_global_id(0);
    const int oy = get_global_id(1);
    const int nc = get_global_id(2);
    if (ox >= OW || oy >= OH || nc >= NC) return;
    SHIFT(x); SHIFT(y);
    const __global T* xc = x + nc * H * W;
    const int y0 = oy * SH - PH, x0 = ox * SW - PW;
    float r;
    if (mode == 0) {
        r = -INFINITY;
        for (int ky = 0; ky < KH; ++ky) {
            const int iy = y0 + ky * DH;
            if (iy < 0 || iy >= H) continue;
            for (int kx = 0; kx < KW; ++kx) {
                const int ix = x0 + kx * DW;
                if (ix < 0 || ix >= W) continue;
                const float v = LD(xc, iy * W + ix);
                r = (v > r || v != v) ? v : r;
            }
        }
    } else {
        const int ys = max(y0, 0), ye = min(y0 + KH, H);
        const int xs = max(x0, 0), xe = min(x0 + KW, W);
        float s = 0.0f;
        for (int iy = ys; iy < ye; ++iy)
            for (int ix = xs; ix < xe; ++ix) s += LD(xc, iy * W + ix);
        int count;
        if (mode == 1) {
            count = (ye - ys) * (xe - xs);
        } else {
            count = (min(y0 + KH, H + PHE) - y0) * (min(x0 + KW, W + PWE) - x0);
        }
        r = s / (float)max(count, 1);
    }
    ST(y, nc * OH * OW + oy * OW + ox, r);
}

#define GROUP 64

__kernel void global_pool(BUF(const T, x), BUF(T, y), const int NC, const int HW, const int mode) {
    __local float part[GROUP];
    const int lane = get_local_id(0);
    const int nc = get_global_id(1);
    SHIFT(x); SHIFT(y);
    float r = mode == 0 ? -INFINITY : 0.0f;
    if (nc < NC) {
        const __global T* xc = x + nc * HW;
        for (int i = lane; i < HW; i += GROUP) {
            const float v = LD(xc, i);
            r = mode == 0 ? fmax(r, v) : r + v;
        }
    }
    part[lane] = r;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = GROUP / 2; s > 0; s >>= 1) {
        if (lane < s) part[lane] = mode == 0 ? fmax(part[lane], part[lane + s]) : part[lane] + part[lane + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lane == 0 && nc < NC) ST(y, nc, mode == 0 ? part[0] : part[0] / (float)HW);
}
