// A matmul's shapes (ops/matmul.py and ops/conv.py pack them), for matmul.comp, matmul_direct.comp and
// matmul_small.comp: word i of the layer's push constants as specialization constant 16 + i (device.py
// SPECIALIZED), so the driver folds them: divisions and strides become constants, loops fixed counts.
// A's element (m, k) is at a[offA + m*A_RS + k*A_CS], B's (k, n) at b[offB + k*B_RS + n*B_CS]; batch
// dimension d < NB (at most 3) has BSHAPE[d] entries, A and B step SA[d] and SB[d] along it.
layout(constant_id = 16) const int M = 1;
layout(constant_id = 17) const int N = 1;
layout(constant_id = 18) const int K = 1;
layout(constant_id = 19) const int NB = 0;
layout(constant_id = 20) const int BSHAPE0 = 1;
layout(constant_id = 21) const int BSHAPE1 = 1;
layout(constant_id = 22) const int BSHAPE2 = 1;
layout(constant_id = 23) const int SA0 = 0;
layout(constant_id = 24) const int SA1 = 0;
layout(constant_id = 25) const int SA2 = 0;
layout(constant_id = 26) const int SB0 = 0;
layout(constant_id = 27) const int SB1 = 0;
layout(constant_id = 28) const int SB2 = 0;
layout(constant_id = 29) const int A_RS = 0;
layout(constant_id = 30) const int A_CS = 0;
layout(constant_id = 31) const int B_RS = 0;
layout(constant_id = 32) const int B_CS = 0;
layout(constant_id = 33) const int HAS_BIAS = 0;
layout(constant_id = 34) const int C_RS = 0;  // the bias's strides
layout(constant_id = 35) const int C_CS = 0;
layout(constant_id = 36) const float ALPHA = 1.0;
layout(constant_id = 37) const float BETA = 1.0;
layout(constant_id = 38) const float ACT_A = 0.0;  // the fused activation's parameters
layout(constant_id = 39) const float ACT_B = 0.0;

// Where batch entry bz's A and B start. The loop over the batch dimensions has a constant count: unrolled,
// it indexes the arrays with constants, so the driver folds them.
ivec2 batch_offsets(int bz) {
    int shape[3] = int[3](BSHAPE0, BSHAPE1, BSHAPE2), sa[3] = int[3](SA0, SA1, SA2), sb[3] = int[3](SB0, SB1, SB2);
    ivec2 off = ivec2(0);
    for (int d = NB - 1; d >= 0; --d) {
        int c = bz % shape[d];
        bz /= shape[d];
        off += c * ivec2(sa[d], sb[d]);
    }
    return off;
}
