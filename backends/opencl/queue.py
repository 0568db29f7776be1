"""The OpenCL queue: enqueueing a segment's recorded work, and the Fence that its completion signals.

One in-order command queue per runtime, and one thread that enqueues every submission on it, in order, so
the event loop never waits on the driver. A run ends with a marker. By default the queue's waiter thread
(aiomnn.waiter, shared with CUDA) sleeps until shortly before a run is expected to end, then the event loop looks
at its marker between its other callbacks and, seeing it complete, hands the results over and completes the
Fence there, so that no thread wakes the loop; a run expected to be short the loop looks at from its submit on.
Where the loop's looks stop without the end, the thread blocks in clWaitForEvents (in the order the runs were
enqueued, which the queue completes them in). The marker's completion callback would need no thread of ours, but
NVIDIA's driver ran it long after the marker had completed (at times longer than the whole run on the device),
while clWaitForEvents returned as soon as it had (tools/opencl_phases.py measures both);
AIOMNN_OPENCL_WAIT=callback keeps the callback.

A run needs no per-kernel events, only the marker at its end: where the device records command buffers, a
segment's kernels are recorded into one at its first run and each run enqueues it with one call; else they are
enqueued one by one through ctypes (driver.py), with no event and the size arrays built once at resize.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import pyopencl as cl

from aiomnn.errors import BackendError
from aiomnn.fence import Fence, offload
from aiomnn.memory import HandedOver, Lease, handed
from aiomnn.waiter import Waiter as WaiterThread

from ..cpu import halves
from . import driver, staging

if TYPE_CHECKING:
    from .plan import SegmentPlan

log = logging.getLogger("aiomnn.opencl")


#: How the end of a run is learned (AIOMNN_OPENCL_WAIT): "loop" (default): the queue's waiter thread (Waiter) hands
#: each run's last stretch to the event loop's looks at its marker, and blocks in clWaitForEvents where they stop
#: without the end; "thread": the waiter thread alone, which polls, then blocks, and wakes the loop; "callback":
#: the marker's completion callback, on a thread pyopencl starts for it.
WAIT_MODES = ("loop", "thread", "callback")
#: Where the driver's status query cannot be called outside the GIL, the waiter sleeps between its polls.
_PYOPENCL_POLL_STEP_S = 20e-6


class Ending:
    """A run enqueued, up to its marker: what its end gives back and hands over (Waiter.over, Ending.hand)."""

    __slots__ = ("marker", "status", "held", "pinned", "results", "values", "give", "looks")

    def __init__(self, marker: "cl.Event", held: list, pinned: list, results: list, values: dict[str, Any],
                 give: Callable[[Any], None], looks: bool):
        self.marker, self.held, self.pinned, self.results, self.values = marker, held, pinned, results, values
        self.status = driver.status(marker)  # the marker's status, read by each poll and look
        self.give = give
        # The event loop may end it: its looks are wanted (BackendConfig.power) and its results need no cast.
        self.looks = looks and all(host.dtype == dtype for _, host, dtype in results)

    def hand(self) -> None:
        """The run's results into its values, as the pipeline reads them (half floats widened)."""
        results, self.results = self.results, []  # the caller's arrays are the caller's alone from now on
        for name, host, dtype in results:
            self.values[name] = host if host.dtype == dtype else halves.widened(host, dtype)

    def give_back(self) -> None:
        """The staging buffers of its uploads, once its commands are over, failed or not, and the host arrays of
        its transfers."""
        self.held = []
        pinned, self.pinned = self.pinned, []
        for buffer in pinned:
            self.give(buffer)


class Waiter(WaiterThread):
    """The queue's waiter thread: it looks at each run's marker (its execution status, read without the GIL where
    driver.py has the library), and blocks in clWaitForEvents."""

    def __init__(self, looks: bool):
        super().__init__("aiomnn-opencl-wait", looks, 0.0 if driver.has_status else _PYOPENCL_POLL_STEP_S)

    def failure(self, exc: BaseException) -> BackendError:
        return exc if isinstance(exc, BackendError) else BackendError(f"OpenCL run failed: {type(exc).__name__}: {exc}")

    def done(self, run: Ending) -> bool:
        code = run.status()
        if code < 0:
            raise BackendError(f"OpenCL run failed with status {code}")
        return code == 0

    def block(self, run: Ending) -> bool:
        try:
            run.marker.wait()
        except cl.Error as exc:  # a command of the run failed
            raise BackendError(f"OpenCL run failed: {exc}") from exc
        return True

    def check(self, run: Ending) -> Callable[[], bool | None] | None:
        if not run.looks:
            return None
        status = run.status

        def look() -> bool | None:
            code = status()
            return True if code == 0 else None if code < 0 else False
        return look

    def over(self, run: Ending) -> None:
        run.give_back()


