/* Resize of the last two dims of [NC, H, W]. The host computes, per output
 * row and column, which input rows and columns to read (and for linear the
 * weight of the second one), so every coordinate mode costs the same here. */

__kernel void resize_nearest(BUF(const T, x), BUF(T, y), BUF(const int, iy), BUF(const int, ix),
                             const int NC, const int H, const int W, const int OH, const int OW) {
    const int ox = get_global_id(0);
    const int oy = get_global_id(1);
    const int nc = get_global_id(2);
    if (ox >= OW || oy >= OH || nc >= NC) return;
    SHIFT(x); SHIFT(y); SHIFT(iy); SHIFT(ix);
    ST(y, (nc * OH + oy) * OW + ox, LD(x, (nc * H + iy[oy]) * W + ix[ox]));
}

/* resize_nearest four output columns a work item, stored as one vector: for an output row a multiple of 4
 * long, which nearly every upsample has. Its stores then cover a warp's row in whole lines. */
__kernel void resize_nearest4(BUF(const T, x), BUF(T, y), BUF(const int, iy), BUF(const int, ix),
                              const int NC, const int H, const int W, const int OH, const int OW) {
    const int ox = 4 * get_global_id(0);
    const int oy = get_global_id(1);
    const int nc = get_global_id(2);
    if (ox >= OW || oy >= OH || nc >= NC) return;
    SHIFT(x); SHIFT(y); SHIFT(iy); SHIFT(ix);
    const __global T* row = x + (nc * H + iy[oy]) * W;
    const int4 c = vload4(0, ix + ox);
    ST4(y, (nc * OH + oy) * OW + ox, (float4)(LD(row, c.x), LD(row, c.y), LD(row, c.z), LD(row, c.w)));
}

/* rows/cols: [i0, i1] per output index; wy/wx: the weight of i1. */
__kernel void resize_linear(BUF(const T, x), BUF(T, y), BUF(const int, rows), BUF(const float, wy),
                            BUF(const int, cols), BUF(const float, wx),
                            const int NC, const int H, const int W, const int OH, const int OW) {
    const int ox = get_global_id(0);
    const int oy = get_global_id(1);
    const int nc = get_global_id(2);
    if (ox >= OW || oy >= OH || nc >= NC) return;
    SHIFT(x); SHIFT(y); SHIFT(rows); SHIFT(wy); SHIFT(cols); SHIFT(wx);
    const __global T* xc = x + nc * H * W;
    const int y0 = rows[2 * oy], y1 = rows[2 * oy + 1];
    const int x0 = cols[2 * ox], x1 = cols[2 * ox + 1];
    const float fy = wy[oy], fx = wx[ox];
    const float top = LD(xc, y0 * W + x0) * (1.0f - fx) + LD(xc, y0 * W + x1) * fx;
    const float bottom = LD(xc, y1 * W + x0) * (1.0f - fx) + LD(xc, y1 * W + x1) * fx;
    ST(y, (nc * OH + oy) * OW + ox, top * (1.0f - fy) + bottom * fy);
}
