"""The schedule GPU waiter threads follow (aiomnn.poll), on a virtual clock so that a busy machine's scheduling
cannot move the times: sleeps overshoot by 30 us, a look at the device costs 2 us, and the driver's blocking
wait wakes 150 us late. CUDA's waiter and Vulkan's queue wait this way (their own tests: test_cuda.py,
test_vulkan.py)."""

from __future__ import annotations

from types import SimpleNamespace

from aiomnn import poll


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
