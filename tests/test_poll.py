"""The schedule GPU waiter threads follow (aiomnn.poll), on a virtual clock so that a busy machine's scheduling
cannot move the times: sleeps overshoot by 30 us, a look at the device costs 2 us, and the driver's blocking
wait wakes 150 us late. CUDA's waiter and Vulkan's queue wait this way (their own tests: test_cuda.py,
test_vulkan.py). Last, the event loop's own looks (aiomnn.fence.Looks) on real loops."""

from __future__ import annotations

import threading
import time as clock_time
from types import SimpleNamespace

import anyio
import pytest
import sniffio

from aiomnn import poll
from aiomnn.fence import Fence


def virtual(monkeypatch):
    """A Poller on a virtual clock, and runs(n, run_s) -> how late it saw each of n runs of run_s finish."""
    clock = SimpleNamespace(t=0.0, finish=0.0, looks=0, blocks=0)
    monkeypatch.setattr(poll, "time", SimpleNamespace(perf_counter=lambda: clock.t))
    p = poll.Poller()

    def sleep(seconds: float) -> None:
        clock.t += seconds + 30e-6

    def done() -> bool:
        clock.t += 2e-6
        clock.looks += 1
        return clock.t >= clock.finish

    def block() -> bool:
        clock.blocks += 1
        clock.t = max(clock.t, clock.finish + 150e-6)
        return True

    p.sleep = sleep
    timing = poll.Timing()
    last = SimpleNamespace(completion=0.0)

    def runs(n: int, run_s: float) -> list[float]:
        delays = []
        for _ in range(n):
            clock.t += 1e-3  # the host's part of a run
            sent_at = clock.t
            clock.finish = sent_at + run_s
            assert p.wait(timing, max(sent_at, last.completion), done, block)
            delays.append(clock.t - clock.finish)
            last.completion = clock.t
        return delays

    return runs, p, timing, clock


def test_the_poll_catches_the_finish_not_the_drivers_late_wake_up(monkeypatch):
    """It learns how long a run takes, sleeps until shortly before that and polls: it notices the finish at
    once, not a driver wake-up later; and it learns how much a sleep overruns."""
    runs, p, timing, clock = virtual(monkeypatch)
    delays = runs(8, 800e-6)
    assert 790e-6 < timing.expect < 820e-6, timing.expect
    assert delays[0] > 100e-6 and clock.blocks == 1  # the first run: nothing learned yet, the driver's wake-up
    assert max(delays[2:]) < 10e-6, delays  # then caught by the poll, not 150 us late
    looks = clock.looks
    runs(1, 800e-6)
    assert clock.looks - looks < 70, clock.looks - looks  # it slept until shortly before the finish
    assert 15e-6 < p.oversleep < 35e-6, p.oversleep


def test_shorter_runs_and_one_slow_run_cost_a_few_late_looks(monkeypatch):
    """A run that got shorter is found late once or twice, then caught; one slow run (a busy GPU, or one that
    ended in the driver's wait) costs a few late wake-ups, not one per run for ever."""
    runs, p, timing, clock = virtual(monkeypatch)
    runs(8, 800e-6)
    delays = runs(8, 300e-6)  # the run got shorter
    assert max(delays[3:]) < 10e-6, delays
    assert 290e-6 < timing.expect < 320e-6, timing.expect
    runs(1, 20e-3)  # one run 60 times slower ...
    delays = runs(10, 300e-6)  # ... then the usual ones again
    assert delays[0] > 15e-3  # found late once, by the slow run's length
    assert max(delays[5:]) < 10e-6, delays
    assert sum(delays[1:]) < 10e-3, delays
    assert clock.blocks <= 2, clock.blocks


def test_a_driver_wait_that_gives_up_learns_nothing(monkeypatch):
    """block() returning False (Vulkan's wait timing out, to look for a close) returns False and leaves the
    expectation as it was."""
    runs, p, timing, clock = virtual(monkeypatch)
    runs(4, 500e-6)
    expect = timing.expect
    def never() -> bool:
        clock.t += 2e-6
        return False

    assert not p.wait(timing, clock.t, never, lambda: False)
    assert timing.expect == expect


