"""The compute queue: submissions built once, a timeline semaphore (or fences),
one waiter thread per queue that reports completions, and a run's way through
it (Queue.start): inputs copied in, one submit, outputs handed over and the
aiomnn Fence signalled on the waiter thread (_finish).

A Submission wraps one recorded command buffer with its VkSubmitInfo, built
once at record time; submitting it again costs one vkQueueSubmit. With a
timeline semaphore every submission signals the queue's next value, and the
waiter waits for the oldest pending value, then runs the callbacks of
everything that value covers. Without one, each Submission has a VkFence and
the waiter waits on that. Callbacks run on the waiter thread: they must be
short and must not block (they read outputs and signal an aiomnn Fence, which
only schedules work on the event loop).

How the waiter waits: it follows the schedule shared with CUDA's waiter
(aiomnn.poll): sleep until shortly before the submission is expected to finish
(each Submission keeps its Timing), poll the progress, then block in the driver,
which on NVIDIA wakes late enough to slow a small model's runs. The driver's wait
gives up every _WAIT_NS, to notice a close. A run's last stretch is polled by the
event loop itself (aiomnn.fence.Looks), which then completes the run there: its
outputs lent or copied and its Fence set without a thread waking the loop. Only
runs whose outputs are never copied in pieces on the copy threads (copies.large)
complete on the loop; the others, and any work without a Fence, on the waiter.
Such a run expected to be short (aiomnn.poll.LOOK_ALL_S) the loop looks at from
its submit on, and the waiter thread is not woken at all.

Runs after an idle spell are slower for a reason outside the waiter: the GPU
lowers its clock when idle, and runs stay slow until it comes back up. CUDA
runs of the same model, next in the same process, found the full clock after
the same pauses.
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import vulkan as vk

from aiomnn import copies, poll
from aiomnn.errors import BackendError
from aiomnn.fence import Fence
from aiomnn.memory import HandedOver, Lease, handed
from aiomnn.poll import Poller, Timing

from ..cpu import halves

if TYPE_CHECKING:
    from .profile import Timestamps
    from .record import Record, Slot

log = logging.getLogger("aiomnn.vulkan")
ffi, lib = vk.ffi, vk.lib

_WAIT_NS = 100_000_000  # the waiter wakes this often to notice a close


def _error(result: int, what: str) -> Exception:
    cls = vk.exception_codes.get(result)
    return cls(f"{what}: VkResult {result}") if cls else RuntimeError(f"{what}: VkResult {result}")


class Submission:
    """One command buffer and its prebuilt VkSubmitInfo (plus a fence when there is no timeline). An
    untracked one signals nothing: Queue.send submits it and nothing waits for it."""

    __slots__ = ("queue", "cmd", "_cmds", "_values", "_sems", "_tinfo", "info", "fence", "_fences", "value",
                 "sent_at", "timing")

    def __init__(self, queue: "Queue", cmd: Any, tracked: bool = True):
        self.queue = queue
        self.cmd = cmd
        self._cmds = ffi.new("VkCommandBuffer[1]", [cmd])
        self.value = 0  # the queue value of its latest submission; done once queue.completed reaches it
        self.sent_at = 0.0  # perf_counter() at its latest submission
        self.timing = Timing()  # how long its runs take on the queue, as the waiter saw them (when to poll)
        if queue.timeline and tracked:
            self._values = ffi.new("uint64_t[1]")
            self._sems = ffi.new("VkSemaphore[1]", [queue.semaphore])
            self._tinfo = ffi.new("VkTimelineSemaphoreSubmitInfo*", {
                "sType": vk.VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO,
                "signalSemaphoreValueCount": 1, "pSignalSemaphoreValues": self._values})
            self.info = ffi.new("VkSubmitInfo*", {
                "sType": vk.VK_STRUCTURE_TYPE_SUBMIT_INFO, "pNext": self._tinfo, "commandBufferCount": 1,
                "pCommandBuffers": self._cmds, "signalSemaphoreCount": 1, "pSignalSemaphores": self._sems})
            self.fence = ffi.NULL
            self._fences = None
        else:
            self._values = self._sems = self._tinfo = None
            self.info = ffi.new("VkSubmitInfo*", {
                "sType": vk.VK_STRUCTURE_TYPE_SUBMIT_INFO, "commandBufferCount": 1, "pCommandBuffers": self._cmds})
            self.fence = vk.vkCreateFence(queue.device, vk.VkFenceCreateInfo(), None) if tracked else ffi.NULL
            self._fences = ffi.new("VkFence[1]", [self.fence]) if tracked else None

    @property
    def pending(self) -> bool:
        return self.value > self.queue.completed

    def destroy(self) -> None:
        if self._fences is not None:
            vk.vkDestroyFence(self.queue.device, self.fence, None)
            self._fences = None


Callback = Callable[[BaseException | None], None]


#: A pending submission: its queue value, the Submission, its callback, and the aiomnn Fence of a run whose
#: completion the event loop may run (None: on the waiter thread only).
Pending = tuple[int, Submission, Callback, Fence | None]


def _call(ready: list[Pending], err: BaseException | None) -> None:
    for _, _, cb, _ in ready:
        try:
            cb(err)
        except BaseException:  # a callback's failure must not kill the waiter
            log.exception("a Vulkan completion callback failed")


class Queue:
    def __init__(self, device: Any, handle: Any, timeline: bool):
        self.device = device
        self.handle = handle
        self.timeline = timeline
        lock = threading.Lock()
        self._cond = threading.Condition(lock)  # what completed: for wait_value
        self._wake = threading.Condition(lock)  # work for the waiter thread
        self._watched = 0  # the value of the run the event loop watches from its submit (_watch); 0: none
        self._pending: collections.deque[Pending] = collections.deque()
        self.submitted = 0
        self.completed = 0
        self.closed = False
        self.semaphore = None
        if timeline:
            tinfo = vk.VkSemaphoreTypeCreateInfo(semaphoreType=vk.VK_SEMAPHORE_TYPE_TIMELINE, initialValue=0)
            self.semaphore = vk.vkCreateSemaphore(device, vk.VkSemaphoreCreateInfo(pNext=tinfo), None)
            self._wait_sems = ffi.new("VkSemaphore[1]", [self.semaphore])
            self._wait_values = ffi.new("uint64_t[1]")
            self._wait_info = ffi.new("VkSemaphoreWaitInfo*", {
                "sType": vk.VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO, "semaphoreCount": 1,
                "pSemaphores": self._wait_sems, "pValues": self._wait_values})
            self._counter = ffi.new("uint64_t*")
            self._looked = ffi.new("uint64_t*")  # the event loop's looks read the counter here
        #: perf_counter() when the waiter last saw work complete (for measuring wake-up lag).
        self.last_completion = 0.0
        self.poller = Poller()
        self._thread = threading.Thread(target=self._wait_loop, name="aiomnn-vulkan-waiter", daemon=True)
        self._thread.start()

    def submit(self, sub: Submission, callback: Callback, fence: Fence | None = None) -> int:
        """Submit a recorded command buffer; callback(error) runs when it completes: on the waiter thread, or
        with `fence` (the run's, which the callback completes) on the event loop where its looks saw it. Such a
        run, expected within poll.LOOK_ALL_S and submitted while the waiter thread has nothing to wait for and a
        core is spare (aiomnn.cores), the loop looks at from now on (_watch); the thread is woken only where
        those looks stop without its end."""
        with self._cond:
            if self.closed:
                raise RuntimeError("the Vulkan queue is closed")
            if sub.pending:
                raise RuntimeError("a command buffer still pending was submitted again")
            value = self.submitted + 1
            if self.timeline:
                sub._values[0] = value
            else:
                lib.vkResetFences(self.device, 1, sub._fences)
            r = lib.vkQueueSubmit(self.handle, 1, sub.info, sub.fence)
            if r != vk.VK_SUCCESS:
                raise _error(r, "vkQueueSubmit")
            self.submitted = sub.value = value
            sub.sent_at = time.perf_counter()
            # Everything before it completed (the thread may still be finishing its own part of the last one).
            watch = fence is not None and not self._pending and poll.watchable(sub.timing)
            self._pending.append((value, sub, callback, fence))
            if watch:
                self._watched = value
            else:
                self._wake.notify()
        if watch and not self._watch(value, sub, fence):
            self._unwatch()
        return value

    def _watch(self, value: int, sub: Submission, fence: Fence) -> bool:
        """The event loop looks at a run from its submit to its end and completes it there; False where it
        cannot (trio)."""
        return self.poller.watch(fence, sub.timing, max(sub.sent_at, self.last_completion),
                                 lambda: self._looked_done(value, sub), lambda at: self._complete(value, None, at),
                                 self._unwatch)

    def _unwatch(self) -> None:
        """The loop's watch has ended without the end of its run (or could not start): the waiter thread takes
        what is pending, the watched run first. (A watched run that completes ends its watch in _complete.)"""
        with self._cond:
            self._watched = 0
            if self._pending:
                self._wake.notify()

    def start(self, rec: "Record", values: dict[str, Any], fence: Fence, stamps: "Timestamps | None",
              looks: bool = True) -> None:
        """Run a segment's recorded commands: copy its inputs from `values` into mapped memory and submit a free
        slot; its outputs go into `values` and `fence` is signalled once it completes (errors go to the fence).
        With profiling, `stamps` learns the slot, to read its timestamps after. looks=False (BackendConfig(power=
        "low")): the event loop does not poll this run; the waiter thread completes it."""
        try:
            slot = rec.slot()
            for name, view, shape in rec.uploads:
                v = values[name]
                if v.shape != shape:
                    raise BackendError(f"input {name!r} has shape {v.shape}, the plan has {shape}")
                sends = slot.sends.get(name, ())
                i = 0
                for _, filled in halves.fill(view, v):
                    while i < len(sends) and sends[i][0] <= filled:
                        self.send(sends[i][1])
                        i += 1
            if stamps is not None:
                stamps.last = slot
            self.submit(slot.sub, functools.partial(_finish, rec, slot, values, fence),
                        fence if slot.light and looks else None)
        except BaseException as exc:
            fence.signal(error=exc)

    def send(self, sub: Submission) -> None:
        """Submit an untracked Submission. Work submitted after it completes after it where that work's
        first barrier waits for what came before (a run's inputs, sent in pieces while the host fills them:
        the run's own command buffer begins with such a barrier)."""
        with self._cond:
            if self.closed:
                raise RuntimeError("the Vulkan queue is closed")
            r = lib.vkQueueSubmit(self.handle, 1, sub.info, ffi.NULL)
            if r != vk.VK_SUCCESS:
                raise _error(r, "vkQueueSubmit")

    def run_blocking(self, cmd: Any) -> None:
        """Submit a one-off command buffer and block until it completes (resize-time uploads)."""
        sub = Submission(self, cmd)
        done = threading.Event()
        errors: list[BaseException] = []

        def finished(err: BaseException | None) -> None:
            if err is not None:
                errors.append(err)
            done.set()

        try:
            self.submit(sub, finished)
            done.wait()
        finally:
            sub.destroy()
        if errors:
            raise errors[0]

    def wait_value(self, value: int, timeout: float = 30.0) -> bool:
        """Block until everything up to `value` has completed (used when freeing resources)."""
        end = time.monotonic() + timeout
        with self._cond:
            while self.completed < value:
                left = end - time.monotonic()
                if left <= 0 or self.closed:
                    return self.completed >= value
                self._cond.wait(min(left, 0.1))
        return True

    def _wait_loop(self) -> None:
        while True:
            with self._cond:
                while (not self._pending or self._pending[0][0] == self._watched) and not self.closed:
                    self._wake.wait()
                if not self._pending:
                    return
                value, sub, _, fence = self._pending[0]
                del _  # the callback holds the run's outputs: this frame must not keep them
            err: BaseException | None = None
            r = self._wait(value, sub, fence)
            if r == vk.VK_SUCCESS and self.timeline:
                if lib.vkGetSemaphoreCounterValue(self.device, self.semaphore, self._counter) == vk.VK_SUCCESS:
                    value = max(value, int(self._counter[0]))
                    if self._watched:  # read after the counter: a run the loop watches is the loop's to complete
                        value = min(value, self._watched - 1)
            if r == vk.VK_TIMEOUT:
                continue
            if r != vk.VK_SUCCESS:
                err = _error(r, "waiting for the GPU")
            self._complete(value, err, self.poller.seen if err is None else time.perf_counter())

    def _complete(self, value: int, err: BaseException | None, seen: float) -> None:
        """Run the callbacks of what completed up to `value` (everything pending, with an error), seen done at
        `seen`; on the waiter thread, or on the event loop where its looks saw the end (then again on the
        thread, which finds those callbacks gone)."""
        with self._cond:
            ready = []
            while self._pending and (err is not None or self._pending[0][0] <= value):
                ready.append(self._pending.popleft())
            if err is None:
                self.completed = max(self.completed, value)
            else:
                self.completed = self.submitted  # the device is lost: nothing more will finish
            self.last_completion = max(self.last_completion, seen)
            self._cond.notify_all()
            if self._watched and self._watched <= self.completed:  # the watched run is done, however it ended
                self._watched = 0
                if self._pending:
                    self._wake.notify()
        _call(ready, err)
        del ready  # what the callbacks hold (a run's outputs) must not wait here for the next completion

    def _wait(self, value: int, sub: Submission, fence: Fence | None = None) -> int:
        """Wait until `value` (sub's submission) completes, for at most about _WAIT_NS (aiomnn.poll's schedule);
        the VkResult: success, a timeout, or the device's error. With `fence`, the event loop looks over the
        last stretch and runs the completion itself."""
        result = [vk.VK_SUCCESS]

        def block() -> bool:
            result[0] = self._block(value, sub, _WAIT_NS)
            return result[0] == vk.VK_SUCCESS

        near = None
        if fence is not None:
            def found() -> None:
                self._complete(value, None, time.perf_counter())

            def near(until: float):
                return fence.looks(lambda: self._looked_done(value, sub), until, found)
        began = max(sub.sent_at, self.last_completion)  # it runs after what was queued before it
        self.poller.wait(sub.timing, began, lambda: self._done(value, sub), block, near)
        return result[0]

    # What the waiter asks of the device (a test replaces them) --------------------------------
    def _done(self, value: int, sub: Submission) -> bool:
        if self.timeline:
            ok = lib.vkGetSemaphoreCounterValue(self.device, self.semaphore, self._counter) == vk.VK_SUCCESS
            return ok and self._counter[0] >= value
        return lib.vkGetFenceStatus(self.device, sub.fence) == vk.VK_SUCCESS

    def _looked_done(self, value: int, sub: Submission) -> bool | None:
        """_done for the event loop's looks (their own counter): None on the device's error, which the waiter
        thread's own wait then reports."""
        if self.timeline:
            r = lib.vkGetSemaphoreCounterValue(self.device, self.semaphore, self._looked)
            return self._looked[0] >= value if r == vk.VK_SUCCESS else None
        r = lib.vkGetFenceStatus(self.device, sub.fence)
        return True if r == vk.VK_SUCCESS else False if r == vk.VK_NOT_READY else None

    def _block(self, value: int, sub: Submission, timeout_ns: int) -> int:
        if self.timeline:
            self._wait_values[0] = value
            return lib.vkWaitSemaphores(self.device, self._wait_info, timeout_ns)
        return lib.vkWaitForFences(self.device, 1, sub._fences, vk.VK_TRUE, timeout_ns)

    def close(self) -> None:
        """Wait for submitted work, stop the waiter and destroy the semaphore."""
        self.wait_value(self.submitted)
        with self._cond:
            self.closed = True
            self._cond.notify_all()
            self._wake.notify_all()
        self._thread.join(timeout=5)
        if self.semaphore is not None:
            vk.vkDestroySemaphore(self.device, self.semaphore, None)
            self.semaphore = None


def _finish(rec: "Record", slot: "Slot", values: dict[str, Any], fence: Fence, err: BaseException | None) -> None:
    """On the waiter thread: the segment completed; hand its outputs over (or copy them) and signal."""
    if err is not None:
        fence.signal(error=BackendError(f"the Vulkan run failed: {err}"))
        return
    try:
        lent = slot.handover and _lend(slot, values)
        for name, view in () if lent else slot.downloads:
            if copies.large(view.nbytes):
                values[name] = out = np.empty(view.shape, view.dtype)
                copies.copy(out, view)
            else:
                values[name] = view.copy()
        for name in rec.pops:
            values.pop(name, None)
    except BaseException as exc:
        fence.signal(error=exc)
        return
    fence.signal()


def _lend(slot: "Slot", values: dict[str, Any]) -> bool:
    """Make the slot's outputs arrays on its own readback, as they are, within the bytes callers may hold
    (memory.handed); the slot is free again when they are all gone."""
    nbytes = sum(view.nbytes for _, view in slot.downloads)
    if not handed.take(nbytes):
        return False
    lease = Lease(slot, nbytes, slot.returned)
    for name, view in slot.downloads:
        values[name] = np.asarray(HandedOver(lease, view.ctypes.data, view.shape, view.dtype))
    slot.lent = True
    return True
