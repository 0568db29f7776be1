/* Y[b] = act(alpha * A[b] B[b] + beta * C), for MatMul and Gemm.
 * A(m, k) is a[m * sam + k * sak], B(k, n) is b[k * sbk + n * sbn], so either
 * may be transposed; C(m, n) is c[m * scm + n * scn] (strides 0 broadcast).
 * Batches broadcast through meta: dims[brank], A strides, B strides.
 *
 * Large products run gemm.cl's tiled matmul. matmul_small, here, is for
 * products of a few tiles (a few hundred rows and columns, or a
 * matrix-vector product), where each tile would walk the whole sum alone:
 * many small work groups instead. Each work item computes 4 rows of one
 * column; the SX work items of a group take consecutive (row block, column)
 * pairs, columns fastest, so a wide B is read coalesced and A's rows
 * broadcast, and a single column spreads its rows over the work items. The
 * group's SY work items along y split the sum (every SY-th k) and add their
 * partial sums in local memory at the end: one barrier, none per step. Built
 * with -DSX and -DSY (the choice tuning makes, tiles.py). */
#ifndef SX  /* tiles.py always gives a shape; this default only lets the file build alone */
#define SX 16
#define SY 16
#endif

__kernel __attribute__((reqd_work_group_size(SX, SY, 1)))
void matmul_small(BUF(const T, a), BUF(const T, b), BUF(const T, c), BUF(T, y), BUF(const int, meta),
                  const int M, const int N, const int K, const int sam, const int sak, const int sbk, const int sbn,
                  const int scm, const int scn, const int batches, const int brank,
                  const float alpha, const float beta, const float p0, const float p1 EPI_ARGS) {
    __local float4 part[SX * SY];
    SHIFT(a); SHIFT(b); SHIFT(c); SHIFT(y); SHIFT(meta); EPI_SHIFT
    const int lx = get_local_id(0), ky = get_local_id(1);
    const int bi = get_group_id(2);
    const int2 off = batch_offsets(meta, brank, bi);
    const int oa = off.x, ob = off.y;
    const int idx = get_group_id(0) * SX + lx;
    const int n = idx % N, m0 = idx / N * 4;
    const bool live = m0 < M;
    /* Rows past the last one read the last one again (their sums are not stored). */
    const __global T* a0 = a + oa + min(m0, M - 1) * sam;
    const __global T* a1 = a + oa + min(m0 + 1, M - 1) * sam;
    const __global T* a2 = a + oa + min(m0 + 2, M - 1) * sam;
    const __global T* a3 = a + oa + min(m0 + 3, M - 1) * sam;
    const __global T* bn = b + ob + n * sbn;
    float4 acc = (float4)(0.0f);
    if (live) {
        for (int k = ky; k < K; k += SY) {
            const int ka = k * sak;
            acc += (float4)(LD(a0, ka), LD(a1, ka), LD(a2, ka), LD(a3, ka)) * LD(bn, k * sbk);
        }
    }
    if (SY > 1) {
        part[ky * SX + lx] = acc;
        barrier(CLK_LOCAL_MEM_FENCE);
        if (ky != 0) return;
        for (int j = 1; j < SY; ++j) acc += part[j * SX + lx];
    }
    if (!live) return;
    float r[4];
    vstore4(acc, 0, r);
    __global T* yb = y + bi * M * N;
    for (int i = 0; i < 4 && m0 + i < M; ++i) {
        const int m = m0 + i;
        float v = alpha * r[i];
        if (beta != 0.0f) v += beta * LD(c, m * scm + n * scn);
        v = ACTIVATE(v);
        EPILOGUE(v, bi, m, n)
        ST(yb, m * N + n, v);
    }
}
