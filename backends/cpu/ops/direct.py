"""Conv's direct path: the compiled tile loop (tiles.conv) over the input itself, no column matrix.

For a 2-D conv of one group in float32, with any kernel, stride (the same along both axes), dilation and
padding. The input is laid out once a run so that each kernel tap reads a contiguous run of output positions
(planes.conv_input: zero padding around each channel, then its s x s stride phases); a 1x1 conv of stride 1
without padding reads its input as it is. Output positions run along the padded rows, so a tap at kernel
row ky and column kx is one offset into that layout, and the tile loop's sums for a tile of channels x
positions (vectors.conv_tile) stay in registers over all the taps. Bias and the fused activation are applied
as a tile leaves the registers, and the padding columns are dropped there.

A map of few output positions (CHANNEL_POSITIONS an image: YOLOv8n's 10 x 10 maps, rec's 1 x 40) takes the other
tile loop instead, tiles.channels: the output channels along the vectors and a block of positions broadcast from
the same layout, so that its tiles hold only real positions (a 10 x 10 map with padded rows of 12 filled 3 tiles of
48 for 100 positions), its weights streamed once a tile with prefetches, as the dense product's are.

The loops hold no GIL, so a conv's pieces run at once, on the crew of workers (crew.py). While the loops compile
(jit.py), Conv's numpy paths serve.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .. import jit, vectors
from ..threads import shared_scratch
from .dtypes import image_blocks
from .products import column_panels

F32 = np.float32
#: A piece of a conv holds at least this many multiply-adds: on the crew held through a run, pieces of a quarter
#: of the earlier 1 << 21 let YOLOv8n's small convs take more of 16 threads (benchmarks/RESULTS.md, session 26).
PIECE_MACS = 1 << 19
#: Bytes of packed weights that a group of channels takes at most (L2 is 512 KiB a core on the 2-core VM).
WEIGHTS_IN_L2 = 1 << 18
#: An input of fewer values than this is laid out by the calling thread alone: on the crew held through a run,
#: YOLOv8n at 2 threads ran 5-7% faster with its inputs above this laid out by every thread, than above the
#: earlier 1 << 17 (benchmarks/RESULTS.md, session 26).
LAYOUT_ELEMENTS = 1 << 14


def plan(p: dict[str, Any], group: int) -> bool:
    """The layout and tap offsets of the direct path, into p["direct"], for a conv it serves."""
    if p["n"] != 2 or group != 1 or p["cdt"] != F32 or p["loop_act"] is None or p["strides"][0] != p["strides"][1]:
        return False
    MR, NR = vectors.conv_tile()
    C, (H, W), (kh, kw), (dh, dw), s = p["C"], p["spatial"], p["kernel"], p["dils"], p["strides"][0]
    (Ho, Wo), (pt, pl, pb, pr) = p["outs"], p["pads"]
    if p["path"] == "pointwise":  # the input is already the layout: a tap is a channel
        rw, xs, layout, hq = W, C * H * W, None, H
        offs = np.arange(C, dtype=np.uint64) * np.uint64(H * W)
    else:
        hq, wq = -(-(H + pt + pb) // s), -(-(W + pl + pr) // s)
        ci, ky, kx = np.meshgrid(np.arange(C), np.arange(kh) * dh, np.arange(kw) * dw, indexing="ij")
        offs = ((((ci * s + ky % s) * s + kx % s) * hq + ky // s) * wq + kx // s).reshape(-1).astype(np.uint64)
        rw = wq
        # Room for the last tile's reads past the last plane, so that it takes the fast way too.
        xs = -(-max(C * s * s * hq * wq, int(offs[-1]) + Ho * wq + NR) // NR) * NR
        layout = (C, H, W, pt, pl, s, hq, wq)
    macs = p["co"] * offs.shape[0] * Ho * Wo
    last = (Ho - 1) * rw + Wo
    p["direct"] = dict(
        offs=offs, layout=layout, hq=hq, macs=macs, rw=rw, last=last, xs=xs,
        # the loop's fixed arguments: the layout's image stride, the farthest tap, row and output widths
        fixed=(xs, offs, int(offs.max())), widths=(rw, Wo),
        groups=_groups(-(-p["co"] // MR), offs.shape[0], 1),
        # for split: an image's tiles, the channel blocks, the taps and the bytes of an image's input
        tiles=-(-last // NR), blocks=-(-p["co"] // MR), taps=offs.shape[0], x_bytes=4 * C * H * W,
        # the output channels along the vectors (tiles.channels) for a map of few positions
        channels=Ho * Wo <= CHANNEL_POSITIONS and p["co"] >= vectors.dense_tile()[1]
        and p["N"] * Ho * Wo >= vectors.dense_tile()[0])
    return True


def positions(d: dict[str, Any], images: int, co: int, outs: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """For tiles.channels: where each output position's taps start in the layout of `images` images, and its
    index in the flat output (channel 0), image by image; made once for each count of images."""
    found = d.setdefault("positions", {}).get(images)
    if found is None:
        (ho, wo), U = outs, np.uint64
        n, oy, ox = np.meshgrid(np.arange(images, dtype=U), np.arange(ho, dtype=U), np.arange(wo, dtype=U),
                                indexing="ij")
        found = d["positions"][images] = ((n * U(d["xs"]) + oy * U(d["rw"]) + ox).reshape(-1),
                                          (n * U(co * ho * wo) + oy * U(wo) + ox).reshape(-1))
    return found


#: A conv of at most this many output positions an image takes tiles.channels: on the VM, one thread, its 10 x 10
#: maps (pointwise, 3x3, stride 2 onto 10 x 10) ran in 0.72-0.86 of the tile loop's time, caches warm or not, and
#: its 20 x 20 and bigger maps in 0.9-1.7 (benchmarks/RESULTS.md, session 36).
CHANNEL_POSITIONS = 144


def panels(packed: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """The weights as tiles.channels reads them, (panel, tap, DC) (the last panel ending at the last channel), and
    the bias (zeros where there is none), made once per weight."""
    found = packed.get("channels")
    if found is None:
        w = packed["w"][0]  # (co, taps), taps in (channel, kernel row, kernel column) order
        bias = np.zeros(w.shape[0], F32) if packed["b"] is None else np.ascontiguousarray(packed["b"], F32)
        found = packed["channels"] = (column_panels(w.T, vectors.dense_tile()[1]), bias)
    return found


def pack(packed: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """The weights as [channel block, tap, MR] and the bias padded to whole blocks, made once per weight."""
    found = packed.get("direct")
    if found is None:
        MR = vectors.conv_tile()[0]
        w = packed["w"][0]  # (co, taps), taps in (channel, kernel row, kernel column) order
        co, taps = w.shape
        blocks = -(-co // MR)
        wp = np.zeros((blocks * MR, taps), F32)
        wp[:co] = w
        bias = np.zeros(blocks * MR, F32)
        if packed["b"] is not None:
            bias[:co] = packed["b"]
        found = packed["direct"] = (np.ascontiguousarray(wp.reshape(blocks, MR, taps).transpose(0, 2, 1)), bias)
    return found


def run(x: np.ndarray, y: np.ndarray, p: dict[str, Any], packed: dict[str, Any]) -> Callable[[], Any] | None:
    """y = act(conv(x)) by the tile loop (tiles.channels where the plan says) for a plan it serves. Returns the
    same work as a call to make again on the same x and y (it returns True; its `bounds()` gives its jobs for the
    calling thread, replay.py), None (nothing done) while the loops compile, or where y is not contiguous.

    The crew's threads and this one lay the input out, in jobs of rows, then share the chunks of the tile loop:
    runs of tiles (of every image), each for a group of the channels (groups where there are fewer tiles than
    threads). An input of fewer than LAYOUT_ELEMENTS values is laid out by this thread alone: more threads take
    longer over it than one, where the tiles still gain."""
    d = p["direct"]
    layout = d["layout"]
    tiles = jit.jitted("conv_channels" if d["channels"] else "conv_tiles")
    lay = jit.jitted("conv_input") if layout is not None else None
    if tiles is None or (layout is not None and lay is None) or not y.flags.c_contiguous:
        return None
    N = p["N"]
    if x.flags.c_contiguous:
        xf = x.reshape(N, -1)
    elif layout is not None and image_blocks(x):
        # A piece of a batch (a Split's view along the channels): each image's block is contiguous, a stride
        # apart. The layout reads the first C*H*W values of each row of xf, the rows a stride long.
        stride = x.strides[0] // x.itemsize
        xf = np.lib.stride_tricks.as_strided(x, (N, stride), (x.strides[0], x.itemsize))
    else:
        return None
    pieces = jit.product_pieces(d["macs"] * N, PIECE_MACS)
    if d["channels"]:
        bind = _channels(tiles, d, p, packed, y, pieces)
    else:
        xs, offs, far = d["fixed"]
        code, alpha, beta = p["loop_act"]
        w, bias = pack(packed)
        ys = y.reshape(N, p["co"], -1)
        MR, NR = vectors.conv_tile()
        runs, groups = split(d, N, pieces)
        scratch = d.get("scratch")  # each piece's tile of sums and output runs, kept with the plan
        if scratch is None or scratch[1].shape[0] != pieces:
            scratch = d["scratch"] = (np.empty((pieces, w.shape[0] * MR * NR), F32),
                                      np.empty((pieces, NR, 3), np.uint64))
        rest = (ys, *d["widths"], 0, N, 0, d["last"], code, alpha, beta, runs * groups, groups, *scratch)

        def bind(src: np.ndarray) -> Any:
            return tiles.bind(pieces, src.reshape(-1), xs, offs, far, w, bias, *rest)

    lay_pieces = pieces if x.size >= LAYOUT_ELEMENTS else 1
    shape = (N, d["xs"])
    jobs = jit.Binds()

    def make(src: np.ndarray) -> tuple:
        """The layout's job and the tiles', for the layout's buffer."""
        return None if layout is None else lay.bind(lay_pieces, xf, src, *layout, 0, N, 0, d["hq"]), bind(src)

    def bounds() -> tuple:
        # The layout's buffer is the calling thread's own, fetched each time.
        laid, tiled = jobs.get((xf if layout is None else shared_scratch("direct", shape, F32)[0],), make)
        return (tiled,) if laid is None else (laid, tiled)

    def call() -> bool:
        for job in bounds():
            job()
        return True

    call.bounds = bounds  # replay.py runs the jobs of consecutive steps as one chain
    call()
    return call


