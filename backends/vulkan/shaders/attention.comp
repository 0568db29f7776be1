#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"
// Scaled dot-product attention, o = softmax(scale(q k^T) + mask) v, one workgroup per (batch entry, head, block of
// BQ query rows), on the tiling of aiomnn/attention.py that CUDA's and OpenCL's kernels share: the keys in tiles
// of TK with an online softmax (each row's running maximum and sum, what a tile has summed rescaled when a later
// tile raises the maximum), so any number of keys fits; q, a tile of k and v, and the tile's probabilities staged
// in shared memory as floats, k's tile and then v's in one buffer (attention.Tiling's kv = 1: heads of 128 fit in
// 32 KB). Invocation tid is row group tr = tid / CT, column tc = tid % CT: RM rows by RN keys (tc + CT * j) in the
// scores phase, the same rows by DW = DP / CT head columns in the output phase. A row's maximum and sum go through
// shared memory (red), a float per row and invocation.
//
// Every operand is read through strides (b, h, row, column), so a Transpose of q, k or v before it, or of the
// output after it, is a stride here; the mask's strides are 0 where it is broadcast; q, k and v start QO, KO and
// VO elements into their buffers (a Slice's offset). Storage is STORE (float or float16_t); shared memory and
// arithmetic are float32. The head size D is padded with zeros to DP.
#define NT 128
layout(local_size_x = NT, local_size_y = 1, local_size_z = 1) in;
layout(std430, set = 0, binding = 0) writeonly buffer O { STORE o[]; };
layout(std430, set = 0, binding = 1) readonly buffer Q { STORE q[]; };
layout(std430, set = 0, binding = 2) readonly buffer K { STORE k[]; };
layout(std430, set = 0, binding = 3) readonly buffer V { STORE v[]; };
layout(std430, set = 0, binding = 4) readonly buffer Mask { STORE mask[]; };
// The tiling (attention.Tiling): BQ query rows as BQ / RM row groups of CT invocations, RN keys an invocation a
// tile (TK = CT * RN), the head padded to DP (whole columns of every invocation and whole vec4s).
layout(constant_id = 3) const int BQ = 16;
layout(constant_id = 4) const int RM = 2;
layout(constant_id = 5) const int RN = 4;
layout(constant_id = 6) const int CT = 16;
layout(constant_id = 7) const int DP = 32;
layout(constant_id = 8) const int SCALE_OP = 0;   // 0: none; 1: scores / SCALE; 2: scores * SCALE
layout(constant_id = 9) const bool MASK = false;
// The layer's shapes and strides: constants of its own pipeline (a SPECIALIZED kernel).
layout(constant_id = 16) const int H = 1;
layout(constant_id = 17) const int S = 1;
layout(constant_id = 18) const int T = 1;
layout(constant_id = 19) const int D = 1;
layout(constant_id = 20) const int NQB = 1;       // query blocks per head: ceil(S / BQ)
layout(constant_id = 21) const int QB = 0;
layout(constant_id = 22) const int QH = 0;
layout(constant_id = 23) const int QS = 0;
layout(constant_id = 24) const int QD = 0;
layout(constant_id = 25) const int KB = 0;
layout(constant_id = 26) const int KH = 0;
layout(constant_id = 27) const int KS = 0;        // along the keys
layout(constant_id = 28) const int KD = 0;        // along the head
layout(constant_id = 29) const int VB = 0;
layout(constant_id = 30) const int VH = 0;
layout(constant_id = 31) const int VS = 0;
layout(constant_id = 32) const int VD = 0;
layout(constant_id = 33) const int OB = 0;
layout(constant_id = 34) const int OH = 0;
layout(constant_id = 35) const int OS = 0;
layout(constant_id = 36) const int OD = 0;
layout(constant_id = 37) const int MB = 0;
layout(constant_id = 38) const int MH = 0;
layout(constant_id = 39) const int MS = 0;
layout(constant_id = 40) const int MT = 0;
layout(constant_id = 41) const float SCALE = 1.0;
layout(constant_id = 42) const int QO = 0;
layout(constant_id = 43) const int KO = 0;
layout(constant_id = 44) const int VO = 0;

const int TK = CT * RN;
const int DW = DP / CT;
const int D4 = DP / 4 + 1;  // a row of q or k in vec4s, one of padding against bank conflicts
const int P4 = TK / 4 + 1;  // a row of probabilities in vec4s
shared vec4 Qs[BQ * D4];
shared vec4 KV[TK * D4];  // the tile's k, then its v
shared vec4 Ps[BQ * P4];
shared float red[BQ * CT];

// The most of the tiling's per-invocation sizes (attention.BLOCKS; attention.py keeps the head within MAX_HEAD):
// rows, keys, head columns.
#define MAX_RM 4
#define MAX_RN 8
#define MAX_DW 16
const float LOWEST = -3.4028234663852886e38;

// Element (j, d) of a (rows x DP) operand at base + j * RS + d * CS, zero past `rows` and D, into shared memory
// by `put`. Consecutive invocations take consecutive addresses: along the head where CS is 1, else along the rows.
#define STAGE(buf, base, RS, CS, r0, rows, NR, put) { \
    bool dfast = (CS) == 1 || (RS) != 1; \
    for (int e = tid; e < (NR) * DP; e += NT) { \
        int j = dfast ? e / DP : e % (NR), d = dfast ? e % DP : e / (NR); \
        float val = (r0) + j < (rows) && d < D ? float(buf[(base) + ((r0) + j) * (RS) + d * (CS)]) : 0.0; \
        put; \
    } \
}

