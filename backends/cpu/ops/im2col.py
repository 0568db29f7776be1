"""Conv's im2col path (conv.py picks it where no other fits).

The zero-padded input is stored as its stride phases (for stride 1, just the padded input), each a long flat
row per channel, so every kernel tap is a contiguous slice and the columns are built at memcpy speed, taps of
one phase in one strided copy. Work goes in tiles of whole groups x output rows sized to stay in cache, so a
big conv never builds its full column matrix. Each tile's GEMM also computes the few columns that wrap around
an output row; one strided copy into the output drops them. The columns carry a row of ones per group, so the
bias rides in the GEMM for free. Where an image is one tile, runs of images share each numpy call
(products.image_runs).
"""

from __future__ import annotations

import math
import threading
from typing import Any, Callable

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ..threads import shared_scratch, threads
from .products import PARALLEL_MACS, SILU_CHUNK, image_runs, negated, silu_negated, split
from .window import tap_phases


def run(x: np.ndarray, y: np.ndarray, p: dict[str, Any], packed: dict[str, Any], group: int,
        act: Callable[[np.ndarray], Any] | None, silu: bool, budget: int) -> None:
    """y = conv(x) for the plan p and the packed weights; a conv with enough GEMM work in tiles shared with the
    runtime's helper threads (planned again for their count where it changed)."""
    g = group
    # A depthwise conv moves 9-25 times its input through memory and gains nothing from a second
    # thread: only convs that do real GEMM work are split, in at least two tiles per thread.
    work = p["co"] * p["kg"] * p["L"] if p["cg"] > 1 else 0
    share = 2 * threads() if work >= PARALLEL_MACS and threads() > 1 else 1
    if p["min_tiles"] != share:
        plan(p, group, budget, share)
    waug = packed["waug"]
    w0 = waug[0]
    xph, xph_token = shared_scratch("conv.phases", p["phase_shape"], p["cdt"])
    # Views made once per thread's buffer: numpy's indexing costs microseconds each.
    me = threading.get_ident()
    views = p["phase_views"].get(me)
    if views is None or views[0] != xph_token:
        views = p["phase_views"][me] = (xph_token, [xph[(slice(None),) + sl] for sl in p["zeros"]],
                                        [(xph[(slice(None),) + d], (slice(None),) + s) for d, s in p["fills"]])
    _, zeros, fills = views
    for z in zeros:
        z.fill(0)
    outs = tuple(p["outs"])
    for i0, i1 in p["runs"]:
        nim, xi = i1 - i0, x[i0:i1]
        for dst, src in fills:
            np.copyto(dst[:nim], xi[src])
        yv = y[i0:i1].reshape((nim, g, p["cog"]) + outs)

        def tile(k: int) -> None:
            copies, gsl, ones, c, acc, extract, out_sel, chunks = _bind(p, packed["phases"], xph, xph_token,
                                                                            nim, group, silu)[k]
            ones.fill(1)  # the row of ones that carries the bias
            for dst, src in copies:
                np.copyto(dst, src)
            if chunks is not None:
                np.matmul(negated(packed, "waug")[0], c, out=acc)
                silu_negated(chunks)
            else:
                np.matmul(w0 if g == 1 else waug[gsl], c, out=acc)
                if act is not None:
                    act(acc)
            # A strided copy drops the columns that wrap around rows: a ufunc writing through that view
            # runs row by row, and took 1.2-1.7x the time of a contiguous pass and this copy.
            np.copyto(yv[out_sel], extract)

        split(len(p["descs"]), tile, work)


