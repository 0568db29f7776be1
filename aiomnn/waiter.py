"""A GPU backend's waiter thread: it completes the fences of the runs a backend submits to one in-order queue, in
submit order, on the schedule shared with Vulkan's queue (aiomnn.poll).

put(mark, ...)    the thread waits for a run's mark (what the device completes after the run: a CUDA event, an
                  OpenCL marker), then calls complete(mark) and signals the run's fence. It sleeps until shortly
                  before the run is expected to end, looks, and with the loop's looks hands the last stretch to the
                  event loop (Fence.looks), which completes the fence itself; else it polls, then blocks in the
                  driver.
watch(mark, ...)  from the event loop's thread, where this thread has nothing to wait for and the run is expected to
                  be short (poll.watchable): the loop looks at it from its submit to its end and no thread wakes;
                  where the looks stop without the end, the run is put to this thread after all.

A backend says how to look at a mark: done(mark) from this thread, check(mark) for the loop's looks (None where
the loop cannot look at it), block(mark) in the driver; each raises the device's errors, and over(mark) runs
once the mark's run is over, whether it failed or not.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable

from . import poll
from .errors import BackendError
from .fence import Fence
from .poll import Poller, Timing

class Waiter:
    """The thread that completes one queue's fences, in submit order."""

    def __init__(self, name: str, looks: bool = False, step: float = 0.0) -> None:
        """looks: the event loop may look at the runs (the last stretch, and short runs from their submit); step:
        the sleep between polls (0 polls again at once, where each look leaves the GIL free)."""
        self.name = name
        self.looks = looks
        #: perf_counter() when the waiter last saw a run complete (a run queued behind it starts then).
        self.last_completion = 0.0
        self.poller = Poller(step)
        self._q: queue.SimpleQueue[_Run | None] = queue.SimpleQueue()
        self._puts = self._ends = 0  # marks put (by the submitting thread) and waited for (by this one)
        self._lock = threading.Lock()
        self._last: Fence | None = None  # the fence of the latest mark put
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def put(self, mark: Any, fence: Fence, timing: Timing, sent_at: float,
            complete: Callable[[Any], None] | None = None) -> None:
        """Wait for `mark` (completed after the run started at `sent_at`), then complete(mark) (where the run ended
        without an error: to hand its results over, to reuse the mark) and signal `fence`."""
        with self._lock:  # the submitting thread puts, and the loop's where its looks stop
            self._puts += 1
            self._last = fence
        self._q.put(_Run(mark, fence, timing, sent_at, complete))

    def watch(self, mark: Any, fence: Fence, timing: Timing, sent_at: float,
              complete: Callable[[Any], None] | None = None) -> bool:
        """From the submitting thread (the event loop's, or one the loop handed the submit to): where this thread
        has nothing to wait for, the loop may look (looks, a
        check of the mark) and the run is expected to end within poll.LOOK_ALL_S with a core spare (aiomnn.cores),
        the loop looks at it from now until its end and completes its fence there (complete(mark) first), so that
        no thread wakes, neither the loop nor this one. Where the looks stop without the end (a run slower than
        expected, an error), the run is put to this thread after all. False where this thread should wait for it
        (put)."""
        last = self._last
        # Idle: everything put has been waited for, or has ended (the loop saw the latest end; this thread may
        # still be finishing its part of it).
        idle = self._puts == self._ends or (last is not None and last.done)
        check = self.check(mark) if self.looks else None
        if check is None or not idle or not poll.watchable(timing):
            return False
        run = _Run(mark, fence, timing, sent_at, complete)

        def completed(at: float) -> None:
            self.last_completion = at
            self._end(run, None)

        def stopped() -> None:
            self.put(mark, fence, timing, sent_at, complete)

        return self.poller.watch(fence, timing, max(sent_at, self.last_completion), check, completed, stopped)

    def close(self) -> None:
        """Stop the thread once what was put before has been waited for."""
        self._q.put(None)

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    # What the waiter asks of the device: a backend's own -----------------------------------------------------
    def done(self, mark: Any) -> bool:
        """Whether the mark's run has ended (from this thread)."""
        raise NotImplementedError

    def block(self, mark: Any) -> bool:
        """Wait in the driver until the mark's run has ended; True once it has."""
        raise NotImplementedError

    def check(self, mark: Any) -> Callable[[], bool | None] | None:
        """The event loop's look at the mark (True: ended, False: not yet, None: the loop cannot tell, an error,
        which this thread's own wait then reports); None where the loop cannot look at it."""
        return None

    def over(self, mark: Any) -> None:
        """The mark's run is over, failed or not (before its fence is signalled)."""

    def failure(self, exc: BaseException) -> BackendError:
        """The error a failed wait hands to the run's fence."""
        return exc if isinstance(exc, BackendError) else BackendError(f"{self.name}: {exc}")

    # The thread -----------------------------------------------------------------------------------------------
    def _loop(self) -> None:
        while (run := self._q.get()) is not None:
            self._serve(run)
            run = None  # nothing of a run (its results) outlives it here while the next is awaited

    def _serve(self, run: _Run) -> None:
        try:
            self._wait(run)
        except BaseException as exc:
            self.last_completion = time.perf_counter()
            self._end(run, self.failure(exc))
            return
        finally:
            self._ends += 1
        self.last_completion = self.poller.seen
        self._end(run, None)

    def _end(self, run: _Run, error: BaseException | None) -> None:
        """The run is over: its mark's part, then its fence, with the error of the wait or of complete(); once,
        on this thread or on the loop's, whichever saw the end first."""
        if not run.once.acquire(blocking=False):
            return
        try:
            self.over(run.mark)
            if error is None and run.complete is not None:
                run.complete(run.mark)
        except BaseException as exc:  # handed to the fence: raised here, it would be lost on this thread
            error = error or exc
        run.fence.signal(error=error)

    def _wait(self, run: _Run) -> None:
        """Return once the mark's run has ended (raise its error); learn its timing. With looks, the event loop
        looks at the last stretch and ends the run itself where it sees the end."""
        mark = run.mark
        began = max(run.sent_at, self.last_completion)  # it runs after what was queued before it
        near = None
        check = self.check(mark) if self.looks else None
        if check is not None:
            def found() -> None:
                self._end(run, None)

            def near(until: float) -> Any:
                return run.fence.looks(check, until, found)
        self.poller.wait(run.timing, began, lambda: self.done(mark), lambda: self.block(mark), near)


class _Run:
    """One run put to the waiter: its mark, fence, timing, start and completion; `once` is taken by whichever
    thread ends it."""

    __slots__ = ("mark", "fence", "timing", "sent_at", "complete", "once")

    def __init__(self, mark: Any, fence: Fence, timing: Timing, sent_at: float,
                 complete: Callable[[Any], None] | None) -> None:
        self.mark, self.fence, self.timing, self.sent_at, self.complete = mark, fence, timing, sent_at, complete
        self.once = threading.Lock()
