"""The loops numba compiles for the CPU backend (see jit.py, which imports this module off the event loop).

Each is a plain loop over float32 rows that LLVM vectorizes: no call inside a loop body (exp and erf are
scalars.py's polynomials), and a loop that works in place takes one array (given the same array twice,
LLVM's check for overlap fails and the scalar loop runs instead). Those over rows and products are here; those
over image planes in planes.py (the conv tile loop's input layout among them); the tile loops in tiles.py, whose
sums are generated. This module compiles them all (compile).
"""

from __future__ import annotations

import ctypes
import os
import site
import sys
from types import FunctionType
from typing import Any, Callable

from . import vectors

vectors.wide()  # before numba loads: it fixes the vector width numba compiles for (vectors.py)

import numba  # noqa: E402
import numpy as np  # noqa: E402
from numba import prange, types  # noqa: E402

from . import planes, scalars, tiles  # noqa: E402
from .scalars import FAST, NEG_INF, exp_neg

F = np.float32
#: The SHA-256 of scalars.py, whose functions these loops inline: numba's disk cache checks only this file for
#: changes, so a change there comes with a new stamp here (tools/make_tiles.py writes it, in tiles.py too).
SCALARS = "902653d4138d67e076f6deba016da5075f34ee0095fe226b1c7c88bef3b11a7d"


def erf(x, y):
    for i in prange(x.size):
        y[i] = scalars.erf(x[i])


def gelu(y):
    """y = y/2 (1 + erf(y / sqrt 2)), in place."""
    for i in prange(y.size):
        v = y[i]
        y[i] = F(0.5) * v * (F(1) + scalars.erf(v * F(0.7071067811865476)))


