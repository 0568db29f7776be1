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
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Callable


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
    """Best-fit offset planner for DYNAMIC blocks, with coalescing of freed ranges.

    With `oldest`, for a GPU that runs independent dispatches together (backends/vulkan/backend.py), a block
    reuses the fitting range freed longest ago (a range merged with a neighbour counts as freed at its last
    release) rather than the smallest: a block in a range a dispatch has just read must wait for that dispatch,
    a write-after-read hazard the data never asked for."""

    def __init__(self, alignment: int = 64, oldest: bool = False):
        self.alignment = alignment
        self.oldest = oldest
        self.size = 0  # the peak: bytes the arena must have
        self.requested = 0  # sum of every block's size, as if nothing were reused
        self._free: list[tuple[int, int, int]] = []  # (offset, size, release count when freed), sorted by offset
        self._releases = 0

    def acquire(self, nbytes: int) -> Block:
        size = max(self.alignment, -(-nbytes // self.alignment) * self.alignment)
        self.requested += size
        free = self._free
        fits = [i for i, r in enumerate(free) if r[1] >= size]
        if fits:
            key = (lambda i: (free[i][2], free[i][1])) if self.oldest else (lambda i: free[i][1])
            off, n, when = free.pop(min(fits, key=key))
            if n > size:
                bisect.insort(free, (off + size, n - size, when))
            return Block(size, StorageType.DYNAMIC, off)
        if free and free[-1][0] + free[-1][1] == self.size:
            off = free.pop()[0]  # grow the trailing free range
            self.size = off + size
            return Block(size, StorageType.DYNAMIC, off)
        block = Block(size, StorageType.DYNAMIC, self.size)
        self.size += size
        return block

    def release(self, block: Block) -> None:
        self._releases += 1
        free, when = self._free, self._releases
        i = bisect.bisect(free, (block.offset, block.size, when))
        free.insert(i, (block.offset, block.size, when))
        # Merge with the neighbours.
        if i + 1 < len(free) and free[i][0] + free[i][1] == free[i + 1][0]:
            free[i] = (free[i][0], free[i][1] + free.pop(i + 1)[1], when)
        if i > 0 and free[i - 1][0] + free[i - 1][1] == free[i][0]:
            free[i - 1] = (free[i - 1][0], free[i - 1][1] + free.pop(i)[1], when)


class SharedArena:
    """An arena whose blocks several values may use at once, for the GPU backends' plans.

    A value that is a view of another (a Reshape's output, a piece of a Concat's output) gets a block inside that
    value's block (`within`), which stays reserved until its last user is released. A block made for no value of
    its own (a Concat and its pieces, aiomnn/places.py) starts with no users and goes with the last of them. A
    release may wait for a later step (`until`): a fused group reads a value at its own last step, after the
    value's last reader in the graph; it happens once that step's outputs are placed (`placed`)."""

    def __init__(self, arena: Arena):
        self.arena = arena
        self.done = -1  # the steps up to this one have their outputs placed
        self._users: dict[int, int] = {}  # id(arena block) -> values still using it
        self._root: dict[int, Block] = {}  # id(block inside another) -> the arena block it lies in
        self._waiting: list[tuple[int, Block]] = []  # (step, block): released once that step is placed

    def acquire(self, nbytes: int, users: int = 1) -> Block:
        block = self.arena.acquire(nbytes)
        self._users[id(block)] = users
        return block

    def root(self, block: Block) -> Block:
        """The arena block that `block` lies in (itself for one of its own)."""
        return self._root.get(id(block), block)

    def owns(self, block: Block) -> bool:
        """Whether `block` lies in a block of this arena that some value still uses."""
        return id(self.root(block)) in self._users

    def within(self, block: Block, nbytes: int, offset: int = 0) -> Block:
        """A block of nbytes at `offset` bytes into `block` (one of this arena's), keeping its memory reserved."""
        root = self.root(block)
        inner = Block(nbytes, root.storage, block.offset + offset)
        self._root[id(inner)] = root
        self._users[id(root)] += 1
        return inner

    def release(self, block: Block, until: int = -1) -> None:
        """One user of `block` less (once step `until` is placed, if that is later); a block not of this
        arena is left alone."""
        if until > self.done:
            self._waiting.append((until, block))
            return
        root = self._root.pop(id(block), block)
        users = self._users.get(id(root))
        if users is None:
            return
        if users > 1:
            self._users[id(root)] = users - 1
            return
        del self._users[id(root)]
        self.arena.release(root)

    def placed(self, step: int) -> None:
        """The outputs of every step up to `step` are placed: the releases that waited for them happen."""
        self.done = max(self.done, step)
        ready = [block for until, block in self._waiting if until <= self.done]
        self._waiting = [(until, block) for until, block in self._waiting if until > self.done]
        for block in ready:
            self.release(block)


class HandedOver:
    """Host memory a backend hands to the caller as one output array's base (`np.asarray(HandedOver(...))`).

    The array is the memory's only user, so the session returns it as it is instead of copying it;
    `memory` (any object that keeps the bytes alive, a Lease) goes when the array goes.
    """

    __slots__ = ("memory", "__array_interface__", "__weakref__")

    def __init__(self, memory: Any, address: int, shape: tuple[int, ...], dtype: Any):
        self.memory = memory
        self.__array_interface__ = {"data": (address, False), "shape": tuple(shape), "typestr": dtype.str,
                                    "version": 3}


class Handed:
    """The bytes of host memory that callers hold in output arrays a backend handed over, within a limit.

    That memory is locked (CUDA's pinned blocks, host memory a Vulkan device imported): a caller who keeps
    many outputs must not lock the host's RAM with them. Past the limit, outputs are copied into ordinary
    memory instead."""

    def __init__(self, limit: int):
        self.limit = limit
        self.bytes = 0
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> bool:
        """Count nbytes as handed over, if they fit under the limit."""
        with self._lock:
            if self.bytes + nbytes > self.limit:
                return False
            self.bytes += nbytes
            return True

    def give_back(self, nbytes: int) -> None:
        with self._lock:
            self.bytes -= nbytes


handed = Handed(256 << 20)


class Lease:
    """The `memory` of HandedOver arrays: it keeps `keep` (what owns their bytes) alive, and when the last of
    them is gone it gives nbytes back to `handed`, then calls `returned` (the memory may be used again)."""

    __slots__ = ("keep", "__weakref__")

    def __init__(self, keep: Any, nbytes: int, returned: Callable[[], None] | None = None):
        self.keep = keep
        weakref.finalize(self, _lease_ended, nbytes, returned)


def _lease_ended(nbytes: int, returned: Callable[[], None] | None) -> None:
    handed.give_back(nbytes)
    if returned is not None:
        returned()