def plan(p: dict[str, Any], group: int, budget: int, min_tiles: int = 1) -> None:
    """Plan im2col over the input split into stride phases, in tiles of about `budget` column elements (at
    least min_tiles), into the conv's plan p.

    The padded input is stored as its s1*...*sn stride phases (for stride 1: just the padded input),
    each phase image seen as one long row per channel ("flat"). Every kernel tap of one phase is then
    a contiguous slice of that row, so building the columns runs at memcpy speed, taps grouped by
    phase in one strided copy per phase. The GEMM also computes the few columns that wrap around each
    output row; a strided copy into the output drops them. Tiles are whole groups x output rows.
    """
    g, n, kernel, outs, strides = group, p["n"], p["kernel"], p["outs"], p["strides"]
    cg, pads, spatial = p["cg"], p["pads"], p["spatial"]
    kk = math.prod(kernel)
    kg = cg * kk
    padded = [spatial[a] + pads[a] + pads[a + n] for a in range(n)]
    Q = [-(-padded[a] // strides[a]) for a in range(n)]  # a phase image's size
    pitch = [math.prod(Q[a + 1:]) for a in range(n)]
    row = pitch[0]  # flat columns per output row
    tail = sum((outs[a] - 1) * pitch[a] for a in range(1, n)) + 1  # columns the last output row needs
    rows = outs[0]
    per_row = (kg + 1) * row
    if g * per_row * rows <= budget:
        gb, rb = g, rows
    elif per_row * rows <= budget:
        gb, rb = max(1, budget // (per_row * rows)), rows
    else:
        gb, rb = 1, max(1, min(rows, budget // per_row))
    blocks = -(-g // gb)
    if blocks * -(-rows // rb) < min_tiles:  # a share for every thread
        rb = max(1, rows * blocks // min_tiles)
    width = rb * row
    descs = []
    for g0 in range(0, g, gb):
        g1 = min(g, g0 + gb)
        for y0 in range(0, rows, rb):
            y1 = min(rows, y0 + rb)
            descs.append((g0, g1, y0, y1, (y1 - y0 - 1) * row + tail))
    # Which stride phases the taps read, and how each is filled from the input and zeroed around it.
    _, phases = tap_phases(kernel, strides, p["dils"])
    used = sorted({ph for ph, *_ in phases})
    slot = {ph: i for i, ph in enumerate(used)}
    fills, zeros = [], []
    for ph in used:
        dst, src, empty = [slot[ph]], [], False
        for a in range(n):
            s_, pb = strides[a], pads[a]
            y0 = max(0, -(-(pb - ph[a]) // s_))  # first phase position inside the input
            r0 = s_ * y0 + ph[a] - pb
            cnt = max(0, -(-(spatial[a] - r0) // s_)) if r0 < spatial[a] else 0
            cnt = min(cnt, Q[a] - y0)
            if cnt <= 0:
                empty = True
                break
            dst.append(slice(y0, y0 + cnt))
            src.append(slice(r0, r0 + s_ * (cnt - 1) + 1, s_))
            pre = (slice(None), slot[ph]) + (slice(None),) * a
            if y0:
                zeros.append(pre + (slice(0, y0),))
            if y0 + cnt < Q[a]:
                zeros.append(pre + (slice(y0 + cnt, Q[a]),))
        if empty:
            zeros.append((slice(None), slot[ph]))
        else:
            fills.append(((slice(None),) + tuple(dst), (slice(None),) + tuple(src)))
    # Where an image is one tile, runs of images share each numpy call (image_runs).
    runs = (image_runs(p["N"], gb * (kg + 1) * width) if len(descs) == 1
            else [(i, i + 1) for i in range(p["N"])])
    nb = max(i1 - i0 for i0, i1 in runs)
    p.update(kg=kg, gb=gb, width=width, row=row, tail=tail, descs=descs, min_tiles=min_tiles, Q=Q,
             pitch=pitch, slot=slot, fills=fills, zeros=zeros, runs=runs,
             phase_shape=(nb, p["C"], len(used)) + tuple(Q), cols_shape=(nb, gb, kg + 1, width),
             acc_shape=(nb, gb, p["cog"], width), bound={}, phase_views={})

def _bind(p: dict[str, Any], phases, xph: np.ndarray, xph_token: int, nim: int, group: int, silu: bool) -> list:
    """Every tile's views over the phase buffer xph and this thread's column and GEMM scratch, for a run
    of nim images."""
    cdt = p["cdt"]
    cols, t2 = shared_scratch("conv.cols", p["cols_shape"], cdt)
    acc_buf, t3 = shared_scratch("conv.acc", p["acc_shape"], cdt)
    silu = silu and group == 1 and cdt == np.float32
    # One chunk's exp scratch, used by every chunk in turn, so that it stays in cache.
    silu_rows = min(p["cog"], max(1, SILU_CHUNK // p["width"]))
    exp_buf, t4 = shared_scratch("conv.exp", (silu_rows * p["width"],), cdt) if silu else (None, None)
    token = (xph_token, t2, t3, t4)
    me = (threading.get_ident(), nim)
    bound = p["bound"].get(me)
    if bound is not None and bound[0] == token:
        return bound[1]
    g, n, outs, cg = group, p["n"], p["outs"], p["cg"]
    kk = math.prod(p["kernel"])
    kg, width, row, pitch, Q = p["kg"], p["width"], p["row"], p["pitch"], p["Q"]
    it = cols.itemsize
    m_all = (outs[0] - 1) * row + p["tail"]
    qsize = math.prod(Q)
    # Per phase group: source (images, C, taps..., m_all) over the phase images, and its first column row.
    srcs = []
    for ph, q0, qstep, counts, first in phases:
        base = p["slot"][ph] * qsize + sum(q0[a] * pitch[a] for a in range(n))
        flat_ph = xph.reshape(xph.shape[0], p["C"], -1)[:, :, base:]
        src = as_strided(flat_ph, shape=(nim, p["C"]) + counts + (m_all,),
                         strides=xph.strides[:2] + tuple(qstep[a] * pitch[a] * it for a in range(n)) + (it,),
                         writeable=False)
        cstr, acc = [], width * it
        for c_ in reversed(counts):
            cstr.append(acc)
            acc *= c_
        cstr.reverse()
        srcs.append((src.reshape((nim, g, cg) + src.shape[2:]), first, counts, tuple(cstr)))
    tiles = []
    for g0, g1, y0, y1, m in p["descs"]:
        gn = g1 - g0
        gsl = slice(g0, g1)
        copies = []
        for src, first, counts, cstr in srcs:
            dst = as_strided(cols[:, :, first:], shape=(nim, gn, cg) + counts + (m,),
                             strides=cols.strides[:2] + (kk * width * it,) + cstr + (it,))
            copies.append((dst, src[(slice(None), gsl, Ellipsis, slice(y0 * row, y0 * row + m))]))
        tcols = cols[:nim, :gn, :, :m]
        # The product goes to a contiguous block, not to columns of a (cog, width) buffer, so the
        # activation runs over it in cache-sized pieces (activation_fn) rather than row by row:
        # yolov8n took 0.92-1.00x the time (median 0.975x, 8 A/B runs; rec 0.95x, det 1.0x).
        a = acc_buf.reshape(-1)[: nim * gn * p["cog"] * m].reshape(nim, gn, p["cog"], m)
        extract = as_strided(a, shape=(nim, gn, p["cog"], y1 - y0) + tuple(outs[1:]),
                             strides=a.strides[:3] + tuple(pt * it for pt in pitch), writeable=False)
        chunks = None
        if silu:  # the product in cache-sized chunks of channel rows, each with the exp scratch
            e = exp_buf[: silu_rows * m].reshape(silu_rows, m)
            chunks = [(a[i, 0, r0:r0 + silu_rows], e[: min(silu_rows, p["cog"] - r0)])
                      for i in range(nim) for r0 in range(0, p["cog"], silu_rows)]
        tiles.append((copies, gsl, tcols[:, :, kg, :], tcols[:, 0] if g == 1 else tcols,
                      a[:, 0] if g == 1 else a, extract, (slice(None), gsl, slice(None), slice(y0, y1)), chunks))
    p["bound"][me] = (token, tiles)
    return tiles
