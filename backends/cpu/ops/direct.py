"""Conv's direct path: the compiled tile loop (tiles.conv) over the input itself, no column matrix.

For a 2-D conv of one group in float32, with any kernel, stride (the same along both axes), dilation and
padding. The input is laid out once a run so that each kernel tap reads a contiguous run of output positions
(loops.conv_input: zero padding around each channel, then its s x s stride phases); a 1x1 conv of stride 1
without padding reads its input as it is. Output positions run along the padded rows, so a tap at kernel
row ky and column kx is one offset into that layout, and the tile loop's sums for a tile of channels x
positions (vectors.conv_tile) stay in registers over all the taps. Bias and the fused activation are applied
as a tile leaves the registers, and the padding columns are dropped there.

The loop holds no GIL, so a conv's pieces run at once: on the crew of workers (crew.py), else on numba's threads
(the loop's parallel build, while the crew's loops compile), else on the runtime's helper threads (see run).
While the loop compiles (jit.py), Conv's numpy paths serve.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np

from .. import jit, vectors
from ..threads import SLICE_ELEMENTS, parallel, shared_scratch

F32 = np.float32
#: A piece of a conv holds at least this many multiply-adds: each must outlast a helper's late start
#: (benchmarks/RESULTS.md, "Piece sizes").
PIECE_MACS = 1 << 21
#: Bytes of packed weights that a group of channels takes at most (L2 is 512 KiB a core on the 2-core VM).
WEIGHTS_IN_L2 = 1 << 18


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
    u = np.uint64
    last = (Ho - 1) * rw + Wo
    p["direct"] = dict(
        offs=offs, layout=layout, hq=hq, macs=macs, rw=rw, last=last, xs=xs,
        reach=dh * (kh - 1) // s + 1,  # plane rows that a band of output rows reads past its last, plus one
        # the loop's fixed arguments: the layout's image stride, the farthest tap, row and output widths
        fixed=(u(xs), offs, u(offs.max())), widths=(u(rw), u(Wo)),
        groups=_groups(-(-p["co"] // MR), offs.shape[0], 1))
    return True


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
    """y = act(conv(x)) by the tile loop for a plan it serves. Returns the same work as a call to make again on
    the same x and y (it returns something true where it did), None (nothing done) while the loop compiles.

    On the crew (_on_crew), its workers and this thread take the layout's jobs and the tiles' pieces as numba's
    threads would. With the loop's parallel build, numba's threads each take an equal run of tiles (of every
    image) for a group of the channels (groups where there are fewer tiles than threads), and they spin a while
    between loops instead of sleeping, so the next conv finds them awake; the same threads make the layout first,
    in jobs of rows (this thread alone, for a small input). Without either (compiling, no TBB, a forked child),
    pieces go to the runtime's helper threads: whole images, or bands of output rows that lay out the input rows
    they read (rows that neighbours read too are written by both, with the same values)."""
    d = p["direct"]
    layout = d["layout"]
    serial = jit.jitted("conv_tiles")
    lay = jit.jitted("conv_input") if layout is not None else None
    if serial is None or (layout is not None and lay is None) or not x.flags.c_contiguous:
        return None
    w, bias = pack(packed)
    N = p["N"]
    xf = x.reshape(N, -1)
    xl = xf if layout is None else shared_scratch("direct", (N, d["xs"]), F32)[0]
    ys = y.reshape(N, p["co"], -1)
    xs, offs, far = d["fixed"]
    code, alpha, beta = p["loop_act"]
    u = np.uint64

    def tiles(fn, first: int, last: int, p_first: int, p_last: int, chunks: int, groups: int) -> None:
        fn(xl.reshape(-1), xs, offs, far, w, bias, ys, *d["widths"], u(first), u(last), u(p_first), u(p_last),
           code, alpha, beta, chunks, groups)

    last = d["last"]
    pieces = jit.product_pieces(d["macs"] * N, PIECE_MACS)
    crewed = _on_crew(xf, ys, w, bias, p, pieces)
    if crewed is not None:
        crewed()
        return crewed
    if pieces == 1 or jit.threaded("conv_tiles", pieces) is not None:
        # One call of the loop, on numba's threads or on this one, bound to its arguments and builds: the caller
        # may repeat it for the same x and y (planned buffers) without the lookups above, as jit.split's and
        # products.dense's repeats do. The layout's scratch is fetched again each time (it belongs to the calling
        # thread).
        runs = min(pieces, N * -(-last // vectors.conv_tile()[1]))
        groups = max(d["groups"], min(w.shape[0], pieces // runs))
        shape, tail = (N, d["xs"]), d["widths"] + (u(0), u(N), u(0), u(last), code, alpha, beta, runs * groups, groups)

        loop = serial if pieces == 1 else jit.threaded("conv_tiles", pieces)
        # An input of fewer than SLICE_ELEMENTS values is laid out by this thread alone: numba's threads took
        # longer over it than one thread (benchmarks/RESULTS.md, session 23), where the tiles still gain. A larger
        # one on numba's threads too, in jobs of rows: laid out on this thread instead, it ran while they spun
        # after the last loop, far slower (session 20).
        lay_pieces = pieces if x.size >= SLICE_ELEMENTS else 1
        lay_parallel = None  # the layout's parallel build, looked up until it is compiled

        def call() -> bool:
            nonlocal lay_parallel
            if pieces > 1:
                jit.use_threads(pieces)  # numba's thread count is this thread's own: other steps set theirs
            src = xf
            if layout is not None:
                src = shared_scratch("direct", shape, F32)[0]
                if lay_parallel is None and lay_pieces > 1:
                    lay_parallel = jit.threaded("conv_input", lay_pieces)
                (lay_parallel or lay)(xf, src, *layout, 0, N, 0, d["hq"])
            loop(src.reshape(-1), xs, offs, far, w, bias, ys, *tail)
            return True

        call()
        return call
    again = functools.partial(run, x, y, p, packed)  # on the helpers: the whole choice again, next time
    groups = d["groups"]
    if pieces == 1 or N >= pieces:
        per = -(-N // pieces)

        def images(k: int) -> None:
            lo, hi = k * per, min(N, (k + 1) * per)
            if layout is not None:
                lay(xf, xl, *layout, lo, hi, 0, d["hq"])
            tiles(serial, lo, hi, 0, last, groups, groups)

        parallel(-(-N // per), images)
        return again
    Ho, rw = p["outs"][0], d["rw"]
    rows = -(-Ho // pieces)

    def band(k: int) -> None:
        r0, r1 = k * rows, min(Ho, (k + 1) * rows)
        if layout is not None:
            lay(xf, xl, *layout, 0, N, r0, min(d["hq"], r1 + d["reach"]))
        tiles(serial, 0, N, r0 * rw, min(last, r1 * rw), groups, groups)

    parallel(-(-Ho // rows), band)
    return again


def _on_crew(xf: np.ndarray, ys: np.ndarray, w: np.ndarray, bias: np.ndarray, p: dict[str, Any],
             pieces: int) -> Callable[[], bool] | None:
    """The conv in `pieces` pieces on the crew of workers (crew.py: started in microseconds, where numba's
    parallel loops took tens at 16 threads), layout and tiles, as a call to make again on the same x and y;
    None while the crew's loops compile (or for few pieces: jit.crew). The jobs are made once for the plan and
    pointed at each call's x and y (a conv whose input is not a planned buffer comes here every run)."""
    crew = jit.crew(pieces)
    if crew is None:
        return None
    made = p.get("crew")
    if made is None or made[0] != (pieces, xf.shape):
        jobs = _crew_jobs(crew, xf, ys, w, bias, p, pieces)
        if jobs is None:
            return None
        made = p["crew"] = ((pieces, xf.shape), *jobs)
    _, tiles, layout, serial_layout = made
    shape, d, N = (p["N"], p["direct"]["xs"]), p["direct"], p["N"]

    def call() -> bool:
        tiles.point(4, ys)
        if d["layout"] is None:
            tiles.point(0, xf)
        else:
            src = shared_scratch("direct", shape, F32)[0]  # the calling thread's own, fetched each time
            if layout is None:  # small: laid out by this thread alone (as in run)
                serial_layout(xf, src, *d["layout"], 0, N, 0, d["hq"])
            else:
                layout.point(0, xf)
                layout.point(1, src)
                layout()
            tiles.point(0, src)
        return tiles()

    return call


