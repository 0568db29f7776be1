"""Device memory for the Vulkan backend: where a tensor lives, and the weight pool.

A Loc names a tensor's bytes: a region and an offset. Regions:

* arena  DYNAMIC activations: one device buffer per pipeline, at the planner's offsets.
* io     DYNAMIC_SEPARATE: values that cross to or from the host (inputs from the
         caller or the CPU backend, graph outputs). Host-visible where the device is
         unified memory (lavapipe, integrated GPUs) or the host can map all of a
         discrete GPU's memory (resizable BAR: the host writes inputs there, outputs
         are copied out); elsewhere a device buffer mirrored by a host staging buffer.
* static STATIC weights, uploaded once into the runtime's pool and shared by every
         session of the runtime that uses the same array.
* aux    small per-plan tables made on the host (resize taps).
* host   float32 areas of an fp16 plan (in Loc.buffer), which cast dispatches read
         inputs from (mapped device memory where there is, as for io) and write
         outputs to.
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np
import vulkan as vk

if TYPE_CHECKING:
    from .device import Buffer, Context
    from .queue import Queue

CHUNK = 32 << 20  # weights are packed into buffers of this size (a bigger weight gets its own)
STATIC_ALIGN = 256


def align_up(n: int, a: int) -> int:
    return -(-n // a) * a


class Loc:
    __slots__ = ("region", "offset", "nbytes", "buffer")

    def __init__(self, region: str, offset: int, nbytes: int, buffer: "Buffer | None" = None):
        self.region, self.offset, self.nbytes, self.buffer = region, offset, nbytes, buffer

    def __repr__(self) -> str:
        return f"Loc({self.region}@{self.offset}+{self.nbytes})"


def upload(ctx: "Context", queue: "Queue", dst: "Buffer", offset: int, data: bytes | np.ndarray) -> None:
    """Copy host bytes into a device buffer: directly where it is mapped, else through staging."""
    raw = np.frombuffer(data, dtype=np.uint8) if isinstance(data, (bytes, bytearray)) \
        else np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    if dst.host is not None:
        dst.host[offset: offset + raw.size] = raw
        return
    staging = ctx.host_buffer(raw.size)
    try:
        staging.host[: raw.size] = raw
        region = vk.VkBufferCopy(srcOffset=0, dstOffset=offset, size=raw.size)
        ctx.run_once(lambda cmd: vk.vkCmdCopyBuffer(cmd, staging.handle, dst.handle, 1, [region]), queue)
    finally:
        staging.destroy()


class _Chunk:
    __slots__ = ("buffer", "used", "live")

    def __init__(self, buffer: "Buffer"):
        self.buffer, self.used, self.live = buffer, 0, 0


class StaticPool:
    """Weights on the device, uploaded once per array and storage type.

    Entries are keyed by the array's identity and freed when the array is
    garbage-collected (the graph that owns it is gone); a chunk is released
    when its last entry goes.
    """

    def __init__(self, ctx: "Context", queue: "Queue"):
        self.ctx, self.queue = ctx, queue
        self._lock = threading.Lock()
        self._entries: dict[tuple[int, str], tuple[Loc, _Chunk]] = {}
        self._chunks: list[_Chunk] = []
        self._pinned: dict[tuple[int, str], Any] = {}  # arrays that cannot be weakly referenced
        self.bytes = 0

    def get(self, array: np.ndarray, dtype: np.dtype) -> Loc:
        dtype = np.dtype(dtype)
        key = (id(array), dtype.str)
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None:
                return hit[0]
        data = np.asarray(array)
        if dtype == np.float16 and data.dtype == np.float32:
            # Saturate finite values outside float16's range: a BERT mask's scale (float32's lowest) would become
            # -inf, and its unmasked entries 0 * -inf = NaN.
            top = float(np.finfo(np.float16).max)
            data = np.where(np.isfinite(data), np.clip(data, -top, top), data)
        data = np.ascontiguousarray(data, dtype=dtype)
        loc, chunk = self._place(data.nbytes)
        upload(self.ctx, self.queue, loc.buffer, loc.offset, data)
        with self._lock:
            self._entries[key] = (loc, chunk)
        try:
            weakref.finalize(array, self._drop, key)
        except TypeError:
            self._pinned[key] = array  # kept (and the upload with it) until the pool is cleared
        return loc

    def _place(self, nbytes: int) -> tuple[Loc, _Chunk]:
        size = align_up(max(nbytes, 1), STATIC_ALIGN)
        with self._lock:
            for chunk in self._chunks:
                if chunk.buffer.size - chunk.used >= size:
                    break
            else:
                chunk = _Chunk(self.ctx.device_buffer(max(CHUNK, size)))
                self._chunks.append(chunk)
            off = chunk.used
            chunk.used += size
            chunk.live += 1
            self.bytes += size
        return Loc("static", off, nbytes, chunk.buffer), chunk

    def _drop(self, key: tuple[int, str]) -> None:
        with self._lock:
            hit = self._entries.pop(key, None)
            if hit is None:
                return
            loc, chunk = hit
            chunk.live -= 1
            self.bytes -= align_up(max(loc.nbytes, 1), STATIC_ALIGN)
            if chunk.live == 0:
                self._chunks.remove(chunk)
                chunk.buffer.destroy()

    def clear(self) -> None:
        with self._lock:
            for chunk in self._chunks:
                chunk.buffer.destroy()
            self._chunks.clear()
            self._entries.clear()
            self._pinned.clear()
            self.bytes = 0
