"""Scalar functions that numba inlines into the compiled loops (loops.py, tiles.py).

No call reaches the C library: numba calls its scalar exp and erf, which keep LLVM from vectorizing the loop
around them. erf is a rational function of x^2 fitted for this file
(max error 3.5e-7 over the line, in float32); exp_neg (softmax's) a polynomial raised to the 32nd power
(relative error about 1e-6 over the range the loops use); exp (the sigmoid's) by range reduction.

numba's disk cache checks only the file of each compiled loop for changes, not the files of what it inlines: after
a change here, tools/make_tiles.py writes a new stamp into the files of the loops (INLINED; a test checks
it), or their cached loops would keep the old code.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

F = np.float32
#: No assumption that values are finite: inf and NaN inputs give what numpy gives.
FAST = {"reassoc", "contract", "nsz", "arcp"}

# erf(x) = x P(x^2) / Q(x^2) for |x| <= 4, clamped to [-1, 1]; beyond 4 erf is 1 to float32 precision.
P0, P1, P2, P3, P4, P5, P6 = (F(1.12837917e+00), F(1.84872543e-01), F(5.38428372e-02), F(3.78018973e-03),
                              F(3.60578215e-04), F(4.18396580e-06), F(-1.05807249e-08))
Q1, Q2, Q3, Q4, Q5 = F(4.97172387e-01), F(1.13440880e-01), F(1.52566643e-02), F(1.26786027e-03), F(5.83646938e-05)
# exp(x) = e(x / 32)^32 with e a Taylor polynomial of degree 7 on [-88/32, 0].
E2, E3, E4, E5, E6, E7 = F(1 / 2), F(1 / 6), F(1 / 24), F(1 / 120), F(1 / 720), F(1 / 5040)
NEG_INF = F(-np.inf)


@numba.njit(inline="always", fastmath=FAST, error_model="numpy")
def erf(v):
    x = min(max(v, F(-4)), F(4))
    t = x * x
    p = ((((((P6 * t + P5) * t + P4) * t + P3) * t + P2) * t + P1) * t + P0)
    q = (((((Q5 * t + Q4) * t + Q3) * t + Q2) * t + Q1) * t + F(1))
    r = min(max(x * p / q, F(-1)), F(1))
    return r if v == v else v  # NaN stays NaN


@numba.njit(inline="always", fastmath=FAST, error_model="numpy")
def exp_neg(x):
    """exp(x) for x <= 0 (below -88 it underflows to 0 through the squarings, as exp does)."""
    x = max(x, F(-100)) * F(1 / 32)
    e = ((((((E7 * x + E6) * x + E5) * x + E4) * x + E3) * x + E2) * x + F(1)) * x + F(1)
    e = max(e, F(0))
    e = e * e
    e = e * e
    e = e * e
    e = e * e
    return e * e


@intrinsic
def _pow2(typingctx, n):
    """2^n as a float32, for an int32 n in [-126, 128] (128 gives inf): n + 127 in the exponent's bits."""

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        bits = builder.shl(builder.add(args[0], ir.Constant(i32, 127)), ir.Constant(i32, 23))
        return builder.bitcast(bits, ir.FloatType())

    return types.float32(types.int32), codegen


LOG2E, LN2_HI, LN2_LO = F(1.4426950408889634), F(0.693359375), F(-2.12194440e-4)


@numba.njit(inline="always", fastmath=FAST, error_model="numpy")
def exp(v):
    """exp(v): v = n ln 2 + r with |r| <= ln 2 / 2, e^r by its Taylor polynomial of degree 7, 2^n in the bits
    (relative error about 5e-7). Below -87.3 it gives e^-87.3, above 88.4 inf."""
    x = min(max(v, F(-87.3)), F(89))
    n = np.floor(x * LOG2E + F(0.5))
    r = x - n * LN2_HI - n * LN2_LO
    p = ((((((E7 * r + E6) * r + E5) * r + E4) * r + E3) * r + E2) * r + F(1)) * r + F(1)
    return p * _pow2(np.int32(n))


