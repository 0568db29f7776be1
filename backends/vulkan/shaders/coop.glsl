// Shared by matmul_coop.comp and conv_coop.comp (which enable GL_NV_cooperative_matrix, its memory scopes,
// subgroup ids and half-float arithmetic): a TM x TN = 64 x 64 tile on four subgroups of 32, each subgroup a
// 32 x 32 quarter of it in 2 x 2 fragments of 16 x 16 half floats, summed in float32. A step stages TK rows of
// k: A's slice as As[row][k], B's as Bs[k][column]. Row strides are padded by 16 bytes, so that the rows a
// fragment load reads fall in different banks, and every row and fragment starts on a 16-byte boundary.
#define TM 64
#define TN 64
#define TK 32
#define NT 128
#define AS (TK + 8)
#define BS (TN + 8)
#define CS (TN + 4)
shared float16_t As[TM * AS];
shared float16_t Bs[TK * BS];
shared float Cs[TM * CS];  // the tile's sums, [row][column], for the epilogue
#define SUMS fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>
#define HALVES fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>

// This subgroup's quarter of the tile (wm, wn), and its sums set to zero.
#define COOP_BEGIN                                                                                \
    int wm = int(gl_SubgroupID) >> 1, wn = int(gl_SubgroupID) & 1;                              \
    SUMS acc[2][2];                                                                             \
    [[unroll]] for (int i = 0; i < 2; ++i)                                                      \
        [[unroll]] for (int j = 0; j < 2; ++j) acc[i][j] = SUMS(0.0);

// The staged step's products added to the sums.
#define COOP_STEP                                                                                 \
    [[unroll]] for (int kk = 0; kk < TK; kk += 16) {                                            \
        HALVES fa[2], fb[2];                                                                    \
        [[unroll]] for (int i = 0; i < 2; ++i)                                                  \
            coopMatLoadNV(fa[i], As, uint((wm * 32 + i * 16) * AS + kk), uint(AS), false);      \
        [[unroll]] for (int j = 0; j < 2; ++j)                                                  \
            coopMatLoadNV(fb[j], Bs, uint(kk * BS + wn * 32 + j * 16), uint(BS), false);        \
        [[unroll]] for (int i = 0; i < 2; ++i)                                                  \
            [[unroll]] for (int j = 0; j < 2; ++j) acc[i][j] = coopMatMulAddNV(fa[i], fb[j], acc[i][j]); \
    }

// The sums into Cs, for every invocation of the workgroup to read after the barrier.
#define COOP_END                                                                                  \
    [[unroll]] for (int i = 0; i < 2; ++i)                                                      \
        [[unroll]] for (int j = 0; j < 2; ++j)                                                  \
            coopMatStoreNV(acc[i][j], Cs, uint((wm * 32 + i * 16) * CS + wn * 32 + j * 16), uint(CS), false); \
    barrier();
