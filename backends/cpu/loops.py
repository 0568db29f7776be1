"""The loops numba compiles for the CPU backend (see jit.py, which imports this module off the event loop).

Each is a plain loop over float32 rows that LLVM vectorizes: no call inside a loop body (exp and erf are
scalars.py's polynomials), and a loop that works in place takes one array (given the same array twice,
LLVM's check for overlap fails and the scalar loop runs instead). A loop over a piece's share of a flat array
runs over unsigned bounds: from a signed start numba's check for negative indices stays in the loop and LLVM
loads each value alone (benchmarks/RESULTS.md, session 42). Those over rows and products are here; those
over image planes in planes.py (the conv tile loop's input layout among them); the tile loops in tiles.py, whose
sums are generated. This module compiles them all (compile).
"""

from __future__ import annotations

from typing import Any, Callable

from . import vectors

vectors.wide()  # before numba loads: it fixes the vector width numba compiles for (vectors.py)

import numba  # noqa: E402
import numpy as np  # noqa: E402
from llvmlite import ir  # noqa: E402
from numba import types  # noqa: E402
from numba.extending import intrinsic  # noqa: E402

from . import crew, planes, pooled, scalars, tiles  # noqa: E402
from .fields import array1, array2, array3, array4, f32, fields, i64, share  # noqa: E402
from .scalars import FAST, NEG_INF, exp_neg, most  # noqa: E402

F = np.float32
#: The SHA-256 of the modules whose functions the loops here inline (make_tiles.INLINED: scalars.py, fields.py,
#: atomics.py): numba's disk cache checks only this file for changes, so a change there comes with a new stamp here
#: (tools/make_tiles.py writes it).
INLINED = "3b2a267be929e2d6acd0c87283c3fff5366ce7c8c17d34523e6f0fd3e02201b2"


def erf(args, c):
    """y = erf(x) elementwise: fields x, y (flat)."""
    a = fields(args, 2)
    x, y = array1(a, 0, F), array1(a, 1, F)
    lo, hi = share(a, c, x.shape[0])
    for i in range(np.uint64(lo), np.uint64(hi)):
        y[i] = scalars.erf(x[i])


@intrinsic
def _half_bits(typingctx, x):
    """The bits of float32 x rounded to the nearest half float, ties to even: LLVM's fptrunc, which x86 with F16C
    does in vectors of 8 or 16 (numba has no float16 type of its own)."""
    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))

    return types.uint16(types.float32), codegen


def half(args, c):
    """y = x as half floats, their bits: fields x (float32, flat), y (uint16, flat). What a GPU backend storing
    half floats writes as a run's input (numpy's own float16 cast takes a value at a time)."""
    a = fields(args, 2)
    x, y = array1(a, 0, F), array1(a, 1, np.uint16)
    lo, hi = share(a, c, x.shape[0])
    for i in range(np.uint64(lo), np.uint64(hi)):
        y[i] = _half_bits(x[i])


@intrinsic
def _float_of_half(typingctx, bits):
    """The float32 value of a half float's bits: LLVM's fpext, in vectors where x86 has F16C."""
    if bits != types.uint16:
        return None

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return types.float32(types.uint16), codegen


def widen(args, c):
    """y = x as float32: fields x (half floats' bits, uint16, flat), y (float32, flat). A GPU backend's output
    stored in half floats, as the caller's float32 array (numpy's own cast takes a value at a time)."""
    a = fields(args, 2)
    x, y = array1(a, 0, np.uint16), array1(a, 1, F)
    lo, hi = share(a, c, x.shape[0])
    for i in range(np.uint64(lo), np.uint64(hi)):
        y[i] = _float_of_half(x[i])


def activation(args, c):
    """y = act(y) in place, a fused activation's code (scalars.activate, with alpha and beta): the unary ops that
    have one, on float32. Fields y (flat), act, alpha, beta."""
    a = fields(args, 4)
    y, act, alpha, beta = array1(a, 0, F), i64(a, 1), f32(a, 2), f32(a, 3)
    lo, hi = share(a, c, y.shape[0])
    scalars.activate(y, np.uint64(lo), np.uint64(hi), act, alpha, beta)


