/* Scaled dot-product attention, y = softmax(scale(q k^T) + mask) v, one work group per (batch entry, head, block
 * of BQ query rows), on aiomnn/attention.py's tiling: the keys in tiles of TK with an online softmax (each row's
 * running maximum and sum, rescaled when a tile raises the maximum), q, k, v and a tile's probabilities staged
 * in local memory as floats. Work item tid is row group tr = tid / CT, column tc = tid % CT: RM rows by RN keys
 * (tc + CT * j) in the scores phase, the same rows by DW = DP / CT head columns in the output phase. A row's
 * maximum and sum go through local memory (red), a float per row and item.
 *
 * Every size and stride is a build option: S queries, TT keys, D the head (DP padded), NQB query blocks a head,
 * HEADS heads an entry; the (batch, head, row, column) strides Q*, K* (rows along the keys), V*, O* (the output)
 * and M* (the mask, 0 where broadcast); q, k and v start QO, KO and VO elements into their buffers; SCALE_OP 0
 * none, 1 divide, 2 multiply by SCALE_BITS (a float's bits); MASK 0 or 1.
 */
#define NT (CT * BQ / RM)
#define DW (DP / CT)

__kernel __attribute__((reqd_work_group_size(NT, 1, 1)))
void attention(BUF(const T, q), BUF(const T, k), BUF(const T, v), BUF(const T, mask), BUF(T, y)) {
    SHIFT(q); SHIFT(k); SHIFT(v); SHIFT(mask); SHIFT(y);
    __local float Qs[BQ][DP + 4];
    __local float Ks[TK][DP + 4];
    __local float Vs[TK][DP];
    __local float Ps[BQ][TK + 4];
    __local float red[BQ][CT];
    const int tid = get_local_id(0), tr = tid / CT, tc = tid % CT;
    const int bh = get_group_id(0) / NQB, q0 = get_group_id(0) % NQB * BQ;
    const int b = bh / HEADS, h = bh % HEADS;
    const __global T* qp = q + QO + b * QB + h * QH;
    const __global T* kp = k + KO + b * KB + h * KH;
    const __global T* vp = v + VO + b * VB + h * VH;
    for (int e = tid; e < BQ * DP; e += NT) {
        const int r = e / DP, c = e % DP;
        Qs[r][c] = (q0 + r < S && c < D) ? LD(qp, (q0 + r) * QR + c * QC) : 0.0f;
    }
    float m[RM], l[RM], o[RM][DW];
    for (int r = 0; r < RM; ++r) {
        m[r] = -FLT_MAX;  /* as the Softmax kernel starts: a row of -inf scores sums to 0 and gives NaN */
        l[r] = 0.0f;
        for (int c = 0; c < DW; ++c) o[r][c] = 0.0f;
    }
    for (int t0 = 0; t0 < TT; t0 += TK) {
        barrier(CLK_LOCAL_MEM_FENCE);  /* the last tile's k, v and probabilities are done with */
        for (int e = tid; e < TK * DP; e += NT) {
            const int j = e / DP, c = e % DP;
            const bool inside = t0 + j < TT && c < D;
            Ks[j][c] = inside ? LD(kp, (t0 + j) * KR + c * KC) : 0.0f;
            Vs[j][c] = inside ? LD(vp, (t0 + j) * VR + c * VC) : 0.0f;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        float sc[RM][RN];
        for (int r = 0; r < RM; ++r)
            for (int j = 0; j < RN; ++j) sc[r][j] = 0.0f;
        for (int c = 0; c < DP; c += 4) {
            float4 qv[RM], kv[RN];
            for (int r = 0; r < RM; ++r) qv[r] = vload4(0, &Qs[tr * RM + r][c]);
            for (int j = 0; j < RN; ++j) kv[j] = vload4(0, &Ks[tc + CT * j][c]);
            for (int r = 0; r < RM; ++r)
                for (int j = 0; j < RN; ++j) sc[r][j] += dot(qv[r], kv[j]);
        }
        float mx[RM];
        for (int r = 0; r < RM; ++r) {
            const int row = min(q0 + tr * RM + r, S - 1);  /* rows past the end compute on zeros, unstored */
            mx[r] = m[r];
            for (int j = 0; j < RN; ++j) {
                const int key = t0 + tc + CT * j;
                float z = sc[r][j];
#if SCALE_OP == 1
                z = z / as_float(SCALE_BITS);
#elif SCALE_OP == 2
                z = z * as_float(SCALE_BITS);
#endif
#if MASK
                if (key < TT) z += LD(mask, b * MB + h * MH + row * MR + key * MC);
#endif
                sc[r][j] = key < TT ? z : -INFINITY;
                mx[r] = fmax(mx[r], sc[r][j]);
            }
            red[tr * RM + r][tc] = mx[r];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        float sum[RM];
        for (int r = 0; r < RM; ++r) {
            for (int u = 0; u < CT; ++u) mx[r] = fmax(mx[r], red[tr * RM + r][u]);
            sum[r] = 0.0f;
            for (int j = 0; j < RN; ++j) {
                const float p = exp(sc[r][j] - mx[r]);
                sum[r] += p;
                Ps[tr * RM + r][tc + CT * j] = p;
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);  /* every item has read the maxima */
        for (int r = 0; r < RM; ++r) red[tr * RM + r][tc] = sum[r];
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int r = 0; r < RM; ++r) {
            float s = 0.0f;
            for (int u = 0; u < CT; ++u) s += red[tr * RM + r][u];
            const float alpha = exp(m[r] - mx[r]);
            m[r] = mx[r];
            l[r] = l[r] * alpha + s;
            for (int c = 0; c < DW; ++c) o[r][c] *= alpha;
        }
        for (int j = 0; j < TK; j += 4) {
            float4 pv[RM];
            for (int r = 0; r < RM; ++r) pv[r] = vload4(0, &Ps[tr * RM + r][j]);
            for (int jj = 0; jj < 4; ++jj) {
                float vv[DW];
                for (int c = 0; c < DW; ++c) vv[c] = Vs[j + jj][tc * DW + c];
                for (int r = 0; r < RM; ++r) {
                    const float p = jj == 0 ? pv[r].x : jj == 1 ? pv[r].y : jj == 2 ? pv[r].z : pv[r].w;
                    for (int c = 0; c < DW; ++c) o[r][c] += p * vv[c];
                }
            }
        }
    }
    for (int r = 0; r < RM; ++r) {
        const int row = q0 + tr * RM + r;
        if (row >= S) continue;
        const float inv = 1.0f / l[r];
        for (int c = 0; c < DW; ++c) {
            const int col = tc * DW + c;
            if (col < D) ST(y, b * OB + h * OH + row * OR + col * OC, o[r][c] * inv);
        }
    }
}