def softmax(y, scale, mask, group, first):
    """y[r] = softmax(y[r] * scale + mask[(first + r) // group]) over rows of y (R, C), in place; an empty
    mask adds nothing."""
    rows = y.shape[0]
    masked = mask.shape[0] > 0
    for r in prange(rows):
        _softmax_row(y[r], scale, mask[(first + r) // group] if masked else mask[0:0].reshape(-1), masked)


def softmax_axis(x, y, sums, width, first, last):
    """y = softmax(x) over axis 1 of x and y (O, N, I), for blocks [first, last) of `width` columns of the last
    axis (O * ceil(I / width) blocks in all; sums holds a row of `width` for each): the reduction runs along rows
    of the block, so that every pass vectorizes over its columns. A block a piece, which the parallel build's
    threads share. y[o, 0] holds the block's maxima until its own exps are taken, last."""
    O, N, I = x.shape
    per = (I + width - 1) // width
    for job in prange(last - first):
        b = first + job
        o, c0 = b // per, (b % per) * width
        n = min(I, c0 + width) - c0
        xo, yo, s = x[o], y[o], sums[b]
        top = yo[0, c0:c0 + n]
        row = xo[0, c0:c0 + n]
        for c in range(n):
            top[c] = row[c]
        for k in range(1, N):
            row = xo[k, c0:c0 + n]
            for c in range(n):
                top[c] = max(top[c], row[c])
        for c in range(n):
            s[c] = F(0)
        for k in range(N - 1, -1, -1):  # row 0 last: it holds the maxima
            row, out = xo[k, c0:c0 + n], yo[k, c0:c0 + n]
            for c in range(n):
                e = exp_neg(row[c] - top[c])
                out[c] = e
                s[c] += e
        for c in range(n):
            s[c] = F(1) / s[c]
        for k in range(N):
            out = yo[k, c0:c0 + n]
            for c in range(n):
                out[c] *= s[c]


@numba.njit(inline="always", fastmath=FAST, error_model="numpy")
def _softmax_row(yr, scale, mr, masked):
    cols = yr.shape[0]
    m = NEG_INF
    if masked:
        for c in range(cols):
            v = yr[c] * scale + mr[c]
            yr[c] = v
            m = max(m, v)
    else:
        for c in range(cols):
            v = yr[c] * scale
            yr[c] = v
            m = max(m, v)
    s = F(0)
    for c in range(cols):
        e = exp_neg(yr[c] - m)
        yr[c] = e
        s += e
    inv = F(1) / s
    for c in range(cols):
        yr[c] *= inv


def attention(q, k, v, scale, mask, out, heads_in, heads_out):
    """out[i, j] = softmax(q[i, j] @ k[i, j] * scale + mask[i]) @ v[i, j] for q (b, h, s, d), k (b, h, d, t),
    v (b, h, t, e), mask (b or 1, t) or empty; one head of one batch item a piece, which the parallel build's
    threads share: both products are calls of numpy's BLAS, and the head's scores, made, normalized and read
    in one piece, stay in its cache. With heads_in, q, k and v come as the [b, s, h, d], [b, t, h, d] and
    [b, t, h, e] arrays of each head's rows side by side (heads.py), k's read transposed; with heads_out, out
    is [b, s, h, e] likewise."""
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
    for piece in prange(b * h):
        i, j = piece // h, piece % h
        scores = np.empty((s, t), np.float32)
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
        # A use of scores by name after BLAS has read it through its address: numba frees an array after its
        # last use by name, which would otherwise come before that product (another thread could take the
        # memory meanwhile, or a large array go back to the system).
        scores[0, 0] = F(0)


def layer_norm(x, residual, gamma, beta, eps, y):
    """y[r] = (z - mean) / sqrt(var + eps) * gamma + beta over rows of z = x (+ residual, when it has rows).
    y must not overlap x or residual."""
    rows, cols = x.shape
    added = residual.shape[0] > 0
    n = F(cols)
    for r in prange(rows):
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


#: numpy's cblas_sgemm, whose address compile() gives LLVM under this name before it compiles or loads gemm:
#: the machine code refers to the name, so numba's disk cache keeps it from one process to the next.
_SGEMM = "aiomnn_cblas_sgemm"
_I8 = types.int64  # pointers, and the integers, which cblas takes as 64 or 32 bits (blas.sgemm_address)
_sgemm = types.ExternalFunction(_SGEMM, types.void(*[_I8] * 6, types.float32, *[_I8] * 4, types.float32, _I8, _I8))
_ROW_MAJOR, _NO_TRANSPOSE, _TRANSPOSE = 101, 111, 112


def gemm(a, b, bias, out, per_row, act, alpha, beta, row_pieces, col_pieces):
    """out[i] = act(a[i % A] @ b[i] + bias) for a (A, m, k), A being 1 (weights that every image shares) or one
    matrix an image, and each b[i] (k, n) into out[i] (m, n), with bias a column
    (one value a row of the product) when per_row, else a row, or empty; in row_pieces x col_pieces pieces of
    each product, which the parallel build's threads share. Each piece is one call of numpy's BLAS, then
    its bias and activation while it is in cache: pieces of columns read only their own columns of b (a
    layer's weights, at few rows, where its time goes in reading them)."""
    A, m, k = a.shape
    images, _, n = b.shape
    width = ((n + col_pieces - 1) // col_pieces + 15) // 16 * 16  # whole vectors
    cols = (n + width - 1) // width
    pa, pb, po = np.int64(a.ctypes.data), np.int64(b.ctypes.data), np.int64(out.ctypes.data)
    biased = bias.shape[0] > 0
    for piece in prange(images * row_pieces * cols):
        i = piece // (row_pieces * cols)
        r = piece // cols % row_pieces
        c0 = piece % cols * width
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


_IN = types.Array(types.float32, 1, "C", readonly=True)  # read-only inputs take writable arrays too
_OUT = types.Array(types.float32, 1, "C")
_IN2 = types.Array(types.float32, 2, "C", readonly=True)
_OUT2 = types.Array(types.float32, 2, "C")
_IN3 = types.Array(types.float32, 3, "C", readonly=True)
_OUT3 = types.Array(types.float32, 3, "C")
SIGNATURES: dict[str, tuple[Callable[..., Any], Any]] = {
    "erf": (erf, types.void(_IN, _OUT)),
    "gelu": (gelu, types.void(_OUT)),
    "softmax_axis": (softmax_axis, types.void(_IN3, _OUT3, _OUT2, *[types.int64] * 3)),
    "softmax": (softmax, types.void(_OUT2, types.float32, _IN2, types.int64, types.int64)),
    "layer_norm": (layer_norm, types.void(_IN2, _IN2, _IN, _IN, types.float32, _OUT2)),
    "depthwise": (planes.depthwise, types.void(_IN3, _IN3, _IN, _OUT3, *[types.int64] * 5, types.float32,
                                               types.float32, *[types.int64] * 3)),
    "attention": (attention, types.void(*[types.Array(types.float32, 4, "C", readonly=True)] * 3, types.float32, _IN2,
                                        types.Array(types.float32, 4, "C"), types.boolean, types.boolean)),
    "gemm": (gemm, types.void(_IN3, _IN3, _IN, _OUT3, types.boolean, types.int64, types.float32, types.float32,
                              types.int64, types.int64)),
    "conv_input": (planes.conv_input, types.void(_IN2, _OUT2, *[types.int64] * 12)),
    "upsample": (planes.upsample, types.void(_IN3, _IN3, _OUT3, *[types.int64] * 4)),
    "max_pool": (planes.max_pool, types.void(_IN3, _OUT3, *[types.int64] * 6)),
    "scatter_taps": (planes.scatter_taps, types.void(types.Array(types.float32, 4, "C", readonly=True), _OUT3,
                                                     types.int64, types.int64)),
    "conv_tiles": (tiles.conv, types.void(_IN, types.uint64, types.Array(types.uint64, 1, "C", readonly=True),
                                          types.uint64, _IN3, _IN, _OUT3, *[types.uint64] * 6, types.int64,
                                          types.float32, types.float32, types.int64, types.int64)),
    "dense": (tiles.dense, types.void(_IN2, _IN3, _IN, _OUT2, types.int64, types.float32, types.float32, types.int64,
                                      types.int64)),
}
#: Compiled with LLVM's SLP vectorizer, which packs a tile's scalar sums into vectors (numba leaves it off).
SLP = {"conv_tiles", "dense"}
#: Loops with a prange that also have a parallel build, "NAME_parallel": numba's threads share the prange,
#: and spin a while between loops where a helper thread of threads.Pool would go to sleep and wake late.
PARALLEL = {"conv_tiles", "conv_input", "dense", "depthwise", "erf", "gelu", "softmax", "layer_norm", "gemm",
            "attention", "scatter_taps", "max_pool", "upsample", "softmax_axis"}


#: The pieces the crew runs (crew.py): cfuncs of (address of their arguments, piece).
PIECES = {"conv_piece": tiles.conv_piece, "conv_input_piece": planes.conv_input_piece}


def compile(name: str) -> Any:  # noqa: A001  (the one entry point, called by jit.py)
    if name == "crew":  # the crew's own loops; the module hands out the crew
        from . import crew

        control = types.Array(types.int64, 1, "C")
        for fn, signature in ((crew.worker, (control,)), (crew.stop, (control,)),
                              (crew.run, (control, types.int64, types.int64, types.int64)),
                              (crew.alone, (types.int64, types.int64, types.int64))):
            fn.compile(signature)
        return crew
    if name in PIECES:
        return _compiled_piece(PIECES[name])
    base = name.removesuffix("_parallel")
    parallel = base != name
    if parallel and base not in PARALLEL:
        raise KeyError(name)
    fn, signature = SIGNATURES[base]
    if base in ("gemm", "attention"):
        _link_blas()
    options: dict[str, Any] = dict(nogil=True, cache=True, fastmath=FAST, error_model="numpy", parallel=parallel)
    if parallel:
        _threadsafe_layer()
        fn = _renamed(fn, fn.__name__ + "_parallel")
    if base not in SLP:
        return _checked(numba.njit(signature, **options)(fn), parallel)
    # No reassociation: with it, LLVM vectorizes the sum over taps (a reduction of gathered values) instead
    # of the tile's rows. The vectorizer setting is numba's global, read while compiling: it is switched on
    # for this compile only, under numba's compiler lock.
    from numba.core import config
    from numba.core.compiler_lock import global_compiler_lock

    options.update(fastmath=FAST - {"reassoc"}, boundscheck=False)
    with global_compiler_lock:
        before = config.SLP_VECTORIZE
        config.SLP_VECTORIZE = 1
        try:
            return _checked(numba.njit(signature, **options)(fn), parallel)
        finally:
            config.SLP_VECTORIZE = before


def _compiled_piece(fn: Callable[..., Any]) -> Any:
    """A piece for the crew as a cfunc, compiled as the tile loops are (SLP vectorizer on, no reassociation)."""
    from numba.core import config
    from numba.core.compiler_lock import global_compiler_lock

    with global_compiler_lock:
        before = config.SLP_VECTORIZE
        config.SLP_VECTORIZE = 1
        try:
            return numba.cfunc(types.void(types.int64, types.int64), nogil=True, cache=True,
                               fastmath=FAST - {"reassoc"}, error_model="numpy", boundscheck=False)(fn)
        finally:
            config.SLP_VECTORIZE = before


def _link_blas() -> None:
    """Give LLVM the address of numpy's cblas_sgemm under gemm's name for it; raises where there is none (a
    name left unresolved would abort the process when the code is linked, not raise)."""
    import llvmlite.binding as ll

    from .blas import sgemm_address

    address = sgemm_address()
    if address is None:
        raise RuntimeError("numpy's BLAS library has no cblas_sgemm that the compiled loops can call")
    ll.add_symbol(_SGEMM, address)


def _renamed(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """fn under another name. numba's disk cache files a function by its name and source line, not by its
    options: the parallel build of a loop, compiled from the same function, would load the serial one's
    machine code (or the serial build the parallel one's)."""
    code = fn.__code__.replace(co_name=name, co_qualname=name)
    return FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)


def _threadsafe_layer() -> None:
    """Parallel loops are launched from several threads at once (sessions run side by side), and services
    fork: of numba's threading layers only TBB allows both (workqueue aborts on concurrent launches, GNU
    OpenMP kills a forked child), so TBB is asked for, unless the user chose a layer. pip's tbb puts its
    library in the environment's lib folder, off the loader's path: it is loaded from there first."""
    from numba.core import config

    if config.THREADING_LAYER != "default":
        return
    for folder in (sys.prefix, sys.base_prefix, site.getuserbase()):
        path = os.path.join(folder, "lib", "libtbb.so.12")
        if os.path.exists(path):
            try:
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            except OSError:
                continue
            break
    config.THREADING_LAYER = "safe"


def _checked(fn: Callable[..., Any], parallel: bool) -> Callable[..., Any]:
    """fn, once its threading layer has started (a parallel build); raises where no safe one can."""
    if parallel:
        from numba.core import config

        try:
            numba.get_num_threads()  # starts the threading layer: raises where it cannot be loaded
        except Exception:
            if config.THREADING_LAYER == "safe":
                config.THREADING_LAYER = "default"  # the user's own parallel loops keep numba's default
            raise
        if numba.threading_layer() == "workqueue":
            raise RuntimeError("only numba's workqueue threading layer is loaded, which is not thread-safe")
    return fn