def binary(args, c):
    """y = act(x op z) elementwise over float32 arrays of one shape (op 0 adds, 1 subtracts, 2 multiplies), then a
    fused activation's code (scalars.activate, with alpha and beta); y may be x or z. Fields x, z, y (flat), op,
    act, alpha, beta."""
    a = fields(args, 7)
    x, z, y, op = array1(a, 0, F), array1(a, 1, F), array1(a, 2, F), i64(a, 3)
    lo, hi = share(a, c, y.shape[0])
    lo, hi = np.uint64(lo), np.uint64(hi)
    if op == 0:
        for i in range(lo, hi):
            y[i] = x[i] + z[i]
    elif op == 1:
        for i in range(lo, hi):
            y[i] = x[i] - z[i]
    else:
        for i in range(lo, hi):
            y[i] = x[i] * z[i]
    scalars.activate(y, lo, hi, i64(a, 4), f32(a, 5), f32(a, 6))


def gelu(args, c):
    """y = y/2 (1 + erf(y / sqrt 2)), in place: field y (flat)."""
    a = fields(args, 1)
    y = array1(a, 0, F)
    lo, hi = share(a, c, y.shape[0])
    for i in range(np.uint64(lo), np.uint64(hi)):
        v = y[i]
        y[i] = F(0.5) * v * (F(1) + scalars.erf(v * F(0.7071067811865476)))


