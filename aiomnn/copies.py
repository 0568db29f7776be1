"""Host copies into and out of the GPU backends' staging memory, in pieces.

numpy lets the GIL go while it copies, so threads copy the pieces of one array at
once: on an H200 host, a 39 MB input (det at batch 8) took 7.2 ms to copy into a
pinned buffer on one thread and 1.3 ms on four. Arrays of SPLIT_BYTES or more are
copied that way, except on a machine with fewer than 4 cores (THREADS 1). More threads
or pieces lost on that host: filling that input and sending each piece as it was
filled took 1355 us on 4 threads in 16 pieces, 1626 on 8, 1943 on 12, and 2389 on 4
in 64 pieces. AIOMNN_SPLIT_COPY=0 turns splitting off; AIOMNN_COPY_THREADS sets the threads.

Arrays from SEND_BYTES up to SPLIT_BYTES are filled on the calling thread in pieces,
each sent as soon as it is filled (`sent_in_pieces`): the device copies one while the
host fills the next. On an H100 host, det at batch 1 (4.9 MB in, 4 pieces) ran on
Vulkan in 1.88-2.02 ms that way and 2.04-2.13 sent whole (2 pieces: 1.96-2.07).

Smaller arrays go in one piece. Filling a medium one piece by piece on the
calling thread, each piece sent to the device as soon as it was filled, lost on
an H200 host: YOLOv8n at batch 1 (1.2 MB in) ran 1.18 ms that way against
1.10 with the copy in the CUDA graph, and threads from 1 MB ran 1.26.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator

import numpy as np

SPLIT_BYTES = int(os.environ.get("AIOMNN_SPLIT_COPY", 8 << 20))
PIECES = 16
PIECE_MIN = 1 << 20
SEND_BYTES = 2 << 20
THREADS = int(os.environ.get("AIOMNN_COPY_THREADS", max(1, min(4, (os.cpu_count() or 2) // 2))))

_pool: ThreadPoolExecutor | None = None
_lock = threading.Lock()


def large(nbytes: int) -> bool:
    """Whether an array of this size is copied in pieces on the copy threads."""
    return bool(SPLIT_BYTES) and nbytes >= SPLIT_BYTES and THREADS > 1


def sent_in_pieces(nbytes: int) -> bool:
    """Whether `fill` yields an array of this size in more than one piece."""
    return large(nbytes) or (bool(SEND_BYTES) and nbytes >= SEND_BYTES)


def pieces(nbytes: int, itemsize: int) -> list[tuple[int, int]]:
    """Byte ranges of a split copy: up to PIECES, each at least PIECE_MIN bytes (but the last), on bounds
    of 4096 items."""
    n = max(1, min(PIECES, nbytes // PIECE_MIN))
    size = -(-nbytes // n)
    size = max(1, -(-size // (4096 * itemsize))) * 4096 * itemsize
    return [(a, min(a + size, nbytes)) for a in range(0, nbytes, size)]


def _copyto(dst: np.ndarray, src: np.ndarray) -> None:
    np.copyto(dst, src, casting="unsafe")


def fill(dst: np.ndarray, src: np.ndarray,
         copy: Callable[[np.ndarray, np.ndarray], object] = _copyto) -> Iterator[tuple[int, int]]:
    """Copy src into dst (np.copyto with unsafe casting, or `copy`, which takes the two arrays, or flat pieces
    of them, and lets the GIL go), yielding the byte range of dst each piece covers, in order, once it is
    filled: a large array's pieces are copied by the copy threads at once, a medium one's (SEND_BYTES) one
    after the other here; others, or arrays whose shapes or layouts differ, in one piece. Sizes are the larger
    of the two arrays' (a copy into half floats reads twice the bytes it writes)."""
    nbytes, size = dst.nbytes, max(dst.nbytes, src.nbytes)
    if not sent_in_pieces(size) or src.shape != dst.shape or not src.flags.c_contiguous \
            or not dst.flags.c_contiguous:
        copy(dst, src)
        yield 0, nbytes
        return
    d, s, step = dst.reshape(-1), src.reshape(-1), dst.itemsize
    if not large(size):
        for a, b in pieces(nbytes, step):
            copy(d[a // step:b // step], s[a // step:b // step])
            yield a, b
        return
    jobs = [(a, b, _threads().submit(copy, d[a // step:b // step], s[a // step:b // step]))
            for a, b in pieces(nbytes, step)]
    for a, b, job in jobs:
        job.result()
        yield a, b


def copy(dst: np.ndarray, src: np.ndarray) -> None:
    """np.copyto(dst, src, casting="unsafe"), in pieces on the copy threads where dst is large."""
    for _ in fill(dst, src):
        pass


def _threads() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(THREADS, thread_name_prefix="aiomnn-copy")
        return _pool
