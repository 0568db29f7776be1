// Written by tools/build_shaders.py from the unary table (aiomnn/unary.py): edit that, not this.
float unary_op(float x, int op, float a, float b) {
    switch (op) {
    case 0: return x;  // Identity
    case 1: return ((x < 0.0) ? 0.0 : x);  // Relu
    case 2: return ((x < 0.0) ? (a * x) : x);  // LeakyRelu
    case 3: return ((x < a) ? a : ((x > b) ? b : x));  // Clip
    case 4: return sigmoid_(x);  // Sigmoid
    case 5: return min(max(((a * x) + b), 0.0), 1.0);  // HardSigmoid
    case 6: return (x * min(max(((x * 0.16666666666666666) + 0.5), 0.0), 1.0));  // HardSwish
    case 7: return tanh_(x);  // Tanh
    case 8: return ((0.5 * x) * (1.0 + erf_((x * 0.7071067811865476))));  // Gelu
    case 9: return ((0.5 * x) * (1.0 + tanh_((0.7978845608028654 * (x + (((0.044715 * x) * x) * x))))));  // GeluTanh
    case 10: return sqrt(x);  // Sqrt
    case 11: return exp(x);  // Exp
    case 12: return log(x);  // Log
    case 13: return abs(x);  // Abs
    case 14: return (-x);  // Neg
    case 15: return floor(x);  // Floor
    case 16: return ceil(x);  // Ceil
    case 17: return (1.0 / x);  // Reciprocal
    case 18: return sin(x);  // Sin
    case 19: return cos(x);  // Cos
    case 20: return tan(x);  // Tan
    case 21: return asin(x);  // Asin
    case 22: return acos(x);  // Acos
    case 23: return atan(x);  // Atan
    case 24: return sinh(x);  // Sinh
    case 25: return cosh(x);  // Cosh
    case 26: return asinh(x);  // Asinh
    case 27: return acosh(x);  // Acosh
    case 28: return atanh(x);  // Atanh
    case 29: return erf_(x);  // Erf
    case 30: return ((x > 0.0) ? x : (a * (exp(x) - 1.0)));  // Elu
    case 31: return (b * ((x > 0.0) ? x : (a * (exp(x) - 1.0))));  // Selu
    case 32: return (max(x, 0.0) + min(0.0, (a * (exp((x / a)) - 1.0))));  // Celu
    case 33: return ((x > a) ? x : 0.0);  // ThresholdedRelu
    case 34: return softplus_(x);  // Softplus
    case 35: return (x / (1.0 + abs(x)));  // Softsign
    case 36: return (x * tanh_(softplus_(x)));  // Mish
    case 37: return (x * sigmoid_((a * x)));  // Swish
    case 38: return roundEven(x);  // Round
    case 39: return ((x > 0.0) ? 1.0 : ((x < 0.0) ? (-1.0) : x));  // Sign
    case 40: return ((x * a) + b);  // ScaleShift
    case 41: return ((x * min(max(((x * 0.16666666666666666) + 0.5), 0.0), 1.0)) + b);  // HardSwishShift
    }
    return x;
}
