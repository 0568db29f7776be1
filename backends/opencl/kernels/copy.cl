/* Moving data: strided copies for Transpose, Slice, Concat, Split, Expand and
 * contiguous copies. Built per element size (-DE=uchar/ushort/uint/ulong), so
 * they serve every dtype. meta: dims[rank], x strides[rank], y strides[rank]. */

__kernel void copy_nd(BUF(const E, x), BUF(E, y), BUF(const int, meta), const int n, const int rank,
                      const int xbase, const int ybase) {
    const int i = get_global_id(0);
    if (i >= n) return;
    SHIFT(x); SHIFT(y); SHIFT(meta);
    int ix = xbase, iy = ybase, r = i;
    for (int d = rank - 1; d >= 0; --d) {
        const int dim = meta[d];
        const int c = r % dim;
        r /= dim;
        ix += c * meta[rank + d];
        iy += c * meta[2 * rank + d];
    }
    y[iy] = x[ix];
}

/* A strided copy whose last dim is contiguous on both sides, as rows (Concat and Split pieces of a batch, and
 * slices): dims [d0, d1, len] (d0 = 1 or d1 = 1 for fewer), each work item (i, r) copying V elements (-DV: 1, 2
 * or 4, dividing len) of row r = a * d1 + b at x[xbase + a xs0 + b xs1] and y likewise: no division per element
 * and vector loads, where copy_nd works out every element's place by `rank` divisions. */
#ifdef V
#if V == 1
#define VLOAD(p) (*(p))
#define VSTORE(v, p) (*(p) = (v))
#else
#define VLOAD(p) CAT(vload, V)(0, (p))
#define VSTORE(v, p) CAT(vstore, V)((v), 0, (p))
#endif
#define CAT(a, b) CAT_(a, b)
#define CAT_(a, b) a##b

__kernel void copy_rows(BUF(const E, x), BUF(E, y), const int len, const int rows, const int d1,
                        const int xs0, const int xs1, const int ys0, const int ys1, const int xbase,
                        const int ybase) {
    const int i = get_global_id(0) * V;
    const int r = get_global_id(1);
    if (i >= len || r >= rows) return;
    SHIFT(x); SHIFT(y);
    const int a = r / d1, b = r - a * d1;
    VSTORE(VLOAD(x + xbase + a * xs0 + b * xs1 + i), y + ybase + a * ys0 + b * ys1 + i);
}

/* Up to four copies by rows in one launch (a batch's Concat or Split: one launch where each piece took its own,
 * and every launch costs the device a gap): piece p (grid z) copies `rows` rows of meta[5p] elements from xp to
 * yp, row r at xp[meta[5p + 3] + r meta[5p + 1]] and yp[meta[5p + 4] + r meta[5p + 2]]. */
__kernel void copy_pieces(BUF(const E, x0), BUF(const E, x1), BUF(const E, x2), BUF(const E, x3),
                          BUF(E, y0), BUF(E, y1), BUF(E, y2), BUF(E, y3), BUF(const int, meta),
                          const int rows, const int pieces) {
    const int i = get_global_id(0) * V;
    const int r = get_global_id(1);
    const int p = get_global_id(2);
    if (r >= rows || p >= pieces) return;
    SHIFT(meta);
    const __global int* m = meta + 5 * p;
    if (i >= m[0]) return;
    const __global E* x = (p == 0 ? x0 + x0_o : p == 1 ? x1 + x1_o : p == 2 ? x2 + x2_o : x3 + x3_o);
    __global E* y = (p == 0 ? y0 + y0_o : p == 1 ? y1 + y1_o : p == 2 ? y2 + y2_o : y3 + y3_o);
    VSTORE(VLOAD(x + m[3] + r * m[1] + i), y + m[4] + r * m[2] + i);
}
#endif

__kernel void copy(BUF(const E, x), BUF(E, y), const int n) {
    const int i = get_global_id(0);
    if (i >= n) return;
    SHIFT(x); SHIFT(y);
    y[i] = x[i];
}

#ifdef IDX
/* Gather along one axis of x viewed as [outer, axis, inner]; indices (-DIDX=int/long) may be negative. */
__kernel void gather(BUF(const E, x), BUF(const IDX, idx), BUF(E, y), const int n, const int axis_len,
                     const int n_idx, const int inner) {
    const int i = get_global_id(0);
    if (i >= n) return;
    SHIFT(x); SHIFT(idx); SHIFT(y);
    const int in = i % inner;
    const int j = (i / inner) % n_idx;
    const int o = i / (inner * n_idx);
    long k = idx[j];
    if (k < 0) k += axis_len;
    k = clamp(k, (long)0, (long)(axis_len - 1));
    y[i] = x[(o * axis_len + (int)k) * inner + in];
}
#endif

/* Pad. meta: out dims[rank], in dims[rank], pads before[rank], in strides[rank].
 * mode: 0 constant (value[0]), 1 edge, 2 reflect, 3 wrap. */
__kernel void pad(BUF(const E, x), BUF(E, y), BUF(const E, value), BUF(const int, meta), const int n,
                  const int rank, const int mode) {
    const int i = get_global_id(0);
    if (i >= n) return;
    SHIFT(x); SHIFT(y); SHIFT(value); SHIFT(meta);
    int r = i, off = 0;
    bool outside = false;
    for (int d = rank - 1; d >= 0; --d) {
        const int c = r % meta[d];
        r /= meta[d];
        const int len = meta[rank + d];
        int s = c - meta[2 * rank + d];
        if (s < 0 || s >= len) {
            if (mode == 0) outside = true;
            else if (mode == 1) s = clamp(s, 0, len - 1);
            else if (mode == 2) {
                const int period = 2 * (len - 1);
                if (period == 0) s = 0;
                else {
                    s = s % period;
                    if (s < 0) s += period;
                    if (s >= len) s = period - s;
                }
            } else {
                s = s % len;
                if (s < 0) s += len;
            }
        }
        off += s * meta[3 * rank + d];
    }
    y[i] = outside ? value[0] : x[off];
}
