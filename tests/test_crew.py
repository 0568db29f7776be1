"""The crew of workers that runs the compiled loops' pieces (backends/cpu/crew.py): every piece once, callers at
once, workers held awake through a run and asleep after it, a forked child, a clean exit."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from aiomnn.backends.cpu import jit

pytest.importorskip("numba")
if jit.mode() == "off":
    pytest.skip("numba is off (AIOMNN_NUMBA=0)", allow_module_level=True)


@pytest.fixture(scope="module")
def bump():
    """A piece that adds 1 to its run of a[1] values of the float32 array at a[0], as a cfunc's address."""
    import numba
    from numba import types

    from aiomnn.backends.cpu.atomics import at

    @numba.cfunc(types.void(types.int64, types.int64), nogil=True)
    def piece(args, c):
        a = numba.carray(at(args, np.int64), (2,))
        y = numba.carray(at(a[0], np.float32), ((c + 1) * a[1],))
        for i in range(c * a[1], (c + 1) * a[1]):
            y[i] += 1.0

    return piece


def crew(threads: int):
    """The process's crew with threads - 1 workers, its loops compiled."""
    if jit.jitted("gelu") is None:
        jit.wait(600)
    assert jit.jitted("gelu") is not None, "the compiled loops are not available"
    from aiomnn.backends.cpu import crew

    return crew.shared(threads)


def run(c, fn: int, args: int, n: int) -> None:
    from aiomnn.backends.cpu import crew as module

    module.run(c.ctl, fn, args, n)


def test_every_piece_runs_once(bump):
    c = crew(3)
    y = np.zeros(64 * 50, np.float32)
    job = np.array([y.ctypes.data, 50], np.int64)
    for _ in range(300):
        run(c, bump.address, job.ctypes.data, 64)
    assert np.all(y == 300)


@pytest.mark.parametrize("pieces", [1, 3])
def test_a_bound_job_runs_again_on_the_same_memory(pieces):
    """Loop.bind writes a job's fields once; each call of the Bound job runs the loop again over what the arrays
    hold then, alone or on the crew, as the loop called with its values does."""
    crew(3)
    loop = jit.jitted("gelu")
    y = np.linspace(-3, 3, 3000, dtype=np.float32)
    want = y.copy()
    loop(pieces, want)
    bound = loop.bind(pieces, y)
    assert bound() is True
    np.testing.assert_array_equal(y, want)
    y[:] = np.linspace(-3, 3, 3000, dtype=np.float32) * 2  # new values in the same memory
    want = y.copy()
    loop(pieces, want)
    bound()
    np.testing.assert_array_equal(y, want)


def test_binds_keep_one_job_a_thread():
    """A thread's job is made again when it brings another buffer (its scratch grew), and the old one is let go;
    each thread has its own."""
    import gc
    import weakref

    made = []
    jobs = jit.Binds()

    def binds(buffer):
        return jobs.get((buffer,), lambda got: made.append(got) or len(made))

    a, b = np.zeros(4), np.zeros(4)
    assert (binds(a), binds(a), binds(b), binds(b)) == (1, 1, 2, 2)
    gone = weakref.ref(a)
    del a
    made.clear()
    gc.collect()
    assert gone() is None  # b's job replaced a's: the replaced buffer is not kept
    other = []
    t = threading.Thread(target=lambda: other.append(binds(b)))
    t.start()
    t.join()
    assert other == [1] and binds(b) == 2  # the other thread made its own (the list was cleared: 0 + 1)


def test_callers_at_once_each_get_all_their_pieces(bump):
    c = crew(3)
    ys = [np.zeros(16 * 10, np.float32) for _ in range(4)]
    jobs = [np.array([y.ctypes.data, 10], np.int64) for y in ys]

    def caller(i: int) -> None:
        for _ in range(200):
            run(c, bump.address, jobs[i].ctypes.data, 16)  # a caller that finds the crew busy runs alone

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(np.all(y == 200) for y in ys)


def test_a_held_crew_stays_awake_and_sleeps_after(bump):
    """Workers asleep after an idle spell are woken by a run's hold and spin while it lasts, then sleep again."""
    from aiomnn.backends.cpu import crew as module

    c = crew(3)
    workers = len(c.workers)

    def sleepers() -> int:
        return int(c.ctl[module.SLEEPERS])

    deadline = time.monotonic() + 10
    while sleepers() < workers and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sleepers() == workers
    y = np.zeros(8 * 10, np.float32)
    job = np.array([y.ctypes.data, 10], np.int64)
    with c.held():
        assert c.ctl[module.HOLDS] == 1
        time.sleep(0.05)  # far past the spin before a sleep
        assert sleepers() == 0
        run(c, bump.address, job.ctypes.data, 8)
    assert c.ctl[module.HOLDS] == 0 and np.all(y == 1)
    deadline = time.monotonic() + 10
    while sleepers() < workers and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sleepers() == workers


CONV = r"""
import asyncio, os, sys, time
import numpy as np
from onnx import helper
import aiomnn
from aiomnn.backends.cpu import jit
from tests.oracle import one_input_model

rng = np.random.default_rng(0)
x = rng.standard_normal((1, 64, 40, 40)).astype(np.float32)
# Three convs: the first two repeat into planned buffers, a replay runs them as one chain (replay.Link).
data = one_input_model([helper.make_node("Conv", ["x", "w"], ["a"], pads=[1, 1, 1, 1]),
                        helper.make_node("Conv", ["a", "w"], ["b"], pads=[1, 1, 1, 1]),
                        helper.make_node("Conv", ["b", "w"], ["y"], pads=[1, 1, 1, 1])], x.shape,
                       {"w": rng.standard_normal((64, 64, 3, 3)).astype(np.float32) / 24})
net = aiomnn.Interpreter.from_bytes(data)

async def make():
    s = await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=2))
    for _ in range(3):
        await s.run({"x": x})
        jit.wait(600)
    return s, (await s.run({"x": x}))["y"]

s, want = asyncio.run(make())
assert jit.jitted("conv_tiles") is not None
segment = s.pipeline.segments[0]
assert segment.backend._replays[segment].ends  # the parent replays a chain; the child makes its own
if sys.argv[1] == "fork":
    pid = os.fork()
    if pid == 0:
        got = asyncio.run(s.run({"x": x}))["y"]  # the convs' calls bound to the parent's crew
        os._exit(0 if np.array_equal(got, want) else 1)
    deadline = time.monotonic() + 60
    while not os.waitpid(pid, os.WNOHANG)[0]:
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            print("child hung")
            sys.exit(1)
        time.sleep(0.02)
    np.testing.assert_array_equal(asyncio.run(s.run({"x": x}))["y"], want)
print("ok")
"""


@pytest.mark.parametrize("how", ["fork", "exit"])
def test_a_conv_on_the_crew_in_a_forked_child_and_at_exit(how):
    r = subprocess.run([sys.executable, "-c", CONV, how], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr[-3000:]
