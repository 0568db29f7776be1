"""The one fence abstraction and the one helper for offloading work.

A Fence is completed from any thread (a worker, an OpenCL callback thread, a
CUDA host function, a Vulkan waiter) and awaited on the event loop. Signalling
only schedules `event.set` on the loop that made the fence, so it is safe from
driver threads and never blocks them. Works under asyncio, uvloop and trio.
"""

from __future__ import annotations

import threading
from concurrent.futures import Executor
from typing import Any, Callable

import anyio
import sniffio


def _loop_scheduler() -> Callable[[Callable[[], Any]], Any]:
    if sniffio.current_async_library() == "trio":
        import trio

        return trio.lowlevel.current_trio_token().run_sync_soon
    import asyncio

    return asyncio.get_running_loop().call_soon_threadsafe


class Fence:
    """Completion of one piece of work, with its result or error."""

    __slots__ = ("_event", "_schedule", "_lock", "_done", "result", "error", "_cancel")

    def __init__(self) -> None:
        self._event = anyio.Event()
        self._schedule = _loop_scheduler()
        self._lock = threading.Lock()
        self._done = False
        self.result: Any = None
        self.error: BaseException | None = None
        self._cancel: Callable[[], bool] | None = None

    @property
    def done(self) -> bool:
        return self._done

    def signal(self, result: Any = None, error: BaseException | None = None) -> None:
        """Complete the fence. Safe from any thread; a second call is ignored."""
        with self._lock:
            if self._done:
                return
            self.result, self.error, self._done = result, error, True
        try:
            self._schedule(self._event.set)
        except RuntimeError:
            pass  # the loop is gone; nobody is waiting any more

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
