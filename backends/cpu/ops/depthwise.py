"""Conv's depthwise path: a 2-D conv with one input channel per group (see conv.py).

Two ways, chosen per input shape when the conv is planned:

* band, for maps of a few rows (cls: 2-12 rows of 96): each input row is
  copied once per kernel column, shifted by it, so the rows of one channel
  form a matrix whose every (input row, kernel column) pair is a contiguous
  row. One small GEMM per channel, (output rows x that matrix's rows) with
  the kernel placed along a band of the weights, gives all the channel's
  output rows: no column matrix of kernel-size height is built, and a row of
  ones carries the bias. Weights outside the band are zero, so this only pays
  while the map has not many more rows than the kernel.
* tiles, elsewhere: the zero-padded input is read through strided views, one
  (taps x rows x width) block per tile of output rows, and each tile is one
  batched matrix-vector product per channel (a row of ones carries the bias)
  written straight into the output. A tile takes only the kernel rows that
  reach real input for some of its rows, so on small feature maps the taps
  that would read only padding are never copied nor multiplied.

Both take a run of images per numpy call where their columns fit
(products.image_runs), with the weights broadcast over the run's images.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import numpy as np
from numpy.lib.stride_tricks import as_strided

from .. import jit
from ..threads import shared_scratch, threads
from .dtypes import same
from .products import image_runs

#: The band way is taken while its GEMMs do at most this many times the multiply-adds the conv needs
#: (its weights are zero outside the band). On the 2-core test machine (one thread, against the tiles way):
#: cls's 5x5 convs over 2-3 rows of 96 took 0.4-0.6x the time, a 3x3 over 12 rows of 160 (3.7 times the
#: multiply-adds) 0.7x; at 7.3 times, 3x3 convs over 24 rows of 160 ranged from 0.76x (16 channels) to
#: 1.13x (64), and a 7x7 over 56 rows of 56 (7.9 times) took 1.4x.
BAND_WASTE = 6


def plan(p: dict[str, Any], budget: int) -> bool:
    """Plan the band or the tiles way, in pieces of about `budget` column elements at most, into the conv's
    plan p; False where im2col is faster."""
    return _plan_band(p, budget) or _plan_tiles(p, budget)


def run(x: np.ndarray, y: np.ndarray, p: dict[str, Any], packed: dict[str, Any],
        act: Callable[[np.ndarray], Any] | None) -> None:
    """y = conv(x) for the plan p and the packed weights by numpy, on this thread: split across threads, cls at
    batch 16 ran 1.2x slower (the numpy calls are short, and the threads queue for the GIL). The compiled loop
    (looped) is tried first where it serves."""
    (_run_band if "band" in p else _run_tiles)(x, y, p, packed, act)


def loop_serves(p: dict[str, Any]) -> bool:
    """Whether loops.depthwise can compute a conv of this plan: 2-D, one channel per group, dilation 1,
    float32."""
    return p["n"] == 2 and p["cg"] == 1 and p["cog"] == 1 and p["dils"] == [1, 1] and p["cdt"] == np.float32


#: The loop's planes are shared by the crew's threads in pieces of this many multiply-adds at least (a quarter of
#: the earlier 1 << 20: cls at batch 8 and 16 threads ran faster so; benchmarks/RESULTS.md, session 26).
LOOP_PIECE = 1 << 18


def looped(x: np.ndarray, y: np.ndarray, p: dict[str, Any], packed: dict[str, Any], act) -> bool:
    """y = conv(x) by planes.depthwise, its planes shared among the crew's threads, for a plan it serves
    (loop_serves); False (nothing done) while it compiles, or for other layouts."""
    found = jobs(x, y, p, packed)
    if found is None:
        return False
    found[0]()
    if p["loop_act"] is None and act is not None:
        act(y)
    return True


def jobs(x: np.ndarray, y: np.ndarray, p: dict[str, Any], packed: dict[str, Any]) -> tuple | None:
    """looped's job, bound once for the same memory (before an activation that the loop cannot apply, which
    looped applies after it); None while it compiles, or for other layouts."""
    if x.dtype != np.float32 or not x.flags.c_contiguous or not y.flags.c_contiguous:
        return None
    loop = jit.jitted("depthwise")
    if loop is None:
        return None
    w = packed.get("loop_w")
    if w is None:
        kh, kw = p["kernel"]
        w = packed["loop_w"] = np.ascontiguousarray(packed["w"].reshape(-1, kh, kw), np.float32)
        packed["loop_b"] = np.zeros(w.shape[0], np.float32) if packed["b"] is None else packed["b"]
    loop_act = p["loop_act"] or (0, 0.0, 0.0)  # None: an activation the loop cannot apply, left to numpy after it
    (H, W), (Ho, Wo), (sh, sw) = p["spatial"], p["outs"], p["strides"]
    planes = x.shape[0] * x.shape[1]
    xs, ys = x.reshape(planes, H, W), y.reshape(planes, Ho, Wo)
    b, pt, pl = packed["loop_b"], p["pads"][0], p["pads"][1]
    each = Ho * Wo * w.shape[1] * w.shape[2]
    pieces = max(1, min(threads(), planes, planes * each // LOOP_PIECE))
    found = p.setdefault("depthwise.jobs", jit.Binds(same))  # bound once for the same memory
    return (found.get((x, y), lambda *_: loop.bind(pieces, xs, w, b, ys, sh, sw, pt, pl, *loop_act, 0, planes)),)


def _plan_band(p: dict[str, Any], budget: int) -> bool:
    """The input rows [lo, hi) that the outputs read and the blocks of channels whose column matrices fit
    the budget, into p, where the band way does not waste too much."""
    (kh, kw), (sh, dh), pad = p["kernel"], (p["strides"][0], p["dils"][0]), p["pads"][0]
    (H, W), (Ho, Wo), C = p["spatial"], p["outs"], p["C"]
    read = [r for y in range(Ho) for ky in range(kh) if 0 <= (r := y * sh + ky * dh - pad) < H]
    if not read:
        return False
    lo, hi = min(read), max(read) + 1
    k = (hi - lo) * kw + 1  # the GEMMs' inner size: (row, kernel column) pairs and the row of ones
    if k > BAND_WASTE * (kh * kw + 1):
        return False
    cb = max(1, min(C, budget // (k * Wo)))
    chunks = image_runs(p["N"], C * k * Wo) if cb == C else [(i, i + 1) for i in range(p["N"])]
    nb = max(i1 - i0 for i0, i1 in chunks)
    p.update(band=(lo, hi), band_rows=(nb, C, hi - lo, W + p["pads"][1] + p["pads"][3]), band_k=k,
             band_blocks=[(c0, min(C, c0 + cb)) for c0 in range(0, C, cb)], band_cols=(nb, cb, k, Wo),
             dw_chunks=chunks, dw_bound={})
    return True


def _run_band(x, y, p, packed, act) -> None:
    lo, hi = p["band"]
    rows, rows_token = shared_scratch("conv.padded", p["band_rows"], p["cdt"])
    cols, cols_token = shared_scratch("conv.cols", p["band_cols"], p["cdt"])
    # Views made once per thread and buffers: numpy's indexing costs microseconds each.
    key = threading.get_ident()
    bound = p["dw_bound"].get(key)
    if bound is None or bound[0] != (rows_token, cols_token):
        bound = p["dw_bound"][key] = ((rows_token, cols_token), _bind_band(p, rows, cols))
    chunks, borders, ones = bound[1]
    for b in borders:  # the scratch is shared: other convs wrote there
        b.fill(0)
    ones.fill(1)
    wm = p.get("band_wm")
    if wm is None or wm[0] is not packed:
        wm = p["band_wm"] = (packed, _band_weights(packed, p))
    wm = wm[1]
    for i0, i1, inside, blocks in chunks:
        np.copyto(inside, x[i0:i1, :, lo:hi])
        yc = y[i0:i1].reshape((i1 - i0,) + wm.shape[:2] + (-1,))
        for c0, c1, dst, src, c in blocks:
            np.copyto(dst, src)
            np.matmul(wm[c0:c1], c, out=yc[:, c0:c1])
        if act is not None:
            act(y[i0:i1])


def _bind_band(p, rows, cols) -> tuple:
    """(per run of images: where it starts and ends, the padded rows' inside, and per block of channels: its
    input rows shifted by each kernel column, where they are read from, and its columns; the rows' zero
    borders; the columns' row of ones)."""
    kw, (sw, dw), pads, W = p["kernel"][1], (p["strides"][1], p["dils"][1]), p["pads"], p["spatial"][1]
    _, _, n, _ = p["band_rows"]
    Wo = p["outs"][1]
    ns, cs, rs, es = rows.strides
    chunks = []
    for i0, i1 in p["dw_chunks"]:
        m, blocks = i1 - i0, []
        for c0, c1 in p["band_blocks"]:
            src = as_strided(rows[:, c0:], shape=(m, c1 - c0, n, kw, Wo), strides=(ns, cs, rs, dw * es, sw * es),
                             writeable=False)
            c = cols[:m, :c1 - c0]
            blocks.append((c0, c1, c[:, :, :n * kw].reshape(m, c1 - c0, n, kw, Wo), src, c))
        chunks.append((i0, i1, rows[:m, :, :, pads[1]:pads[1] + W], blocks))
    borders = [v for v in (rows[..., :pads[1]], rows[..., pads[1] + W:]) if v.size]
    return chunks, borders, cols[:, :, n * kw]


def _band_weights(packed: dict[str, Any], p: dict[str, Any]) -> np.ndarray:
    """(groups, outputs per group x output rows, band_k): each output row's kernel rows placed at the input
    rows they read, the bias last; made once per packed weights and geometry."""
    (kh, kw), (sh, dh), pad = p["kernel"], (p["strides"][0], p["dils"][0]), p["pads"][0]
    (lo, hi), Ho = p["band"], p["outs"][0]
    key = ("band", kh, kw, sh, dh, pad, lo, hi, Ho)
    wm = packed.get(key)
    if wm is None:
        w = packed["w"]
        g, cog = w.shape[:2]
        w4 = w.reshape(g, cog, kh, kw)
        wm = np.zeros((g, cog, Ho, p["band_k"]), w.dtype)
        for y in range(Ho):
            for ky in range(kh):
                r = y * sh + ky * dh - pad - lo
                if 0 <= r < hi - lo:
                    wm[:, :, y, r * kw:(r + 1) * kw] = w4[:, :, ky]
        wm[:, :, :, -1] = 0 if packed["b"] is None else packed["b"].reshape(g, cog, 1)
        wm = packed[key] = wm.reshape(g, cog * Ho, p["band_k"])
    return wm


def _plan_tiles(p: dict[str, Any], budget: int) -> bool:
    """Tiles of output rows of about `budget` column elements at most, into the conv's plan p; False where
    im2col is faster.

    Output row y reads input rows y*sh + ky*dh - pad_top; the kernel rows that land inside the input form a
    range. On a map not much taller than the kernel, rows sharing a range make one tile (split further to stay
    in cache), so a tile copies and multiplies no kernel row that reads only padding. Elsewhere that would save
    little and cost many short products: all rows form one range, and this path only pays where output rows
    are long (96 or more), since it copies the columns row by row while im2col copies a tile's rows as one run.
    """
    kh, kw = p["kernel"]
    sh, dh = p["strides"][0], p["dils"][0]
    (H, W), (Ho, Wo), pads, C = p["spatial"], p["outs"], p["pads"], p["C"]
    groups: list[list[Any]] = []
    for y in range(Ho):
        inside = [ky for ky in range(kh) if 0 <= y * sh + ky * dh - pads[0] < H]
        rng = (inside[0], inside[-1] + 1) if inside else (0, 0)
        if groups and groups[-1][2] == rng:
            groups[-1][1] = y + 1
        else:
            groups.append([y, y + 1, rng])
    ka, kb = min(g[2][0] for g in groups), max(g[2][1] for g in groups)
    needed = sum((y1 - y0) * (b - a) for y0, y1, (a, b) in groups)
    if needed > 0.75 * Ho * (kb - ka):
        if Wo < 96:
            return False
        groups = [[0, Ho, (ka, kb)]]
    tiles = []
    for y0, y1, (ka, kb) in groups:
        # All of a channel's rows in a tile where they fit: long matrix-vector products beat many.
        per_row = ((kb - ka) * kw + 1) * Wo  # one output row's columns, bias row included
        rows = min(y1 - y0, max(1, budget // per_row))
        cb = max(1, min(C, budget // (per_row * rows)))
        for c0 in range(0, C, cb):
            for r0 in range(y0, y1, rows):
                tiles.append((c0, min(C, c0 + cb), r0, min(y1, r0 + rows), ka, kb))
    cols = max((c1 - c0) * ((kb - ka) * kw + 1) * (r1 - r0) * Wo for c0, c1, r0, r1, ka, kb in tiles)
    chunks = image_runs(p["N"], cols)
    nb = max(i1 - i0 for i0, i1 in chunks)
    # The padded rows the tiles read: on a short map, the padding rows outside them need no zeroing (cls:
    # 2 rows of input between 2+2 rows of padding, of which the tiles read none).
    lo = min(r0 * sh + ka * dh for c0, c1, r0, r1, ka, kb in tiles)
    hi = max((r1 - 1) * sh + (kb - 1) * dh + 1 for c0, c1, r0, r1, ka, kb in tiles)
    p.update(dw_tiles=tiles, cols_size=nb * cols, padded_shape=(nb, C, H + pads[0] + pads[2], W + pads[1] + pads[3]),
             dw_rows=(lo, hi), dw_chunks=chunks, dw_bound={})
    return True


def _run_tiles(x, y, p, packed, act) -> None:
    (H, W), (Ho, Wo), pads = p["spatial"], p["outs"], p["pads"]
    cols, cols_token = shared_scratch("conv.cols", (p["cols_size"],), p["cdt"])
    if any(pads):  # the border the tiles read is zeroed once; each run of images fills the inside
        padded, pad_token = shared_scratch("conv.padded", p["padded_shape"], p["cdt"])
        lo, hi = p["dw_rows"]
        padded[:, :, lo:pads[0]].fill(0)
        padded[:, :, pads[0] + H:hi].fill(0)
        padded[:, :, pads[0]:pads[0] + H, :pads[1]].fill(0)
        padded[:, :, pads[0]:pads[0] + H, pads[1] + W:].fill(0)
        inside = padded[:, :, pads[0]:pads[0] + H, pads[1]:pads[1] + W]
    for i0, i1 in p["dw_chunks"]:
        if any(pads):
            np.copyto(inside[:i1 - i0], x[i0:i1])
            img, img_token = padded, pad_token
        else:
            img, img_token = x[i0:i1], x[i0:i1].ctypes.data
        yc = y[i0:i1].reshape(i1 - i0, p["C"], p["cog"], Ho * Wo)
        # Views are made once per thread, run of images and buffers: numpy's indexing costs microseconds each.
        # The bound entry holds the arrays and weights it names, so no other can take their addresses.
        token = (cols_token, img_token, img.strides, yc.ctypes.data, id(packed))
        key = (threading.get_ident(), i0)
        bound = p["dw_bound"].get(key)
        if bound is None or bound[0] != token:
            bound = p["dw_bound"][key] = (token, _bind(p, packed, cols, img, yc), packed)
        for dst, src, ones, wt, c, out in bound[1]:
            np.copyto(dst, src)
            ones.fill(1)  # the row of ones that carries the bias
            np.matmul(wt, c, out=out)
        if act is not None:  # on whole images: a tile's rows are strided views, several times slower
            act(y[i0:i1])


def _bind(p, packed, cols, img, yc) -> list:
    """Per tile: the strided source over the (padded) images, its column block, weights and output rows."""
    (kh, kw), (sh, sw), (dh, dw) = p["kernel"], p["strides"], p["dils"]
    Wo, m = p["outs"][1], yc.shape[0]
    ns, cs, rs, es = img.strides
    views = []
    for c0, c1, r0, r1, ka, kb in p["dw_tiles"]:
        nc, nr, taps = c1 - c0, r1 - r0, (kb - ka) * kw
        c = cols[: m * nc * (taps + 1) * nr * Wo].reshape(m, nc, taps + 1, nr * Wo)
        src = as_strided(img[:, c0:, r0 * sh + ka * dh:], shape=(m, nc, kb - ka, kw, nr, Wo),
                         strides=(ns, cs, dh * rs, dw * es, sh * rs, sw * es), writeable=False)
        dst = c[:, :, :taps].reshape(m, nc, kb - ka, kw, nr, Wo)
        wt = _weights(packed, kh, kw, ka, kb)[c0:c1]
        views.append((dst, src, c[:, :, taps], wt, c, yc[:, c0:c1, :, r0 * Wo:r1 * Wo]))
    return views


def _weights(packed: dict[str, Any], kh: int, kw: int, ka: int, kb: int) -> np.ndarray:
    """(groups, outputs per group, taps of kernel rows ka..kb-1 + bias): the weights one tile multiplies,
    made once per packed weights."""
    key = ("depthwise", ka, kb)
    wt = packed.get(key)
    if wt is None:
        w = packed["w"]
        g, cog = w.shape[:2]
        taps = (kb - ka) * kw
        wt = np.empty((g, cog, taps + 1), w.dtype)
        wt[:, :, :taps] = w.reshape(g, cog, kh, kw)[:, :, ka:kb].reshape(g, cog, taps)
        wt[:, :, taps] = 0 if packed["b"] is None else packed["b"].reshape(g, cog)
        packed[key] = wt
    return wt
