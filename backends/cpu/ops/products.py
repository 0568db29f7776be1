"""The products a conv's GEMMs end in: y = act(w @ x + bias) with the bias as a tile, and SiLU taken from the
product of the negated weights in three passes (conv.py, and the squeeze-excitation fusion in fuse.py); the same
product compiled, each piece one BLAS call with its bias and activation (compiled); and how a conv's work is
shared out: runs of images per numpy call (image_runs), tiles over threads (split)."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .. import jit, packing, vectors
from ..threads import parallel, shared_scratch
from .dtypes import same

F32 = np.dtype(np.float32)
_NO_BIAS = np.empty(0, F32)


def loop_bias(bias: np.ndarray | None) -> np.ndarray:
    """A bias as the compiled loops take it: an empty array for none."""
    return _NO_BIAS if bias is None else bias


def product(w: np.ndarray, x: np.ndarray, y: np.ndarray, bias: np.ndarray | None, act) -> None:
    """y = act(w @ x + bias), the bias shaped as y's last two axes."""
    np.matmul(w, x, out=y)
    if bias is not None:
        np.add(y, bias, out=y)
    if act is not None:
        act(y)


#: A piece of a compiled product holds at least this many multiply-adds (some microseconds of BLAS): the crew's
#: threads, held awake through a run, start a job in a few, and at 16 threads cls at batch 8 ran faster with pieces
#: a quarter of the earlier 1 << 20 (benchmarks/RESULTS.md, session 26).
GEMM_PIECE = 1 << 18
#: The same for the dense tile loop, smaller: at few rows a product's time goes in reading its weights from
#: memory, which more pieces read side by side (benchmarks/RESULTS.md, "A compiled product on BLAS").
DENSE_PIECE = 1 << 18
#: Bytes of x's rows that a piece of the dense tile loop reads at most, where the pieces can split the rows too:
#: each panel of the piece reads them again, from L2 where they fit. MiniLM at 8 x 128 ran 11% faster at 16 threads
#: and 7% at 2 so than with whole columns a piece (benchmarks/RESULTS.md, session 26).
ROWS_IN_L2 = 1 << 19
#: Columns of b a piece takes at least, where the pieces split its columns.
GEMM_COLUMNS = 64


def compiled(a: np.ndarray, b: np.ndarray, out: np.ndarray, bias: np.ndarray | None, per_row: bool,
             activation: tuple[int, float, float], kept: dict[str, Any] | None = None) -> bool:
    """out[i] = act(a @ b[i] + bias) for float32 a (m, k), or a[i] for a (N, m, k) (weights of each image's own),
    b (N, k, n), out (N, m, n), by loops.gemm: the bias a value per row of the product (per_row) or per column,
    the activation a loop code (jit.loop_activation).
    The crew's threads share its parts, whole products where there are images enough, else columns of b (of a
    layer's weights, which each thread then reads alone) and then rows. False (nothing done) where it cannot
    serve: other dtypes or layouts, or while it compiles. A caller that brings the same arrays run after run
    (a conv's plan) gives `kept`, where the job stays bound (crew.Bound) while they do."""
    job = gemm_job(a, b, out, bias, per_row, activation, kept)
    return job is not None and bool(job())


