"""Winograd F(4x4, 3x3) convolution: the path conv.py takes for 2-D 3x3 convs of stride and dilation 1 with
enough channels (per group) on big enough maps.

Each 4x4 output tile comes from a 6x6 tile of the padded input d: with V = BT d BT' the transformed input tile
and U = G g G' the transformed 3x3 filter g, the tile is AT (sum over input channels of U * V) AT'. The sum
over channels is, for each of the 36 tile positions, one GEMM (Co x Ci) @ (Ci x tiles): 36/16 multiply-adds per
output and channel pair instead of 9. The filters are transformed once per constant weight (at each run for a
weight that is a graph input), in float64, then rounded to float32.

The transforms are small GEMMs too. The padded input rows are (tiles per row + 1) * 4 wide, so that a tile
column of every channel and row is one strided slice: the tile rows of a block are gathered into (6, channels x
rows x width) and transformed along the rows by one product with BT, then gathered by tile column (one strided
copy) and transformed along the columns. The extra tile of each row wraps around into the next; like im2col's
wrapped columns, it is computed and dropped. The bias is added at one tile position (that of point 1, which AT
spreads to every output); AT along the tile rows and then along the columns (as the right-hand factor) leaves
the tiles as rows of the output, finished (fused activation, SiLU from the negated filters as in products.py)
and copied into it. Work goes in blocks of tile rows whose buffers stay in cache. The blocks are planned for
the shape alone: the BLAS rounds a product differently for other widths, so blocks sized by the thread count
would make the result depend on it. Any thread computes a block the same way.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from .. import jit
from ..threads import parallel, shared_scratch
from .dtypes import image_blocks, same
from .products import SILU_CHUNK, silu_negated

#: Output tile size. F(2, 3) moves 4x the input through its transforms where F(4, 3) moves 2.25x, and was never
#: faster than im2col; F(6, 3) was no faster than F(4, 3) and 3-4x as far from an exact conv (benchmarks/RESULTS.md,
#: "Winograd tile sizes").
M = 4
T = M + 2
#: Toom-Cook interpolation points of F(4, 3), besides infinity; the bias goes at the tile position of point 1.
POINTS = (0, 1, -1, 2, -2)
BIAS_AT = 1 * T + 1

#: Winograd only where it beat im2col (conv.py): outputs at least MIN_SIDE on each side and per group
#: ci * co / (ci + co) of at least MIN_CHANNELS. Its transforms cost about as much per input and output element
#: as im2col's copies of 9 taps, so it wins on big GEMMs only. F(4, 3) / im2col kernel time, one thread (2 cores,
#: noisy VM, medians of 12 interleaved rounds, repeated): 64->64 channels 40x40 0.69-0.77, 128->64 20x20
#: 0.73-0.90, 128->128 20x20 0.75, 48->48 40x40 0.85, 96->24 (19.2) 40x40 0.88, 80x80 0.94, 160x160 0.99 (in det,
#: two threads: 0.8-0.9 at 40x40 to 160x160, 0.8-1.15 at 20x20 where one thread gave 1.21), 64->64 20x20
#: 0.94-1.01 (in yolov8n 0.86-1.00); below the bars: 32->32 (16) 40x40 0.92-1.04, 16->16 80x80 1.30, 128->128
#: 10x10 1.16-1.36, 256->64 10x10 1.13-1.46, 64->64 10x10 1.54-1.69. yolov8n took 0.88x the time, det 0.94x.
MIN_SIDE = 20
MIN_CHANNELS = 19
#: The compiled loops (looped) take the convs of this path whose ci * co / (ci + co) is at least this: on one thread
#: they took 0.6-0.7 of the tile loop's time for 64 -> 64 and 128 -> 128 channels, 0.82 for 48 -> 48, and 1.0-1.1
#: for 32 -> 32 (benchmarks/RESULTS.md, session 27).
LOOPED_CHANNELS = 24
#: ... and at least this many tiles of 4 x 4 outputs in all (the products' rows): YOLOv8n's 10 x 10 maps (9 tiles an
#: image) ran 3% slower through the loops at batch 1, 1-2.5% faster at batch 8 (benchmarks/RESULTS.md, session 27).
LOOPED_TILES = 16
#: ... and whose transformed tiles and products (36 x tiles x (ci + co) floats, held at once) take at most this
#: many bytes: bigger maps keep the tile loop, whose memory does not grow with them.
LOOPED_BYTES = 1 << 25


@functools.cache
def transforms() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(AT, G, BT) of F(4, 3), from Toom-Cook over POINTS: with E(n) the 6 x n matrix that evaluates a polynomial
    of n coefficients at the points and infinity, correlation is y = E(4)' ((E(3) g) * (E(6)^-T d)). Each row
    of BT is scaled to have 1 as its smallest nonzero entry, G's by the inverse: BT then holds small integers
    (rounded off the inverse's float64 error), so that the input transform adds no rounding of its own."""
    pts = np.array(POINTS, np.float64)

    def evaluation(n: int) -> np.ndarray:
        return np.vstack([pts[:, None] ** np.arange(n), np.eye(n)[-1:]])

    bt = np.linalg.inv(evaluation(T)).T
    scale = np.array([np.abs(r[np.abs(r) > 1e-9]).min() for r in bt])
    return evaluation(M).T, evaluation(3) * scale[:, None], np.round(bt / scale[:, None])


