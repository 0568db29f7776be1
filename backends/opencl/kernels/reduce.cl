/* Reductions and Softmax.
 *
 * reduce: one output element per work item. meta: kept dims[kr], their input
 * strides[kr], reduced dims[rr], their input strides[rr]. op: 0 sum, 1 mean,
 * 2 max, 3 min, 4 prod, 5 sum of squares, 6 L1, 7 L2, 8 log-sum, 9 log-sum-exp.
 *
 * softmax: the input viewed as [outer, axis, inner]; one work item per
 * (outer, inner) row. log != 0 gives LogSoftmax. */

/* Shared by reduce and reduce_wg. */
int kept_base(const __global int* meta, int kr, int i) {
    int base = 0;
    for (int d = kr - 1; d >= 0; --d) {
        base += (i % meta[d]) * meta[kr + d];
        i /= meta[d];
    }
    return base;
}

int reduced_off(const __global int* rd, int rr, int base, int j) {
    for (int d = rr - 1; d >= 0; --d) {
        base += (j % rd[d]) * rd[rr + d];
        j /= rd[d];
    }
    return base;
}

float reduce_init(int op) {
    return op == 2 ? -INFINITY : (op == 3 ? INFINITY : (op == 4 ? 1.0f : 0.0f));
}

float reduce_step(int op, float acc, float v, float m) {
    switch (op) {
    case 2: return (v > acc || v != v) ? v : acc;
    case 3: return (v < acc || v != v) ? v : acc;
    case 4: return acc * v;
    case 5: case 7: return acc + v * v;
    case 6: return acc + fabs(v);
    case 9: return acc + exp(v - m);
    default: return acc + v;
    }
}

float reduce_finish(int op, float acc, int count, float m) {
    if (op == 1) return acc / (float)count;
    if (op == 7) return sqrt(acc);
    if (op == 8) return log(acc);
    if (op == 9) return log(acc) + m;
    return acc;
}

__kernel void reduce(BUF(const T, x), BUF(T, y), BUF(const int, meta), const int n, const int kr, const int rr,
                     const int count, const int op) {
    const int i = get_global_id(0);
    if (i >= n) return;
    SHIFT(x); SHIFT(y); SHIFT(meta);
    const int base = kept_base(meta, kr, i);
    const __global int* rd = meta + 2 * kr;
    float m = -INFINITY;
    if (op == 9) {
        for (int j = 0; j < count; ++j) m = fmax(m, LD(x, reduced_off(rd, rr, base, j)));
        if (isinf(m)) m = 0.0f;
    }
    float acc = reduce_init(op);
    for (int j = 0; j < count; ++j) acc = reduce_step(op, acc, LD(x, reduced_off(rd, rr, base, j)), m);
    ST(y, i, reduce_finish(op, acc, count, m));
}

__kernel void softmax(BUF(const T, x), BUF(T, y), const int outer, const int axis, const int inner, const int log_) {
    const int in = get_global_id(0);
    const int out = get_global_id(1);
    if (in >= inner || out >= outer) return;
    SHIFT(x); SHIFT(y);
    const int base = out * axis * inner + in;
    float m = -INFINITY;
    for (int j = 0; j < axis; ++j) m = fmax(m, LD(x, base + j * inner));
    float s = 0.0f;
    for (int j = 0; j < axis; ++j) s += exp(LD(x, base + j * inner) - m);
    if (log_) {
        const float ls = log(s);
        for (int j = 0; j < axis; ++j) ST(y, base + j * inner, LD(x, base + j * inner) - m - ls);
    } else {
        const float inv = 1.0f / s;
        for (int j = 0; j < axis; ++j) ST(y, base + j * inner, exp(LD(x, base + j * inner) - m) * inv);
    }
}

#define GROUP 64

/* Softmax of long contiguous rows: one work group of GROUP per row. */
__kernel void softmax_rows(BUF(const T, x), BUF(T, y), const int rows, const int len, const int log_) {
    __local float part[GROUP];
    const int lane = get_local_id(0);
    const int row = get_global_id(1);
    SHIFT(x); SHIFT(y);
    const bool live = row < rows;
    const __global T* xr = x + (live ? row : 0) * len;
    float m = -INFINITY;
    if (live)
        for (int j = lane; j < len; j += GROUP) m = fmax(m, LD(xr, j));
    m = group_max(part, m, GROUP);
    float s = 0.0f;
    if (live)
        for (int j = lane; j < len; j += GROUP) s += exp(LD(xr, j) - m);
    s = group_sum(part, s, GROUP);
    if (!live) return;
    __global T* yr = y + row * len;
    if (log_) {
        const float ls = log(s);
        for (int j = lane; j < len; j += GROUP) ST(yr, j, LD(xr, j) - m - ls);
    } else {
        const float inv = 1.0f / s;
        for (int j = lane; j < len; j += GROUP) ST(yr, j, exp(LD(xr, j) - m) * inv);
    }
}