def _channels(loop: Any, d: dict[str, Any], p: dict[str, Any], packed: dict[str, Any], y: np.ndarray,
              pieces: int) -> Callable[[np.ndarray], Any]:
    """The binding of tiles.channels' job to a layout's buffer, for direct.run: its pieces, no more than its
    (panel, block of positions) jobs, each with its scratch (kept with the plan)."""
    DR, DC = vectors.dense_tile()
    wp, bias = panels(packed)
    pos, outs = positions(d, p["N"], p["co"], p["outs"])
    pieces = max(1, min(pieces, wp.shape[0] * -(-pos.shape[0] // DR)))
    scratch = d.get("channel_scratch")
    if scratch is None or scratch[1].shape[0] != pieces:
        scratch = d["channel_scratch"] = np.empty((pieces, DR * DC), F32), np.empty((pieces, DR), np.uint64)
    offs = d["fixed"][1]
    plane = p["outs"][0] * p["outs"][1]
    return lambda src: loop.bind(pieces, src.reshape(-1), offs, wp, bias, y.reshape(-1), pos, outs, plane,
                                 *p["loop_act"], *scratch)


def split(d: dict[str, Any], images: int, pieces: int) -> tuple[int, int]:
    """(runs, groups): how the tile loop's pieces share a conv of `images` images. Chunk c is run c // groups of
    the tiles (of every image) for group c % groups of the channel blocks, and each piece takes a run of
    consecutive chunks; so a piece computes its chunks' tiles x blocks, reads the weights of the groups it meets
    and the input of the runs it meets. Of the splits with groups of weights that stay in L2 (d["groups"] at
    least), the one whose busiest piece costs least, multiply-adds and bytes read from past L2 together. A conv
    of few positions and many channels (YOLOv8n's at 10 x 10: 3 tiles, 16 or 32 blocks) thus shares its channels,
    each piece reading its share of the weights, where splitting 3 tiles in 2 runs gave one thread twice the
    other's work and both every weight."""
    key = (images, pieces)
    found = d.setdefault("splits", {}).get(key)
    if found is None:
        found = d["splits"][key] = _best_split(images * d["tiles"], d["blocks"], d["groups"], pieces,
                                               d["taps"], d["x_bytes"] * images)
    return found


#: What a byte read from past L2 costs, in multiply-adds of the tile loop (about 40 G multiply-adds and 8 GB
#: a second a core on the VM).
BYTE_MACS = 5


def _best_split(tiles: int, blocks: int, least: int, pieces: int, taps: int, x_bytes: int) -> tuple[int, int]:
    """The (runs, groups) of split, of those with up to four chunks a piece (each piece's cost in O(1): the tiles
    of runs [0, r) are r * tiles // runs, and the blocks of groups [0, q) are q * blocks // groups)."""
    MR, NR = vectors.conv_tile()
    unit, w_bytes, x_tile = MR * NR * taps, MR * taps * 4, x_bytes / tiles
    best, choice = None, (1, least)
    for runs in range(1, min(tiles, 4 * pieces) + 1):
        for groups in range(least, max(least, min(blocks, 4 * pieces // runs)) + 1):
            chunks = runs * groups
            if chunks < pieces and (runs < tiles or groups < blocks):
                continue
            cost = 0.0
            for p in range(pieces):
                a, b = p * chunks // pieces, (p + 1) * chunks // pieces
                if a == b:
                    continue
                r0, r1 = a // groups, (b - 1) // groups + 1
                met_x = r1 * tiles // runs - r0 * tiles // runs
                q0, n = a % groups, b - a
                if n >= groups:
                    met_w = blocks
                elif q0 + n <= groups:
                    met_w = (q0 + n) * blocks // groups - q0 * blocks // groups
                else:
                    met_w = blocks - q0 * blocks // groups + (q0 + n - groups) * blocks // groups
                units = _done(b, tiles, blocks, runs, groups) - _done(a, tiles, blocks, runs, groups)
                cost = max(cost, units * unit + BYTE_MACS * (met_w * w_bytes + met_x * x_tile))
            if best is None or cost < best:
                best, choice = cost, (runs, groups)
    return choice


def _done(c: int, tiles: int, blocks: int, runs: int, groups: int) -> int:
    """The tile x block units of chunks [0, c) under split's chunking."""
    r, q = divmod(c, groups)
    return r * tiles // runs * blocks + ((r + 1) * tiles // runs - r * tiles // runs) * (q * blocks // groups)


def _groups(blocks: int, taps: int, threads: int) -> int:
    """Groups of the weights' channel blocks for the tile loop: at least one for each thread that the runs of
    tiles leave idle, and enough that a group's weights stay in L2 while the loop takes its tiles one after
    another (weights read again for every tile from past L2 starve the loop)."""
    return max(1, min(blocks, max(threads, -(-blocks * taps * vectors.conv_tile()[0] * 4 // WEIGHTS_IN_L2))))
