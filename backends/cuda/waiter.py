"""The CUDA waiter: one thread per backend that learns when each run finished and signals its Fence.

Blocked in cudaEventSynchronize on a blocking-sync event, the thread wakes
late: the driver sleeps until an interrupt arrives. So the waiter sleeps
(time.sleep, outside the GIL) until shortly before the run is expected to
finish, then polls the event for at most POLL_S, then blocks in the driver.
Each run's Timing remembers how long its last run took from its launch (or from
the previous completion, when it was queued behind other work) to its
completion. A sleep overruns what it asked for (the kernel's timer slack), so
the waiter learns by how much and asks for that much less. A poll asks the
driver (cuEventQuery through ctypes, which leaves the GIL free during the call;
cupy's query holds it) and then sleeps POLL_STEP_S (0: polls again at once: a
sleep there would last at least the timer slack).

A run that turned out to finish while the waiter slept is found late once; its
expectation then shrinks, by POLL_LEAD_S and then doubling for each further
late finish, and while runs finish early the waiter also looks in three times
on its way to the poll, so that a run that was slow once (a busy GPU) costs a
few late wake-ups, not hundreds.
"""

from __future__ import annotations

import ctypes
import logging
import queue
import threading
import time
from typing import Any, Callable

from aiomnn.errors import BackendError
from aiomnn.fence import Fence

log = logging.getLogger("aiomnn")

#: The waiter starts polling this long before a run is expected to finish, and polls at most POLL_S.
POLL_LEAD_S = 100e-6
POLL_S = 400e-6
#: Sleep between polls (0: poll again at once; each query leaves the GIL free).
POLL_STEP_S = 0.0
_LATE_MAX = 16  # the shrink after late finishes doubles at most this many times
_OVERSLEEP_MAX = 1e-3  # the most a sleep is assumed to overrun

_NOT_READY = 600  # CUDA_ERROR_NOT_READY (cudaErrorNotReady is 600 too)


class Timing:
    """What the waiter learned about one recorded run: seconds from its start to its completion."""

    __slots__ = ("expect", "late")

    def __init__(self) -> None:
        self.expect = 0.0
        self.late = 0  # late finishes in a row


def _driver_query() -> Callable[[int], int] | None:
    """cuEventQuery from the driver library, called outside the GIL; None where it cannot be loaded."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        fn = lib.cuEventQuery
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn


class Waiter:
    """The thread that completes a backend's fences, in launch order (one stream)."""

    def __init__(self, name: str = "aiomnn-cuda-wait") -> None:
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._query = _driver_query()
        self._primed = False
        #: perf_counter() when the waiter last saw a run complete (a run queued behind it starts then).
        self.last_completion = 0.0
        self.oversleep = 0.0  # how much longer than asked a sleep lasts, as seen
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def put(self, event: Any, fence: Fence, timing: Timing, sent_at: float,
            done: Callable[[Any], None] | None = None) -> None:
        """Wait for `event` (recorded after the run launched at `sent_at`), then signal `fence`.
        `done(event)` runs first once the event has completed without error (to reuse it)."""
        self._q.put((event, fence, timing, sent_at, done))

    def close(self) -> None:
        """Stop the thread once what was put before has been waited for."""
        self._q.put(None)

    def _loop(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            event, fence, timing, sent_at, done = item
            try:
                self._wait(event, timing, sent_at)
            except BaseException as exc:
                self.last_completion = time.perf_counter()
                fence.signal(error=exc if isinstance(exc, BackendError) else BackendError(f"cuda: {exc}"))
                continue
            self.last_completion = time.perf_counter()
            if done is not None:
                try:
                    done(event)
                except BaseException:  # pragma: no cover - a pool that cannot take it back
                    log.exception("cuda: returning an event failed")
            fence.signal()

    def _wait(self, event: Any, timing: Timing, sent_at: float) -> None:
        """Return once the event has completed (raise on a CUDA error); learn timing.expect."""
        began = max(sent_at, self.last_completion)  # it runs after what was queued before it
        poll_from = began + timing.expect - POLL_LEAD_S
        now = time.perf_counter()
        if now < poll_from:
            pieces = 4 if timing.late else 1  # it finished early last time: look in on the way too
            piece = (poll_from - now) / pieces
            for k in range(1, pieces):
                self._sleep_until(now + k * piece)
                if self._done(event):
                    return self._early(timing, began)
            self._sleep_until(poll_from)
        if self._done(event):  # finished while the waiter slept (or before it looked)
            return self._early(timing, began)
        timing.late = 0
        end = time.perf_counter() + POLL_S
        # Without the driver's query, cupy's holds the GIL: sleep between polls then.
        step = POLL_STEP_S if self._query is not None else max(POLL_STEP_S, 20e-6)
        while True:
            if step:
                self._sleep(step)
            if self._done(event):  # the poll caught the finish
                timing.expect = time.perf_counter() - began
                return
            if time.perf_counter() > end:
                self._block(event)
                # Late by the driver's wake-up: the next run's poll starts earlier than this.
                timing.expect = time.perf_counter() - began
                return

    def _sleep_until(self, t: float) -> None:
        """Sleep until about t: a sleep overruns (by the timer's slack), so it asks for that much less, as
        learned from the sleeps before."""
        want = t - time.perf_counter() - self.oversleep
        if want <= 0:
            return
        start = time.perf_counter()
        self._sleep(want)
        over = time.perf_counter() - start - want
        self.oversleep = min(max(0.0, self.oversleep + (over - self.oversleep) / 8), _OVERSLEEP_MAX)

    @staticmethod
    def _early(timing: Timing, began: float) -> None:
        """The run was found finished at the first look: it took at most this long; poll earlier next
        time, by POLL_LEAD_S and then twice as much more for each further early finish in a row."""
        elapsed = time.perf_counter() - began
        timing.expect = max(0.0, min(timing.expect, elapsed) - POLL_LEAD_S * (1 << timing.late))
        timing.late = min(timing.late + 1, _LATE_MAX)

    # The three things the waiter asks of the world (a test replaces them) ------------
    def _sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def _done(self, event: Any) -> bool:
        q = self._query
        if q is not None and self._primed:
            r = q(event.ptr)
            if r == 0:
                return True
            if r == _NOT_READY:
                return False
            # An error, or a driver call that does not work from this thread: the runtime decides
            # (its synchronize raises a CUDA error), and polls go through cupy from now on.
            self._query = None
            self._block(event)
            return True
        self._primed = True  # a runtime call first: it makes the device's context current here
        return bool(event.done)

    def _block(self, event: Any) -> None:
        event.synchronize()
