"""The cores this process may run on, and how many of them its CPU runs hold now.

The event loop polls a short GPU run from its submit to its end (aiomnn.poll.LOOK_ALL_S), a core kept busy that
long. Beside CPU runs that use every core, that core is theirs: a CPU session beside a GPU session watched so ran
a quarter slower than beside one whose waiter thread slept (benchmarks/RESULTS.md, session 45). So the CPU backend
holds its threads' cores for each run (HELD.hold), and the GPU backends have the loop look at a run (from its
submit, or over its last stretch) only while one is spare.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Iterator


def count() -> int:
    """The cores this process may run on (its affinity where the OS tells it)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


class Held:
    """The cores this process's CPU runs hold now."""

    def __init__(self) -> None:
        self.held = 0
        self._lock = threading.Lock()
        self._count = 0  # count(), read once

    @contextlib.contextmanager
    def hold(self, cores: int) -> Iterator[None]:
        """Hold `cores` cores while the block runs (a CPU run's threads)."""
        with self._lock:
            self.held += cores
        try:
            yield
        finally:
            with self._lock:
                self.held -= cores

    def spare(self) -> bool:
        """Whether a core is left that no CPU run holds."""
        if not self._count:
            self._count = count()
        return self.held < self._count


HELD = Held()
