// Shared by every aiomnn Vulkan shader. Storage is float, or float16_t when
// built with -DFP16 (arithmetic stays in float32 either way); STORE4 is its four-vector.
#ifdef FP16
#extension GL_EXT_shader_16bit_storage : require
#define STORE float16_t
#define STORE4 f16vec4
#else
#define STORE float
#define STORE4 vec4
#endif

#define INF uintBitsToFloat(0x7f800000u)
#define NAN_ uintBitsToFloat(0x7fc00000u)

// erf to about 1e-7: a Maclaurin series below 0.5, else 1 - erfc with a Chebyshev fit.
float erf_(float x) {
    float a = abs(x);
    if (a < 0.5) {
        float z = a * a;
        float p = -1.0 / 1320.0 * 1.1283791670955126;  // n = 5 term of 2/sqrt(pi) (-1)^n / (n! (2n+1))
        p = p * z + 1.0 / 216.0 * 1.1283791670955126;
        p = p * z - 1.0 / 42.0 * 1.1283791670955126;
        p = p * z + 1.0 / 10.0 * 1.1283791670955126;
        p = p * z - 1.0 / 3.0 * 1.1283791670955126;
        p = p * z + 1.1283791670955126;
        return x * p;
    }
    float t = 1.0 / (1.0 + 0.5 * a);
    float q = 0.17087277;
    q = q * t - 0.82215223;
    q = q * t + 1.48851587;
    q = q * t - 1.13520398;
    q = q * t + 0.27886807;
    q = q * t - 0.18628806;
    q = q * t + 0.09678418;
    q = q * t + 0.37409196;
    q = q * t + 1.00002368;
    q = q * t - 1.26551223;
    float r = 1.0 - t * exp(q - a * a);
    return x < 0.0 ? -r : r;
}

float tanh_(float x) {
    float a = abs(x);
    float r;
    if (a < 0.0625) {
        float z = a * a;
        r = a * (1.0 + z * (-1.0 / 3.0 + z * (2.0 / 15.0 - z * 17.0 / 315.0)));
    } else {
        float e = exp(-2.0 * a);
        r = (1.0 - e) / (1.0 + e);
    }
    return x < 0.0 ? -r : r;
}

float sigmoid_(float x) {
    return 1.0 / (1.0 + exp(-x));
}

// log(1 + u) for u >= 0 to a few ulp. Near 1, Vulkan's log is only good to 2^-21 absolute (NVIDIA's
// is no better), so a small u takes the series instead: to u^8, off by under 1e-9 relative at u = 0.1.
float log1p_(float u) {
    if (u >= 0.1) return log(1.0 + u);
    return u * (1.0 - u * (1.0 / 2.0 - u * (1.0 / 3.0 - u * (1.0 / 4.0 - u * (1.0 / 5.0 - u * (1.0 / 6.0
           - u * (1.0 / 7.0 - u / 8.0)))))));
}

float softplus_(float x) {
    return max(x, 0.0) + log1p_(exp(-abs(x)));
}

// x / y correctly rounded in nearly every case: Vulkan lets a plain division be 2.5 ulp off
// (NVIDIA's is), which moves values across Round's and Floor's boundaries.
float div_(float x, float y) {
    precise float q = x / y;
    if (isinf(q) || isnan(q) || q == 0.0) return q;
    precise float r = fma(-q, y, x);
    return q + r / y;
}

// unary_op(x, code, a, b): the unary table's ops and fused activations by their codes, written from the table
// (aiomnn/unary.py) by tools/build_shaders.py.
#include "unary_op.glsl"

// pow as ONNX means it: a negative base with an integral exponent keeps its sign.
float pow_(float x, float y) {
    if (y == 0.0) return 1.0;
    if (y == 1.0) return x;
    if (y == 2.0) return x * x;
    if (y == 0.5) return sqrt(x);
    if (x >= 0.0) return pow(x, y);
    if (floor(y) != y) return NAN_;
    float r = pow(-x, y);
    return mod(y, 2.0) == 1.0 ? -r : r;
}

// x - y * trunc(x / y): ONNX's Mod with fmod=1 (GLSL's mod rounds down instead).
float fmod_(float x, float y) {
    return x - y * trunc(x / y);
}

// binary_op(x, y, code): the binary table's ops by their codes, written from the table (aiomnn/binary.py) by
// tools/build_shaders.py.
#include "binary_op.glsl"