void main() {
    int tid = int(gl_LocalInvocationID.x), tr = tid / CT, tc = tid % CT;
    int wg = int(gl_WorkGroupID.x);
    int bh = wg / NQB, q0 = wg % NQB * BQ;
    int h = bh % H, b = bh / H;
    int qoff = QO + b * QB + h * QH, koff = KO + b * KB + h * KH, voff = VO + b * VB + h * VH;
    int ooff = b * OB + h * OH, moff = b * MB + h * MH;

    STAGE(q, qoff, QS, QD, q0, S, BQ, Qs[j * D4 + (d >> 2)][d & 3] = val)
    float m[MAX_RM], l[MAX_RM], acc[MAX_RM][MAX_DW];
    [[unroll]] for (int r = 0; r < MAX_RM; ++r) {
        m[r] = LOWEST;  // as the Softmax op starts: a row of -inf scores sums to 0 and gives NaN
        l[r] = 0.0;
        [[unroll]] for (int c = 0; c < MAX_DW; ++c) acc[r][c] = 0.0;
    }
    for (int t0 = 0; t0 < T; t0 += TK) {
        barrier();  // the last tile's v and probabilities are done with
        STAGE(k, koff, KS, KD, t0, T, TK, KV[j * D4 + (d >> 2)][d & 3] = val)
        barrier();
        float sc[MAX_RM][MAX_RN];
        [[unroll]] for (int r = 0; r < MAX_RM; ++r)
            [[unroll]] for (int j = 0; j < MAX_RN; ++j) sc[r][j] = 0.0;
        for (int c4 = 0; c4 < DP / 4; ++c4) {
            vec4 kv[MAX_RN];
            [[unroll]] for (int j = 0; j < MAX_RN; ++j)
                if (j < RN) kv[j] = KV[(tc + CT * j) * D4 + c4];
            [[unroll]] for (int r = 0; r < MAX_RM; ++r) {
                if (r >= RM) break;
                vec4 qv = Qs[(tr * RM + r) * D4 + c4];
                [[unroll]] for (int j = 0; j < MAX_RN; ++j)
                    if (j < RN) sc[r][j] += dot(qv, kv[j]);
            }
        }
        float mx[MAX_RM];
        [[unroll]] for (int r = 0; r < MAX_RM; ++r) {
            if (r >= RM) break;
            int row = min(q0 + tr * RM + r, S - 1);  // rows past the end compute on zeros, unstored
            mx[r] = m[r];
            [[unroll]] for (int j = 0; j < MAX_RN; ++j) {
                if (j >= RN) break;
                int key = t0 + tc + CT * j;
                float z = sc[r][j];
                if (SCALE_OP == 1) z = div_(z, SCALE);
                if (SCALE_OP == 2) z *= SCALE;
                if (MASK && key < T) z += float(mask[moff + row * MS + key * MT]);
                sc[r][j] = key < T ? z : -INF;
                mx[r] = max(mx[r], sc[r][j]);
            }
            red[(tr * RM + r) * CT + tc] = mx[r];
        }
        barrier();
        float sum[MAX_RM];
        [[unroll]] for (int r = 0; r < MAX_RM; ++r) {
            if (r >= RM) break;
            for (int u = 0; u < CT; ++u) mx[r] = max(mx[r], red[(tr * RM + r) * CT + u]);
            sum[r] = 0.0;
            [[unroll]] for (int j = 0; j < MAX_RN; ++j) {
                if (j >= RN) break;
                float p = exp(sc[r][j] - mx[r]);
                sum[r] += p;
                int key = tc + CT * j;
                Ps[(tr * RM + r) * P4 + (key >> 2)][key & 3] = p;
            }
        }
        STAGE(v, voff, VS, VD, t0, T, TK, KV[j * D4 + (d >> 2)][d & 3] = val)  // the scores have read k
        barrier();  // every invocation has read the maxima
        [[unroll]] for (int r = 0; r < MAX_RM; ++r)
            if (r < RM) red[(tr * RM + r) * CT + tc] = sum[r];
        barrier();
        [[unroll]] for (int r = 0; r < MAX_RM; ++r) {
            if (r >= RM) break;
            float s = 0.0;
            for (int u = 0; u < CT; ++u) s += red[(tr * RM + r) * CT + u];
            float alpha = exp(m[r] - mx[r]);
            m[r] = mx[r];
            l[r] = l[r] * alpha + s;
            [[unroll]] for (int c = 0; c < MAX_DW; ++c) acc[r][c] *= alpha;
        }
        for (int j4 = 0; j4 < TK / 4; ++j4) {
            vec4 pv[MAX_RM];
            [[unroll]] for (int r = 0; r < MAX_RM; ++r)
                if (r < RM) pv[r] = Ps[(tr * RM + r) * P4 + j4];
            [[unroll]] for (int jj = 0; jj < 4; ++jj) {
                float vv[MAX_DW];
                [[unroll]] for (int c = 0; c < MAX_DW; ++c)
                    if (c < DW) vv[c] = KV[(4 * j4 + jj) * D4 + ((tc * DW + c) >> 2)][(tc * DW + c) & 3];
                [[unroll]] for (int r = 0; r < MAX_RM; ++r) {
                    if (r >= RM) break;
                    [[unroll]] for (int c = 0; c < MAX_DW; ++c)
                        if (c < DW) acc[r][c] += pv[r][jj] * vv[c];
                }
            }
        }
    }
    [[unroll]] for (int r = 0; r < MAX_RM; ++r) {
        int row = q0 + tr * RM + r;
        if (r >= RM || row >= S) break;
        float inv = 1.0 / l[r];
        [[unroll]] for (int c = 0; c < MAX_DW; ++c) {
            int col = tc * DW + c;
            if (c < DW && col < D) o[ooff + row * OS + col * OD] = STORE(acc[r][c] * inv);
        }
    }
}
