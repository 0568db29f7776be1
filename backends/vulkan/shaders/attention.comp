#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"
// Scaled dot-product attention, o = softmax(scale(q k^T) + mask) v, one workgroup per (batch entry, head,
// block of BQ query rows) (attention.py plans it). The block's scores against all T keys stay in shared memory:
// K goes through shared memory a tile of TK keys at a time and each invocation scores one key against several
// query rows; the rows' softmax (max subtracted) reduces through shared memory, NT / BQ invocations a row; then
// V goes through the same tiles and each invocation sums one 4-wide piece of the output of several rows. The
// output is divided by the row's sum at the end.
//
// Every operand is read through strides (b, h, row, column), so a Transpose of q, k or v before it, or of the
// output after it, is a stride here; the mask's strides are 0 where it is broadcast. Storage is STORE (float or
// float16_t); shared memory and arithmetic are float32. The head size D is padded with zeros to 4 * D4P in shared
// memory, D4P a power of two (so its vec4 columns divide the workgroup).
#define NT 128
layout(local_size_x = NT, local_size_y = 1, local_size_z = 1) in;
layout(std430, set = 0, binding = 0) writeonly buffer O { STORE o[]; };
layout(std430, set = 0, binding = 1) readonly buffer Q { STORE q[]; };
layout(std430, set = 0, binding = 2) readonly buffer K { STORE k[]; };
layout(std430, set = 0, binding = 3) readonly buffer V { STORE v[]; };
layout(std430, set = 0, binding = 4) readonly buffer Mask { STORE mask[]; };
layout(constant_id = 3) const int BQ = 16;        // query rows a workgroup: 4, 8 or 16
layout(constant_id = 4) const int TK = 64;        // keys a tile: 32 or 64
layout(constant_id = 5) const int D4P = 8;        // vec4 columns of the padded head, a power of two up to 32
layout(constant_id = 6) const int SCALE_OP = 0;   // 0: none; 1: scores / SCALE; 2: scores * SCALE
layout(constant_id = 7) const bool MASK = false;
// The layer's shapes and strides: constants of its own pipeline (a SPECIALIZED kernel). T_PAD is T rounded up
// to whole tiles, plus one: a row's stride in Ss, so rows read together fall in different banks.
layout(constant_id = 16) const int H = 1;
layout(constant_id = 17) const int S = 1;
layout(constant_id = 18) const int T = 1;
layout(constant_id = 19) const int D = 1;
layout(constant_id = 20) const int NQB = 1;       // query blocks per head: ceil(S / BQ)
layout(constant_id = 21) const int T_PAD = 1;
layout(constant_id = 22) const int QB = 0;
layout(constant_id = 23) const int QH = 0;
layout(constant_id = 24) const int QS = 0;
layout(constant_id = 25) const int QD = 0;
layout(constant_id = 26) const int KB = 0;
layout(constant_id = 27) const int KH = 0;
layout(constant_id = 28) const int KS = 0;        // along the keys
layout(constant_id = 29) const int KD = 0;        // along the head
layout(constant_id = 30) const int VB = 0;
layout(constant_id = 31) const int VH = 0;
layout(constant_id = 32) const int VS = 0;
layout(constant_id = 33) const int VD = 0;
layout(constant_id = 34) const int OB = 0;
layout(constant_id = 35) const int OH = 0;
layout(constant_id = 36) const int OS = 0;
layout(constant_id = 37) const int OD = 0;
layout(constant_id = 38) const int MB = 0;
layout(constant_id = 39) const int MH = 0;
layout(constant_id = 40) const int MS = 0;
layout(constant_id = 41) const int MT = 0;
layout(constant_id = 42) const float SCALE = 1.0;
layout(constant_id = 43) const int QO = 0;        // where q, k and v start in their buffers (a Slice's offset)
layout(constant_id = 44) const int KO = 0;
layout(constant_id = 45) const int VO = 0;

const int DP = 4 * D4P;
const int KVROW = D4P + 1;  // a tile row's stride in vec4s: consecutive keys fall in different banks
shared vec4 Qs[BQ * D4P];
shared vec4 KV[TK * KVROW];
shared float Ss[BQ * T_PAD];
shared float red[2 * NT];
shared float total[BQ];

// The per-invocation work (attention.py keeps each within these): scores a tile (BQ * TK / NT), outputs
// (BQ * D4P / NT vec4s).
#define MAX_SC 8
#define MAX_OC 4
const int SC = BQ * TK / NT;
const int RP = NT / D4P;                   // rows one pass over the outputs covers
const int OC = (BQ + RP - 1) / RP;

