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

/* Activations and unary ops, by code (backends/opencl/ops/elementwise.py keeps the same table). */
#define OP_IDENTITY 0
#define OP_RELU 1
#define OP_LEAKY_RELU 2
#define OP_CLIP 3
#define OP_SIGMOID 4
#define OP_HARD_SIGMOID 5
#define OP_HARD_SWISH 6
#define OP_TANH 7
#define OP_GELU 8
#define OP_GELU_TANH 9
#define OP_SQRT 10
#define OP_EXP 11
#define OP_LOG 12
#define OP_ABS 13
#define OP_NEG 14
#define OP_FLOOR 15
#define OP_CEIL 16
#define OP_RECIPROCAL 17
#define OP_SIN 18
#define OP_COS 19
#define OP_ERF 20
#define OP_ELU 21
#define OP_SOFTPLUS 22
#define OP_SOFTSIGN 23
#define OP_ROUND 24
#define OP_SIGN 25
#define OP_SELU 26
#define OP_CELU 27
#define OP_THRESHOLDED_RELU 28
#define OP_MISH 29
#define OP_TAN 30
#define OP_ASIN 31
#define OP_ACOS 32
#define OP_ATAN 33
#define OP_SINH 34
#define OP_COSH 35
#define OP_ASINH 36
#define OP_ACOSH 37
#define OP_ATANH 38
#define OP_SWISH 39

/* ACT (a build option, default none) is the activation a kernel applies: a constant, so
 * the switch below folds away. p0 and p1 are its parameters, passed as kernel arguments. */
#ifndef ACT
#define ACT 0
#endif
#define ACTIVATE(v) activate((v), ACT, p0, p1)

inline float softplus_(float v) { return v > 20.0f ? v : log1p(exp(v)); }

inline float activate(float v, int op, float a, float b) {
    switch (op) {
    case OP_IDENTITY: return v;
    case OP_RELU: return v < 0.0f ? 0.0f : v;
    case OP_LEAKY_RELU: return v < 0.0f ? v * a : v;
    case OP_CLIP: return v < a ? a : (v > b ? b : v);
    case OP_SIGMOID: return 1.0f / (1.0f + exp(-v));
    case OP_HARD_SIGMOID: return fmin(fmax(a * v + b, 0.0f), 1.0f);
    case OP_HARD_SWISH: return v * fmin(fmax(v * (1.0f / 6.0f) + 0.5f, 0.0f), 1.0f);
    case OP_TANH: return tanh(v);
    case OP_GELU: return 0.5f * v * (1.0f + erf(v * 0.70710678118654752f));
    case OP_GELU_TANH: return 0.5f * v * (1.0f + tanh(0.79788456080286536f * (v + 0.044715f * v * v * v)));
    case OP_SQRT: return sqrt(v);
    case OP_EXP: return exp(v);
    case OP_LOG: return log(v);
    case OP_ABS: return fabs(v);
    case OP_NEG: return -v;
    case OP_FLOOR: return floor(v);
    case OP_CEIL: return ceil(v);
    case OP_RECIPROCAL: return 1.0f / v;
    case OP_SIN: return sin(v);
    case OP_COS: return cos(v);
    case OP_ERF: return erf(v);
    case OP_ELU: return v < 0.0f ? a * (exp(v) - 1.0f) : v;
    case OP_SOFTPLUS: return softplus_(v);
    case OP_SOFTSIGN: return v / (1.0f + fabs(v));
    case OP_ROUND: return rint(v);
    case OP_SIGN: return v > 0.0f ? 1.0f : (v < 0.0f ? -1.0f : v);
    case OP_SELU: return v > 0.0f ? b * v : b * (a * exp(v) - a);
    case OP_CELU: return fmax(0.0f, v) + fmin(0.0f, a * (exp(v / a) - 1.0f));
    case OP_THRESHOLDED_RELU: return v > a ? v : 0.0f;
    case OP_MISH: return v * tanh(softplus_(v));
    case OP_TAN: return tan(v);
    case OP_ASIN: return asin(v);
    case OP_ACOS: return acos(v);
    case OP_ATAN: return atan(v);
    case OP_SINH: return sinh(v);
    case OP_COSH: return cosh(v);
    case OP_ASINH: return asinh(v);
    case OP_ACOSH: return acosh(v);
    case OP_ATANH: return atanh(v);
    case OP_SWISH: return v / (1.0f + exp(-a * v));
    }
    return v;
}