def gemm_job(a: np.ndarray, b: np.ndarray, out: np.ndarray, bias: np.ndarray | None, per_row: bool,
             activation: tuple[int, float, float], kept: dict[str, Any] | None = None) -> Callable[[], Any] | None:
    """compiled's job, to call: bound once (crew.Bound) for these arrays where `kept` holds it; None where it
    cannot serve."""
    arrays = (a, b, out) if bias is None else (a, b, out, bias)
    if any(x.dtype != F32 or not x.flags.c_contiguous for x in arrays):
        return None
    a = a if a.ndim == 3 else a[None]
    (m, k), (N, _, n) = a.shape[1:], b.shape
    if not (m and k and n and N) or a.shape[0] not in (1, N):  # BLAS refuses a leading dimension of 0
        return None
    pieces = jit.product_pieces(N * m * n * k, GEMM_PIECE)
    loop = jit.jitted("gemm")
    if loop is None:
        return None
    cols = 1 if N >= pieces else max(1, min(pieces, n // GEMM_COLUMNS))
    rows = 1 if N >= pieces else max(1, min(pieces // cols, m // 16))
    if kept is None:
        return lambda: loop(pieces, a, b, loop_bias(bias), out, per_row, *activation, rows, cols)
    jobs = kept.setdefault("gemm.jobs", jit.Binds(same))
    return jobs.get((a, b, out), lambda *_: loop.bind(pieces, a, b, loop_bias(bias), out, per_row, *activation, rows,
                                                      cols))


def panels(w: np.ndarray) -> packing.Packed | None:
    """A constant weight w (K, N) packed for the dense tile loop (tiles.dense), in panels of its columns, made
    once for every kernel of w (packing.py; the caller holds what this returns); None where that loop cannot
    take it: another dtype, or fewer columns than a panel."""
    cols = vectors.dense_tile()[1]
    if w.dtype != F32 or w.ndim != 2 or w.shape[1] < cols or not w.shape[0]:
        return None

    return packing.shared(w, None, ("dense", cols), lambda: {"panels": column_panels(w, cols)})


def column_panels(w: np.ndarray, cols: int) -> np.ndarray:
    """w (K, N) as panels of `cols` columns, (P, K, cols), the last panel ending at the last column (it overlaps
    the one before where N is not a whole number of panels): the dense tile loops' weights (tiles.py)."""
    n = w.shape[1]
    return np.ascontiguousarray(np.stack([w[:, min(p, n - cols):min(p, n - cols) + cols] for p in range(0, n, cols)]))


def dense(x: np.ndarray, packed: packing.Packed, bias: np.ndarray | None, out: np.ndarray,
          activation: tuple[int, float, float]) -> Callable[[], bool] | None:
    """out = act(x @ w + bias) for float32 x (M, K), w's panels (panels) and out (M, N), by the dense tile loop:
    the crew's threads share its panels, then its rows. Runs it, and returns the same call with its arguments bound
    (a caller that gets the same arrays again may repeat it alone; it returns True); None (nothing done) where
    it cannot serve: other dtypes or layouts, or while it compiles."""
    wp = packed["panels"]
    arrays = (x, out) if bias is None else (x, out, bias)
    if any(a.dtype != F32 or not a.flags.c_contiguous for a in arrays) or not x.shape[0]:
        return None
    (m, k), n = x.shape, out.shape[1]
    pieces = jit.product_pieces(m * n * k, DENSE_PIECE)
    blocks = -(-m // vectors.dense_tile()[0])
    # Runs of rows, each x's rows that a piece reads again for each of its panels, held in L2; then runs of panels.
    runs = max(1, min(pieces, blocks, -(-x.nbytes // ROWS_IN_L2)))
    cols = max(1, min(pieces // runs, wp.shape[0]))
    if cols == 1:
        runs = max(1, min(pieces, blocks))
    loop = jit.jitted("dense")
    if loop is None:
        return None
    rows, width = vectors.dense_tile()
    chunks = cols * runs
    scratch = np.empty((chunks, rows * width), F32), np.empty((chunks, rows), np.uint64)  # a tile's sums and rows
    call = loop.bind(chunks, x, wp, loop_bias(bias), out, *activation, cols, *scratch)
    call()
    return call


def negated(packed: dict[str, Any], key: str) -> np.ndarray:
    """-packed[key], made once: a product with negated weights gives -z exactly, the input SiLU's exp needs."""
    neg = packed.get(("negated", key))
    if neg is None:
        neg = packed[("negated", key)] = np.negative(packed[key])
    return neg


#: SiLU runs over chunks of about this many elements, so that its passes stay in cache.
SILU_CHUNK = 1 << 15


def silu_negated(chunks: list) -> None:
    """SiLU in place over products that hold -z, chunk by chunk ((-z, scratch of its size)): e = exp(-z),
    e = -1 - e, -z / e. Three passes where Swish takes four, with the same result to the bit: 0.8x the time
    over 32K floats."""
    with np.errstate(over="ignore"):  # exp(-z) is inf for z below -88: the quotient is then -0.0, as Swish's
        for nz, e in chunks:
            np.exp(nz, out=e)
            np.subtract(_MINUS_ONE, e, out=e)
            np.divide(nz, e, out=nz)


_MINUS_ONE = np.float32(-1)


def silu_product(packed: dict[str, Any], x: np.ndarray, y: np.ndarray, width: int) -> None:
    """y = SiLU(w @ x + bias) for a pointwise conv's packed weights, x (N, C, width), y (N, co, width): the
    product of the negated weights gives -z for silu_negated."""
    np.matmul(negated(packed, "w")[0], x, out=y)
    if packed["b"] is not None:
        np.subtract(y, bias_tile(packed, width), out=y)
    flat = y.reshape(-1)
    step = SILU_CHUNK
    e = shared_scratch("conv.exp", (min(step, flat.size),), y.dtype)[0]
    silu_negated([(flat[i:i + step], e[:min(step, flat.size - i)]) for i in range(0, flat.size, step)])


#: Runs of images whose columns take about this many elements (1 MiB of float32) at most share each numpy
#: call of a conv's depthwise and im2col paths. Each call releases the GIL, and two runs on two threads queue
#: for it at every short call. On the 2-core test machine, cls at batch 16 (items/s, one session / two
#: concurrent): an image per call 732-758 / 814-843, this budget 763-775 / 871-885. Larger runs leave the
#: L2 cache (2 MiB a core): 1 << 20 gave 629-668 / 964-985.
BATCH_COLS = 1 << 18


def image_runs(N: int, per_image: int) -> list[tuple[int, int]]:
    """The batch as near-equal runs [i0, i1) of images whose columns (per_image elements each) fit BATCH_COLS,
    one image at least. matmul broadcasts the weights over a run's images and still makes one GEMM per image,
    so an image's result does not depend on the others in its batch."""
    n = -(-N // max(1, min(N, BATCH_COLS // max(1, per_image))))
    step = -(-N // n)
    return [(i, min(N, i + step)) for i in range(0, N, step)]


#: Convs with this many GEMM multiply-adds or more are split in tiles across the runtime's threads. Below it,
#: waking a helper and sharing caches with it cost more than they save (benchmarks/RESULTS.md, "Piece
#: sizes"). Depthwise convs, bound by memory traffic, stay on one thread whatever their size.
PARALLEL_MACS = 1 << 25


def split(count: int, fn: Callable[[int], None], macs: int) -> None:
    """fn(0..count-1): in parallel when the conv is big enough to gain from it."""
    if macs >= PARALLEL_MACS:
        parallel(count, fn)
    else:
        for k in range(count):
            fn(k)


def bias_tile(packed: dict[str, Any], width: int) -> np.ndarray:
    """The bias as a (co, width) tile, made once per width: adding a same-shaped array is several times
    faster than a (co, 1) column broadcast along short rows."""
    key = ("bias tile", width)
    tile = packed.get(key)
    if tile is None:
        tile = packed[key] = np.ascontiguousarray(np.broadcast_to(packed["bcol"], (packed["bcol"].shape[0], width)))
    return tile
