/* Elementwise ops. Binary ops broadcast through a table of the output's
 * dims and each input's strides (0 along broadcast dims), collapsed on the
 * host so that same-shape and per-channel cases have rank 1 or 2. */

/* Both inputs flat: strides 0 (broadcast scalar) or 1. */
__kernel void binary_flat(BUF(const T, a), BUF(const T, b), BUF(T, y), const int n, const int sa, const int sb,
                          const int op, const float p0, const float p1) {
    const int i = get_global_id(0);
    if (i >= n) return;
    SHIFT(a); SHIFT(b); SHIFT(y);
    ST(y, i, ACTIVATE(binary_op(LD(a, i * sa), LD(b, i * sb), op)));
}

/* meta: dims[rank], a strides[rank], b strides[rank] */
__kernel void binary(BUF(const T, a), BUF(const T, b), BUF(T, y), BUF(const int, meta),
                     const int n, const int rank, const int op, const float p0, const float p1) {
    const int i = get_global_id(0);
    if (i >= n) return;
    SHIFT(a); SHIFT(b); SHIFT(y); SHIFT(meta);
    int ia = 0, ib = 0, r = i;
    for (int d = rank - 1; d > 0; --d) {
        const int dim = meta[d];
        const int c = r % dim;
        r /= dim;
        ia += c * meta[rank + d];
        ib += c * meta[2 * rank + d];
    }
    ia += r * meta[rank];
    ib += r * meta[2 * rank];
    ST(y, i, ACTIVATE(binary_op(LD(a, ia), LD(b, ib), op)));
}

/* The op is ACT (built once per op). */
__kernel void unary(BUF(const T, x), BUF(T, y), const int n, const float p0, const float p1) {
    const int i = get_global_id(0);
    if (i >= n) return;
    SHIFT(x); SHIFT(y);
    ST(y, i, ACTIVATE(LD(x, i)));
}

/* Where(cond, a, b) with broadcasting; meta: dims, cond strides, a strides, b strides. */
__kernel void where_(BUF(const uchar, c), BUF(const T, a), BUF(const T, b), BUF(T, y), BUF(const int, meta),
                     const int n, const int rank) {
    const int i = get_global_id(0);
    if (i >= n) return;
    SHIFT(c); SHIFT(a); SHIFT(b); SHIFT(y); SHIFT(meta);
    int ic = 0, ia = 0, ib = 0, r = i;
    for (int d = rank - 1; d >= 0; --d) {
        const int dim = meta[d];
        const int k = r % dim;
        r /= dim;
        ic += k * meta[rank + d];
        ia += k * meta[2 * rank + d];
        ib += k * meta[3 * rank + d];
    }
    ST(y, i, c[ic] ? LD(a, ia) : LD(b, ib));
}

/* Comparisons of float tensors into bool (uchar). */
__kernel void compare(BUF(const T, a), BUF(const T, b), BUF(uchar, y), BUF(const int, meta),
                      const int n, const int rank, const int op) {
    const int i = get_global_id(0);
    if (i >= n) return;
    SHIFT(a); SHIFT(b); SHIFT(y); SHIFT(meta);
    int ia = 0, ib = 0, r = i;
    for (int d = rank - 1; d >= 0; --d) {
        const int dim = meta[d];
        const int c = r % dim;
        r /= dim;
        ia += c * meta[rank + d];
        ib += c * meta[2 * rank + d];
    }
    const float x = LD(a, ia), z = LD(b, ib);
    uchar v;
    switch (op) {
    case 0: v = x == z; break;
    case 1: v = x < z; break;
    case 2: v = x > z; break;
    case 3: v = x <= z; break;
    default: v = x >= z; break;
    }
    y[i] = v;
}

/* Clip whose bounds are inputs, not constants: flags bit 0 has a lower, bit 1 an upper bound. */
__kernel void clip_t(BUF(const T, x), BUF(const T, lo), BUF(const T, hi), BUF(T, y), const int n, const int flags) {
    const int i = get_global_id(0);
    if (i >= n) return;
    SHIFT(x); SHIFT(lo); SHIFT(hi); SHIFT(y);
    float v = LD(x, i);
    if ((flags & 1) && v < LD(lo, 0)) v = LD(lo, 0);
    if ((flags & 2) && v > LD(hi, 0)) v = LD(hi, 0);
    ST(y, i, v);
}

/* Elementwise ops fused into one kernel (../epilogues.py): x read through strides over a three-dimensional view
 * of the output (its dims d0 x d1 x d2, collapsed on the host), its unary op ACT, then the epilogue's steps
 * (common.cl's EPILOGUE), each reading its operand the same way. */
__kernel void chain(BUF(const T, x), BUF(T, y), const int n, const int d1, const int d2,
                    const int xs0, const int xs1, const int xs2, const float p0, const float p1 EPI_ARGS) {
    const int i = get_global_id(0);
    if (i >= n) return;
    SHIFT(x); SHIFT(y); EPI_SHIFT
    const int i2 = i % d2, r = i / d2, i1 = r % d1, i0 = r / d1;
    float v = ACTIVATE(LD(x, i0 * xs0 + i1 * xs1 + i2 * xs2));
    EPILOGUE(v, i0, i1, i2)
    ST(y, i, v);
}
