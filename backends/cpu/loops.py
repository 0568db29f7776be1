"""The loops numba compiles for the CPU backend (see jit.py, which imports this module off the event loop).

Each is a plain loop over float32 rows that LLVM vectorizes: no call inside a loop body, so no math.exp
or math.erf, and a loop that works in place takes one array (given the same array twice, LLVM's check for
overlap fails and the scalar loop runs, 10x slower) (numba calls the C library's scalar functions for those, 25x slower than a polynomial here).
erf is a rational function of x^2 fitted for this file (max error 3.5e-7 over the line, in float32), exp
a polynomial raised to the 32nd power (relative error about 1e-6 where softmax evaluates it).
"""

from __future__ import annotations

from typing import Any, Callable

import numba
import numpy as np
from numba import types

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
def _erf(v):
    x = min(max(v, F(-4)), F(4))
    t = x * x
    p = ((((((P6 * t + P5) * t + P4) * t + P3) * t + P2) * t + P1) * t + P0)
    q = (((((Q5 * t + Q4) * t + Q3) * t + Q2) * t + Q1) * t + F(1))
    r = min(max(x * p / q, F(-1)), F(1))
    return r if v == v else v  # NaN stays NaN


@numba.njit(inline="always", fastmath=FAST, error_model="numpy")
def _exp_neg(x):
    """exp(x) for x <= 0 (below -88 it underflows to 0 through the squarings, as exp does)."""
    x = max(x, F(-100)) * F(1 / 32)
    e = ((((((E7 * x + E6) * x + E5) * x + E4) * x + E3) * x + E2) * x + F(1)) * x + F(1)
    e = max(e, F(0))
    e = e * e
    e = e * e
    e = e * e
    e = e * e
    return e * e


def erf(x, y):
    for i in range(x.size):
        y[i] = _erf(x[i])


def gelu(y):
    """y = y/2 (1 + erf(y / sqrt 2)), in place."""
    for i in range(y.size):
        v = y[i]
        y[i] = F(0.5) * v * (F(1) + _erf(v * F(0.7071067811865476)))


