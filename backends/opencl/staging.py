"""Pinned host memory for a queue's large transfers.

A buffer the driver allocates in host memory (ALLOC_HOST_PTR), mapped once, is pinned: a copy between it and
the device goes by DMA at the bus's speed, where a copy from a numpy array goes through the driver's own
staging at the speed of one thread's memcpy (on the H200's NVIDIA OpenCL, 39 MB: 0.73 ms from pinned memory
against 2.79 from numpy; benchmarks/RESULTS.md, session 28). Staging pays only where the host's copy into
the pinned memory is quicker than the driver's: copies.fill splits a large input over the copy threads and
each piece goes to the device as soon as it is filled. A download lands in pinned memory that is handed to
the caller as the output array itself (memory.HandedOver), so no host copy follows it.

Buffers are kept by size and taken again once what used them is done (a run's completion for an upload, the
caller's array gone for a download).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pyopencl as cl

from aiomnn import copies

from ..cpu import halves

#: Free pinned bytes kept for reuse; more are unmapped and released (and all of them by the runtime's gc()).
KEEP_BYTES = 256 << 20


def staged_upload(nbytes: int) -> bool:
    """Whether an input of this size goes through pinned memory: where the copy threads fill it (copies.large)."""
    return copies.large(nbytes)


def staged_download(nbytes: int) -> bool:
    """Whether an output of this size is read into pinned memory handed to the caller."""
    return nbytes >= copies.SEND_BYTES


class Pinned:
    """One mapped ALLOC_HOST_PTR buffer: `host`, its bytes as a uint8 array."""

    __slots__ = ("buffer", "host", "nbytes")

    def __init__(self, context: "cl.Context", queue: "cl.CommandQueue", nbytes: int):
        self.nbytes = nbytes
        self.buffer = cl.Buffer(context, cl.mem_flags.READ_WRITE | cl.mem_flags.ALLOC_HOST_PTR, nbytes)
        self.host, _ = cl.enqueue_map_buffer(queue, self.buffer, cl.map_flags.READ | cl.map_flags.WRITE, 0,
                                             (nbytes,), np.uint8, is_blocking=True)

    def release(self, queue: "cl.CommandQueue") -> None:
        host, self.host = self.host, None
        if host is not None:
            host.base.release(queue)
        self.buffer.release()


class Staging:
    """A queue's pinned buffers, by size. Mapping runs on a queue of its own, so that a new buffer does not wait
    for the runs enqueued before it."""

    def __init__(self, context: "cl.Context", device: "cl.Device"):
        self._context = context
        self._device = device
        self._queue: "cl.CommandQueue | None" = None
        self._free: dict[int, list[Pinned]] = {}
        self._free_bytes = 0
        self._lock = threading.Lock()
        self._closed = False

    def take(self, nbytes: int) -> Pinned:
        """A pinned buffer of nbytes that nothing uses."""
        with self._lock:
            found = self._free.get(nbytes)
            if found:
                self._free_bytes -= nbytes
                return found.pop()
            if self._queue is None:
                self._queue = cl.CommandQueue(self._context, self._device)
            return Pinned(self._context, self._queue, nbytes)

    def give(self, pinned: Pinned) -> None:
        """Back for reuse, once nothing reads or writes it any more."""
        with self._lock:
            if self._closed or self._free_bytes + pinned.nbytes > KEEP_BYTES:
                pinned.release(self._queue)
                return
            self._free.setdefault(pinned.nbytes, []).append(pinned)
            self._free_bytes += pinned.nbytes

    def trim(self) -> None:
        """Release the free buffers."""
        with self._lock:
            for kept in self._free.values():
                for pinned in kept:
                    pinned.release(self._queue)
            self._free.clear()
            self._free_bytes = 0

    def close(self) -> None:
        """Release the free buffers; those still in use are released when given back."""
        with self._lock:
            self._closed = True
        self.trim()
        if self._queue is not None:
            self._queue.finish()


def upload(queue: "cl.CommandQueue", staging: Staging, memory: "cl.Buffer", offset: int, src: np.ndarray,
           dtype: np.dtype, held: list[Any]) -> Pinned:
    """Enqueue src's copy (cast to dtype) into memory at offset through a pinned buffer, piece by piece as the copy
    threads fill it; the pinned buffer goes to `held` until the run is done."""
    nbytes = src.size * dtype.itemsize
    pinned = staging.take(nbytes)
    held.append(pinned)
    dst = pinned.host[:nbytes].view(dtype).reshape(src.shape)
    for a, b in halves.fill(dst, src):  # half floats rounded by the compiled loop, where dst holds them
        cl.enqueue_copy(queue, memory, pinned.host[a:b], dst_offset=offset + a, is_blocking=False)
        queue.flush()  # let the device take this piece while the next is filled
    return pinned
