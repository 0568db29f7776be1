"""Device memory: a pool of cl.Buffers reused best fit.

A backend takes one buffer for its plan's arena (every DYNAMIC tensor is an
offset in it), one per DYNAMIC_SEPARATE tensor and one per weight (STATIC).
Arena and separate buffers go back to the pool when the plan is cleared, so
a resize, or another session of the same runtime, reuses them.
"""

from __future__ import annotations

import bisect
import threading

import pyopencl as cl

from aiomnn.errors import BackendError

GRANULE = 4096


class BufferPool:
    def __init__(self, context: "cl.Context"):
        self.context = context
        self._free: list[tuple[int, int, cl.Buffer]] = []  # (size, serial, buffer), sorted by size
        self._serial = 0
        self._lock = threading.Lock()
        self.allocated = 0  # bytes held, in use or free

    def acquire(self, nbytes: int) -> "cl.Buffer":
        """The smallest free buffer that holds nbytes without wasting more than half of it, else a new one."""
        need = max(GRANULE, -(-nbytes // GRANULE) * GRANULE)
        with self._lock:
            i = bisect.bisect_left(self._free, (need, -1))
            if i < len(self._free) and self._free[i][0] <= 2 * need:
                return self._free.pop(i)[2]
        try:
            buf = cl.Buffer(self.context, cl.mem_flags.READ_WRITE, need)
        except cl.Error as exc:
            raise BackendError(f"OpenCL: cannot allocate {need} bytes of device memory: {exc}") from None
        with self._lock:
            self.allocated += need
        return buf

    def release(self, buf: "cl.Buffer") -> None:
        with self._lock:
            self._serial += 1
            bisect.insort(self._free, (buf.size, self._serial, buf))

    def upload(self, data) -> "cl.Buffer":
        """A read-only buffer holding a copy of host data (weights, index tables); not pooled."""
        try:
            return cl.Buffer(self.context, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR,
                             hostbuf=data if data.nbytes else bytes(4))
        except cl.Error as exc:
            raise BackendError(f"OpenCL: cannot upload {data.nbytes} bytes: {exc}") from None

    def trim(self) -> None:
        """Free every pooled buffer not in use."""
        with self._lock:
            free, self._free = self._free, []
            self.allocated -= sum(size for size, _, _ in free)
        for _, _, buf in free:
            buf.release()
