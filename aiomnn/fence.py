"""The one fence abstraction and the one helper for offloading work.

A Fence is completed from any thread (a worker, an OpenCL callback thread, a
CUDA host function, a Vulkan waiter) and awaited on the event loop. Signalling
only schedules `event.set` on the loop that made the fence, so it is safe from
driver threads and never blocks them. Works under asyncio, uvloop and trio.

Looks: the last stretch of a wait for a device, looked at from the event loop's
own thread (asyncio), so that the run's end reaches the awaiting task without
a thread waking the loop (Fence.looks).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Executor
from typing import Any, Callable

import anyio
import sniffio

from . import cores


def _running_loop() -> Any:
    """The asyncio loop running here, or trio's token."""
    if sniffio.current_async_library() == "trio":
        import trio

        return trio.lowlevel.current_trio_token()
    import asyncio

    return asyncio.get_running_loop()


class Fence:
    """Completion of one piece of work, with its result or error."""

    __slots__ = ("_event", "_loop", "_home", "_schedule", "_lock", "_done", "result", "error", "_cancel")

    def __init__(self) -> None:
        self._event = anyio.Event()
        self._home = threading.get_ident()  # the loop's thread (a fence is made there)
        loop = _running_loop()
        self._loop = loop if hasattr(loop, "call_soon") else None  # asyncio's (Looks); None under trio
        self._schedule = loop.call_soon_threadsafe if self._loop is not None else loop.run_sync_soon
        self._lock = threading.Lock()
        self._done = False
        self.result: Any = None
        self.error: BaseException | None = None
        self._cancel: Callable[[], bool] | None = None

    @property
    def done(self) -> bool:
        return self._done

    def signal(self, result: Any = None, error: BaseException | None = None) -> None:
        """Complete the fence. Safe from any thread; a second call is ignored. On the loop's own thread the
        event is set at once."""
        with self._lock:
            if self._done:
                return
            self.result, self.error, self._done = result, error, True
        try:
            if threading.get_ident() == self._home:
                self._event.set()
            else:
                self._schedule(self._event.set)
        except RuntimeError:
            pass  # the loop is gone; nobody is waiting any more

    def looks(self, check: Callable[[], bool | None], until: float, found: Callable[[], None] | None = None,
              stopped: Callable[[], None] | None = None) -> Looks | None:
        """From another thread: look at the work from the loop's own thread from now until it is done or until
        `until` (perf_counter), and there complete the fence (or call found(), which completes it). check() says
        whether the work is done (None: it cannot tell, an error: the looks stop). stopped(), where given, runs on
        the loop where the looks stop without seeing the end. From the loop's own thread the looks start at its
        next pass. None where the loop cannot look (trio, a closed loop)."""
        if self._loop is None:
            return None
        looks = Looks(self, self._loop, check, until, found, stopped)
        try:
            if threading.get_ident() == self._home:
                self._loop.call_soon(looks.look)
            else:
                self._loop.call_soon_threadsafe(looks.look)
        except RuntimeError:
            return None  # the loop is gone
        return looks

    async def wait(self) -> Any:
        """Wait for completion; return the result or raise the error."""
        await self._event.wait()
        if self.error is not None:
            raise self.error
        return self.result

    async def settle(self) -> None:
        """Wait for completion, ignoring the outcome."""
        await self._event.wait()

    def cancel(self) -> None:
        """Drop the work if it has not started; started work runs on and still signals."""
        if self._cancel is not None and not self._done and self._cancel():
            self.signal(error=WorkCancelled("cancelled before it started"))


class Looks:
    """The last stretch of a wait for a device, looked at from the event loop's thread.

    A thread that completes a fence wakes the loop (the selector's sleep ended through its self-pipe, the task
    resumed after), a cost paid on every run (benchmarks/RESULTS.md, session 44). A waiter that expects its work
    to end soon hands the last stretch to the loop instead: each pass of the loop looks once (check(), one
    query of the device), between the loop's other callbacks, so the loop never waits; the look that sees the
    work done completes the fence on the spot. The looks stop at `until`, at an error, where CPU runs come to
    hold every core (the loop's among them: aiomnn.cores), or where the fence was completed otherwise; the
    waiting thread learns which from wait() and the marks."""

    __slots__ = ("_fence", "_loop", "_check", "until", "_found", "_stopped", "_verdict", "handed", "first", "found",
                 "count")

    def __init__(self, fence: Fence, loop: Any, check: Callable[[], bool | None], until: float,
                 found: Callable[[], None] | None = None, stopped: Callable[[], None] | None = None) -> None:
        self._fence, self._loop, self._check, self.until = fence, loop, check, until
        self._found, self._stopped = found, stopped
        self._verdict = threading.Event()
        self.handed = time.perf_counter()  # when the thread asked
        self.first = 0.0  # when the loop first looked
        self.found = 0.0  # when a look saw the work done (0: none did)
        self.count = 0  # looks taken

    def look(self) -> None:
        """One look, on the loop's thread; the next one is queued behind the loop's other callbacks."""
        now = time.perf_counter()
        self.first = self.first or now
        self.count += 1
        fence = self._fence
        if fence.done:
            self._verdict.set()
            return
        try:
            ok = self._check()
        except Exception:  # the waiting thread's own wait reports the device's error
            ok = None
        if ok:
            self.found = time.perf_counter()
            try:
                if self._found is None:
                    fence.signal()
                else:
                    self._found()
            finally:
                self._verdict.set()
        elif ok is None or now >= self.until or not cores.HELD.spare():
            try:
                if self._stopped is not None:
                    self._stopped()
            finally:
                self._verdict.set()
        else:
            self._loop.call_soon(self.look)

    def wait(self, timeout: float) -> bool:
        """On the waiting thread: until the looks stop (True), at most timeout seconds (False: the loop was
        busy elsewhere)."""
        return self._verdict.wait(timeout)


class WorkCancelled(Exception):
    """The offloaded work was cancelled before it started."""


def offload(executor: Executor, fn: Callable[..., Any], *args: Any) -> Fence:
    """Run fn(*args) on a worker thread; the returned fence completes with its outcome.

    `await fence.wait()` gets the result. A waiter that is cancelled calls
    `fence.cancel()`: work that has not started is dropped, and work that has
    started runs to its end in the background, its fence still completing, so
    the owner can wait for its buffers to be free again.
    """
    fence = Fence()

    def work() -> None:
        try:
            result = fn(*args)
        except BaseException as exc:  # handed to the waiter, never swallowed
            fence.signal(error=exc)
        else:
            fence.signal(result)

    fence._cancel = executor.submit(work).cancel
    return fence
