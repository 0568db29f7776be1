"""float32 inputs rounded to half floats on the host, for the GPU backends whose devices store fp16: half the bytes
over the bus and no cast on the device; and outputs stored in half floats widened to float32. The rounding is the
compiled loop `half` (loops.py), the widening `widen`; numpy's own float16 casts take a value at a time.

ready()     whether the host rounds: the loop is compiled (asking starts its compile). Not while it compiles,
            nor where numba or the CPU's instruction is missing; the device casts float32 inputs then.
pending()   whether ready() may yet turn true (numba is compiling): a GPU segment recorded with the device's
            casts meanwhile is marked provisional, and recorded again once it is done (settled).
fill(dst, src)  aiomnn.copies.fill, rounding where dst holds half floats and src does not.
widened(x, dtype)  x (half floats) as dtype: float32 through the compiled loop where it is ready, else numpy.
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from aiomnn import copies

from . import jit

F16 = np.dtype(np.float16)


def ready() -> bool:
    """Whether the host rounds float32 to half floats itself (asking starts the loop's compile)."""
    return jit.jitted("half") is not None


def pending() -> bool:
    """Whether ready() may yet turn true: numba is compiling."""
    return jit.pending()


def settled(made: Any) -> bool:
    """Whether `made` (a GPU segment's recorded run, marked `provisional` where it was recorded with the device's
    casts while the rounding compiled) is to be recorded again now: once the compile has ended its mark is
    cleared, and it is, where the host rounds now."""
    if not made.provisional or jit.pending():
        return False
    made.provisional = False
    return ready()


def fill(dst: np.ndarray, src: np.ndarray) -> Iterator[tuple[int, int]]:
    """Copy src into dst, yielding the byte ranges of dst filled, in order (copies.fill); into half floats through
    the compiled loop, a large input's pieces on the copy threads as a float32 one's are."""
    # (with numba turned off since the plan was made: numpy's cast, slow but right)
    if dst.dtype != F16 or src.dtype == F16 or not ready():
        yield from copies.fill(dst, src)
        return
    x = np.ascontiguousarray(src, dtype=np.float32)
    yield from copies.fill(dst.view(np.uint16), x, _round)


def _round(dst: np.ndarray, src: np.ndarray) -> None:
    """Half floats' bits into dst from float32 src, of one shape, on this thread (one bound job of the loop)."""
    jit.split("half", src.size, src.size, src.reshape(-1), dst.reshape(-1))


def widened(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """x, half floats, as a new array of dtype: float32 by the compiled loop `widen` (on this thread), other
    dtypes, or while it compiles, by numpy."""
    if x.dtype != F16 or np.dtype(dtype) != np.float32 or not x.flags.c_contiguous or not x.size:
        return x.astype(dtype)
    out = np.empty(x.shape, np.float32)
    if jit.split("widen", x.size, x.size, x.reshape(-1).view(np.uint16), out.reshape(-1)) is None:
        return x.astype(dtype)
    return out
