/* Shared by every kernel file: the runtime prepends it to each; never built on its own.
 *
 * T is the storage type of float tensors: float, or half when the session runs
 * in fp16 (-DSTORAGE_HALF). Kernels compute in float and go through LD/ST, so
 * one source serves both. Each buffer argument comes with its offset in
 * elements: BUF(type, x) declares both, SHIFT(x) applies the offset.
 */
#ifdef STORAGE_HALF
typedef half T;
#define LD(p, i) vload_half((i), (p))
#define ST(p, i, v) vstore_half((v), (i), (p))
#define LD4(p, i) vload_half4(0, (p) + (i))
#define ST4(p, i, v) vstore_half4((v), 0, (p) + (i))
#else
typedef float T;
#define LD(p, i) ((p)[(i)])
#define ST(p, i, v) ((p)[(i)] = (v))
#define LD4(p, i) vload4(0, (p) + (i))
#define ST4(p, i, v) vstore4((v), 0, (p) + (i))
#endif

#define BUF(type, name) __global type* name, const int name##_o
#define SHIFT(name) name += name##_o

/* ACT (a build option, default none) is the activation a kernel applies, a code of the unary table
 * (aiomnn/unary.py): a constant, so the switch of activate() folds away; the runtime writes activate(), and
 * binary_op() from the binary table (aiomnn/binary.py), after this header (runtime.py). p0 and p1 are its parameters, passed as kernel arguments. */
#ifndef ACT
#define ACT 0
#endif
#define ACTIVATE(v) activate((v), ACT, p0, p1)

inline float sigmoid_(float v) { return 1.0f / (1.0f + exp(-v)); }
inline float softplus_(float v) { return v > 20.0f ? v : log1p(exp(v)); }
inline float div_(float x, float y) { return x / y; }

/* A fused epilogue (-DEPI, ../epilogues.py): up to three steps after a kernel's own bias and activation, each a
 * binary op (code EOPk, none if -1) with a tensor ek, then an activation (code EACTk, parameters eka, ekb). A
 * step's tensor is read at (i0, i1, i2), the output's position in a three-dimensional view of it that each
 * kernel names ((image, channel, pixel) for a conv, (batch, row, column) for a product), through its strides
 * eks0..eks2 (0 where it broadcasts). ESWk puts the tensor first (x - v rather than v - x). The codes are build
 * options, so the switches of binary_op() and activate() fold away and an unused step costs nothing. */
#ifdef EPI
#ifndef EOP0
#define EOP0 -1
#endif
#ifndef EOP1
#define EOP1 -1
#endif
#ifndef EOP2
#define EOP2 -1
#endif
#ifndef EACT0
#define EACT0 0
#endif
#ifndef EACT1
#define EACT1 0
#endif
#ifndef EACT2
#define EACT2 0
#endif
#ifndef ESW0
#define ESW0 0
#endif
#ifndef ESW1
#define ESW1 0
#endif
#ifndef ESW2
#define ESW2 0
#endif
#define EPI_STEP_ARGS(k) , BUF(const T, e##k), const int e##k##s0, const int e##k##s1, const int e##k##s2, \
    const float e##k##a, const float e##k##b
#define EPI_ARGS EPI_STEP_ARGS(0) EPI_STEP_ARGS(1) EPI_STEP_ARGS(2)
#define EPI_SHIFT SHIFT(e0); SHIFT(e1); SHIFT(e2);
#define EPI_STEP(k, v, i0, i1, i2)                                                                  \
    if (EOP##k >= 0) {                                                                              \
        const float t_ = LD(e##k, (i0) * e##k##s0 + (i1) * e##k##s1 + (i2) * e##k##s2);            \
        v = ESW##k ? binary_op(t_, v, EOP##k) : binary_op(v, t_, EOP##k);                           \
    }                                                                                               \
    v = activate(v, EACT##k, e##k##a, e##k##b);
#define EPILOGUE(v, i0, i1, i2) { EPI_STEP(0, v, i0, i1, i2) EPI_STEP(1, v, i0, i1, i2) EPI_STEP(2, v, i0, i1, i2) }
#else
#define EPI_ARGS
#define EPI_SHIFT
#define EPILOGUE(v, i0, i1, i2)
#endif

/* The offsets into a batched product's a and b of batch bi: meta holds the batch dims, then a's and b's strides
   over them (zero along a dim that one of them broadcasts). */
inline int2 batch_offsets(const __global int* meta, const int brank, int bi) {
    int oa = 0, ob = 0;
    for (int d = brank - 1; d >= 0; --d) {
        const int q = bi % meta[d];
        bi /= meta[d];
        oa += q * meta[brank + d];
        ob += q * meta[2 * brank + d];
    }
    return (int2)(oa, ob);
}

/* Work-group reductions in local memory over the group's n work items (n a power of two); every work item gets the
   result, and `part` may take the next reduction at once. */
inline float group_sum(__local float* part, float v, const int n) {
    const int lane = get_local_id(0);
    part[lane] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = n / 2; s > 0; s >>= 1) {
        if (lane < s) part[lane] += part[lane + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float r = part[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}

inline float group_max(__local float* part, float v, const int n) {
    const int lane = get_local_id(0);
    part[lane] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = n / 2; s > 0; s >>= 1) {
        if (lane < s) part[lane] = fmax(part[lane], part[lane + s]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float r = part[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}