def softmax(y, scale, mask, group, first):
    """y[r] = softmax(y[r] * scale + mask[(first + r) // group]) over rows of y (R, C), in place; an empty
    mask adds nothing."""
    rows, cols = y.shape
    masked = mask.shape[0] > 0
    for r in range(rows):
        xr = yr = y[r]
        m = NEG_INF
        if masked:
            mr = mask[(first + r) // group]
            for c in range(cols):
                v = xr[c] * scale + mr[c]
                yr[c] = v
                m = max(m, v)
        else:
            for c in range(cols):
                v = xr[c] * scale
                yr[c] = v
                m = max(m, v)
        s = F(0)
        for c in range(cols):
            e = _exp_neg(yr[c] - m)
            yr[c] = e
            s += e
        inv = F(1) / s
        for c in range(cols):
            yr[c] *= inv


def layer_norm(x, residual, gamma, beta, eps, y):
    """y[r] = (z - mean) / sqrt(var + eps) * gamma + beta over rows of z = x (+ residual, when it has rows).
    y must not overlap x or residual."""
    rows, cols = x.shape
    added = residual.shape[0] > 0
    n = F(cols)
    for r in range(rows):
        xr, yr = x[r], y[r]
        s = F(0)
        if added:
            rr = residual[r]
            for c in range(cols):
                v = xr[c] + rr[c]
                yr[c] = v
                s += v
        else:
            for c in range(cols):
                v = xr[c]
                yr[c] = v
                s += v
        mean = s / n
        q = F(0)
        for c in range(cols):
            d = yr[c] - mean
            q += d * d
        inv = F(1) / np.sqrt(q / n + eps)
        for c in range(cols):
            yr[c] = (yr[c] - mean) * inv * gamma[c] + beta[c]


def depthwise(x, w, bias, y, sh, sw, pt, pl, act, first, last):
    """A depthwise 2-D conv over planes [first, last) of x (N*C planes of H x W): plane p of y (Ho x Wo) is
    the conv of plane p with w[p % C] (kh x kw; stride sh x sw, padding pt above and pl left, dilation 1)
    plus bias[p % C], then act (0: none; jit.LOOP_ACTIVATIONS).

    Each plane is first copied between zero columns (its left and right padding), so a kernel tap adds to a
    whole output row with no test in the inner loop, whose indices LLVM can then prove non-negative (numba
    tests every possibly negative index for wrap-around, and that keeps LLVM from vectorizing); kernel rows
    that fall in the top or bottom padding are skipped."""
    C, kh, kw = w.shape
    H, W = x.shape[1], x.shape[2]
    Ho, Wo = y.shape[1], y.shape[2]
    Wp = (Wo - 1) * sw + kw
    inner = max(0, min(W, Wp - pl))
    buf = np.zeros((H, Wp), np.float32)
    for plane in range(first, last):
        c = plane % C
        xp, yp = x[plane], y[plane]
        for r in range(H):
            src, dst = xp[r], buf[r]
            for t in range(inner):
                dst[pl + t] = src[t]
        for oh in range(Ho):
            row = yp[oh]
            b = bias[c]
            for ow in range(Wo):
                row[ow] = b
            for i in range(kh):
                ih = oh * sh - pt + i
                if ih < 0 or ih >= H:
                    continue
                xrow = buf[ih]
                if kw == 3 and sw == 1:  # a kernel row's taps at once: the output row is read and written once
                    w0, w1, w2 = w[c, i, 0], w[c, i, 1], w[c, i, 2]
                    for ow in range(Wo):
                        row[ow] += w0 * xrow[ow] + w1 * xrow[ow + 1] + w2 * xrow[ow + 2]
                elif kw == 5 and sw == 1:
                    w0, w1, w2, w3, w4 = w[c, i, 0], w[c, i, 1], w[c, i, 2], w[c, i, 3], w[c, i, 4]
                    for ow in range(Wo):
                        row[ow] += (w0 * xrow[ow] + w1 * xrow[ow + 1] + w2 * xrow[ow + 2] + w3 * xrow[ow + 3]
                                    + w4 * xrow[ow + 4])
                elif kw == 3 and sw == 2:
                    w0, w1, w2 = w[c, i, 0], w[c, i, 1], w[c, i, 2]
                    for ow in range(Wo):
                        row[ow] += w0 * xrow[2 * ow] + w1 * xrow[2 * ow + 1] + w2 * xrow[2 * ow + 2]
                else:
                    for j in range(kw):
                        wv = w[c, i, j]
                        if sw == 1:
                            for ow in range(Wo):
                                row[ow] += wv * xrow[ow + j]
                        else:
                            for ow in range(Wo):
                                row[ow] += wv * xrow[ow * sw + j]
            if act == 1:
                for ow in range(Wo):
                    row[ow] = max(row[ow], F(0))
            elif act == 2:
                for ow in range(Wo):
                    v = row[ow]
                    row[ow] = v * min(max(v * F(1 / 6) + F(0.5), F(0)), F(1))


_IN = types.Array(types.float32, 1, "C", readonly=True)  # read-only inputs take writable arrays too
_OUT = types.Array(types.float32, 1, "C")
_IN2 = types.Array(types.float32, 2, "C", readonly=True)
_OUT2 = types.Array(types.float32, 2, "C")
_IN3 = types.Array(types.float32, 3, "C", readonly=True)
_OUT3 = types.Array(types.float32, 3, "C")
SIGNATURES: dict[str, tuple[Callable[..., Any], Any]] = {
    "erf": (erf, types.void(_IN, _OUT)),
    "gelu": (gelu, types.void(_OUT)),
    "softmax": (softmax, types.void(_OUT2, types.float32, _IN2, types.int64, types.int64)),
    "layer_norm": (layer_norm, types.void(_IN2, _IN2, _IN, _IN, types.float32, _OUT2)),
    "depthwise": (depthwise, types.void(_IN3, _IN3, _IN, _OUT3, *[types.int64] * 7)),
}


def compile(name: str) -> Callable[..., Any]:  # noqa: A001  (the one entry point, called by jit.py)
    fn, signature = SIGNATURES[name]
    return numba.njit(signature, nogil=True, cache=True, fastmath=FAST, error_model="numpy")(fn)