// Stage rows [r0, r0 + TK) of a (T x D) operand (k or v: element (j, d) at base + j * RS + d * CS) into KV,
// zeros past T and D. Consecutive invocations take consecutive addresses: along the head where CS is 1, else
// along the keys.
#define STAGE(buf, base, RS, CS, r0) { \
    [[unroll]] for (int u = 0; u < (TK * DP + NT - 1) / NT; ++u) { \
        int e = tid + u * NT; \
        if (e >= TK * DP) break; \
        bool dfast = CS == 1 || RS != 1; \
        int j = dfast ? e / DP : e % TK, d = dfast ? e % DP : e / TK; \
        bool in_ = (r0) + j < T && d < D; \
        KV[j * KVROW + (d >> 2)][d & 3] = in_ ? float(buf[(base) + ((r0) + j) * (RS) + d * (CS)]) : 0.0; \
    } \
}

void main() {
    int tid = int(gl_LocalInvocationID.x);
    int wg = int(gl_WorkGroupID.x);
    int qb = wg % NQB, bh = wg / NQB;
    int h = bh % H, b = bh / H;
    int q0 = qb * BQ;
    int qoff = QO + b * QB + h * QH, koff = KO + b * KB + h * KH, voff = VO + b * VB + h * VH;
    int ooff = b * OB + h * OH, moff = b * MB + h * MH;

    [[unroll]] for (int u = 0; u < (BQ * DP + NT - 1) / NT; ++u) {
        int e = tid + u * NT;
        if (e >= BQ * DP) break;
        bool dfast = QD == 1 || QS != 1;
        int i = dfast ? e / DP : e % BQ, d = dfast ? e % DP : e / BQ;
        Qs[i * D4P + (d >> 2)][d & 3] = (q0 + i < S && d < D) ? float(q[qoff + (q0 + i) * QS + d * QD]) : 0.0;
    }

    // Scores: this invocation's key j of each tile, against rows i0, i0 + NT / TK, ...
    int j = tid % TK, i0 = tid / TK;
    for (int k0 = 0; k0 < T; k0 += TK) {
        barrier();
        STAGE(k, koff, KS, KD, k0);
        barrier();
        float acc[MAX_SC];
        [[unroll]] for (int c = 0; c < MAX_SC; ++c) acc[c] = 0.0;
        [[unroll]] for (int d4 = 0; d4 < D4P; ++d4) {
            vec4 kv = KV[j * KVROW + d4];
            [[unroll]] for (int c = 0; c < MAX_SC; ++c)
                if (c < SC) acc[c] += dot(Qs[(i0 + c * (NT / TK)) * D4P + d4], kv);
        }
        if (k0 + j < T) {
            [[unroll]] for (int c = 0; c < MAX_SC; ++c) {
                if (c >= SC) break;
                int i = i0 + c * (NT / TK);
                float s = acc[c];
                if (SCALE_OP == 1) s = div_(s, SCALE);
                if (SCALE_OP == 2) s *= SCALE;
                if (MASK && q0 + i < S) s += float(mask[moff + (q0 + i) * MS + (k0 + j) * MT]);
                Ss[i * T_PAD + k0 + j] = s;
            }
        }
    }
    barrier();

    // Softmax of each row, L invocations a row: the max, then exp(s - max) in place and its sum. A row of -inf
    // (all masked) gives NaN, as the Softmax op does.
    const int L = NT / BQ;
    int row = tid / L, lane = tid % L;
    float m = -INF;
    for (int t = lane; t < T; t += L) m = max(m, Ss[row * T_PAD + t]);
    red[tid] = m;
    barrier();
    m = -INF;
    [[unroll]] for (int l = 0; l < L; ++l) m = max(m, red[row * L + l]);
    float sum = 0.0;
    for (int t = lane; t < T; t += L) {
        float e = exp(Ss[row * T_PAD + t] - m);
        Ss[row * T_PAD + t] = e;
        sum += e;
    }
    red[NT + tid] = sum;
    barrier();
    if (lane == 0) {
        sum = 0.0;
        [[unroll]] for (int l = 0; l < L; ++l) sum += red[NT + row * L + l];
        total[row] = sum;
    }

    // o = p v: this invocation's vec4 column d4 of rows r0, r0 + RP, ...
    int d4 = tid % D4P, r0 = tid / D4P;
    vec4 out_[MAX_OC];
    [[unroll]] for (int c = 0; c < MAX_OC; ++c) out_[c] = vec4(0.0);
    for (int k0 = 0; k0 < T; k0 += TK) {
        barrier();
        STAGE(v, voff, VS, VD, k0);
        barrier();
        int n = min(TK, T - k0);
        for (int t = 0; t < n; ++t) {
            vec4 vv = KV[t * KVROW + d4];
            [[unroll]] for (int c = 0; c < MAX_OC; ++c)
                if (c < OC && r0 + c * RP < BQ) out_[c] += Ss[(r0 + c * RP) * T_PAD + k0 + t] * vv;
        }
    }
    barrier();
    [[unroll]] for (int c = 0; c < MAX_OC; ++c) {
        int i = r0 + c * RP;
        if (c >= OC || i >= BQ || q0 + i >= S) break;
        float s = total[i];
        [[unroll]] for (int r = 0; r < 4; ++r) {
            int d = 4 * d4 + r;
            if (d < D) o[ooff + (q0 + i) * OS + d * OD] = STORE(out_[c][r] / s);
        }
    }
}