def _called_back(run: Ending, status: int, fence: Fence) -> None:
    """The marker's completion callback (AIOMNN_OPENCL_WAIT=callback), on pyopencl's thread: errors raised here
    would be lost, so they go to the fence."""
    try:
        run.give_back()
        if status < 0:
            raise BackendError(f"OpenCL run failed with status {status}")
        run.hand()
        fence.signal()
    except BaseException as exc:
        fence.signal(error=exc)


class Queue:
    """A runtime's command queue (with profiling, for profile runs), its submit thread and its waiter thread."""

    def __init__(self, context: "cl.Context", device: "cl.Device"):
        wait_mode = os.environ.get("AIOMNN_OPENCL_WAIT", "loop")
        if wait_mode not in WAIT_MODES:
            raise BackendError(f"AIOMNN_OPENCL_WAIT must be one of {WAIT_MODES}, not {wait_mode!r}")
        self.cl_queue = cl.CommandQueue(context, device, properties=cl.command_queue_properties.PROFILING_ENABLE)
        self.submitter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="aiomnn-opencl-submit")
        self.waiter = Waiter(looks=wait_mode == "loop") if wait_mode != "callback" else None
        self.staging = staging.Staging(context, device)
        self.recorder = driver.Recorder.of(self.cl_queue)

    def launcher(self, kernel: "cl.Kernel", gws: tuple[int, ...], lws: tuple[int, ...] | None) -> Callable[[], None]:
        """A callable that enqueues this kernel on this queue, with no event; built once at resize."""
        queue = self.cl_queue
        fn = driver.enqueue_kernel
        if fn is None:
            return lambda: cl.enqueue_nd_range_kernel(queue, kernel, gws, lws) and None
        dims = len(gws)
        g, l = driver.sizes(gws), driver.sizes(lws)
        q, k = ctypes.c_void_p(queue.int_ptr), ctypes.c_void_p(kernel.int_ptr)

        def launch() -> None:
            err = fn(q, k, dims, None, g, l, 0, None, None)
            if err:
                raise BackendError(f"OpenCL: enqueueing {kernel.function_name} {gws}/{lws} failed with error {err}")

        launch.keep = (queue, kernel, g, l)  # type: ignore[attr-defined]  # the handles must outlive the callable
        return launch

    def submit(self, segment: "SegmentPlan", values: dict[str, Any], timed: list | None, looks: bool = True) -> Fence:
        """Enqueue the segment on the submit thread; the fence completes when the device is done and its results
        are in `values`. With `timed`, each kernel is enqueued with an event, appended to it (profiling). looks=False
        (BackendConfig(power="low")): the event loop does not look at the run.

        Enqueueing is cheap on a GPU driver, but PoCL compiles a kernel the first time it is
        enqueued, so it never happens on the event loop.
        """
        fence = Fence()
        try:
            offload(self.submitter, self._enqueue, segment, values, fence, timed, looks)
        except RuntimeError:  # the executor is shut down
            fence.signal(error=BackendError("the OpenCL runtime is closed"))
        return fence

    def _enqueue(self, segment: "SegmentPlan", values: dict[str, Any], fence: Fence, timed: list | None,
                 looks: bool) -> None:
        """Write the host values the segment needs, enqueue its kernels, read back what the rest of the pipeline
        needs, and signal the fence once one marker after them has completed (the waiter's, or the marker's
        callback); any failure signals it with the error."""
        try:
            q = self.cl_queue
            sent_at = time.perf_counter()
            held: list[Any] = []  # host arrays and their transfer events, alive until the run completes
            pinned: list[staging.Pinned] = []  # staging buffers of the uploads, given back when the run completes
            for name, block, t, storage in segment.uploads:
                host = np.asarray(values[name])
                if host.shape != t.shape:
                    raise BackendError(f"value {name!r} has shape {host.shape}, the plan expects {t.shape}")
                if staging.staged_upload(host.size * np.dtype(storage).itemsize):
                    staging.upload(q, self.staging, block.memory, block.offset, host, np.dtype(storage), pinned)
                    continue
                if host.dtype != storage or not host.flags.c_contiguous:
                    cast = np.empty(host.shape, storage)
                    for _ in halves.fill(cast, host):  # half floats rounded by the compiled loop
                        pass
                    host = cast
                held.append((host, cl.enqueue_copy(q, block.memory, host, dst_offset=block.offset,
                                                   is_blocking=False)))
            commands = self._commands(segment) if timed is None else None
            if commands is not None:
                commands.enqueue()
            elif timed is None:
                for i, launch in enumerate(segment.launches):
                    launch.enqueue()
                    if i % 32 == 7:  # let the device start while the rest is enqueued
                        q.flush()
            else:
                timed.extend(cl.enqueue_nd_range_kernel(q, launch.cl_kernel, launch.gws, launch.lws)
                             for launch in segment.launches)
            results = []
            for name, block, t, storage in segment.downloads:
                host = self._download_array(t.shape, np.dtype(storage), t.dtype)
                held.append(cl.enqueue_copy(q, host, block.memory, src_offset=block.offset, is_blocking=False))
                results.append((name, host, t.dtype))
            for x in segment.frees:
                values.pop(x, None)
            marker = cl.enqueue_marker(q)
            if commands is not None:
                commands.last = marker
            run = Ending(marker, held, pinned, results, values, self.staging.give, looks)
            waiter = self.waiter
            q.flush()
            if waiter is None:
                marker.set_callback(cl.command_execution_status.COMPLETE,
                                    lambda status: _called_back(run, status, fence))
            elif not waiter.watch(run, fence, segment.timing, sent_at, Ending.hand):
                waiter.put(run, fence, segment.timing, sent_at, Ending.hand)
        except BaseException as exc:
            fence.signal(error=exc if isinstance(exc, BackendError)
                         else BackendError(f"OpenCL run failed: {type(exc).__name__}: {exc}"))

    def _commands(self, segment: "SegmentPlan") -> "driver.CommandBuffer | None":
        """The segment's kernels as one command buffer, recorded at its first run (on this thread, where PoCL
        compiles what it records); None where the device records none or refused these."""
        if not segment.recorded:
            segment.recorded = True
            if self.recorder is not None and segment.launches:
                segment.commands = self.recorder.record(segment.launches)
        return segment.commands

    def _download_array(self, shape: tuple[int, ...], storage: np.dtype, dtype: np.dtype) -> np.ndarray:
        """Where a download lands: for a large output stored as its own dtype, pinned memory handed to the caller
        as the array (staging.py), within the bytes callers may hold (memory.handed); else a new numpy array."""
        nbytes = int(np.prod(shape, dtype=np.int64)) * storage.itemsize
        if storage != dtype or not staging.staged_download(nbytes) or not handed.take(nbytes):
            return np.empty(shape, dtype=storage)
        try:
            buffer = self.staging.take(nbytes)
        except BaseException:
            handed.give_back(nbytes)
            raise
        lease = Lease(buffer, nbytes, lambda: self.staging.give(buffer))
        return np.asarray(HandedOver(lease, buffer.host.ctypes.data, shape, storage))

    def close(self) -> None:
        """Stop the submit thread, let the waiter complete the runs enqueued (or, with callbacks, wait until
        pyopencl's callback threads are done: one that reached the interpreter while it tears down would abort
        the process, "terminate called without an active exception")."""
        self.submitter.shutdown(wait=True, cancel_futures=True)
        if self.waiter is not None:
            self.waiter.close()
            self.waiter.join()
        try:
            self.cl_queue.finish()
        except cl.Error:
            pass
        if self.waiter is None:
            self._drain_callbacks()
        self.staging.close()

    def _drain_callbacks(self, timeout: float = 5.0) -> None:
        """Until pyopencl has run the completion callbacks of what the queue did: one last marker's callback runs
        after theirs were dispatched (an in-order queue), and a moment more lets theirs return."""
        fired = threading.Event()
        try:
            marker = cl.enqueue_marker(self.cl_queue)
            marker.set_callback(cl.command_execution_status.COMPLETE, lambda status: fired.set())
            self.cl_queue.flush()
        except cl.Error:
            return
        fired.wait(timeout)
        time.sleep(0.01)
