"""The waiter thread GPU backends share (aiomnn.waiter), on real threads and a real loop, with a stand-in device:
each run is ended once, by the thread or by the event loop's looks, its results handed over before its fence
completes and its mark's part (Waiter.over) done in either case; errors reach the fence and the thread goes on;
the loop may be asked to watch a run from another thread (OpenCL submits on one)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from aiomnn import poll
from aiomnn.errors import BackendError
from aiomnn.fence import Fence
from aiomnn.poll import Timing
from aiomnn.waiter import Waiter


class Device(Waiter):
    """Marks are run numbers; a run ends at finish[mark]; mark "bad" fails."""

    def __init__(self, looks: bool):
        self.finish: dict = {}
        self.overs: list = []
        super().__init__("test-waiter", looks)

    def done(self, mark) -> bool:
        if mark == "bad":
            raise RuntimeError("the device failed")
        return time.perf_counter() >= self.finish[mark]

    def block(self, mark) -> bool:
        while not self.done(mark):
            time.sleep(1e-4)
        return True

    def check(self, mark):
        return None if mark == "bad" else lambda: self.done(mark)

    def over(self, mark) -> None:
        self.overs.append(mark)


@pytest.mark.parametrize("looks", [True, False], ids=["looks", "thread"])
def test_each_run_ends_once_results_before_the_fence(looks, monkeypatch):
    """Runs of 1-3 ms put to the thread and, with looks, watched from the submit once learned: each one's
    complete() runs once, before its fence completes, and over() once; with looks the loop ends most of them, the
    thread ends them all without."""
    monkeypatch.setattr(poll, "LOOK_ALL_S", 10e-3)  # loose for a busy host

    async def main() -> tuple[list, list, Device]:
        w = Device(looks)
        ended, on = [], []
        try:
            for i in range(30):
                fence = Fence()
                w.finish[i] = time.perf_counter() + (1 + i % 3) * 1e-3

                def complete(mark, fence=fence):
                    assert not fence.done  # the results are there before the fence says so
                    ended.append(mark)
                    on.append(threading.current_thread() is threading.main_thread())

                sent = time.perf_counter()
                if not w.watch(i, fence, timing, sent, complete):
                    w.put(i, fence, timing, sent, complete)
                await asyncio.wait_for(fence.wait(), 5)
                assert time.perf_counter() >= w.finish[i]
        finally:
            w.close()
        return ended, on, w

    timing = Timing()
    ended, on, w = asyncio.run(main())
    w.join(5)
    assert ended == list(range(30)) and sorted(w.overs) == list(range(30))
    if looks:
        assert sum(on) >= 10, on  # the loop ended them, once the first runs taught their length
    else:
        assert not any(on)


def test_a_watch_asked_from_another_thread_ends_runs_already_over():
    """A run that is over before the watch is asked (from a thread that is not the loop's, as OpenCL's submit
    thread) is ended by the loop's first look, which may come before the watch call returns: once each, no error in
    the loop's callbacks."""
    errors: list = []

    async def main() -> list:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda loop, context: errors.append(context))
        spinning = True

        def spin() -> None:  # the loop kept busy, so that it takes the GIL whenever the submitting thread lets it go
            if spinning:
                loop.call_soon(spin)

        loop.call_soon(spin)
        w = Device(looks=True)
        ended: list = []
        timing = Timing()
        timing.known, timing.expect = True, 1e-3
        try:
            for i in range(200):
                fence = Fence()
                w.finish[i] = 0.0  # over already
                asked = await asyncio.to_thread(w.watch, i, fence, timing, time.perf_counter(), ended.append)
                if not asked:
                    w.put(i, fence, timing, time.perf_counter(), ended.append)
                await asyncio.wait_for(fence.wait(), 5)
                timing.known, timing.expect = True, 1e-3
        finally:
            spinning = False
            w.close()
        return ended

    ended = asyncio.run(main())
    assert not errors, errors
    assert ended == list(range(200))


def test_an_error_reaches_the_fence_and_the_thread_goes_on():
    """A failed wait ends the run with a BackendError naming the waiter, its mark's part still done and its
    results not handed over; the next run completes."""

    async def main() -> tuple[Fence, Fence, list, Device]:
        w = Device(looks=False)
        w.finish["good"] = 0.0
        handed: list = []
        bad, good = Fence(), Fence()
        w.put("bad", bad, Timing(), time.perf_counter(), handed.append)
        w.put("good", good, Timing(), time.perf_counter(), handed.append)
        with pytest.raises(BackendError, match="test-waiter: the device failed"):
            await asyncio.wait_for(bad.wait(), 5)
        await asyncio.wait_for(good.wait(), 5)
        w.close()
        return bad, good, handed, w

    bad, good, handed, w = asyncio.run(main())
    w.join(5)
    assert handed == ["good"] and w.overs == ["bad", "good"]
