/* Blocks of ops that one kernel does (../blocks.py finds them). One work group works on one image or row, and
 * its work items share what they found through local memory.
 *
 * se:        a squeeze-and-excitation block's squeeze, per image n: the mean of each of C channels over its HW
 *            values (LANES work items a channel, reading consecutive values), then h = ACT1(W1 mean + b1) (C1
 *            values), then the gate s = ACT2(W2 h + b2) (C values); W1 and W2 come transposed, so that the
 *            work items of one output read consecutive weights. GATE 0 stores s as (N, C, 1, 1); GATE 1
 *            applies it, y = x * s (N, C, H, W), and GATE 2 adds x too, y = x + x * s. `part` holds C x LANES
 *            floats, `hid` C1. Built with -DLOCAL, -DACT1, -DACT2 and -DGATE.
 * layernorm: the LayerNorm exporters spell out, per row of n values: (x - mean) / sqrt(mean((x - mean)^2) + eps)
 *            times a scale, plus a bias, both over the row. Built with -DLOCAL (a power of two).
 */
#define LANES 8
#ifndef LOCAL
#define LOCAL 64
#endif
#ifndef ACT1
#define ACT1 0
#endif
#ifndef ACT2
#define ACT2 0
#endif
#ifndef GATE
#define GATE 0
#endif

__kernel __attribute__((reqd_work_group_size(LOCAL, 1, 1)))
void se(BUF(const T, x), BUF(const T, w1), BUF(const T, b1), BUF(const T, w2), BUF(const T, b2), BUF(T, y),
        const int C, const int HW, const int C1, const float a1a, const float a1b, const float a2a, const float a2b,
        __local float* part, __local float* hid) {
    SHIFT(x); SHIFT(w1); SHIFT(b1); SHIFT(w2); SHIFT(b2); SHIFT(y);
    const int n = get_group_id(0), lid = get_local_id(0), lane = lid % LANES;
    const __global T* xn = x + n * C * HW;
    for (int c = lid / LANES; c < C; c += LOCAL / LANES) {
        const __global T* xc = xn + c * HW;
        float s = 0.0f;
        for (int i = lane; i < HW; i += LANES) s += LD(xc, i);
        part[c * LANES + lane] = s;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int c = lid; c < C; c += LOCAL) {  /* each channel's mean, in its first slot (only this item reads it) */
        float s = 0.0f;
        for (int l = 0; l < LANES; ++l) s += part[c * LANES + l];
        part[c * LANES] = s / HW;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int h = lid; h < C1; h += LOCAL) {  /* w1 is W1 transposed, C x C1: neighbours read neighbours */
        float s = LD(b1, h);
        for (int c = 0; c < C; ++c) s += LD(w1, c * C1 + h) * part[c * LANES];
        hid[h] = activate(s, ACT1, a1a, a1b);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int c = lid; c < C; c += LOCAL) {  /* w2 is W2 transposed, C1 x C */
        float s = LD(b2, c);
        for (int h = 0; h < C1; ++h) s += LD(w2, h * C + c) * hid[h];
#if GATE == 0
        ST(y, n * C + c, activate(s, ACT2, a2a, a2b));
#else
        part[c * LANES] = activate(s, ACT2, a2a, a2b);  /* the means are read: the slot holds the gate now */
#endif
    }
#if GATE != 0
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int i = lid; i < C * HW; i += LOCAL) {
        const float v = LD(xn, i), g = part[i / HW * LANES];
        ST(y, n * C * HW + i, GATE == 1 ? v * g : v + v * g);
    }
#endif
}

__kernel __attribute__((reqd_work_group_size(LOCAL, 1, 1)))
void layernorm(BUF(const T, x), BUF(const T, scale), BUF(const T, bias), BUF(T, y), const int n, const float eps,
               const int has_bias) {
    __local float red[LOCAL];
    SHIFT(x); SHIFT(scale); SHIFT(bias); SHIFT(y);
    const int row = get_group_id(0), lid = get_local_id(0);
    const __global T* xr = x + row * n;
    float s = 0.0f;
    for (int i = lid; i < n; i += LOCAL) s += LD(xr, i);
    const float mean = group_sum(red, s, LOCAL) / n;
    float q = 0.0f;
    for (int i = lid; i < n; i += LOCAL) {
        const float d = LD(xr, i) - mean;
        q += d * d;
    }
    const float sd = sqrt(group_sum(red, q, LOCAL) / n + eps);
    for (int i = lid; i < n; i += LOCAL) {
        float v = (LD(xr, i) - mean) / sd * LD(scale, i);
        if (has_bias) v += LD(bias, i);
        ST(y, row * n + i, v);
    }
}