def test_the_loop_polls_the_last_stretch_and_the_handoff_is_learned(monkeypatch):
    """With `near`, the waiter hands the poll to the event loop (aiomnn.fence.Looks) that much before the poll
    would start as the loop takes to start looking (80 us here, learned): the loop's looks, 5 us apart, see
    each finish within a look, and the driver's late wake-up is paid once, for the first run only."""
    clock = SimpleNamespace(t=0.0, finish=0.0, blocks=0, looks=0)
    monkeypatch.setattr(poll, "time", SimpleNamespace(perf_counter=lambda: clock.t))
    p = poll.Poller()
    p.sleep = lambda seconds: setattr(clock, "t", clock.t + seconds + 30e-6)
    wake = 80e-6

    def done() -> bool:
        clock.t += 2e-6
        return clock.t >= clock.finish

    def block() -> bool:
        clock.blocks += 1
        clock.t = max(clock.t, clock.finish + 150e-6)
        return True

    def near(until: float):
        """The loop's looks on the virtual clock: the first `wake` after the hand-off, then every 5 us."""
        looks = SimpleNamespace(handed=clock.t, first=clock.t + wake, found=0.0, count=0, until=until)
        t = looks.first
        while True:
            looks.count += 1
            clock.looks += 1
            if t >= clock.finish:
                looks.found = t
                break
            if t >= until:
                break
            t += 5e-6
        looks.wait = lambda timeout: setattr(clock, "t", max(clock.t, t)) or True
        return looks

    timing, delays, last = poll.Timing(), [], 0.0
    for _ in range(12):
        clock.t += 1e-3
        sent_at = clock.t
        clock.finish = sent_at + 800e-6
        assert p.wait(timing, max(sent_at, last), done, block, near)
        delays.append(p.seen - clock.finish)
        last = p.seen
    assert clock.blocks == 1 and delays[0] > 100e-6, delays  # nothing learned yet: the driver's wake-up
    assert max(delays[3:]) < 6e-6, delays  # then seen by a look of the loop
    assert 60e-6 < p.handoff < 85e-6, p.handoff
    looks = clock.looks
    clock.t += 1e-3
    clock.finish = clock.t + 800e-6
    p.wait(timing, clock.t, done, block, near)
    assert clock.looks - looks < 40, clock.looks - looks  # the loop looked only over the last stretch


def test_a_loop_that_cannot_look_leaves_the_poll_to_the_thread(monkeypatch):
    """near() returning None (trio, a closed loop): the thread polls, as without near."""
    clock = SimpleNamespace(t=0.0)
    monkeypatch.setattr(poll, "time", SimpleNamespace(perf_counter=lambda: clock.t))
    p = poll.Poller()
    p.sleep = lambda seconds: setattr(clock, "t", clock.t + seconds)
    finish = 300e-6

    def done() -> bool:
        clock.t += 2e-6
        return clock.t >= finish

    asked = []
    assert p.wait(poll.Timing(), 0.0, done, lambda: False, lambda until: asked.append(until))
    assert asked and finish <= p.seen < finish + 5e-6


def _looks_from_a_thread(fence: Fence, check, until_s: float):
    """fence.looks(check, ...) asked from another thread, as a waiter asks it."""
    got = []
    t = threading.Thread(target=lambda: got.append(fence.looks(check, clock_time.perf_counter() + until_s)))
    t.start()
    t.join()
    return got[0]


@pytest.mark.anyio
async def test_the_loop_looks_on_its_own_thread_and_completes_the_fence(anyio_backend):
    """Asked from a waiter thread, the loop looks (on its own thread) until the work is done and completes the
    fence there; the thread learns when it was seen. Under trio there are no looks (None): the thread polls."""
    fence, finish, where = Fence(), clock_time.perf_counter() + 50e-3, set()

    def check() -> bool:
        where.add(threading.get_ident())
        return clock_time.perf_counter() >= finish

    looks = _looks_from_a_thread(fence, check, 1.0)
    if sniffio.current_async_library() == "trio":
        assert looks is None
        return
    await fence.wait()
    assert looks.wait(1.0)
    assert looks.found >= finish and looks.count > 1 and looks.first >= looks.handed
    assert where == {threading.get_ident()}


@pytest.mark.anyio
async def test_the_looks_stop_at_an_error_or_the_deadline_and_leave_the_fence_to_the_thread(anyio_backend):
    """A look that cannot tell (None: the device's error) or the deadline stops the looks without completing
    the fence; the thread's own signal completes it."""
    if sniffio.current_async_library() == "trio":
        pytest.skip("trio's loop does not look (Fence.looks is None)")
    for check, until_s in ((lambda: None, 1.0), (lambda: False, 2e-3)):
        fence = Fence()
        looks = _looks_from_a_thread(fence, check, until_s)
        while not looks.wait(0):
            await anyio.sleep(1e-3)
        assert not looks.found and not fence.done
        threading.Thread(target=fence.signal).start()
        await fence.wait()


@pytest.mark.anyio
async def test_the_looks_stop_where_cpu_runs_come_to_hold_every_core(anyio_backend):
    """The loop's looks take a core: where CPU runs come to hold every one (aiomnn.cores), the next look stops
    them without completing the fence, and stopped() hands the work back (here: a thread signals the fence)."""
    from aiomnn import cores

    if sniffio.current_async_library() == "trio":
        pytest.skip("trio's loop does not look (Fence.looks is None)")
    fence, stops = Fence(), []

    def stopped() -> None:
        stops.append(clock_time.perf_counter())
        threading.Thread(target=fence.signal).start()

    looks = fence.looks(lambda: False, clock_time.perf_counter() + 10.0, stopped=stopped)
    await anyio.sleep(5e-3)
    assert looks.count > 1 and not stops  # looking, a core spare
    with cores.HELD.hold(cores.count()), anyio.fail_after(1.0):  # not at the deadline, 10 s on
        await fence.wait()
    assert len(stops) == 1 and not looks.found

