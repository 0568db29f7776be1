"""Memory planning, after MNN's storage types.

STATIC blocks (weights) are never reused. DYNAMIC blocks (activations) are
offsets in one arena per pipeline; a block released after its tensor's last
use is handed to a later tensor, best fit first. DYNAMIC_SEPARATE blocks get
their own allocation and are freed when the pipeline's buffers are cleared.
Backends turn the plan into real memory: a numpy arena on the CPU, one device
buffer on a GPU.
"""

from __future__ import annotations

import bisect
import enum
from dataclasses import dataclass
from typing import Any


class StorageType(enum.Enum):
    STATIC = "static"
    DYNAMIC = "dynamic"
    DYNAMIC_SEPARATE = "dynamic_separate"


@dataclass(eq=False)
class Block:
    """A planned piece of memory. `memory` is set by the backend once the plan is final."""

    size: int
    storage: StorageType
    offset: int = 0
    memory: Any = None


class Arena:
    """Best-fit offset planner for DYNAMIC blocks, with coalescing of freed ranges."""

    def __init__(self, alignment: int = 64):
        self.alignment = alignment
        self.size = 0  # the peak: bytes the arena must have
        self.requested = 0  # sum of every block's size, as if nothing were reused
        self._free: list[tuple[int, int]] = []  # (offset, size), sorted by offset

    def acquire(self, nbytes: int) -> Block:
        size = max(self.alignment, -(-nbytes // self.alignment) * self.alignment)
        self.requested += size
        best = None
        for i, (off, free) in enumerate(self._free):
            if free >= size and (best is None or free < self._free[best][1]):
                best = i
        if best is not None:
            off, free = self._free.pop(best)
            if free > size:
                bisect.insort(self._free, (off + size, free - size))
            return Block(size, StorageType.DYNAMIC, off)
        if self._free and self._free[-1][0] + self._free[-1][1] == self.size:
            off, free = self._free.pop()  # grow the trailing free range
            self.size = off + size
            return Block(size, StorageType.DYNAMIC, off)
        block = Block(size, StorageType.DYNAMIC, self.size)
        self.size += size
        return block

    def release(self, block: Block) -> None:
        i = bisect.bisect(self._free, (block.offset, block.size))
        self._free.insert(i, (block.offset, block.size))
        # Merge with the neighbours.
        if i + 1 < len(self._free) and self._free[i][0] + self._free[i][1] == self._free[i + 1][0]:
            self._free[i] = (self._free[i][0], self._free[i][1] + self._free.pop(i + 1)[1])
        if i > 0 and self._free[i - 1][0] + self._free[i - 1][1] == self._free[i][0]:
            self._free[i - 1] = (self._free[i - 1][0], self._free[i - 1][1] + self._free.pop(i)[1])


class HandedOver:
    """Host memory a backend hands to the caller as one output array's base (`np.asarray(HandedOver(...))`).

    The array is the memory's only user, so the session returns it as it is instead of copying it;
    `memory` (any object that keeps the bytes alive) goes when the array goes.
    """

    __slots__ = ("memory", "__array_interface__", "__weakref__")

    def __init__(self, memory: Any, address: int, shape: tuple[int, ...], dtype: Any):
        self.memory = memory
        self.__array_interface__ = {"data": (address, False), "shape": tuple(shape), "typestr": dtype.str,
                                    "version": 3}
