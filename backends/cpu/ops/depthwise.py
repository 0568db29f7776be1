"""Conv's depthwise path: a 2-D conv with one input channel per group (see conv.py).

The zero-padded input is read through strided views, one (taps x rows x width)
block per tile of output rows, and each tile is one batched matrix-vector
product per channel (a row of ones carries the bias) written straight into the
output. A tile takes only the kernel rows that reach real input for some of its
rows, so on small feature maps (a 5x5 kernel over 2 or 3 rows) the taps that
would read only padding are never copied nor multiplied.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ..kernel import shared_scratch


def plan(p: dict[str, Any], budget: int) -> bool:
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
    # The padded rows the tiles read: on a short map, the padding rows outside them need no zeroing (cls:
    # 2 rows of input between 2+2 rows of padding, of which the tiles read none).
    lo = min(r0 * sh + ka * dh for c0, c1, r0, r1, ka, kb in tiles)
    hi = max((r1 - 1) * sh + (kb - 1) * dh + 1 for c0, c1, r0, r1, ka, kb in tiles)
    p.update(dw_tiles=tiles, cols_size=cols, padded_shape=(C, H + pads[0] + pads[2], W + pads[1] + pads[3]),
             dw_rows=(lo, hi), dw_bound={})
    return True


def run(x: np.ndarray, y: np.ndarray, p: dict[str, Any], packed: dict[str, Any],
        act: Callable[[np.ndarray], Any] | None) -> None:
    """y = conv(x) for the plan p and the packed weights. Image by image, on this thread: split across
    threads, cls at batch 16 ran 1.2x slower (the numpy calls are short, and the threads queue for the GIL)."""
    (H, W), (Ho, Wo), pads = p["spatial"], p["outs"], p["pads"]
    cols, cols_token = shared_scratch("conv.cols", (p["cols_size"],), p["cdt"])
    if any(pads):  # the border the tiles read is zeroed once; each image fills the inside
        padded, pad_token = shared_scratch("conv.padded", p["padded_shape"], p["cdt"])
        lo, hi = p["dw_rows"]
        padded[:, lo:pads[0]].fill(0)
        padded[:, pads[0] + H:hi].fill(0)
        padded[:, pads[0]:pads[0] + H, :pads[1]].fill(0)
        padded[:, pads[0]:pads[0] + H, pads[1] + W:].fill(0)
        inside = padded[:, pads[0]:pads[0] + H, pads[1]:pads[1] + W]
    for i in range(p["N"]):
        if any(pads):
            np.copyto(inside, x[i])
            img, img_token = padded, pad_token
        else:
            img, img_token = x[i], x[i].ctypes.data
        yi = y[i].reshape(p["C"], p["cog"], Ho * Wo)
        # Views are made once per thread, image and buffers: numpy's indexing costs microseconds each.
        # The bound entry holds the arrays and weights it names, so no other can take their addresses.
        token = (cols_token, img_token, img.strides, yi.ctypes.data, id(packed))
        key = (threading.get_ident(), i)
        bound = p["dw_bound"].get(key)
        if bound is None or bound[0] != token:
            bound = p["dw_bound"][key] = (token, _bind(p, packed, cols, img, yi), packed)
        for dst, src, ones, wt, c, out in bound[1]:
            np.copyto(dst, src)
            ones.fill(1)  # the row of ones that carries the bias
            np.matmul(wt, c, out=out)
        if act is not None:  # on the whole image: a tile's rows are strided views, several times slower
            act(y[i])


def _bind(p, packed, cols, img, yi) -> list:
    """Per tile: the strided source over the (padded) image, its column block, weights and output rows."""
    (kh, kw), (sh, sw), (dh, dw) = p["kernel"], p["strides"], p["dils"]
    Wo = p["outs"][1]
    cs, rs, es = img.strides
    views = []
    for c0, c1, r0, r1, ka, kb in p["dw_tiles"]:
        nc, nr, taps = c1 - c0, r1 - r0, (kb - ka) * kw
        c = cols[: nc * (taps + 1) * nr * Wo].reshape(nc, taps + 1, nr * Wo)
        src = as_strided(img[c0:, r0 * sh + ka * dh:], shape=(nc, kb - ka, kw, nr, Wo),
                         strides=(cs, dh * rs, dw * es, sh * rs, sw * es), writeable=False)
        dst = c[:, :taps].reshape(nc, kb - ka, kw, nr, Wo)
        wt = _weights(packed, kh, kw, ka, kb)[c0:c1]
        views.append((dst, src, c[:, taps], wt, c, yi[c0:c1, :, r0 * Wo:r1 * Wo]))
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
