"""Pinned host memory for a run's large transfers.

A copy between a numpy array (pageable memory) and the device goes through the driver's own bounce buffers: on
NVIDIA's OpenCL, det's 39 MB input at batch 8 took most of a 20 ms run. A buffer made with ALLOC_HOST_PTR and
mapped once is pinned memory there, and a transfer from or to its mapped array is one DMA: the run copies the
input into it (a memcpy), and the output out of it. Each area serves one run at a time: it is taken when the run
is enqueued and given back when the run completes, so runs in flight never share one.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pyopencl as cl

#: Transfers of at least this many bytes go through pinned memory; a smaller one costs more in the extra copy
#: than in the driver's own staging.
STAGED_BYTES = 1 << 18


class Staging:
    """A queue's pinned areas, kept by size for reuse; each a mapped host array over an ALLOC_HOST_PTR buffer."""

    def __init__(self, queue: "cl.CommandQueue"):
        self.queue = queue
        self._free: dict[int, list[tuple[Any, np.ndarray]]] = {}
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> tuple[Any, np.ndarray] | None:
        """A pinned area of nbytes (the buffer, and its mapped bytes), or None where the device gives none."""
        with self._lock:
            free = self._free.get(nbytes)
            if free:
                return free.pop()
        try:
            buf = cl.Buffer(self.queue.context, cl.mem_flags.READ_WRITE | cl.mem_flags.ALLOC_HOST_PTR, nbytes)
            host, _ = cl.enqueue_map_buffer(self.queue, buf, cl.map_flags.READ | cl.map_flags.WRITE, 0, (nbytes,),
                                            np.uint8, is_blocking=True)
        except cl.Error:
            return None
        return buf, host

    def give(self, area: tuple[Any, np.ndarray]) -> None:
        with self._lock:
            self._free.setdefault(area[1].nbytes, []).append(area)

    def clear(self) -> None:
        """Unmap and free every area not in use."""
        with self._lock:
            free, self._free = self._free, {}
        for areas in free.values():
            for buf, host in areas:
                host.base.release()
                buf.release()