def softmax(args, c):
    """y[r] = softmax(y[r] * scale + mask[(first + r) // group]) over rows of y (R, C), in place; an empty
    mask adds nothing. Fields y, scale, mask, group, first."""
    a = fields(args, 5)
    y, scale, mask, group, first = array2(a, 0, F), f32(a, 1), array2(a, 2, F), i64(a, 3), i64(a, 4)
    masked = mask.shape[0] > 0
    for r in range(*share(a, c, y.shape[0])):
        _softmax_row(y[r], scale, mask[(first + r) // group] if masked else mask[0:0].reshape(-1), masked)


def softmax_axis(args, c):
    """y = softmax(x) over axis 1 of x and y (O, N, I), in blocks of `width` columns of the last axis (O *
    ceil(I / width) blocks in all; sums holds a row of `width` for each): the reduction runs along rows of the
    block, so that every pass vectorizes over its columns. y[o, 0] holds the block's maxima until its own exps
    are taken, last. Fields x, y, sums, width."""
    a = fields(args, 4)
    x, y, sums, width = array3(a, 0, F), array3(a, 1, F), array2(a, 2, F), i64(a, 3)
    O, N, I = x.shape
    per = (I + width - 1) // width
    for b in range(*share(a, c, O * per)):
        o, c0 = b // per, (b % per) * width
        n = min(I, c0 + width) - c0
        xo, yo, s = x[o], y[o], sums[b]
        top = yo[0, c0:c0 + n]
        row = xo[0, c0:c0 + n]
        for i in range(n):
            top[i] = row[i]
        for k in range(1, N):
            row = xo[k, c0:c0 + n]
            for i in range(n):
                top[i] = max(top[i], row[i])
        for i in range(n):
            s[i] = F(0)
        for k in range(N - 1, -1, -1):  # row 0 last: it holds the maxima
            row, out = xo[k, c0:c0 + n], yo[k, c0:c0 + n]
            for i in range(n):
                e = exp_neg(row[i] - top[i])
                out[i] = e
                s[i] += e
        for i in range(n):
            s[i] = F(1) / s[i]
        for k in range(N):
            out = yo[k, c0:c0 + n]
            for i in range(n):
                out[i] *= s[i]


@numba.njit(inline="always", fastmath=FAST, error_model="numpy")
def _softmax_row(yr, scale, mr, masked):
    cols = yr.shape[0]
    if masked:
        for c in range(cols):
            yr[c] = yr[c] * scale + mr[c]
    else:
        for c in range(cols):
            yr[c] = yr[c] * scale
    m = NEG_INF
    for c in range(cols):  # apart from the pass above: with its stores, the reduction did not vectorize
        m = most(m, yr[c])
    s = F(0)
    for c in range(cols):
        e = exp_neg(yr[c] - m)
        yr[c] = e
        s += e
    inv = F(1) / s
    for c in range(cols):
        yr[c] *= inv


def attention(args, c):
    """out[i, j] = softmax(q[i, j] @ k[i, j] * scale + mask[i]) @ v[i, j] for q (b, h, s, d), k (b, h, d, t),
    v (b, h, t, e), mask (b or 1, t) or empty; the heads of the batch items shared by the pieces: both products
    are calls of numpy's BLAS, and the head's scores, made, normalized and read in one piece, stay in its cache.
    With heads_in, q, k and v come as the [b, s, h, d], [b, t, h, d] and [b, t, h, e] arrays of each head's rows
    side by side (heads.py), k's read transposed; with heads_out, out is [b, s, h, e] likewise. Fields q, k, v,
    scale, mask, out, heads_in, heads_out."""
    a = fields(args, 8)
    q, k, v, scale, mask, out = array4(a, 0, F), array4(a, 1, F), array4(a, 2, F), f32(a, 3), array2(a, 4, F), array4(a, 5, F)
    heads_in, heads_out = i64(a, 6) != 0, i64(a, 7) != 0
    if heads_in:
        b, s, h, d = q.shape
        t = k.shape[1]
    else:
        b, h, s, d = q.shape
        t = k.shape[3]
    e = v.shape[3]
    masked = mask.shape[0] > 0
    # Each head's rows lie their leading dimension apart: all heads' widths in the heads' layout, one's else.
    lq, lk, lv = (h * d, h * d, h * e) if heads_in else (d, t, e)
    lo = h * e if heads_out else e
    scores = np.empty((s, t), np.float32)
    for piece in range(*share(a, c, b * h)):
        i, j = piece // h, piece % h
        if heads_in:
            pq, pk, pv = q[i, 0, j].ctypes.data, k[i, 0, j].ctypes.data, v[i, 0, j].ctypes.data
        else:
            pq, pk, pv = q[i, j].ctypes.data, k[i, j].ctypes.data, v[i, j].ctypes.data
        po = out[i, 0, j].ctypes.data if heads_out else out[i, j].ctypes.data
        _sgemm(_ROW_MAJOR, _NO_TRANSPOSE, _TRANSPOSE if heads_in else _NO_TRANSPOSE, s, t, d, F(1), np.int64(pq),
               lq, np.int64(pk), lk, F(0), np.int64(scores.ctypes.data), t)
        mr = mask[i if mask.shape[0] > 1 else 0] if masked else mask[0:0].reshape(-1)
        for r in range(s):
            _softmax_row(scores[r], scale, mr, masked)
        _sgemm(_ROW_MAJOR, _NO_TRANSPOSE, _NO_TRANSPOSE, s, e, t, F(1), np.int64(scores.ctypes.data), t,
               np.int64(pv), lv, F(0), np.int64(po), lo)
    # A use of scores by name after BLAS has read it through its address: numba frees an array after its last use
    # by name, which would otherwise come before the products.
    scores[0, 0] = F(0)


def layer_norm(args, c):
    """y[r] = (z - mean) / sqrt(var + eps) * gamma + beta over rows of z = x (+ residual, when it has rows; row r
    adds residual's row r modulo its rows: a residual broadcast over x's leading dims, as a position embedding
    over a batch). y must not overlap x or residual. Fields x, residual, gamma, beta, eps, y."""
    a = fields(args, 6)
    x, residual, gamma, beta, eps, y = array2(a, 0, F), array2(a, 1, F), array1(a, 2, F), array1(a, 3, F), f32(a, 4), array2(a, 5, F)
    rows, cols = x.shape
    added = residual.shape[0] > 0
    n = F(cols)
    for r in range(*share(a, c, rows)):
        xr, yr = x[r], y[r]
        s = F(0)
        if added:
            rr = residual[r % residual.shape[0]]
            for i in range(cols):
                v = xr[i] + rr[i]
                yr[i] = v
                s += v
        else:
            for i in range(cols):
                v = xr[i]
                yr[i] = v
                s += v
        mean = s / n
        q = F(0)
        for i in range(cols):
            d = yr[i] - mean
            q += d * d
        inv = F(1) / np.sqrt(q / n + eps)
        for i in range(cols):
            yr[i] = (yr[i] - mean) * inv * gamma[i] + beta[i]


#: numpy's cblas_sgemm, whose address compile() gives LLVM under this name before it compiles or loads gemm:
#: the machine code refers to the name, so numba's disk cache keeps it from one process to the next.
_SGEMM = "aiomnn_cblas_sgemm"
_I8 = types.int64  # pointers, and the integers, which cblas takes as 64 or 32 bits (blas.sgemm_address)
_sgemm = types.ExternalFunction(_SGEMM, types.void(*[_I8] * 6, types.float32, *[_I8] * 4, types.float32, _I8, _I8))
_ROW_MAJOR, _NO_TRANSPOSE, _TRANSPOSE = 101, 111, 112


def gemm(args, c):
    """out[i] = act(a[i % A] @ b[i] + bias) for a (A, m, k), A being 1 (weights that every image shares) or one
    matrix an image, and each b[i] (k, n) into out[i] (m, n), with bias a column (one value a row of the product)
    when per_row, else a row, or empty; in row_pieces x col_pieces parts of each product, which the pieces share.
    Each part is one call of numpy's BLAS, then its bias and activation while it is in cache: parts of columns
    read only their own columns of b (a layer's weights, at few rows, where its time goes in reading them).
    Fields a, b, bias, out, per_row, act, alpha, beta, row_pieces, col_pieces."""
    f = fields(args, 10)
    a, b, bias, out = array3(f, 0, F), array3(f, 1, F), array1(f, 2, F), array3(f, 3, F)
    per_row, act, alpha, beta = i64(f, 4) != 0, i64(f, 5), f32(f, 6), f32(f, 7)
    row_pieces, col_pieces = i64(f, 8), i64(f, 9)
    A, m, k = a.shape
    images, _, n = b.shape
    width = ((n + col_pieces - 1) // col_pieces + 15) // 16 * 16  # whole vectors
    cols = (n + width - 1) // width
    pa, pb, po = np.int64(a.ctypes.data), np.int64(b.ctypes.data), np.int64(out.ctypes.data)
    biased = bias.shape[0] > 0
    for part in range(*share(f, c, images * row_pieces * cols)):
        i = part // (row_pieces * cols)
        r = part // cols % row_pieces
        c0 = part % cols * width
        c1 = min(n, c0 + width)
        r0, r1 = r * m // row_pieces, (r + 1) * m // row_pieces
        if r0 == r1:
            continue
        _sgemm(_ROW_MAJOR, _NO_TRANSPOSE, _NO_TRANSPOSE, r1 - r0, c1 - c0, k, F(1), pa + 4 * ((i % A) * m + r0) * k, k,
               pb + 4 * (i * k * n + c0), n, F(0), po + 4 * ((i * m + r0) * n + c0), n)
        for row in range(r0, r1):
            y = out[i, row, c0:c1]
            if biased and per_row:
                v = bias[row]
                for j in range(c1 - c0):
                    y[j] += v
            elif biased:
                bc = bias[c0:c1]
                for j in range(c1 - c0):
                    y[j] += bc[j]
            scalars.activate(y, 0, c1 - c0, act, alpha, beta)


def squeeze_excite(args, c):
    """A squeeze-and-excitation for x (N, C, L): per image, s = act2(w2 @ act1(w1 @ mean(x) + b1) + b2), a value
    a channel; then out = act(wp @ (x * s) + bp) by a product of numpy's BLAS with wp's columns scaled by s (a 1x1
    conv after the block; empty wp and bp where it has none: out = x * s). The pieces share (image, part) pairs,
    `parts` runs of whole vectors of each image's columns; each recomputes its image's s (C x L additions, 1 / CO
    of its product). An empty b1, b2 or bp adds nothing; each activation is a loop code with its two values.
    Fields x, w1, b1, act1, alpha1, beta1, w2, b2, act2, alpha2, beta2, wp, bp, act, alpha, beta, out, parts,
    scratch (a row a piece: C values of s, C1 of the hidden layer, and CO x C scaled weights)."""
    f = fields(args, 19)
    x, w1, b1, w2, b2, wp, bp = (array3(f, 0, F), array2(f, 1, F), array1(f, 2, F), array2(f, 6, F),
                                 array1(f, 7, F), array2(f, 11, F), array1(f, 12, F))
    out, parts, scratch = array3(f, 16, F), i64(f, 17), array2(f, 18, F)[c]
    N, C, L = x.shape
    C1, CO = w1.shape[0], wp.shape[0]
    sv, h, ws = scratch[:C], scratch[C:C + C1], scratch[C + C1:C + C1 + CO * C]
    width = ((L + parts - 1) // parts + 15) // 16 * 16
    inv = F(1) / F(L)
    for item in range(*share(f, c, N * parts)):
        n, part = item // parts, item % parts
        c0 = min(L, part * width)
        c1 = min(L, c0 + width)
        if c0 == c1:
            continue
        xn = x[n]
        for ch in range(C):
            acc = F(0)
            row = xn[ch]
            for p in range(L):
                acc += row[p]
            sv[ch] = acc * inv
        _layer(w1, b1, sv, h, i64(f, 3), f32(f, 4), f32(f, 5))
        _layer(w2, b2, h, sv, i64(f, 8), f32(f, 9), f32(f, 10))
        if CO == 0:
            for ch in range(C):
                v, xr, yr = sv[ch], xn[ch], out[n, ch]
                for p in range(np.uint64(c0), np.uint64(c1)):
                    yr[p] = xr[p] * v
            continue
        for o in range(CO):
            for ch in range(C):
                ws[o * C + ch] = wp[o, ch] * sv[ch]
        _sgemm(_ROW_MAJOR, _NO_TRANSPOSE, _NO_TRANSPOSE, CO, c1 - c0, C, F(1), np.int64(ws.ctypes.data), C,
               np.int64(xn.ctypes.data) + 4 * c0, L, F(0), np.int64(out[n].ctypes.data) + 4 * c0, L)
        for o in range(CO):
            y = out[n, o, c0:c1]
            if bp.shape[0] > 0:
                v = bp[o]
                for p in range(c1 - c0):
                    y[p] += v
            scalars.activate(y, 0, c1 - c0, i64(f, 13), f32(f, 14), f32(f, 15))


@numba.njit(inline="always", fastmath=FAST, error_model="numpy")
def _layer(w, b, v, out, act, alpha, beta):
    """out = act(w @ v + b) for a small matrix w, an empty b adding nothing (out must not be v)."""
    for i in range(w.shape[0]):
        acc = b[i] if b.shape[0] > 0 else F(0)
        wr = w[i]
        for j in range(w.shape[1]):
            acc += wr[j] * v[j]
        out[i] = acc
    scalars.activate(out, 0, w.shape[0], act, alpha, beta)


def _array(ndim: int, readonly: bool = False, dtype: Any = types.float32) -> Any:
    return types.Array(dtype, ndim, "C", readonly=readonly)  # read-only inputs take writable arrays too


_IN, _IN2, _IN3, _IN4 = (_array(n, True) for n in (1, 2, 3, 4))
_OUT, _OUT2, _OUT3, _OUT4 = (_array(n) for n in (1, 2, 3, 4))
_I, _F, _B = types.int64, types.float64, types.boolean  # a float field is float32 in the job (fields.py)
_UIN = _array(1, True, types.uint64)  # indices
#: Each loop's pieces, and the types of its fields, in order (what a caller hands jit.Loop after the piece count).
SIGNATURES: dict[str, tuple[Callable[..., Any], tuple[Any, ...]]] = {
    "erf": (erf, (_IN, _OUT)),
    "gelu": (gelu, (_OUT,)),
    "activation": (activation, (_OUT, _I, _F, _F)),
    "binary": (binary, (_IN, _IN, _OUT, _I, _I, _F, _F)),
    "softmax_axis": (softmax_axis, (_IN3, _OUT3, _OUT2, _I)),
    "softmax": (softmax, (_OUT2, _F, _IN2, _I, _I)),
    "layer_norm": (layer_norm, (_IN2, _IN2, _IN, _IN, _F, _OUT2)),
    "masked_mean": (pooled.masked_mean, (_IN3, _array(2, True, types.int64), _F, _F, _OUT2)),
    "depthwise": (planes.depthwise, (_IN3, _IN3, _IN, _OUT3, *[_I] * 5, _F, _F, _I, _I)),
    "attention": (attention, (_IN4, _IN4, _IN4, _F, _IN2, _OUT4, _B, _B)),
    "gemm": (gemm, (_IN3, _IN3, _IN, _OUT3, _B, _I, _F, _F, _I, _I)),
    "squeeze_excite": (squeeze_excite, (_IN3, _IN2, _IN, _I, _F, _F, _IN2, _IN, _I, _F, _F, _IN2, _IN, _I, _F, _F, _OUT3,
                                        _I, _OUT2)),
    "conv_input": (planes.conv_input, (_IN2, _OUT2, *[_I] * 12)),
    "upsample": (planes.upsample, (_IN3, _IN3, _OUT3, _I, _I)),
    "max_pool": (planes.max_pool, (_IN3, _OUT3, *[_I] * 8)),
    "scatter_taps": (planes.scatter_taps, (_IN4, _OUT3, _I, _I)),
    "winograd_layout": (planes.winograd_layout, (_IN3, _OUT3, *[_I] * 4)),
    "winograd_in": (planes.winograd_in, (_IN3, _OUT3, _OUT2, _I, _I)),
    "winograd_out": (planes.winograd_out, (_IN3, _IN, _OUT3, _OUT2, _I, _F, _F, *[_I] * 4)),
    "conv_tiles": (tiles.conv, (_IN, _I, _array(1, True, types.uint64), _I, _IN3, _IN, _OUT3, *[_I] * 7, _F, _F, _I,
                                _I, _OUT2, _array(3, False, types.uint64))),
    "conv_channels": (tiles.channels, (_IN, _UIN, _IN3, _IN, _OUT, _UIN, _UIN, _I, _I, _F, _F, _OUT2,
                                       _array(2, False, types.uint64))),
    "half": (half, (_IN, _array(1, False, types.uint16))),
    "widen": (widen, (_array(1, True, types.uint16), _OUT)),
    "dense": (tiles.dense, (_IN2, _IN3, _IN, _OUT2, _I, _F, _F, _I, _OUT2, _array(2, False, types.uint64))),
}
#: Compiled with LLVM's SLP vectorizer, which packs a tile's scalar sums into vectors (numba leaves it off).
SLP = {"conv_tiles", "conv_channels", "dense"}
_CONTROL = _array(1, False, types.int64)


def compile(name: str) -> Any:  # noqa: A001  (the one entry point, called by jit.py)
    """Loop `name` (SIGNATURES) as a crew.Loop: its pieces as a cfunc, and the launch for its fields' types."""
    fn, values = SIGNATURES[name]
    if name in ("gemm", "attention", "squeeze_excite"):
        _link_blas()
    if name in ("half", "widen"):
        _check_half()
    _compile_crew()
    piece = _compiled_piece(fn, name in SLP)
    launch = numba.njit(types.void(_CONTROL, types.int64, types.int64, types.Tuple(values)), nogil=True,
                        cache=True)(crew.launch)
    crew.fill.compile((_CONTROL, types.int64, types.Tuple(values)))  # for Loop.bind, before a run asks
    return crew.Loop(piece.address, launch)


def _compile_crew() -> None:
    """The crew's own loops, compiled (or loaded from the disk cache) once, before a worker starts."""
    for fn, signature in ((crew.worker, (_CONTROL,)), (crew.stop, (_CONTROL,)), (crew.hold, (_CONTROL, types.int64)),
                          (crew.run, (_CONTROL, types.int64, types.int64, types.int64)),
                          (crew.alone, (types.int64, types.int64)),
                          (crew.sequence, (_CONTROL, types.Array(types.int64, 2, "C")))):
        if not fn.signatures:
            fn.compile(signature)


def _compiled_piece(fn: Callable[..., Any], slp: bool) -> Any:
    """A loop's pieces as a cfunc of (address of their fields, piece). The tile loops are compiled with LLVM's SLP
    vectorizer on and no reassociation: with it, LLVM vectorizes the sum over taps (a reduction of gathered values)
    instead of the tile's rows. The vectorizer setting is numba's global, read while compiling: it is switched on
    for this compile only, under numba's compiler lock."""
    from numba.core import config
    from numba.core.compiler_lock import global_compiler_lock

    options: dict[str, Any] = dict(nogil=True, cache=True, fastmath=FAST, error_model="numpy")
    if slp:
        options.update(fastmath=FAST - {"reassoc"}, boundscheck=False)
    with global_compiler_lock:
        before = config.SLP_VECTORIZE
        config.SLP_VECTORIZE = 1 if slp else before
        try:
            return numba.cfunc(types.void(types.int64, types.int64), **options)(fn)
        finally:
            config.SLP_VECTORIZE = before


def _check_half() -> None:
    """Raise unless this CPU rounds to half floats, and widens them, in an instruction (x86 with F16C, 64-bit
    Arm): elsewhere LLVM would call a runtime function that numba does not link, and the process would abort when
    the code is linked."""
    import platform

    import llvmlite.binding as ll

    machine = platform.machine().lower()
    if machine in ("aarch64", "arm64"):
        return
    if machine not in ("x86_64", "amd64") or "+f16c" not in ll.get_host_cpu_features().flatten().split(","):
        raise RuntimeError(f"no instruction rounds to half floats on this CPU ({machine})")


def _link_blas() -> None:
    """Give LLVM the address of numpy's cblas_sgemm under gemm's name for it; raises where there is none (a
    name left unresolved would abort the process when the code is linked, not raise)."""
    import llvmlite.binding as ll

    from .blas import sgemm_address

    address = sgemm_address()
    if address is None:
        raise RuntimeError("numpy's BLAS library has no cblas_sgemm that the compiled loops can call")
    ll.add_symbol(_SGEMM, address)
