// A matmul's outputs and the LayerNorm its epilogue may end with, for matmul.comp, matmul_direct.comp and
// matmul_small.comp (after matmul_shape.glsl). Output 0 is the shader's own binding 0.
//
// Merged projections (dense.py: q, k and v of one input as one product over their weights side by side): the
// columns from SPLIT1 go to o1, from SPLIT2 to o2, from SPLIT3 to o3, each a dense matrix of its own width, so
// every reader sees the values it would have unmerged.
layout(std430, set = 0, binding = 6) writeonly buffer O1 { STORE o1[]; };
layout(std430, set = 0, binding = 7) writeonly buffer O2 { STORE o2[]; };
layout(std430, set = 0, binding = 8) writeonly buffer O3 { STORE o3[]; };
// LayerNormalization over each output row (N columns), after the bias, activation and residual: a row's
// pre-norm values are stored in o, the workgroup that stores its last columns (counted per row in ln_cnt,
// which it resets to zero for the next run) normalizes it in place. Scale then bias, N each, in ln.
layout(std430, set = 0, binding = 9) readonly buffer Ln { STORE ln[]; };
layout(std430, set = 0, binding = 10) coherent buffer LnCnt { uint ln_cnt[]; };
layout(constant_id = 6) const bool LN = false;
layout(constant_id = 40) const int SPLIT1 = 1 << 30;
layout(constant_id = 41) const int SPLIT2 = 1 << 30;
layout(constant_id = 42) const int SPLIT3 = 1 << 30;
layout(constant_id = 43) const float LN_EPS = 0.0;

void put(int bz, int gm, int gn, float v) {
    int row = bz * M + gm;
    if (gn < SPLIT1) o[row * min(SPLIT1, N) + gn] = STORE(v);
    else if (gn < SPLIT2) o1[row * (min(SPLIT2, N) - SPLIT1) + gn - SPLIT1] = STORE(v);
    else if (gn < SPLIT3) o2[row * (min(SPLIT3, N) - SPLIT2) + gn - SPLIT2] = STORE(v);
    else o3[row * (N - SPLIT3) + gn - SPLIT3] = STORE(v);
}

// A workgroup's rows (at most 128: the largest tile) that it completes, and the sums of its row teams.
shared int ln_rows[128];
shared int ln_n;
shared float ln_red[256];

// The sum of v over each team of t consecutive invocations (t a power of two), for every invocation.
float ln_sum(float v, int tid, int t) {
    ln_red[tid] = v;
    barrier();
    for (int s = t >> 1; s > 0; s >>= 1) {
        if ((tid & (t - 1)) < s) ln_red[tid] += ln_red[tid + s];
        barrier();
    }
    float r = ln_red[tid & ~(t - 1)];
    barrier();
    return r;
}

// Called by every invocation (nt of them, at most 256) after the workgroup stored rows [r0, r1) x columns
// [c0, c1) of batch entry bz; rmax is the most rows any of its workgroups stores. Each completed row is
// normalized by a team of nt / rmax invocations (a power of two, fixed per kernel: the sums' order, and so
// the result, does not depend on which workgroup finishes a row).
void ln_finish(int tid, int nt, int rmax, int bz, int r0, int r1, int c0, int c1) {
    memoryBarrierBuffer();
    barrier();
    if (tid == 0) ln_n = 0;
    barrier();
    uint w = uint(c1 - c0);
    for (int r = r0 + tid; r < r1; r += nt) {
        int row = bz * M + r;
        if (atomicAdd(ln_cnt[row], w) + w == uint(N)) {
            ln_cnt[row] = 0u;
            ln_rows[atomicAdd(ln_n, 1)] = row;
        }
    }
    barrier();
    memoryBarrierBuffer();
    int n = ln_n;
    int t = 1;
    while (2 * t * rmax <= nt) t *= 2;
    int per = nt / t;
    for (int base = 0; base < n; base += per) {
        int k = base + tid / t, lane = tid & (t - 1);
        bool live = tid / t < per && k < n;
        int at = live ? ln_rows[k] * N : 0;
        float s = 0.0;
        if (live)
            for (int j = lane; j < N; j += t) s += float(o[at + j]);
        float mean = ln_sum(s, tid, t) / float(N);
        float q = 0.0;
        if (live)
            for (int j = lane; j < N; j += t) {
                float d = float(o[at + j]) - mean;
                q += d * d;
            }
        float inv = 1.0 / sqrt(ln_sum(q, tid, t) / float(N) + LN_EPS);
        if (live)
            for (int j = lane; j < N; j += t)
                o[at + j] = STORE((float(o[at + j]) - mean) * inv * float(ln[j]) + float(ln[N + j]));
    }
}