def filters(packed: dict[str, Any], cg: int, negate: bool) -> np.ndarray:
    """The conv's packed filters transformed, (groups, 36, Co/group, Ci/group) float32 (negated for SiLU); made
    once per packed weights."""
    key = ("winograd", negate)
    u = packed.get(key)
    if u is None:
        w = packed["w"].astype(np.float64)  # (groups, Co/group, Ci/group * 9)
        groups, cog = w.shape[:2]
        g = transforms()[1]
        u = np.einsum("ak,zockl,bl->zaboc", g, w.reshape(groups, cog, cg, 3, 3), g).reshape(groups, T * T, cog, cg)
        u = packed[key] = np.ascontiguousarray(-u if negate else u, np.float32)
    return u


def _fits(p: dict[str, Any]) -> bool:
    """A conv (conv.py's plan) that F(4x4, 3x3) computes: 2-D, 3x3, stride and dilation 1, in float32."""
    return (p["n"] == 2 and p["kernel"] == [3, 3] and p["strides"] == [1, 1] and p["dils"] == [1, 1]
            and p["cdt"] == np.float32)


def plan(p: dict[str, Any], tile: int) -> bool:
    """Take this path for the conv planned in p (conv.py's plan) if it fits and gains: sets p["path"], the GEMM
    work per image p["work"] and the blocks of tile rows, whose largest buffer holds about `tile` elements."""
    cg, cog, C = p["cg"], p["cog"], p["C"]
    if not (_fits(p) and min(p["outs"]) >= MIN_SIDE and cg * cog >= MIN_CHANNELS * (cg + cog)):
        return False
    ho, wo = p["outs"]
    th, tq = -(-ho // M), -(-wo // M) + 1  # tile rows, tiles per row with the one that wraps
    rows = max(1, min(th, tile // max(T * C * tq * M, T * T * max(C, p["co"]) * tq)))
    at, _, bt = transforms()
    p.update(path="winograd", tq=tq, padded=(C, th * M + 2, tq * M), work=T * T * cg * p["co"] * th * tq,
             blocks=[(i0, min(th, i0 + rows)) for i0 in range(0, th, rows)], at=at.astype(np.float32),
             at_t=np.ascontiguousarray(at.T, np.float32), bt=bt.astype(np.float32), views={})
    return True


def run(x: np.ndarray, y: np.ndarray, p: dict[str, Any], packed: dict[str, Any], act, silu: bool,
        split: bool) -> None:
    """y = act(conv(x) + bias) for float32 x and y of the planned shapes; each image's blocks shared with the
    runtime's threads if split."""
    co, blocks = p["co"], p["blocks"]
    ho, wo = p["outs"]
    at, at_t, bt = p["at"], p["at_t"], p["bt"]
    u = filters(packed, p["cg"], silu)
    bias = None if packed["b"] is None else packed["b"].reshape(co, 1)
    add_bias = np.subtract if silu else np.add  # a product of negated filters holds -z
    xp, xp_token = shared_scratch("winograd.padded", p["padded"], np.float32)
    pt, pl = p["pads"][0], p["pads"][1]
    h, w = x.shape[2:]
    for border in (xp[:, :pt], xp[:, pt + h:], xp[:, :, :pl], xp[:, :, pl + w:]):
        border.fill(0)

    def block(n: int, k: int) -> None:
        i0, i1 = blocks[k]
        rows_src, gath, rt, past, cols_src, d, v, groups, mm, pu, pu_t, q, q3, chunks = _views(p, xp, xp_token, i0, i1)
        # The input tiles: gathered and transformed by BT along the rows, then the same along the columns.
        np.copyto(gath.reshape(rows_src.shape), rows_src)
        np.matmul(bt, gath, out=rt)
        past.fill(0)  # read by the last tile, which is dropped: no stale inf or nan there to warn about
        np.copyto(d, cols_src)
        np.matmul(bt, d, out=v)
        for uz, vz, mz in zip(u, *groups):  # each group's 36 GEMMs
            np.matmul(uz, vz, out=mz)
        if bias is not None:
            add_bias(mm[BIAS_AT], bias, out=mm[BIAS_AT])
        # The output tiles: AT along the rows, then along the columns, finished, copied into the output.
        np.matmul(at, mm.reshape(T, -1), out=pu)
        np.matmul(pu_t, at_t, out=q3)
        if silu:
            silu_negated(chunks)
        elif act is not None:
            act(q)
        y0, y1 = M * i0, min(ho, M * i1)
        for r in range(M):  # q[r] holds output rows y0 + r, y0 + r + 4, ...
            out = y[n, :, y0 + r:y1:M]
            np.copyto(out, q[r, :, : out.shape[1], :wo])

    for n in range(x.shape[0]):
        np.copyto(xp[:, pt:pt + h, pl:pl + w], x[n])
        if split:
            parallel(len(blocks), functools.partial(block, n))
        else:
            for k in range(len(blocks)):
                block(n, k)


def _views(p: dict[str, Any], xp: np.ndarray, xp_token: int, i0: int, i1: int) -> tuple:
    """The views that the block of tile rows i0..i1-1 works through, over the padded input xp and this thread's
    scratch; made once per thread and buffers, since numpy's indexing costs microseconds each."""
    tq, C, co, cg, cog = p["tq"], p["C"], p["co"], p["cg"], p["cog"]
    r, wq = i1 - i0, tq * M
    tiles = r * tq
    size = max(T * C * wq * r, T * T * max(C, co) * tiles) + T  # + T: the last tile column reads past the end
    a, a_token = shared_scratch("winograd.a", (size,), np.float32)
    b, b_token = shared_scratch("winograd.b", (size,), np.float32)
    e, e_token = shared_scratch("conv.exp", (min(SILU_CHUNK, M * co * tiles * M),), np.float32)
    token = (xp_token, a_token, b_token, e_token)
    mine = p["views"].setdefault(threading.get_ident(), {})
    found = mine.get((i0, i1))
    if found is not None and found[0] == token:
        return found[1]
    s0, s1, s2 = xp.strides
    it = a.itemsize
    # The 6 rows of each tile row, (6, C, r, wq), gathered into a, transformed into b.
    rows_src = as_strided(xp[:, M * i0:], (T, C, r, wq), (s1, s0, M * s1, s2), writeable=False)
    gath = a[: T * C * r * wq].reshape(T, -1)
    rt = b[: gath.size].reshape(T, -1)
    # Position c of tile column j starts at c + 4 j of a transformed row: (6, 6, C x r x tq), into a, then b. The
    # last tile reads up to 6 elements past the rows.
    cols_src = as_strided(b, (T, T, C * tiles), (rt.strides[0], it, M * it), writeable=False)
    d = a[: T * T * C * tiles].reshape(T, T, -1)
    v = b[: d.size].reshape(T, T, -1)
    v3 = v.reshape(T * T, C, tiles)
    # The GEMMs' products, (36, co, tiles), into a; AT along the rows into b, along the columns into a.
    mm = a[: T * T * co * tiles].reshape(T * T, co, tiles)
    ngroups = C // cg
    groups = ([v3[:, z * cg:(z + 1) * cg] for z in range(ngroups)],
              [mm[:, z * cog:(z + 1) * cog] for z in range(ngroups)])
    pu = b[: M * T * co * tiles].reshape(M, -1)
    q = a[: M * co * tiles * M].reshape(M, co, r, wq)
    flat = q.reshape(-1)
    chunks = [(flat[i:i + SILU_CHUNK], e[: min(SILU_CHUNK, flat.size - i)]) for i in range(0, flat.size, SILU_CHUNK)]
    views = (rows_src, gath, rt, b[rt.size: rt.size + T], cols_src, d, v, groups, mm, pu,
             pu.reshape(M, T, -1).transpose(0, 2, 1), q, q.reshape(M, -1, M), chunks)
    mine[(i0, i1)] = (token, views)
    return views


#: The compiled loops of looped(), in the order it runs them.
LOOPS = ("winograd_layout", "winograd_in", "gemm", "winograd_out")


def loops_serve(p: dict[str, Any]) -> bool:
    """Whether looped() takes the conv planned in p (conv.py's plan): a 2-D 3x3 conv of stride and dilation 1 and
    one group in float32, an activation the loops apply, LOOPED_CHANNELS, LOOPED_TILES and LOOPED_BYTES."""
    if not (_fits(p) and p["cg"] == p["C"] and p["loop_act"] is not None
            and p["cg"] * p["cog"] >= LOOPED_CHANNELS * (p["cg"] + p["cog"])):
        return False
    tiles = p["N"] * -(-p["outs"][0] // M) * -(-p["outs"][1] // M)
    return LOOPED_TILES <= tiles and T * T * tiles * (p["C"] + p["co"]) * 4 <= LOOPED_BYTES


def looped(x: np.ndarray, y: np.ndarray, p: dict[str, Any], packed: dict[str, Any]) -> bool:
    """y = act(conv(x) + bias) for a conv this path serves, by the compiled loops: the input channel-last
    (planes.winograd_layout), its tiles transformed (planes.winograd_in), the 36 products of every tile by numpy's
    BLAS (loops.gemm), the output tiles transformed, with the bias and the activation (planes.winograd_out); each
    shared by the crew, for a conv they serve (loops_serve). False (nothing done) while the loops compile."""
    loops = [jit.jitted(name) for name in LOOPS]
    if None in loops or not image_blocks(x):
        return False
    if not x.flags.c_contiguous:  # a Split's piece of a batch: its images gathered, as the Split once copied them
        gathered = shared_scratch("winograd.x", x.shape, np.float32)[0]
        np.copyto(gathered, x)
        x = gathered
    for job in _jobs(x, y, p, packed, loops):
        job()
    return True


def jobs(x: np.ndarray, y: np.ndarray, p: dict[str, Any], packed: dict[str, Any]) -> tuple | None:
    """looped's jobs for the calling thread, where they are all it does (replay.py runs them in a chain): None
    while the loops compile, or where x is a batch's piece that it gathers first."""
    loops = [jit.jitted(name) for name in LOOPS]
    if None in loops or not x.flags.c_contiguous:
        return None
    return _jobs(x, y, p, packed, loops)


def _jobs(x: np.ndarray, y: np.ndarray, p: dict[str, Any], packed: dict[str, Any], loops: list[Any]) -> tuple:
    """The four jobs of looped on a contiguous x, bound once for these arrays: a conv's later runs bring the same
    ones (its input and output the same memory, the scratch the calling thread's own)."""
    layout, into, gemm, out = loops
    N, C, co = p["N"], p["C"], p["co"]
    (h, w), (ho, wo), (pt, pl) = p["spatial"], p["outs"], p["pads"][:2]
    th, tw = -(-ho // M), -(-wo // M)
    hp, wp = M * th + 2, M * tw + 2
    tiles = N * th * tw
    threads = jit.threads()
    rows = min(threads, N * th)
    xt = shared_scratch("winograd.xt", (N, hp, wp * C), np.float32)[0]
    v = shared_scratch("winograd.v", (T * T, tiles, C), np.float32)[0]
    m = shared_scratch("winograd.m", (T * T, tiles, co), np.float32)[0]
    scratch_in = shared_scratch("winograd.in", (threads, T * T * C), np.float32)[0]
    scratch_out = shared_scratch("winograd.out", (rows, 24 * co + 4 * M * tw * co), np.float32)[0]
    ut, bias = packed.get("winograd.looped", (None, None))
    if ut is None:
        ut = np.ascontiguousarray(filters(packed, C, False)[0].transpose(0, 2, 1))
        bias = np.zeros(0, np.float32) if packed["b"] is None else np.ascontiguousarray(packed["b"], np.float32)
        packed["winograd.looped"] = ut, bias
    code, alpha, beta = p["loop_act"]
    key = (x, y, xt, v, m, scratch_in, scratch_out, ut)
    return p.setdefault("winograd.jobs", jit.Binds(same)).get(key, lambda *_: (
        layout.bind(min(threads, N * hp), x.reshape(N, C, -1), xt, h, w, pt, pl),
        into.bind(min(threads, tiles), xt, v, scratch_in, th, tw),
        gemm.bind(min(threads, T * T), v, ut, bias[:0], m, False, 0, 0.0, 0.0, 1, 1),
        out.bind(rows, m, bias, y.reshape(N, co, -1), scratch_out, code, alpha, beta, ho, wo, th, tw)))
