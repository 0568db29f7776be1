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