/* reduce with one work group of GROUP per output element, for long reductions (same meta and ops). */
__kernel void reduce_wg(BUF(const T, x), BUF(T, y), BUF(const int, meta), const int n, const int kr, const int rr,
                        const int count, const int op) {
    __local float part[GROUP];
    const int lane = get_local_id(0);
    const int i = get_global_id(1);
    SHIFT(x); SHIFT(y); SHIFT(meta);
    const bool live = i < n;
    const int base = kept_base(meta, kr, live ? i : 0);
    const __global int* rd = meta + 2 * kr;
    float m = 0.0f;
    if (op == 9) {
        float v = -INFINITY;
        for (int j = lane; live && j < count; j += GROUP) v = fmax(v, LD(x, reduced_off(rd, rr, base, j)));
        m = group_max(part, v, GROUP);
        if (isinf(m)) m = 0.0f;
    }
    float acc = reduce_init(op);
    for (int j = lane; live && j < count; j += GROUP) acc = reduce_step(op, acc, LD(x, reduced_off(rd, rr, base, j)), m);
    /* Combine the lanes: max/min/prod have their own tree; the rest are sums. */
    part[lane] = acc;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = GROUP / 2; s > 0; s >>= 1) {
        if (lane < s) {
            const float a = part[lane], b = part[lane + s];
            part[lane] = op == 2 ? ((b > a || b != b) ? b : a) : op == 3 ? ((b < a || b != b) ? b : a)
                       : op == 4 ? a * b : a + b;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lane != 0 || !live) return;
    ST(y, i, reduce_finish(op, part[0], count, m));
}

/* The mean of a row of `size` values and its inverse standard deviation, 1 / sqrt(variance + eps), in two passes. */
inline float2 row_stats(const __global T* xr, const int size, const float eps) {
    float mean = 0.0f;
    for (int j = 0; j < size; ++j) mean += LD(xr, j);
    mean /= (float)size;
    float var = 0.0f;
    for (int j = 0; j < size; ++j) {
        const float d = LD(xr, j) - mean;
        var += d * d;
    }
    return (float2)(mean, 1.0f / sqrt(var / (float)size + eps));
}

/* LayerNormalization over the last `size` elements of each row; scale and
 * bias are expanded to `size` on the host. stats: bit 0 writes the mean,
 * bit 1 the inverse standard deviation of each row. */
__kernel void layer_norm(BUF(const T, x), BUF(const T, scale), BUF(const T, bias), BUF(T, y),
                         BUF(T, mean_out), BUF(T, istd_out), const int rows, const int size, const float eps,
                         const int stats) {
    const int r = get_global_id(0);
    if (r >= rows) return;
    SHIFT(x); SHIFT(scale); SHIFT(bias); SHIFT(y); SHIFT(mean_out); SHIFT(istd_out);
    const __global T* xr = x + r * size;
    const float2 st = row_stats(xr, size, eps);
    const float mean = st.x, inv = st.y;
    __global T* yr = y + r * size;
    for (int j = 0; j < size; ++j) ST(yr, j, (LD(xr, j) - mean) * inv * LD(scale, j) + LD(bias, j));
    if (stats & 1) ST(mean_out, r, mean);
    if (stats & 2) ST(istd_out, r, inv);
}

/* BatchNormalization (inference) whose parameters are inputs, not constants. */
__kernel void batch_norm(BUF(const T, x), BUF(const T, scale), BUF(const T, bias), BUF(const T, mean),
                         BUF(const T, var), BUF(T, y), const int n, const int C, const int inner, const float eps) {
    const int i = get_global_id(0);
    if (i >= n) return;
    SHIFT(x); SHIFT(scale); SHIFT(bias); SHIFT(mean); SHIFT(var); SHIFT(y);
    const int c = (i / inner) % C;
    const float k = LD(scale, c) / sqrt(LD(var, c) + eps);
    ST(y, i, (LD(x, i) - LD(mean, c)) * k + LD(bias, c));
}

/* x * scale[c] + bias[c] for channel c of [outer, C, inner]: BatchNormalization
 * (inference) and InstanceNormalization's affine step. */
__kernel void channel_affine(BUF(const T, x), BUF(const T, scale), BUF(const T, bias), BUF(T, y),
                             const int n, const int C, const int inner) {
    const int i = get_global_id(0);
    if (i >= n) return;
    SHIFT(x); SHIFT(scale); SHIFT(bias); SHIFT(y);
    const int c = (i / inner) % C;
    ST(y, i, LD(x, i) * LD(scale, c) + LD(bias, c));
}

/* InstanceNormalization: one row of `size` elements per (n, c). */
__kernel void instance_norm(BUF(const T, x), BUF(const T, scale), BUF(const T, bias), BUF(T, y),
                            const int rows, const int C, const int size, const float eps) {
    const int r = get_global_id(0);
    if (r >= rows) return;
    SHIFT(x); SHIFT(scale); SHIFT(bias); SHIFT(y);
    const __global T* xr = x + r * size;
    const float2 st = row_stats(xr, size, eps);
    const float mean = st.x, k = LD(scale, r % C) * st.y;
    const float b = LD(bias, r % C);
    __global T* yr = y + r * size;
    for (int j = 0; j < size; ++j) ST(yr, j, (LD(xr, j) - mean) * k + b);
}
