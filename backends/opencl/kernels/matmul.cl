/* Y[b] = act(alpha * A[b] B[b] + beta * C), for MatMul and Gemm.
 * A(m, k) is a[m * sam + k * sak], B(k, n) is b[k * sbk + n * sbn], so either
 * may be transposed; C(m, n) is c[m * scm + n * scn] (strides 0 broadcast).
 * Batches broadcast through meta: dims[brank], A strides, B strides.
 * One work item makes a 4 x 4 tile of Y. */

__kernel void gemm(BUF(const T, a), BUF(const T, b), BUF(const T, c), BUF(T, y), BUF(const int, meta),
                   const int M, const int N, const int K, const int sam, const int sak, const int sbk, const int sbn,
                   const int scm, const int scn, const int batches, const int brank,
                   const float alpha, const float beta, const float p0, const float p1) {
    const int n0 = get_global_id(0) * 4;
    const int m0 = get_global_id(1) * 4;
    const int bi = get_global_id(2);
    if (n0 >= N || m0 >= M || bi >= batches) return;
    SHIFT(a); SHIFT(b); SHIFT(c); SHIFT(y); SHIFT(meta);
    int oa = 0, ob = 0, r = bi;
    for (int d = brank - 1; d >= 0; --d) {
        const int dim = meta[d];
        const int q = r % dim;
        r /= dim;
        oa += q * meta[brank + d];
        ob += q * meta[2 * brank + d];
    }
    const __global T* ap = a + oa;
    const __global T* bp = b + ob;
    const int mn = min(4, M - m0), nn = min(4, N - n0);
    float4 acc[4] = {(float4)(0.0f), (float4)(0.0f), (float4)(0.0f), (float4)(0.0f)};
    if (nn == 4 && sbn == 1) {
        for (int k = 0; k < K; ++k) {
            const float4 bv = LD4(bp, k * sbk + n0);
            for (int i = 0; i < 4; ++i)
                if (i < mn) acc[i] += (float4)(LD(ap, (m0 + i) * sam + k * sak)) * bv;
        }
    } else {
        for (int k = 0; k < K; ++k) {
            float4 bv;
            bv.s0 = LD(bp, k * sbk + n0 * sbn);
            bv.s1 = nn > 1 ? LD(bp, k * sbk + (n0 + 1) * sbn) : 0.0f;
            bv.s2 = nn > 2 ? LD(bp, k * sbk + (n0 + 2) * sbn) : 0.0f;
            bv.s3 = nn > 3 ? LD(bp, k * sbk + (n0 + 3) * sbn) : 0.0f;
            for (int i = 0; i < 4; ++i)
                if (i < mn) acc[i] += (float4)(LD(ap, (m0 + i) * sam + k * sak)) * bv;
        }
    }
    __global T* yb = y + bi * M * N;
    for (int i = 0; i < mn; ++i) {
        float t[4];
        vstore4(acc[i], 0, t);
        for (int j = 0; j < nn; ++j) {
            const int m = m0 + i, n = n0 + j;
            float v = alpha * t[j];
            if (beta != 0.0f) v += beta * LD(c, m * scm + n * scn);
            ST(yb, m * N + n, ACTIVATE(v));
        }
    }
}
