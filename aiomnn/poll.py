"""When a GPU backend's waiter thread looks at the device: the schedule shared by CUDA's waiter and Vulkan's queue.

Blocked in the driver (cudaEventSynchronize on a blocking-sync event, vkWaitSemaphores), a thread wakes late:
the driver sleeps until an interrupt arrives, late enough to slow a small model's runs. So the waiter sleeps
(time.sleep, outside the GIL) until shortly before the work is expected to finish, then polls for at most
POLL_S, then blocks in the driver. Each piece of recorded work keeps a Timing: how long its last run took from
its start (its launch, or the previous completion where it was queued behind other work) to its completion.
A sleep overruns what it asked for (the kernel's timer slack), so the poller learns by how much and asks for
that much less.

A run that turned out to finish while the waiter slept is found late once; its expectation then shrinks, by
POLL_LEAD_S and then doubling for each further early finish in a row, and while runs finish early the waiter
also looks in three times on its way to the poll, so that a run that was slow once (a busy GPU, a clock coming
back up after an idle spell) costs a few late wake-ups, not hundreds.
"""

from __future__ import annotations

import time
from typing import Callable

#: The waiter starts polling this long before the work is expected to finish, and polls at most POLL_S.
POLL_LEAD_S = 100e-6
POLL_S = 400e-6
_LATE_MAX = 16  # the shrink after early finishes doubles at most this many times
_OVERSLEEP_MAX = 1e-3  # the most a sleep is assumed to overrun


class Timing:
    """What the waiter learned about one piece of recorded work: seconds from its start to its completion."""

    __slots__ = ("expect", "late")

    def __init__(self) -> None:
        self.expect = 0.0
        self.late = 0  # early finishes in a row (found only after the sleep: late for the caller)


class Poller:
    """One waiter thread's schedule (its learned oversleep is the thread's own). `step` is the sleep between
    polls: 0 polls again at once, where each look leaves the GIL free."""

    def __init__(self, step: float = 0.0) -> None:
        self.step = step
        self.oversleep = 0.0  # how much longer than asked a sleep lasts, as seen

    def wait(self, timing: Timing, began: float, done: Callable[[], bool], block: Callable[[], bool]) -> bool:
        """Return once done() holds, or block() (the driver's wait) returned: True once the work has finished,
        False where block() gave up (a timeout, to look for a close). Learns timing.expect. done() and block()
        raise the device's errors."""
        poll_from = began + timing.expect - POLL_LEAD_S
        now = time.perf_counter()
        if now < poll_from:
            pieces = 4 if timing.late else 1  # it finished early last time: look in on the way too
            piece = (poll_from - now) / pieces
            for k in range(1, pieces):
                self._sleep_until(now + k * piece)
                if done():
                    return self._early(timing, began)
            self._sleep_until(poll_from)
        if done():  # finished while the waiter slept (or before it looked)
            return self._early(timing, began)
        timing.late = 0
        end = time.perf_counter() + POLL_S
        while True:
            if self.step:
                self.sleep(self.step)
            if done():  # the poll caught the finish
                timing.expect = time.perf_counter() - began
                return True
            if time.perf_counter() > end:
                if not block():
                    return False
                # Late by the driver's wake-up: early finds shrink that back.
                timing.expect = time.perf_counter() - began
                return True

    def sleep(self, seconds: float) -> None:
        """(A test replaces it with a virtual clock's.)"""
        time.sleep(seconds)

    def _sleep_until(self, t: float) -> None:
        """Sleep until about t, asking for as much less as the sleeps before overran."""
        want = t - time.perf_counter() - self.oversleep
        if want <= 0:
            return
        start = time.perf_counter()
        self.sleep(want)
        over = time.perf_counter() - start - want
        self.oversleep = min(max(0.0, self.oversleep + (over - self.oversleep) / 8), _OVERSLEEP_MAX)

    @staticmethod
    def _early(timing: Timing, began: float) -> bool:
        """The work was found finished at the first look: it took at most this long; poll earlier next time,
        by POLL_LEAD_S and then twice as much more for each further early finish in a row."""
        elapsed = time.perf_counter() - began
        timing.expect = max(0.0, min(timing.expect, elapsed) - POLL_LEAD_S * (1 << timing.late))
        timing.late = min(timing.late + 1, _LATE_MAX)
        return True
