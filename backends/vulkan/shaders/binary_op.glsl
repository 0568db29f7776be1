// Written by tools/build_shaders.py from the binary table (aiomnn/binary.py): edit that, not this.
float binary_op(float x, float y, int op) {
    switch (op) {
    case 0: return (x + y);  // Add
    case 1: return (x - y);  // Sub
    case 2: return (x * y);  // Mul
    case 3: return div_(x, y);  // Div
    case 4: return pow_(x, y);  // Pow
    case 5: return ((isnan(x) || isnan(y)) ? (x + y) : max(x, y));  // Max
    case 6: return ((isnan(x) || isnan(y)) ? (x + y) : min(x, y));  // Min
    case 7: return ((x < 0.0) ? (x * y) : x);  // PRelu
    case 8: return fmod_(x, y);  // Fmod
    case 9: return (x + (x * y));  // Gate
    }
    return x;
}