def _crew_jobs(crew: Any, xf: np.ndarray, ys: np.ndarray, w: np.ndarray, bias: np.ndarray, p: dict[str, Any],
               pieces: int) -> tuple[Any, Any, Any] | None:
    """The tile loop's job, the layout's (None for none, or a small input laid out by the calling thread) and the
    layout's serial loop, for the crew; None while their loops compile."""
    tile_piece, layout_piece = jit.jitted("conv_piece"), jit.jitted("conv_input_piece")
    serial_layout = jit.jitted("conv_input")
    if tile_piece is None or layout_piece is None or serial_layout is None:
        return None
    d, N = p["direct"], p["N"]
    xs, offs, far = d["fixed"]
    code, alpha, beta = p["loop_act"]
    MR, NR = vectors.conv_tile()
    runs = min(pieces, N * -(-d["last"] // NR))
    groups = max(d["groups"], min(w.shape[0], pieces // runs))
    chunks = runs * groups
    sums = np.empty((chunks, w.shape[0] * MR * NR), F32)
    spans = np.empty((chunks, NR, 3), np.uint64)
    x = np.empty(N * d["xs"], F32)  # a stand-in: each call points the job at its x or its layout
    tiles = crew.job(tile_piece, [x, offs, w, bias, ys, sums, spans, np.array([alpha, beta], F32), int(xs),
                                  int(far), *map(int, d["widths"]), 0, N, 0, d["last"], code, chunks, groups], chunks)
    layout, hq = d["layout"], d["hq"]
    if layout is None or xf.size < SLICE_ELEMENTS:
        return tiles, None, serial_layout
    from .. import planes  # loaded by now: the crew's loops were compiled from it

    jobs = planes.layout_jobs.py_func(layout[0], layout[5], hq, 0, N, 0, hq)
    return tiles, crew.job(layout_piece, [xf, np.empty((N, d["xs"]), F32), *layout, 0, N, 0, hq], jobs), serial_layout


def _groups(blocks: int, taps: int, threads: int) -> int:
    """Groups of the weights' channel blocks for the tile loop: at least one for each thread that the runs of
    tiles leave idle, and enough that a group's weights stay in L2 while the loop takes its tiles one after
    another (weights read again for every tile from past L2 starve the loop)."""
    return max(1, min(blocks, max(threads, -(-blocks * taps * vectors.conv_tile()[0] * 4 // WEIGHTS_IN_L2))))
