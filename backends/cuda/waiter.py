"""The CUDA waiter: one thread per backend that learns when each run finished and signals its Fence.

It follows the shared schedule (aiomnn.poll): sleep until shortly before the run is expected to finish, poll
its blocking-sync event, then block in cudaEventSynchronize. A poll asks the driver (cuEventQuery through
ctypes, which leaves the GIL free during the call; cupy's query holds it, so without the driver's query the
poller sleeps between polls).
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
from aiomnn.poll import Poller, Timing

log = logging.getLogger("aiomnn")

_NOT_READY = 600  # CUDA_ERROR_NOT_READY (cudaErrorNotReady is 600 too)
#: Sleep between polls where only cupy's query (which holds the GIL) is there.
_CUPY_POLL_STEP_S = 20e-6


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
        self.poller = Poller(0.0 if self._query is not None else _CUPY_POLL_STEP_S)
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
        self.poller.wait(timing, began, lambda: self._done(event), lambda: self._block(event))

    # What the waiter asks of the device (a test replaces them) ------------
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
            self.poller.step = _CUPY_POLL_STEP_S
            return self._block(event)
        self._primed = True  # a runtime call first: it makes the device's context current here
        return bool(event.done)

    def _block(self, event: Any) -> bool:
        event.synchronize()
        return True