@numba.njit(inline="always", fastmath=FAST, error_model="numpy")
def sigmoid(v):
    s = F(1) / (F(1) + exp(-v))  # one division and no select on the sign (benchmarks/RESULTS.md)
    return s if v == v else v  # NaN stays NaN (the clamp in exp would lose it)


@numba.njit(inline="always", fastmath=FAST, error_model="numpy")
def activate(y, lo, hi, act, alpha, beta):
    """A fused activation, in place over y[lo:hi] (indices, not a view: see tiles.py), by its code (jit.loop_activation): 0 none, 1 Relu,
    2 HardSwish, 3 Swish(alpha), 4 Sigmoid, 5 LeakyRelu(alpha), 6 Clip(alpha, beta), 7 HardSigmoid(alpha,
    beta), 8 Gelu; then codes with a Mul and an Add by scalars fused after them: 9 y * alpha + beta, 10 HardSwish
    then * alpha + beta. One loop for each, so that each vectorizes."""
    if act == 1:
        for j in range(lo, hi):
            y[j] = max(y[j], F(0))
    elif act == 2:
        for j in range(lo, hi):
            v = y[j]
            y[j] = v * min(max(v * F(1 / 6) + F(0.5), F(0)), F(1))
    elif act == 3:
        for j in range(lo, hi):
            v = y[j]
            y[j] = v * sigmoid(alpha * v)
    elif act == 4:
        for j in range(lo, hi):
            y[j] = sigmoid(y[j])
    elif act == 5:
        for j in range(lo, hi):
            v = y[j]
            y[j] = v if v >= F(0) else alpha * v
    elif act == 6:
        for j in range(lo, hi):
            y[j] = min(max(y[j], alpha), beta)
    elif act == 7:
        for j in range(lo, hi):
            y[j] = min(max(alpha * y[j] + beta, F(0)), F(1))
    elif act == 8:
        for j in range(lo, hi):
            v = y[j]
            y[j] = F(0.5) * v * (F(1) + erf(v * F(0.7071067811865476)))
    elif act == 9:
        for j in range(lo, hi):
            y[j] = y[j] * alpha + beta
    elif act == 10:
        for j in range(lo, hi):
            v = y[j]
            y[j] = v * min(max(v * F(1 / 6) + F(0.5), F(0)), F(1)) * alpha + beta


@intrinsic
def most(typingctx, a, b):
    """The larger of two float32s by llvm.maxnum (a NaN operand gives the other): a loop that reduces with it
    vectorizes, where numba's max, which tests for NaN first, keeps a running maximum one value at a time (a
    softmax row of 128 took three times as long)."""

    def codegen(context, builder, signature, args):
        f = ir.FloatType()
        fn = builder.module.declare_intrinsic("llvm.maxnum", [f], ir.FunctionType(f, [f, f]))
        return builder.call(fn, args)

    return types.float32(types.float32, types.float32), codegen


@intrinsic
def prefetch(typingctx, array, index):
    """A hint that array's element `index` will be read soon (llvm.prefetch, for reading, into every cache
    level): the dense tile loop streams its weights from memory faster when it asks for them a few KB ahead.
    The index may lie past the array's end (the next panel): a prefetch never faults."""

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        ptr = builder.gep(data, [args[1]])
        if not getattr(ptr.type, "is_opaque", False):  # LLVM with typed pointers names the i8* form
            ptr = builder.bitcast(ptr, ir.IntType(8).as_pointer())
        name = "llvm.prefetch.p0" if getattr(ptr.type, "is_opaque", False) else "llvm.prefetch.p0i8"
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [ptr.type, i32, i32, i32]),
                                            name)
        builder.call(fn, [ptr, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return types.void(array, index), codegen

