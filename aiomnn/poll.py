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

Where the waiter may hand the poll to the event loop (`near`: aiomnn.fence.Looks), it does so that much
earlier than the poll would start as the loop takes to start looking (learned, as the oversleep is), and
waits for the loop's verdict: the loop completes the fence itself, without a thread waking it. Where the
loop's looks stop without seeing the end (a deadline, an error), the waiter blocks in the driver as before.
Short work the loop looks at from its submit on (LOOK_ALL_S), and no thread wakes at all.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable

from . import cores

if TYPE_CHECKING:
    from .fence import Fence, Looks

#: The waiter starts polling this long before the work is expected to finish, and polls at most POLL_S.
POLL_LEAD_S = 100e-6
POLL_S = 400e-6
_LATE_MAX = 16  # the shrink after early finishes doubles at most this many times
_OVERSLEEP_MAX = 1e-3  # the most a sleep is assumed to overrun
_HANDOFF_MAX = 1e-3  # the most the loop is assumed to take to start looking
#: How much longer than its poll the waiter waits for a busy loop's verdict before blocking in the driver itself.
LOOKS_GRACE_S = 2e-3
#: Work expected to take at most this long, submitted while its waiter has nothing else to wait for and a core is
#: spare (aiomnn.cores), is looked at by the event loop from its submit to its end (at most until its expectation
#: and POLL_S have passed), and the waiter thread is not woken at all; the loop's thread spins that long, between
#: its other callbacks, a core's worth of CPU for the run's length: bounded here. Where the looks stop without
#: the end, the waiter takes the work after all. (CUDA's Waiter.watch, Vulkan's Queue.submit.)
LOOK_ALL_S = 2e-3


class Timing:
    """What the waiter learned about one piece of recorded work: seconds from its start to its completion."""

    __slots__ = ("expect", "late", "known")

    def __init__(self) -> None:
        self.expect = 0.0
        self.late = 0  # early finishes in a row (found only after the sleep: late for the caller)
        self.known = False  # seen finished once: expect is a measure (early finds may shrink it to 0)


def watchable(timing: Timing) -> bool:
    """Whether the event loop may look at this work from its submit on (LOOK_ALL_S): its length is known and
    short, and a core is spare (aiomnn.cores). The caller also knows its waiter has nothing else to wait for."""
    return timing.known and timing.expect <= LOOK_ALL_S and cores.HELD.spare()


class Poller:
    """One waiter thread's schedule (its learned oversleep is the thread's own). `step` is the sleep between
    polls: 0 polls again at once, where each look leaves the GIL free."""

    def __init__(self, step: float = 0.0) -> None:
        self.step = step
        self.oversleep = 0.0  # how much longer than asked a sleep lasts, as seen
        self.handoff = 0.0  # how long the loop takes to start looking once asked, as seen
        self.seen = 0.0  # perf_counter() when the last wait saw its work finished

    def wait(self, timing: Timing, began: float, done: Callable[[], bool], block: Callable[[], bool],
             near: Callable[[float], Looks | None] | None = None) -> bool:
        """Return once done() holds, or block() (the driver's wait) returned: True once the work has finished,
        False where block() gave up (a timeout, to look for a close). Learns timing.expect. done() and block()
        raise the device's errors. near(until), where given, starts the event loop's looks until `until` (None
        where the loop cannot look); not while CPU runs hold every core (the loop's looks take one)."""
        if near is not None and not cores.HELD.spare():
            near = None
        poll_from = began + timing.expect - POLL_LEAD_S - (self.handoff if near is not None else 0.0)
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
        looks = near(end + self.handoff) if near is not None else None
        if looks is not None:
            return self._from_loop(looks, timing, began, block)
        while True:
            if self.step:
                self.sleep(self.step)
            if done():  # the poll caught the finish
                return self.caught(timing, began, time.perf_counter())
            if time.perf_counter() > end:
                return self._blocked(timing, began, block)

    def watch(self, fence: Fence, timing: Timing, began: float, check: Callable[[], bool | None],
              complete: Callable[[float], None], stopped: Callable[[], None]) -> bool:
        """From the submit on (from the loop's thread or another), the event loop looks at work that began at
        `began` (watchable), until its end or its expectation and POLL_S have passed: complete(at) runs on the loop
        where a look sees the end (the timing learned first), stopped() where the looks stop without it. False
        where the loop cannot look."""
        made: list[Looks] = []  # from another thread, a look may see the end before fence.looks returns

        def found() -> None:
            at = made[0].found if made else time.perf_counter()
            self.caught(timing, began, at)
            complete(at)

        looks = fence.looks(check, began + timing.expect + POLL_S, found, stopped)
        if looks is None:
            return False
        made.append(looks)
        return True

    def _from_loop(self, looks: Looks, timing: Timing, began: float, block: Callable[[], bool]) -> bool:
        """The loop's verdict: the end it saw (a first look that saw it counts as early), or the driver's wait
        where it saw none. Learns how long the loop takes to start looking."""
        looks.wait(max(0.0, looks.until - time.perf_counter()) + LOOKS_GRACE_S)
        if looks.first:
            self.handoff = min(max(0.0, self.handoff + (looks.first - looks.handed - self.handoff) / 4), _HANDOFF_MAX)
        if looks.found:
            if looks.count == 1:
                return self._early(timing, began, looks.found)
            return self.caught(timing, began, looks.found)
        return self._blocked(timing, began, block)

    def caught(self, timing: Timing, began: float, at: float) -> bool:
        """The work was seen finished at `at`, after it had been looked at a while: it takes that long."""
        timing.expect = at - began
        timing.late = 0
        timing.known = True
        self.seen = at
        return True

    def _blocked(self, timing: Timing, began: float, block: Callable[[], bool]) -> bool:
        if not block():
            return False
        # Late by the driver's wake-up: early finds shrink that back.
        return self.caught(timing, began, time.perf_counter())

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

    def _early(self, timing: Timing, began: float, at: float = 0.0) -> bool:
        """The work was found finished at the first look (at `at`, or now): it took at most this long; poll
        earlier next time, by POLL_LEAD_S and then twice as much more for each further early finish in a row."""
        self.seen = at or time.perf_counter()
        elapsed = self.seen - began
        timing.expect = max(0.0, min(timing.expect, elapsed) - POLL_LEAD_S * (1 << timing.late))
        timing.late = min(timing.late + 1, _LATE_MAX)
        timing.known = True
        return True
